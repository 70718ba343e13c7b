//! Mounting the container's rootfs (the snapshot mounts containerd sends in Task.Create) onto
//! `<bundle>/rootfs`, and unmounting it.

use std::path::Path;

use containerd_shim_protos::types::mount::Mount;
use nix::mount::{mount, MsFlags};

use crate::error::{Error, IoContext, Result};
use crate::sys::mount::{is_mount_point, unmount_if_mounted};

/// Mount options that are flags, not filesystem data.
fn flag(option: &str) -> Option<(bool, MsFlags)> {
    // (clear?, flag)
    Some(match option {
        "ro" => (false, MsFlags::MS_RDONLY),
        "rw" => (true, MsFlags::MS_RDONLY),
        "nosuid" => (false, MsFlags::MS_NOSUID),
        "suid" => (true, MsFlags::MS_NOSUID),
        "nodev" => (false, MsFlags::MS_NODEV),
        "dev" => (true, MsFlags::MS_NODEV),
        "noexec" => (false, MsFlags::MS_NOEXEC),
        "exec" => (true, MsFlags::MS_NOEXEC),
        "noatime" => (false, MsFlags::MS_NOATIME),
        "atime" => (true, MsFlags::MS_NOATIME),
        "nodiratime" => (false, MsFlags::MS_NODIRATIME),
        "relatime" => (false, MsFlags::MS_RELATIME),
        "strictatime" => (false, MsFlags::MS_STRICTATIME),
        "sync" => (false, MsFlags::MS_SYNCHRONOUS),
        "dirsync" => (false, MsFlags::MS_DIRSYNC),
        "bind" => (false, MsFlags::MS_BIND),
        "rbind" => (false, MsFlags::MS_BIND | MsFlags::MS_REC),
        "remount" => (false, MsFlags::MS_REMOUNT),
        _ => return None,
    })
}

/// Splits containerd mount options into mount(2) flags and the data string.
pub fn parse_options(options: &[String]) -> (MsFlags, String) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for opt in options {
        match flag(opt) {
            Some((true, f)) => flags.remove(f),
            Some((false, f)) => flags.insert(f),
            None => data.push(opt.as_str()),
        }
    }
    (flags, data.join(","))
}

/// Mounts every rootfs mount onto `target`, in order; on failure undoes what it mounted.
pub fn mount_rootfs(mounts: &[Mount], target: &Path) -> Result<()> {
    for (i, m) in mounts.iter().enumerate() {
        let (flags, data) = parse_options(&m.options);
        // A bind mount has no filesystem type; "bind" as a type is containerd's spelling of it.
        let fstype = if m.type_.is_empty() || m.type_ == "bind" { None } else { Some(m.type_.as_str()) };
        let data = (!data.is_empty()).then_some(data.as_str());
        if data.is_some_and(|d| d.len() >= 4096) {
            let _ = unmount_rootfs(target);
            return Err(Error::invalid(format!(
                "rootfs[{i}].options: longer than a page ({} bytes)",
                data.map_or(0, str::len)
            )));
        }
        if let Err(e) = mount(Some(m.source.as_str()), target, fstype, flags, data)
            .with_path(&format!("mount rootfs[{i}] ({} {}) on", m.type_, m.source), target)
        {
            let _ = unmount_rootfs(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts everything stacked on `target`.
pub fn unmount_rootfs(target: &Path) -> Result<()> {
    // Stacked mounts (rare) need one unmount each; stop when nothing is mounted there.
    for _ in 0..16 {
        let before = is_mount_point(target);
        if !before {
            return Ok(());
        }
        unmount_if_mounted(target)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_flags_from_overlay_data() {
        let opts: Vec<String> = ["ro", "index=off", "lowerdir=/a:/b", "upperdir=/u", "workdir=/w", "nosuid"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (flags, data) = parse_options(&opts);
        assert_eq!(flags, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID);
        assert_eq!(data, "index=off,lowerdir=/a:/b,upperdir=/u,workdir=/w");
        let (flags, data) = parse_options(&["rbind".into(), "ro".into(), "rw".into()]);
        assert_eq!(flags, MsFlags::MS_BIND | MsFlags::MS_REC);
        assert_eq!(data, "");
    }
}
