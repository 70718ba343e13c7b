//! Mounting the container's rootfs (the snapshot mounts containerd sends in Task.Create) onto
//! `<bundle>/rootfs`, and unmounting it. Mounts with containerd's `uidmap=`/`gidmap=` options are
//! idmapped with the container's user namespace (see [`super::idmap`]).

use std::path::Path;

use containerd_shim_protos::types::mount::Mount;
use nix::mount::{mount, MsFlags};

use crate::error::{Error, IoContext, Result};
use crate::sys::mount::{is_mount_point, unmount_if_mounted};
use crate::sys::mount_api::{self, CopyOptions};
use crate::task::idmap::{self, LayerPaths, PodUserns};

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
/// `userns` is the user namespace the container joins, needed when a mount asks for an idmapping.
pub fn mount_rootfs(mounts: &[Mount], target: &Path, userns: Option<&PodUserns>) -> Result<()> {
    for (i, m) in mounts.iter().enumerate() {
        if let Err(e) = mount_one(&format!("rootfs[{i}]"), m, target, userns) {
            let _ = unmount_rootfs(target);
            return Err(e);
        }
    }
    Ok(())
}

fn mount_one(field: &str, m: &Mount, target: &Path, userns: Option<&PodUserns>) -> Result<()> {
    let (options, idmapping) = idmap::split_rootfs_options(field, &m.options)?;
    // A bind mount has no filesystem type; "bind" as a type is containerd's spelling of it.
    let is_bind = m.type_.is_empty() || m.type_ == "bind";
    let Some((uids, gids)) = &idmapping else {
        return mount_with(field, m, target, &options);
    };
    let userns = userns.ok_or_else(|| {
        Error::invalid(format!(
            "{field}.options: uidmap=/gidmap= ask for an idmapped rootfs, but the container \
             joins no existing user namespace"
        ))
    })?;
    userns.check(&format!("{field}.options uidmap/gidmap"), uids, gids)?;
    if is_bind {
        return idmapped_bind(field, m, &options, target, userns);
    }
    if m.type_ != "overlay" {
        return Err(Error::Unimplemented(format!(
            "{field}: idmapped rootfs mounts of type {:?} are not supported (overlay and bind are)",
            m.type_
        )));
    }
    // Detached layer copies first; a kernel whose overlayfs refuses them (EINVAL) gets them
    // attached.
    let mut detached = options.clone();
    let layers = idmap::idmap_lowerdirs(field, &mut detached, userns, LayerPaths::Detached)?;
    match mount_with(field, m, target, &detached) {
        Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
            drop(layers);
            tracing::debug!(field, "overlayfs refused detached idmapped layers; attaching them");
            let mut attached = options;
            let _layers = idmap::idmap_lowerdirs(field, &mut attached, userns, LayerPaths::Attached)?;
            mount_with(field, m, target, &attached)
        }
        done => done,
    }
}

/// mount(2) of `m` on `target` with `options` (flags and data).
fn mount_with(field: &str, m: &Mount, target: &Path, options: &[String]) -> Result<()> {
    let (flags, data) = parse_options(options);
    let is_bind = m.type_.is_empty() || m.type_ == "bind";
    let fstype = if is_bind { None } else { Some(m.type_.as_str()) };
    let data = (!data.is_empty()).then_some(data.as_str());
    if data.is_some_and(|d| d.len() >= 4096) {
        return Err(Error::invalid(format!(
            "{field}.options: longer than a page ({} bytes)",
            data.map_or(0, str::len)
        )));
    }
    mount(Some(m.source.as_str()), target, fstype, flags, data)
        .with_path(&format!("mount {field} ({} {}) on", m.type_, m.source), target)
}

