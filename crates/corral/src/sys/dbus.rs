//! A minimal D-Bus client for one peer-to-peer connection: EXTERNAL authentication, method calls
//! with a body marshalled by [`Encoder`], and the replies and signals that come back. corral
//! talks to one peer only (systemd's private socket, see `cgroups::scope`) and uses a handful of
//! basic types, so this covers the wire format's fixed header, strings, booleans, integers,
//! arrays, structs and variants, and nothing of the bus (no Hello, names or match rules).
//!
//! Hand-written rather than through `zbus`: measured on a probe binary built with the shim's
//! release profile, zbus 5 (tokio and p2p features) adds 58 crates and 1.06 MB of stripped text
//! (0.37 -> 1.44 MB), a third of the static shim again, and the shim's resident memory per pod
//! follows its text.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const METHOD_CALL: u8 = 1;
pub const METHOD_RETURN: u8 = 2;
pub const ERROR: u8 = 3;
pub const SIGNAL: u8 = 4;

/// Header field codes (the D-Bus specification's table).
const FIELD_PATH: u8 = 1;
const FIELD_INTERFACE: u8 = 2;
const FIELD_MEMBER: u8 = 3;
const FIELD_ERROR_NAME: u8 = 4;
const FIELD_REPLY_SERIAL: u8 = 5;
const FIELD_DESTINATION: u8 = 6;
const FIELD_SIGNATURE: u8 = 8;

/// A message larger than this is refused: systemd's answers to corral are a few hundred bytes.
const MAX_MESSAGE: usize = 1 << 20;

/// What went wrong talking to the peer.
#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol (or this client misread it).
    #[error("D-Bus protocol: {0}")]
    Protocol(String),
    /// The peer answered the call with an error.
    #[error("{name}: {message}")]
    Remote { name: String, message: String },
}

pub type DbusResult<T> = std::result::Result<T, DbusError>;

/// A body (or header) being marshalled; alignment is relative to its start, which is a
/// multiple of 8 in the message.
#[derive(Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn pad(&mut self, align: usize) {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
    }

    pub fn byte(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn boolean(&mut self, v: bool) {
        self.u32(v as u32);
    }

    pub fn u32(&mut self, v: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.pad(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A string or an object path (`s`, `o`).
    pub fn string(&mut self, v: &str) {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v.as_bytes());
        self.buf.push(0);
    }

    /// A type signature (`g`).
    pub fn signature(&mut self, v: &str) {
        self.buf.push(v.len() as u8);
        self.buf.extend_from_slice(v.as_bytes());
        self.buf.push(0);
    }

    /// An array whose elements align to `element_align` (8 for structs); `fill` writes them.
    /// The length counts the elements' bytes, not the padding before the first.
    pub fn array(&mut self, element_align: usize, fill: impl FnOnce(&mut Encoder)) {
        self.u32(0);
        let len_at = self.buf.len() - 4;
        self.pad(element_align);
        let start = self.buf.len();
        fill(self);
        let len = (self.buf.len() - start) as u32;
        self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// A struct (or dict entry): aligned to 8, then its fields.
    pub fn structure(&mut self, fill: impl FnOnce(&mut Encoder)) {
        self.pad(8);
        fill(self);
    }

    /// A variant holding a value of type `sig`, which `fill` writes.
    pub fn variant(&mut self, sig: &str, fill: impl FnOnce(&mut Encoder)) {
        self.signature(sig);
        fill(self);
    }
}

/// Reads the basic types out of a received body.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Decoder<'a> {
    fn new(buf: &'a [u8], big_endian: bool) -> Self {
        Decoder { buf, pos: 0, big_endian }
    }

    fn take(&mut self, n: usize) -> DbusResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| DbusError::Protocol("message ends inside a value".into()))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn align(&mut self, n: usize) -> DbusResult<()> {
        let pad = (n - self.pos % n) % n;
        self.take(pad).map(|_| ())
    }

    pub fn u8(&mut self) -> DbusResult<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> DbusResult<u32> {
        self.align(4)?;
        let b: [u8; 4] = self.take(4)?.try_into().expect("four bytes");
        Ok(if self.big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    }

    /// A string or an object path (`s`, `o`).
    pub fn string(&mut self) -> DbusResult<String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        self.take(1)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DbusError::Protocol("a string is not UTF-8".into()))
    }

    pub fn signature(&mut self) -> DbusResult<String> {
        let len = self.u8()? as usize;
        let bytes = self.take(len)?;
        self.take(1)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DbusError::Protocol("a signature is not ASCII".into()))
    }
}

/// A received message, its header fields decoded.
#[derive(Debug, Default)]
pub struct Message {
    pub kind: u8,
    pub serial: u32,
    pub reply_serial: Option<u32>,
    pub path: String,
    pub interface: String,
    pub member: String,
    pub error_name: String,
    pub signature: String,
    big_endian: bool,
    body: Vec<u8>,
}

