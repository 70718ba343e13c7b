//! The holder: a tiny process that sits in the pod's namespaces for as long as the pod lives.
//! CRI builds every container's namespace paths as `/proc/<pid>/ns/*` from the pid corral
//! reports, so that pid must be a process in exactly the pod's namespaces: the holder's. No image,
//! no runc, no container.
//!
//! The holder is a separate `no_std` program without libc (`holder/main.rs`, built by this
//! crate's build script) embedded in the shim and run from a sealed memfd: about 10 KiB of code,
//! under 100 KiB resident per pod. Parent and child talk over the child's stdin and stdout in the
//! format of [`protocol`]: the parent sends a spec; the child answers one report line naming the
//! step that failed, if one did.

pub mod pins;
pub mod protocol;

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::error::{Error, IoContext, Result};
use crate::sys::pidfd::PidFd;
use crate::sys::process::ProcessId;

/// The holder program, built by build.rs.
pub static HOLDER_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/corral-holder"));

/// argv of a holder: `corral-holder holder <sandbox id>`; `delete` and operators find holders by it.
pub const HOLDER_ARG0: &str = "corral-holder";
pub const HOLDER_ARG: &str = "holder";

/// The holder's spec is read into a fixed buffer of this size.
const MAX_SPEC: usize = 32 * 1024 - 1;

/// What the holder must set up.
#[derive(Clone, Debug, Default)]
pub struct HolderSpec {
    pub sandbox_id: String,
    /// Join this network namespace (CRI's); `None` keeps the node's.
    pub netns: Option<PathBuf>,
    /// First join the user namespace that owns `netns` (user namespace mode POD).
    pub join_netns_owner: bool,
    pub new_ipc: bool,
    pub new_uts: bool,
    /// Create a PID namespace; the reported pid is then pid 1 of it, which reaps the pod's orphans.
    pub new_pid: bool,
    pub hostname: Option<String>,
    /// Validated sysctls, in the order they are written.
    pub sysctls: Vec<SysctlWrite>,
}

/// One sysctl for the holder to write from inside the pod's namespaces.
#[derive(Clone, Debug, Default)]
pub struct SysctlWrite {
    /// The key as the pod named it (for messages).
    pub key: String,
    /// Its file under /proc/sys.
    pub path: String,
    pub value: String,
}

