//! The new mount API calls nix does not wrap (open_tree, mount_setattr, move_mount), for idmapped
//! mounts: a detached copy of a mount is given a user namespace's idmapping, then attached.
//!
//! The kernel lets MOUNT_ATTR_IDMAP be set only on a detached copy that was never attached, hence
//! the three steps.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Converts a raw syscall return into a result.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A detached copy of the mount at `path` (with the mounts below it when `recursive`).
pub fn clone_tree(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `path` is a NUL-terminated string alive for the call; open_tree reads nothing else
    // from our memory and returns a new fd or -1.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) })?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: open_tree returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Gives the detached tree `tree` the idmapping of user namespace `userns` (and makes it
/// read-only when `readonly`); `recursive` applies it to every mount of the tree.
pub fn set_idmap(
    tree: BorrowedFd<'_>,
    userns: BorrowedFd<'_>,
    readonly: bool,
    recursive: bool,
) -> io::Result<()> {
    // SAFETY: mount_attr is plain integers; all zero is a valid value.
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = libc::MOUNT_ATTR_IDMAP | if readonly { libc::MOUNT_ATTR_RDONLY } else { 0 };
    attr.userns_fd =
        u64::try_from(userns.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    // SAFETY: the empty path and `attr` are valid for the call and the size passed is attr's own;
    // the kernel only reads them.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })?;
    Ok(())
}

/// Attaches the detached tree `tree` on `target` (which must exist: a directory for a directory,
/// a file for a file).
pub fn attach(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let target = c_path(target)?;
    // SAFETY: both paths are NUL-terminated strings alive for the call; the kernel only reads them.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Clones the mount at `source`, idmaps the copy with `userns`, and attaches it on `target`.
pub fn idmapped_copy(
    source: &Path,
    target: &Path,
    userns: BorrowedFd<'_>,
    opts: CopyOptions,
) -> io::Result<()> {
    let tree = clone_tree(source, opts.recursive_clone)?;
    set_idmap(std::os::fd::AsFd::as_fd(&tree), userns, opts.readonly, opts.recursive_idmap)?;
    attach(std::os::fd::AsFd::as_fd(&tree), target)
}

/// How [`idmapped_copy`] copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyOptions {
    /// Copy the mounts below `source` too (rbind).
    pub recursive_clone: bool,
    /// Idmap those mounts too, not only the top one.
    pub recursive_idmap: bool,
    pub readonly: bool,
}
