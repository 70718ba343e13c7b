//! The holder's wire format, shared by corral (which writes the spec and reads the report) and
//! the holder itself (a `no_std` program built from `holder/main.rs`, which includes this file).
//! It uses `core` only.
//!
//! Spec (parent -> holder, on the holder's stdin): records, each a tag byte followed by its
//! NUL-terminated strings; the end of input ends the spec.
//! Report (holder -> parent, one line on stdout): `R<pid>` when ready, or
//! `F<step>:<index>:<errno>` naming the failed step (and which sysctl, for `S`).

/// Join this network namespace: one string, the path.
pub const NETNS: u8 = b'N';
/// Join the user namespace owning the network namespace first (no strings).
pub const JOIN_NETNS_OWNER: u8 = b'U';
/// Create an IPC namespace (no strings).
pub const NEW_IPC: u8 = b'I';
/// Create a UTS namespace (no strings).
pub const NEW_UTS: u8 = b'T';
/// Create a PID namespace and fork pid 1 of it (no strings).
pub const NEW_PID: u8 = b'P';
/// Set the hostname: one string.
pub const HOSTNAME: u8 = b'H';
/// Write a sysctl: two strings, the /proc/sys path and the value.
pub const SYSCTL: u8 = b'S';

/// Failed steps, as reported.
pub const STEP_READ_SPEC: u8 = b'r';
pub const STEP_PARSE_SPEC: u8 = b'p';
pub const STEP_SIGNALS: u8 = b'b';
pub const STEP_OPEN_NETNS: u8 = b'n';
pub const STEP_NETNS_OWNER: u8 = b'o';
pub const STEP_JOIN_USERNS: u8 = b'u';
pub const STEP_JOIN_NETNS: u8 = b'j';
pub const STEP_UNSHARE: u8 = b'x';
pub const STEP_HOSTNAME: u8 = b'h';
pub const STEP_SYSCTL: u8 = b's';
pub const STEP_FORK: u8 = b'f';
/// Confining itself (mount namespace, capabilities, no_new_privs, seccomp); the index says which
/// call.
pub const STEP_CONFINE: u8 = b'c';

/// The decoded spec; strings borrow from the input buffer.
#[derive(Default)]
pub struct Spec<'a> {
    pub netns: Option<&'a [u8]>,
    pub join_netns_owner: bool,
    pub new_ipc: bool,
    pub new_uts: bool,
    pub new_pid: bool,
    pub hostname: Option<&'a [u8]>,
    /// The whole input, for [`sysctls`].
    pub raw: &'a [u8],
}

/// How many strings a tag carries; None for an unknown tag.
fn arity(tag: u8) -> Option<usize> {
    match tag {
        JOIN_NETNS_OWNER | NEW_IPC | NEW_UTS | NEW_PID => Some(0),
        NETNS | HOSTNAME => Some(1),
        SYSCTL => Some(2),
        _ => None,
    }
}

/// One record: its tag and up to two strings.
type Record<'a> = (u8, &'a [u8], &'a [u8]);

/// Splits off the first record; None if it is malformed.
fn next_record(input: &[u8]) -> Option<(Record<'_>, &[u8])> {
    let (&tag, mut rest) = input.split_first()?;
    let mut strings: [&[u8]; 2] = [&[], &[]];
    for slot in strings.iter_mut().take(arity(tag)?) {
        let end = rest.iter().position(|b| *b == 0)?;
        *slot = &rest[..end];
        rest = &rest[end + 1..];
    }
    Some(((tag, strings[0], strings[1]), rest))
}

/// Decodes and validates a spec.
pub fn parse(raw: &[u8]) -> Option<Spec<'_>> {
    let mut spec = Spec { raw, ..Spec::default() };
    let mut input = raw;
    while !input.is_empty() {
        let ((tag, a, _), rest) = next_record(input)?;
        match tag {
            NETNS => spec.netns = Some(a),
            JOIN_NETNS_OWNER => spec.join_netns_owner = true,
            NEW_IPC => spec.new_ipc = true,
            NEW_UTS => spec.new_uts = true,
            NEW_PID => spec.new_pid = true,
            HOSTNAME => spec.hostname = Some(a),
            _ => {}
        }
        input = rest;
    }
    Some(spec)
}

/// The (path, value) pairs of the sysctl records of a spec [`parse`] accepted, in order.
pub fn sysctls(raw: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut input = raw;
    core::iter::from_fn(move || loop {
        let ((tag, a, b), rest) = next_record(input)?;
        input = rest;
        if tag == SYSCTL {
            return Some((a, b));
        }
    })
}