impl HolderSpec {
    /// The wire form read by the holder (see [`protocol`]).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut record = |tag: u8, strings: &[&[u8]]| {
            out.push(tag);
            for s in strings {
                out.extend_from_slice(s);
                out.push(0);
            }
        };
        if let Some(netns) = &self.netns {
            record(protocol::NETNS, &[netns.as_os_str().as_encoded_bytes()]);
        }
        for (on, tag) in [
            (self.join_netns_owner, protocol::JOIN_NETNS_OWNER),
            (self.new_ipc, protocol::NEW_IPC),
            (self.new_uts, protocol::NEW_UTS),
            (self.new_pid, protocol::NEW_PID),
        ] {
            if on {
                record(tag, &[]);
            }
        }
        if let Some(name) = &self.hostname {
            record(protocol::HOSTNAME, &[name.as_bytes()]);
        }
        for s in &self.sysctls {
            record(protocol::SYSCTL, &[s.path.as_bytes(), s.value.as_bytes()]);
        }
        let nul_inside = self.netns.iter().any(|p| p.as_os_str().as_encoded_bytes().contains(&0))
            || self.hostname.iter().any(|h| h.contains('\0'))
            || self.sysctls.iter().any(|s| [&s.key, &s.path, &s.value].iter().any(|v| v.contains('\0')));
        if nul_inside {
            return Err(Error::invalid("pod spec: a path, hostname or sysctl contains a NUL byte"));
        }
        if out.len() > MAX_SPEC {
            return Err(Error::invalid(format!(
                "PodSandboxConfig.linux.sysctls: the pod's hostname and sysctls take {} bytes, more than {MAX_SPEC}",
                out.len()
            )));
        }
        Ok(out)
    }

    /// A failure report `F<step>:<index>:<errno>` as an error naming the step.
    fn failure(&self, report: &str) -> Error {
        let mut parts = report.splitn(3, ':');
        let (step, index, errno) = (parts.next(), parts.next(), parts.next());
        let index: usize = index.and_then(|i| i.parse().ok()).unwrap_or(0);
        let errno: i32 = errno.and_then(|e| e.trim().parse().ok()).unwrap_or(0);
        let netns = || self.netns.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let step = match step.and_then(|s| s.as_bytes().get(1).copied()) {
            Some(protocol::STEP_READ_SPEC) => "read its spec".to_string(),
            Some(protocol::STEP_PARSE_SPEC) => "decode its spec".to_string(),
            Some(protocol::STEP_SIGNALS) => "block signals".to_string(),
            Some(protocol::STEP_OPEN_NETNS) => format!("open network namespace {}", netns()),
            Some(protocol::STEP_NETNS_OWNER) => {
                format!("find the user namespace owning {}", netns())
            }
            Some(protocol::STEP_JOIN_USERNS) => "join the pod's user namespace".to_string(),
            Some(protocol::STEP_JOIN_NETNS) => format!("join network namespace {}", netns()),
            Some(protocol::STEP_UNSHARE) => "create pod namespaces".to_string(),
            Some(protocol::STEP_HOSTNAME) => {
                format!("set hostname {:?}", self.hostname.as_deref().unwrap_or(""))
            }
            Some(protocol::STEP_SYSCTL) => match self.sysctls.get(index) {
                Some(s) => format!("set sysctl {}={:?}", s.key, s.value),
                None => "set a sysctl".to_string(),
            },
            Some(protocol::STEP_FORK) => "fork pid 1 of the pod".to_string(),
            Some(protocol::STEP_CONFINE) => format!("confine itself (call {index})"),
            _ => {
                return Error::Holder {
                    step: "report".into(),
                    message: format!("unreadable report {report:?}"),
                }
            }
        };
        let mut message = std::io::Error::from_raw_os_error(errno).to_string();
        if errno == libc::EINVAL && step.starts_with("join network namespace") {
            message.push_str(" (not a network namespace)");
        }
        Error::Holder { step, message }
    }
}

/// A running holder.
pub struct Holder {
    pub pid: i32,
    /// Its pid and start time, for the pod's record.
    pub id: ProcessId,
    pub pidfd: PidFd,
}

/// The holder program in a sealed memfd, made once per shim process.
fn holder_program() -> Result<&'static OwnedFd> {
    static PROGRAM: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = PROGRAM.get() {
        return Ok(fd);
    }
    let name = c"corral-holder";
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(Error::io("memfd_create for the holder", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = File::from(fd);
    file.write_all(HOLDER_ELF).context(|| "write the holder into its memfd".into())?;
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl F_ADD_SEALS on an fd we own, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(Error::io("seal the holder memfd", std::io::Error::last_os_error()));
    }
    Ok(PROGRAM.get_or_init(|| OwnedFd::from(file)))
}

