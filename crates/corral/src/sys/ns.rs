//! Namespace file descriptors.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// ioctl NS_GET_USERNS: _IO(0xb7, 0x1).
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// The user namespace that owns the namespace `ns` (a /proc/<pid>/ns/* or pinned file).
pub fn owner_user_ns(ns: &File) -> io::Result<OwnedFd> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd or -1.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS as _) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