/// An idmapped bind rootfs (a snapshot without parents): an idmapped copy of the source.
fn idmapped_bind(
    field: &str,
    m: &Mount,
    options: &[String],
    target: &Path,
    userns: &PodUserns,
) -> Result<()> {
    let (flags, data) = parse_options(options);
    if !data.is_empty() {
        return Err(Error::invalid(format!("{field}.options: {data:?} on an idmapped bind mount")));
    }
    // What the copy can carry; anything else (nosuid, noexec, ...) is refused rather than dropped.
    let unsupported = flags - (MsFlags::MS_BIND | MsFlags::MS_REC | MsFlags::MS_RDONLY);
    if !unsupported.is_empty() {
        return Err(Error::invalid(format!(
            "{field}.options: {unsupported:?} not supported on an idmapped bind rootfs"
        )));
    }
    let opts = CopyOptions {
        recursive_clone: flags.contains(MsFlags::MS_REC),
        recursive_idmap: false,
        readonly: flags.contains(MsFlags::MS_RDONLY),
    };
    mount_api::idmapped_copy(Path::new(&m.source), target, userns.fd(), opts)
        .with_path(&format!("mount {field} (idmapped bind {}) on", m.source), target)
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

    /// containerd 2.1.9's idmapped rootfs mounts (overlay with parents, bind without), mounted
    /// through the real kernel: the container's root owns what the host's root owns, and the
    /// snapshot's files keep their owners.
    #[test]
    fn mounts_containerd_idmapped_rootfs_options() {
        use std::os::unix::fs::MetadataExt;

        use crate::task::idmap::testing::Userns;

        let dir = std::env::temp_dir().join(format!("corral-rootfs-idmap-{}", std::process::id()));
        for d in ["1/fs/bin", "2/fs", "2/work", "rootfs"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("1/fs/bin/sh"), "x").unwrap();
        std::os::unix::fs::chown(dir.join("2/fs"), Some(196608), Some(196608)).unwrap();
        let ns = Userns::new();
        let userns = PodUserns::from_spec(&ns.spec()).unwrap().unwrap();
        let owner = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            (m.uid(), m.gid())
        };
        let mount = |type_: &str, source: &Path, options: &[String]| Mount {
            type_: type_.into(),
            source: source.display().to_string(),
            options: options.to_vec(),
            ..Default::default()
        };
        let map = ["uidmap=0:196608:65536".to_string(), "gidmap=0:196608:65536".to_string()];
        let p = |s: &str| dir.join(s).display().to_string();
        let overlay_opts = [
            &map[..],
            &[
                "index=off".into(),
                format!("workdir={}", p("2/work")),
                format!("upperdir={}", p("2/fs")),
                format!("lowerdir={}", p("1/fs")),
            ],
        ]
        .concat();
        let target = dir.join("rootfs");
        let cases = [
            (mount("overlay", Path::new("overlay"), &overlay_opts), (196608, 196608)),
            // A snapshot without parents: containerd idmaps the bind itself.
            (
                mount("bind", &dir.join("1/fs"), &[&map[..], &["rw".into(), "rbind".into()]].concat()),
                (196608, 196608),
            ),
        ];
        for (m, root_owner) in cases {
            mount_rootfs(std::slice::from_ref(&m), &target, Some(&userns)).unwrap();
            let seen = (owner(&target), owner(&target.join("bin/sh")));
            unmount_rootfs(&target).unwrap();
            assert_eq!(seen, (root_owner, (196608, 196608)), "{}", m.type_);
            assert!(!is_mount_point(&target));
        }
        assert_eq!(owner(&dir.join("1/fs/bin/sh")), (0, 0), "the layer is not chowned");

        // Refusals name the mount.
        let err = mount_rootfs(&[mount("overlay", Path::new("overlay"), &overlay_opts)], &target, None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("rootfs[0].options: uidmap=/gidmap= ask for an idmapped rootfs"), "{err}");
        let other = ["uidmap=0:500000:65536".to_string(), "gidmap=0:500000:65536".to_string()];
        let err = mount_rootfs(&[mount("bind", &dir.join("1/fs"), &other)], &target, Some(&userns))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("rootfs[0].options uidmap/gidmap: idmapping"), "{err}");
        assert!(!is_mount_point(&target));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