impl Message {
    pub fn body(&self) -> Decoder<'_> {
        Decoder::new(&self.body, self.big_endian)
    }

    /// Parses one whole message (`bytes` holds exactly it).
    fn parse(bytes: &[u8]) -> DbusResult<Message> {
        let big_endian = match bytes.first() {
            Some(b'l') => false,
            Some(b'B') => true,
            other => return Err(DbusError::Protocol(format!("bad endianness byte {other:?}"))),
        };
        let mut d = Decoder::new(bytes, big_endian);
        d.u8()?;
        let kind = d.u8()?;
        let _flags = d.u8()?;
        let _version = d.u8()?;
        let body_len = d.u32()? as usize;
        let serial = d.u32()?;
        let fields_len = d.u32()? as usize;
        let fields_end = d.pos + fields_len;
        let mut msg = Message { kind, serial, big_endian, ..Default::default() };
        while d.pos < fields_end {
            d.align(8)?;
            let code = d.u8()?;
            let sig = d.signature()?;
            match sig.as_str() {
                "s" | "o" => {
                    let v = d.string()?;
                    match code {
                        FIELD_PATH => msg.path = v,
                        FIELD_INTERFACE => msg.interface = v,
                        FIELD_MEMBER => msg.member = v,
                        FIELD_ERROR_NAME => msg.error_name = v,
                        _ => {}
                    }
                }
                "u" => {
                    let v = d.u32()?;
                    if code == FIELD_REPLY_SERIAL {
                        msg.reply_serial = Some(v);
                    }
                }
                "g" => {
                    let v = d.signature()?;
                    if code == FIELD_SIGNATURE {
                        msg.signature = v;
                    }
                }
                other => return Err(DbusError::Protocol(format!("header field {code} of type {other:?}"))),
            }
        }
        d.align(8)?;
        msg.body = d.take(body_len)?.to_vec();
        Ok(msg)
    }
}

#[cfg(test)]
impl Message {
    pub(crate) fn for_test(
        kind: u8,
        interface: &str,
        member: &str,
        signature: &str,
        body: Vec<u8>,
    ) -> Message {
        let (interface, member, signature) = (interface.into(), member.into(), signature.into());
        Message { kind, interface, member, signature, body, ..Default::default() }
    }
}

/// The fixed part of a message header: the first 16 bytes say how long the rest is.
fn message_len(fixed: &[u8; 16]) -> DbusResult<usize> {
    let big_endian = fixed[0] == b'B';
    let word = |at: usize| {
        let b: [u8; 4] = fixed[at..at + 4].try_into().expect("four bytes");
        (if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }) as usize
    };
    let fields = word(12);
    let header = (16 + fields).div_ceil(8) * 8;
    let total = header.checked_add(word(4)).filter(|t| *t <= MAX_MESSAGE);
    total.ok_or_else(|| DbusError::Protocol(format!("a message of {} bytes", header + word(4))))
}

/// A method call to send.
pub struct Call<'a> {
    pub destination: &'a str,
    pub path: &'a str,
    pub interface: &'a str,
    pub member: &'a str,
    /// The body's signature, empty for none.
    pub signature: &'a str,
    pub body: Vec<u8>,
}

