//! Unmounting and mount-point checks shared by the pod (pins, shm), the containers (rootfs) and
//! `delete`. Paths here can be below a container's filesystem, so nothing follows a symlink and
//! nothing removes recursively.

use std::path::Path;

use nix::mount::{umount2, MntFlags};

use crate::error::{IoContext, Result};

/// Unmounts `path` if it is mounted; a missing path or a path that is not a mount is fine. Never
/// follows a symlink at `path` (a container may have made one where a mount point was).
pub fn unmount_if_mounted(path: &Path) -> Result<()> {
    match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e).with_path("unmount", path),
    }
}

/// rmdir: removes nothing that is still inside (unlike remove_dir_all, which would delete what a
/// still-mounted filesystem holds).
pub fn remove_empty_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_path("remove", dir),
        _ => Ok(()),
    }
}

/// Whether `path` is a mount point, from /proc/self/mountinfo.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(wanted.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::mount::{mount, MsFlags};

    #[test]
    fn unmounting_never_follows_a_symlink() {
        // Needs root (as every test run here has): a real tmpfs mount.
        let dir = std::env::temp_dir().join(format!("corral-nofollow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (target, link) = (dir.join("mnt"), dir.join("link"));
        std::fs::create_dir_all(&target).unwrap();
        mount(Some("t"), &target, Some("tmpfs"), MsFlags::empty(), None::<&str>).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let via_link = unmount_if_mounted(&link);
        let still_mounted = is_mount_point(&target);
        unmount_if_mounted(&target).unwrap();
        let gone = !is_mount_point(&target);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(via_link.is_ok(), "a symlink is not a mount point: {via_link:?}");
        assert!(still_mounted && gone, "the mount behind the symlink was left alone, then unmounted");
    }
}