impl Holder {
    /// Starts a holder and waits for its report. Blocking: call from a blocking context.
    pub fn spawn(spec: &HolderSpec) -> Result<Holder> {
        let message = spec.encode()?;
        // Executed by path in the child, where the (close-on-exec) memfd is still open.
        let exe = PathBuf::from(format!("/proc/self/fd/{}", holder_program()?.as_raw_fd()));
        let mut child = Command::new(&exe)
            .arg0(HOLDER_ARG0)
            .arg(HOLDER_ARG)
            .arg(&spec.sandbox_id)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_path("spawn holder", &exe)?;

        // Closing stdin (end of the spec) is what lets the holder start.
        let sent = child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(&message)
            .context(|| "send spec to holder".into());
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .context(|| "read holder report".into());

        let ready = match (sent, read) {
            (Ok(()), Ok(_)) => match line.trim().strip_prefix('R').map(str::parse::<i32>) {
                Some(Ok(pid)) => Ok(pid),
                _ if line.starts_with('F') => Err(spec.failure(line.trim())),
                _ => Err(Error::Holder {
                    step: "report".into(),
                    message: format!("unreadable report {line:?}"),
                }),
            },
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        match ready {
            Ok(pid) => {
                // With a PID namespace the reporting process is an intermediate that exits now;
                // its child (pid 1 of the pod) is reparented to corral, a subreaper.
                if pid as u32 != child.id() {
                    let _ = child.wait();
                }
                let pidfd = PidFd::open(pid).context(|| format!("pidfd_open holder {pid}"))?;
                // Our child (or reparented to us), not reaped: its pid cannot be recycled yet.
                let id = ProcessId::of(pid).unwrap_or(ProcessId { pid, start: 0 });
                Ok(Holder { pid, id, pidfd })
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, path: &str, value: &str) -> SysctlWrite {
        SysctlWrite { key: key.into(), path: path.into(), value: value.into() }
    }

    fn spec() -> HolderSpec {
        HolderSpec {
            sandbox_id: "sb".into(),
            netns: Some("/var/run/netns/cni-1".into()),
            join_netns_owner: false,
            new_ipc: true,
            new_uts: true,
            new_pid: false,
            hostname: Some("web-0".into()),
            sysctls: vec![
                write("net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward", "1"),
                write("kernel.shmmni", "/proc/sys/kernel/shmmni", "2048"),
            ],
        }
    }

    #[test]
    fn the_holder_decodes_what_corral_encodes() {
        let bytes = spec().encode().unwrap();
        let got = protocol::parse(&bytes).expect("valid spec");
        assert_eq!(got.netns, Some(&b"/var/run/netns/cni-1"[..]));
        assert!(got.new_ipc && got.new_uts && !got.new_pid && !got.join_netns_owner);
        assert_eq!(got.hostname, Some(&b"web-0"[..]));
        let sysctls: Vec<_> = protocol::sysctls(got.raw).collect();
        assert_eq!(
            sysctls,
            vec![
                (&b"/proc/sys/net/ipv4/ip_forward"[..], &b"1"[..]),
                (&b"/proc/sys/kernel/shmmni"[..], &b"2048"[..])
            ]
        );
        assert!(protocol::parse(b"Z").is_none(), "unknown tag");
        assert!(protocol::parse(b"Nno-terminator").is_none(), "unterminated string");
    }

    #[test]
    fn failure_reports_name_the_step() {
        let s = spec();
        assert_eq!(
            s.failure("Fs:1:13").to_string(),
            "pod holder: set sysctl kernel.shmmni=\"2048\": Permission denied (os error 13)"
        );
        assert_eq!(
            s.failure("Fj:0:22").to_string(),
            "pod holder: join network namespace /var/run/netns/cni-1: Invalid argument (os error 22) (not a network namespace)"
        );
        assert!(s.failure("garbage").to_string().contains("unreadable report"));
    }

    #[test]
    fn refuses_nul_bytes_and_oversized_specs() {
        let mut s = spec();
        s.hostname = Some("a\0b".into());
        assert!(s.encode().unwrap_err().to_string().contains("NUL"));
        let mut s = spec();
        s.sysctls =
            (0..20).map(|i| write(&format!("net.ipv4.k{i}"), "/proc/sys/k", &"x".repeat(4000))).collect();
        assert!(s.encode().unwrap_err().to_string().contains("linux.sysctls"));
    }

    #[test]
    fn the_embedded_holder_is_a_small_static_program() {
        assert_eq!(&HOLDER_ELF[..4], b"\x7fELF");
        assert!(HOLDER_ELF.len() < 64 * 1024, "{} bytes", HOLDER_ELF.len());
    }
}