impl Call<'_> {
    fn marshal(&self, serial: u32) -> Vec<u8> {
        let mut e = Encoder::default();
        e.byte(b'l');
        e.byte(METHOD_CALL);
        e.byte(0);
        e.byte(1);
        e.u32(self.body.len() as u32);
        e.u32(serial);
        e.array(8, |e| {
            let string_fields = [
                (FIELD_PATH, "o", self.path),
                (FIELD_INTERFACE, "s", self.interface),
                (FIELD_MEMBER, "s", self.member),
                (FIELD_DESTINATION, "s", self.destination),
            ];
            for (code, sig, value) in string_fields {
                e.structure(|e| {
                    e.byte(code);
                    e.variant(sig, |e| e.string(value));
                });
            }
            if !self.signature.is_empty() {
                e.structure(|e| {
                    e.byte(FIELD_SIGNATURE);
                    e.variant("g", |e| e.signature(self.signature));
                });
            }
        });
        e.pad(8);
        let mut out = e.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// One authenticated connection to a peer.
pub struct Connection {
    stream: UnixStream,
    serial: u32,
    deadline: Instant,
}

impl Connection {
    /// Connects to the peer's socket and authenticates as this process's uid. Every read and
    /// write after this must finish within `timeout` of now.
    pub fn connect(socket: &Path, timeout: Duration) -> DbusResult<Connection> {
        let stream = UnixStream::connect(socket)?;
        let mut conn = Connection { stream, serial: 0, deadline: Instant::now() + timeout };
        conn.authenticate()?;
        Ok(conn)
    }

    /// The SASL exchange: a NUL byte, `AUTH EXTERNAL <uid in hex>`, `OK <guid>`, `BEGIN`.
    fn authenticate(&mut self) -> DbusResult<()> {
        let uid = nix::unistd::geteuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        self.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            let mut byte = [0u8; 1];
            self.read_exact(&mut byte)?;
            line.push(byte[0]);
            if line.len() > 512 {
                return Err(DbusError::Protocol("authentication answer too long".into()));
            }
        }
        if !line.starts_with(b"OK ") {
            let answer = String::from_utf8_lossy(&line).trim().to_string();
            return Err(DbusError::Protocol(format!("authentication refused: {answer:?}")));
        }
        self.write_all(b"BEGIN\r\n")
    }

    fn arm(&self) -> DbusResult<()> {
        let left = self.deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
        let left =
            left.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "D-Bus peer too slow"))?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))?;
        Ok(())
    }

    fn write_all(&mut self, bytes: &[u8]) -> DbusResult<()> {
        self.arm()?;
        Ok(self.stream.write_all(bytes)?)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> DbusResult<()> {
        self.arm()?;
        Ok(self.stream.read_exact(buf)?)
    }

    /// Sends `call`; returns its serial, which the reply names.
    pub fn send(&mut self, call: &Call<'_>) -> DbusResult<u32> {
        self.serial += 1;
        let bytes = call.marshal(self.serial);
        self.write_all(&bytes)?;
        Ok(self.serial)
    }

    /// The next message from the peer, whatever it is.
    pub fn receive(&mut self) -> DbusResult<Message> {
        let mut fixed = [0u8; 16];
        self.read_exact(&mut fixed)?;
        let mut bytes = vec![0u8; message_len(&fixed)?];
        bytes[..16].copy_from_slice(&fixed);
        self.read_exact(&mut bytes[16..])?;
        Message::parse(&bytes)
    }

    /// Sends `call` and waits for its reply; signals that arrive meanwhile go to `on_signal`.
    /// An error reply becomes [`DbusError::Remote`].
    pub fn call(&mut self, call: &Call<'_>, mut on_signal: impl FnMut(&Message)) -> DbusResult<Message> {
        let serial = self.send(call)?;
        loop {
            let msg = self.receive()?;
            match msg.kind {
                SIGNAL => on_signal(&msg),
                METHOD_RETURN | ERROR if msg.reply_serial == Some(serial) => {
                    if msg.kind == ERROR {
                        let message =
                            if msg.signature.starts_with('s') { msg.body().string()? } else { String::new() };
                        return Err(DbusError::Remote { name: msg.error_name, message });
                    }
                    return Ok(msg);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_parses_back_as_sent() {
        let mut body = Encoder::default();
        body.string("corral-sb.scope");
        body.array(8, |e| {
            e.structure(|e| {
                e.string("PIDs");
                e.variant("au", |e| e.array(4, |e| e.u32(42)));
            });
            e.structure(|e| {
                e.string("MemoryMax");
                e.variant("t", |e| e.u64(1 << 30));
            });
        });
        let call = Call {
            destination: "org.freedesktop.systemd1",
            path: "/org/freedesktop/systemd1",
            interface: "org.freedesktop.systemd1.Manager",
            member: "StartTransientUnit",
            signature: "sa(sv)",
            body: body.into_bytes(),
        };
        let bytes = call.marshal(7);
        let fixed: [u8; 16] = bytes[..16].try_into().unwrap();
        assert_eq!(message_len(&fixed).unwrap(), bytes.len());
        let msg = Message::parse(&bytes).unwrap();
        assert_eq!((msg.kind, msg.serial), (METHOD_CALL, 7));
        assert_eq!(msg.path, "/org/freedesktop/systemd1");
        assert_eq!(msg.member, "StartTransientUnit");
        assert_eq!(msg.signature, "sa(sv)");
        let mut d = msg.body();
        assert_eq!(d.string().unwrap(), "corral-sb.scope");
        // The array's length excludes the padding before its first struct: 4 bytes of length,
        // 4 of padding, then the structs.
        let len = d.u32().unwrap() as usize;
        d.align(8).unwrap();
        let start = d.pos;
        assert_eq!(d.string().unwrap(), "PIDs");
        assert_eq!(d.signature().unwrap(), "au");
        assert_eq!(d.u32().unwrap(), 4, "one u32 in the PIDs array");
        assert_eq!(d.u32().unwrap(), 42);
        d.align(8).unwrap();
        assert_eq!(d.string().unwrap(), "MemoryMax");
        assert_eq!(d.signature().unwrap(), "t");
        d.align(8).unwrap();
        assert_eq!(u64::from_le_bytes(d.take(8).unwrap().try_into().unwrap()), 1 << 30);
        assert_eq!(d.pos - start, len);
    }

    #[test]
    fn a_truncated_or_huge_message_is_refused() {
        let call =
            Call { destination: "d", path: "/p", interface: "i", member: "m", signature: "", body: vec![] };
        let bytes = call.marshal(1);
        assert!(Message::parse(&bytes[..bytes.len() - 3]).is_err());
        let mut huge: [u8; 16] = bytes[..16].try_into().unwrap();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(message_len(&huge).is_err());
    }
}
