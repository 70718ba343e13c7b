//! Idmapped mounts for the containers of a pod with its own user namespace (`hostUsers: false`).
//!
//! runc 1.1 cannot idmap mounts, so corral does it before `runc create`, with the user namespace
//! the container joins (the pod's) as the idmapping. Nothing on the host is chowned:
//! - the rootfs: containerd's overlay snapshotter adds `uidmap=`/`gidmap=` options and expects the
//!   lower layers idmapped (the upper dir it already owns by the mapped root); see
//!   [`split_rootfs_options`] and [`idmap_lowerdirs`];
//! - bind mounts that ask for it (`uidMappings`/`gidMappings`, or the `idmap`/`ridmap` options),
//!   which include the pod files and shm [`super::oci`] adds: each source gets an idmapped copy
//!   attached under [`COPIES_DIR`], the spec points at the copy, and the copies are detached as
//!   soon as runc has built the container's mounts ([`BindCopies`]).
//!
//! Only the pod's own mapping can be applied (the kernel idmaps with a user namespace, and the
//! pod's is the one at hand); a mount asking for another mapping is refused by name.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::error::{Error, IoContext, Result};
use crate::sys::mount_api::{self, CopyOptions};
use crate::sys::process::ProcessId;

/// Where the idmapped copies of bind sources live between their preparation and `runc create`:
/// outside the bundle, which containerd removes recursively.
pub const COPIES_DIR: &str = "/run/corral/idmap";

/// One range of an id mapping, as in the OCI spec and in containerd's `uidmap=` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// Parses containerd's mapping list `container:host:size[,...]` (snapshot labels and the
/// `uidmap=`/`gidmap=` mount options).
pub fn parse_mappings(field: &str, text: &str) -> Result<Vec<IdMapping>> {
    text.split(',')
        .map(|range| {
            let parts: Vec<_> = range.split(':').map(str::parse::<u32>).collect();
            match parts.as_slice() {
                [Ok(c), Ok(h), Ok(s)] if *s > 0 => Ok(IdMapping { container_id: *c, host_id: *h, size: *s }),
                _ => Err(Error::invalid(format!(
                    "{field}: {range:?} is not a mapping container-id:host-id:size"
                ))),
            }
        })
        .collect()
}

/// Parses an OCI mapping array (`[{"containerID", "hostID", "size"}]`); absent means empty.
fn spec_mappings(field: &str, value: Option<&Value>) -> Result<Vec<IdMapping>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = value.as_array().ok_or_else(|| Error::invalid(format!("{field}: not an array")))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let get = |key: &str| {
                m.get(key).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    Error::invalid(format!("{field}[{i}].{key}: missing or not a 32-bit unsigned number"))
                })
            };
            Ok(IdMapping { container_id: get("containerID")?, host_id: get("hostID")?, size: get("size")? })
        })
        .collect()
}

/// The rootfs mount options without containerd's `uidmap=`/`gidmap=`, and those mappings.
pub type SplitOptions = (Vec<String>, Option<(Vec<IdMapping>, Vec<IdMapping>)>);

/// Takes `uidmap=`/`gidmap=` out of a rootfs mount's options (`field` names the mount).
/// containerd acts on them only as a pair, so one without the other is refused.
pub fn split_rootfs_options(field: &str, options: &[String]) -> Result<SplitOptions> {
    let (mut uids, mut gids, mut rest) = (None, None, Vec::new());
    for opt in options {
        if let Some(v) = opt.strip_prefix("uidmap=") {
            uids = Some(parse_mappings(&format!("{field}.options uidmap"), v)?);
        } else if let Some(v) = opt.strip_prefix("gidmap=") {
            gids = Some(parse_mappings(&format!("{field}.options gidmap"), v)?);
        } else {
            rest.push(opt.clone());
        }
    }
    match (uids, gids) {
        (Some(u), Some(g)) => Ok((rest, Some((u, g)))),
        (None, None) => Ok((rest, None)),
        _ => Err(Error::invalid(format!("{field}.options: uidmap= and gidmap= must come together"))),
    }
}

/// Replaces each layer of the overlay option `lowerdir=a:b:...` by what `layer` returns for it.
pub fn map_lowerdirs(
    field: &str,
    options: &mut [String],
    mut layer: impl FnMut(&Path) -> Result<String>,
) -> Result<()> {
    let opt = options
        .iter_mut()
        .find(|o| o.starts_with("lowerdir="))
        .ok_or_else(|| Error::invalid(format!("{field}.options: an idmapped overlay without lowerdir=")))?;
    let layers =
        opt["lowerdir=".len()..].split(':').map(|l| layer(Path::new(l))).collect::<Result<Vec<_>>>()?;
    *opt = format!("lowerdir={}", layers.join(":"));
    Ok(())
}

/// How overlayfs is given the idmapped copies of the lower layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerPaths {
    /// Detached copies reached through `/proc/self/fd/<fd>`: nothing enters the mount table, so
    /// nothing can leak. Needs an overlayfs that takes detached mounts as layers (6.18 does).
    Detached,
    /// Copies attached under [`COPIES_DIR`], as containerd does: for older kernels.
    Attached,
}

/// The idmapped copies of an overlay's lower layers. Keep it until the overlay is mounted;
/// overlayfs then holds its own private copies, so dropping it releases nothing the overlay needs.
#[derive(Debug, Default)]
pub struct IdmappedLayers {
    fds: Vec<OwnedFd>,
    attached: BindCopies,
}

/// Idmaps each lower layer of an overlay (read-only) and points `lowerdir=` at the copies.
pub fn idmap_lowerdirs(
    field: &str,
    options: &mut [String],
    userns: &PodUserns,
    how: LayerPaths,
) -> Result<IdmappedLayers> {
    let mut layers = IdmappedLayers::default();
    map_lowerdirs(field, options, |layer| match how {
        LayerPaths::Detached => {
            let tree =
                mount_api::clone_tree(layer, false).with_path("open_tree (clone) lower layer", layer)?;
            mount_api::set_idmap(tree.as_fd(), userns.fd(), true, false)
                .with_path("idmap (mount_setattr) lower layer", layer)?;
            let path = format!("/proc/self/fd/{}", tree.as_raw_fd());
            layers.fds.push(tree);
            Ok(path)
        }
        LayerPaths::Attached => {
            let target = layers.attached.placeholder(true, None)?;
            let opts = CopyOptions { readonly: true, ..Default::default() };
            mount_api::idmapped_copy(layer, &target, userns.fd(), opts)
                .with_path(&format!("idmapped copy of lower layer {} on", layer.display()), &target)?;
            Ok(target.display().to_string())
        }
    })?;
    Ok(layers)
}

/// The user namespace a container joins and its mappings, as the spec gives them.
#[derive(Debug)]
pub struct PodUserns {
    ns: File,
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
}

impl PodUserns {
    /// The user namespace of `linux.namespaces` when it is an existing one (a path: the pod's);
    /// None when the container gets none, or a fresh one that does not exist yet.
    pub fn from_spec(spec: &Value) -> Result<Option<PodUserns>> {
        let namespaces = spec.pointer("/linux/namespaces").and_then(Value::as_array);
        let Some(user) = namespaces.and_then(|list| list.iter().find(|ns| ns["type"] == "user")) else {
            return Ok(None);
        };
        let Some(path) = user.get("path").and_then(Value::as_str).filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let ns = File::open(path).with_path("open user namespace", Path::new(path))?;
        Ok(Some(PodUserns {
            ns,
            uids: spec_mappings("config.json: linux.uidMappings", spec.pointer("/linux/uidMappings"))?,
            gids: spec_mappings("config.json: linux.gidMappings", spec.pointer("/linux/gidMappings"))?,
        }))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ns.as_fd()
    }

    /// The host uid and gid of the container's root, when the mappings map root.
    pub fn root_owner(&self) -> Option<(u32, u32)> {
        let host = |map: &[IdMapping]| map.iter().find(|m| m.container_id == 0).map(|m| m.host_id);
        Some((host(&self.uids)?, host(&self.gids)?))
    }

    /// Refuses mappings other than the user namespace's own.
    pub fn check(&self, field: &str, uids: &[IdMapping], gids: &[IdMapping]) -> Result<()> {
        if uids == self.uids && gids == self.gids {
            return Ok(());
        }
        Err(Error::Unimplemented(format!(
            "{field}: idmapping {uids:?}/{gids:?} differs from the container's user namespace \
             ({:?}/{:?}); corral idmaps with that namespace only",
            self.uids, self.gids
        )))
    }
}

/// Whether a spec mount asks to be idmapped.
fn wants_idmap(m: &Value) -> bool {
    let nonempty = |key: &str| m.get(key).and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    nonempty("uidMappings") || nonempty("gidMappings") || has_option(m, "idmap") || has_option(m, "ridmap")
}

fn has_option(m: &Value, name: &str) -> bool {
    m.get("options").and_then(Value::as_array).is_some_and(|o| o.iter().any(|v| v == name))
}

/// Idmapped copies of bind sources, attached under [`COPIES_DIR`] until [`BindCopies::release`]
/// (or drop) detaches them. runc's bind mounts copy them, idmapping included.
#[derive(Debug, Default)]
pub struct BindCopies {
    dir: Option<PathBuf>,
    /// Mount points made in `dir`, attached or not.
    points: Vec<PathBuf>,
}

impl BindCopies {
    /// Gives every mount of `spec` that asks for an idmapping an idmapped copy of its source and
    /// points the mount at it; the mapping fields and options runc 1.1 does not know are removed.
    pub fn prepare(spec: &mut Value, userns: Option<&PodUserns>) -> Result<BindCopies> {
        let mut copies = BindCopies::default();
        let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
            return Ok(copies);
        };
        for (i, m) in mounts.iter_mut().enumerate() {
            if wants_idmap(m) {
                copies.prepare_one(&format!("config.json: mounts[{i}]"), m, userns)?;
            }
        }
        Ok(copies)
    }

    fn prepare_one(&mut self, field: &str, m: &mut Value, userns: Option<&PodUserns>) -> Result<()> {
        let userns = userns.ok_or_else(|| {
            Error::Unimplemented(format!(
                "{field}: an idmapped mount needs the container to join an existing user namespace \
                 (linux.namespaces user with a path)"
            ))
        })?;
        let is_bind = m["type"] == "bind" || has_option(m, "bind") || has_option(m, "rbind");
        if !is_bind {
            return Err(Error::Unimplemented(format!(
                "{field}: idmapped mounts of type {} are not supported, only bind mounts",
                m["type"]
            )));
        }
        let mut uids = spec_mappings(&format!("{field}.uidMappings"), m.get("uidMappings"))?;
        let mut gids = spec_mappings(&format!("{field}.gidMappings"), m.get("gidMappings"))?;
        if uids.is_empty() && gids.is_empty() {
            // `idmap` alone: the container's own mapping.
            (uids, gids) = (userns.uids.clone(), userns.gids.clone());
        }
        userns.check(field, &uids, &gids)?;
        let source = m["source"]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| Error::invalid(format!("{field}.source: missing or not a string")))?;
        let meta = std::fs::metadata(&source).with_path(&format!("{field}: stat source"), &source)?;
        let target = self.placeholder(meta.is_dir(), userns.root_owner())?;
        let opts = CopyOptions {
            recursive_clone: has_option(m, "rbind"),
            recursive_idmap: has_option(m, "ridmap"),
            readonly: false, // runc applies `ro` to its own bind of the copy
        };
        mount_api::idmapped_copy(&source, &target, userns.fd(), opts)
            .with_path(&format!("{field}: idmapped copy of {} on", source.display()), &target)?;
        let obj = m.as_object_mut().expect("a mount with a type is an object");
        obj.insert("source".into(), Value::String(target.display().to_string()));
        obj.remove("uidMappings");
        obj.remove("gidMappings");
        if let Some(options) = obj.get_mut("options").and_then(Value::as_array_mut) {
            options.retain(|o| o != "idmap" && o != "ridmap");
        }
        Ok(())
    }

    /// A fresh empty file or directory to attach a copy on. The set's directory is 0700, owned
    /// by `owner` when given: the host ids of the container's root, so that a runtime joining
    /// the user namespace before it opens the mount sources (corral's builtin runtime does;
    /// runc opens them first) can reach the copies, and no other host user can.
    fn placeholder(&mut self, dir: bool, owner: Option<(u32, u32)>) -> Result<PathBuf> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = match &self.dir {
            Some(d) => d.clone(),
            None => {
                sweep_stale(Path::new(COPIES_DIR));
                let d = Path::new(COPIES_DIR).join(set_name(NEXT.fetch_add(1, Ordering::Relaxed)));
                private_dir(Path::new(COPIES_DIR))?;
                // create_dir, not create_dir_all: a directory of that name is never reused.
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&d)
                    .with_path("create idmapped copies directory", &d)?;
                self.dir = Some(d.clone());
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::lchown(&d, Some(uid), Some(gid))
                        .with_path("chown idmapped copies directory", &d)?;
                }
                d
            }
        };
        let path = base.join(self.points.len().to_string());
        self.points.push(path.clone());
        if dir {
            std::fs::create_dir(&path).with_path("create mount point", &path)?;
        } else {
            File::create(&path).with_path("create mount point", &path)?;
        }
        Ok(path)
    }

    /// Detaches every copy and removes the mount points and their directory. Never removes
    /// recursively (a copy still attached would expose its source); tries every step and reports
    /// the first failure.
    pub fn release(&mut self) -> Result<()> {
        let mut first = None;
        for path in self.points.drain(..).rev() {
            if let Err(e) = crate::sys::mount::unmount_if_mounted(&path) {
                first.get_or_insert(e);
                continue;
            }
            let removed =
                if path.is_dir() { std::fs::remove_dir(&path) } else { std::fs::remove_file(&path) };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    first.get_or_insert(Error::io(format!("remove mount point {}", path.display()), e));
                }
                _ => {}
            }
        }
        if let Some(dir) = self.dir.take() {
            if let Err(e) = std::fs::remove_dir(&dir) {
                first.get_or_insert(Error::io(format!("remove {}", dir.display()), e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// `<shim pid>-<its start time>-<n>`: names the shim that made a set of copies, so a sweep can
/// tell a live shim's from those of a dead one whose pid was reused.
fn set_name(n: u64) -> String {
    let me = ProcessId::current();
    format!("{}-{}-{n}", me.pid, me.start)
}

/// The copies expose their sources (pod volumes: secrets, tokens) to whoever can walk to them.
/// This directory is root's whatever the umask and whoever made it first, and others may pass
/// through it but not list it; each set below is 0700, root's or its container root's.
fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new().mode(0o711).recursive(true).create(dir).with_path("create", dir)?;
    let meta = std::fs::symlink_metadata(dir).with_path("stat", dir)?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(Error::invalid(format!("{}: not a directory owned by root", dir.display())));
    }
    if meta.mode() & 0o777 != 0o711 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).with_path("chmod 0711", dir)?;
    }
    Ok(())
}

/// Releases the copies of shims that died between preparing them and `runc create` (see
/// [`set_name`]: a live shim's copies are left alone).
pub fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let mut parts = name.to_str().unwrap_or("").split('-').map(|p| p.parse::<u64>().ok());
        let (pid, start) = (parts.next().flatten(), parts.next().flatten());
        let alive = match (pid, start) {
            (Some(pid), Some(start)) => ProcessId::of(pid as i32).is_some_and(|p| p.start == start),
            // A name corral did not make (or an older corral's `<pid>-<n>`): by pid alone.
            (Some(pid), None) => Path::new(&format!("/proc/{pid}")).exists(),
            _ => true,
        };
        if alive {
            continue;
        }
        let points = std::fs::read_dir(entry.path())
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let mut stale = BindCopies { dir: Some(entry.path()), points };
        if let Err(e) = stale.release() {
            tracing::warn!(error = %e, "release stale idmapped copies");
        }
    }
}

impl Drop for BindCopies {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(error = %e, "release idmapped bind copies");
        }
    }
}

/// Test helpers shared with [`super::rootfs`]'s tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::os::unix::fs::MetadataExt;

    use serde_json::{json, Value};

    /// A process in a new user namespace mapping 0..65536 to 196608.., as CRI makes for a pod.
    pub(crate) struct Userns(std::process::Child);

    impl Userns {
        pub(crate) fn new() -> Userns {
            // Owned (so killed and reaped) from the start, whatever happens below.
            let ns = Userns(
                std::process::Command::new("unshare").args(["--user", "sleep", "60"]).spawn().unwrap(),
            );
            let pid = ns.0.id();
            let ours = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
            for _ in 0..500 {
                let ino = std::fs::metadata(format!("/proc/{pid}/ns/user")).map(|m| m.ino());
                // After exec: the user namespace is new and `sleep` runs.
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if ino.is_ok_and(|i| i != ours) && comm.trim() == "sleep" {
                    std::fs::write(format!("/proc/{pid}/uid_map"), "0 196608 65536").unwrap();
                    std::fs::write(format!("/proc/{pid}/gid_map"), "0 196608 65536").unwrap();
                    return ns;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            panic!("unshare --user did not start");
        }

        pub(crate) fn spec(&self) -> Value {
            let map = json!([{"containerID": 0, "hostID": 196608, "size": 65536}]);
            json!({"linux": {"namespaces": [{"type": "user", "path": format!("/proc/{}/ns/user", self.0.id())}],
                             "uidMappings": map, "gidMappings": map}})
        }
    }

    impl Drop for Userns {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use serde_json::json;

    use super::testing::Userns;
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const MAP: IdMapping = IdMapping { container_id: 0, host_id: 196608, size: 65536 };

    /// containerd 2.1.9's overlay snapshotter options for a container of a `hostUsers: false` pod
    /// (mappings first, as plugins/snapshots/overlay builds them), and what corral makes of them.
    #[test]
    fn translates_containerd_rootfs_options() {
        struct Case {
            options: &'static [&'static str],
            rest: &'static [&'static str],
            mapped: Option<(Vec<IdMapping>, Vec<IdMapping>)>,
        }
        let two = vec![MAP, IdMapping { container_id: 65536, host_id: 300000, size: 10 }];
        let cases = [
            Case {
                options: &[
                    "uidmap=0:196608:65536",
                    "gidmap=0:196608:65536",
                    "index=off",
                    "workdir=/s/2/work",
                    "upperdir=/s/2/fs",
                    "lowerdir=/s/1/fs",
                ],
                rest: &["index=off", "workdir=/s/2/work", "upperdir=/s/2/fs", "lowerdir=/s/1/fs"],
                mapped: Some((vec![MAP], vec![MAP])),
            },
            Case {
                options: &["uidmap=0:196608:65536,65536:300000:10", "gidmap=0:196608:65536", "rw", "rbind"],
                rest: &["rw", "rbind"],
                mapped: Some((two, vec![MAP])),
            },
            Case {
                options: &["index=off", "lowerdir=/a:/b"],
                rest: &["index=off", "lowerdir=/a:/b"],
                mapped: None,
            },
        ];
        for case in cases {
            let (rest, mapped) = split_rootfs_options("rootfs[0]", &strings(case.options)).unwrap();
            assert_eq!(rest, strings(case.rest), "{:?}", case.options);
            assert_eq!(mapped, case.mapped, "{:?}", case.options);
        }
    }

    #[test]
    fn refuses_broken_rootfs_mappings_naming_the_option() {
        let err = |opts: &[&str]| split_rootfs_options("rootfs[0]", &strings(opts)).unwrap_err().to_string();
        assert_eq!(
            err(&["uidmap=0:196608:65536"]),
            "rootfs[0].options: uidmap= and gidmap= must come together"
        );
        assert!(
            err(&["uidmap=0:196608", "gidmap=0:1:1"]).starts_with("rootfs[0].options uidmap: \"0:196608\"")
        );
        assert!(err(&["uidmap=0:1:1", "gidmap=0:x:1"]).starts_with("rootfs[0].options gidmap:"));
        assert!(err(&["uidmap=0:1:0", "gidmap=0:1:1"]).contains("not a mapping"), "size 0");
    }

    #[test]
    fn rewrites_each_lower_layer() {
        let mut opts = strings(&["upperdir=/s/3/fs", "lowerdir=/s/2/fs:/s/1/fs", "workdir=/s/3/work"]);
        let mut n = 10;
        map_lowerdirs("rootfs[0]", &mut opts, |l| {
            n += 1;
            Ok(format!("/proc/self/fd/{n}#{}", l.display()))
        })
        .unwrap();
        assert_eq!(opts[1], "lowerdir=/proc/self/fd/11#/s/2/fs:/proc/self/fd/12#/s/1/fs");
        assert_eq!(opts[0], "upperdir=/s/3/fs");
        let err = map_lowerdirs("rootfs[0]", &mut strings(&["upperdir=/u"]), |_| Ok(String::new()));
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("rootfs[0].options: an idmapped overlay without lowerdir="));
    }

    #[test]
    fn reads_spec_mappings_naming_the_field() {
        let v = json!([{"containerID": 0, "hostID": 196608, "size": 65536}]);
        assert_eq!(spec_mappings("m", Some(&v)).unwrap(), vec![MAP]);
        assert!(spec_mappings("m", None).unwrap().is_empty());
        let bad = json!([{"containerID": 0, "hostID": -1, "size": 1}]);
        assert_eq!(
            spec_mappings("mounts[2].uidMappings", Some(&bad)).unwrap_err().to_string(),
            "mounts[2].uidMappings[0].hostID: missing or not a 32-bit unsigned number"
        );
    }

    /// Whether any of `paths` is a mount point.
    fn mounted_any(paths: &[&str]) -> bool {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines().any(|l| l.split(' ').nth(4).is_some_and(|mp| paths.contains(&mp)))
    }

    fn owner(path: &Path) -> (u32, u32) {
        let m = std::fs::metadata(path).unwrap();
        (m.uid(), m.gid())
    }

    /// On the real kernel: an overlay over idmapped lower layers shows root's files as the
    /// mapped root, and the layers themselves keep their owners.
    #[test]
    fn idmapped_lower_layers_show_the_mapped_root_and_chown_nothing() {
        let dir = std::env::temp_dir().join(format!("corral-idmap-ovl-{}", std::process::id()));
        for d in ["l1", "l2/sub", "upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("l1/file"), "x").unwrap();
        std::os::unix::fs::chown(dir.join("upper"), Some(196608), Some(196608)).unwrap();
        let ns = Userns::new();
        let userns = PodUserns::from_spec(&ns.spec()).unwrap().unwrap();
        let opts = strings(&[
            &format!("lowerdir={}:{}", dir.join("l1").display(), dir.join("l2").display()),
            &format!("upperdir={}", dir.join("upper").display()),
            &format!("workdir={}", dir.join("work").display()),
        ]);
        let merged = dir.join("merged");
        for how in [LayerPaths::Detached, LayerPaths::Attached] {
            let mut opts = opts.clone();
            let layers = idmap_lowerdirs("rootfs[0]", &mut opts, &userns, how).unwrap();
            let data = opts.join(",");
            let flags = nix::mount::MsFlags::empty();
            nix::mount::mount(Some("overlay"), &merged, Some("overlay"), flags, Some(data.as_str())).unwrap();
            drop(layers);
            let seen = [owner(&merged), owner(&merged.join("file")), owner(&merged.join("sub"))];
            nix::mount::umount2(&merged, nix::mount::MntFlags::MNT_DETACH).unwrap();
            assert_eq!(seen, [(196608, 196608); 3], "{how:?}: /, a lower file, a lower dir");
            if how == LayerPaths::Attached {
                assert!(opts[0].contains(COPIES_DIR), "{opts:?}");
                let copies: Vec<_> = opts[0]["lowerdir=".len()..].split(':').collect();
                assert!(!mounted_any(&copies), "attached layer copies released: {copies:?}");
            }
        }
        assert_eq!(owner(&dir.join("l1/file")), (0, 0), "layers are not chowned");
        assert_eq!(owner(&dir.join("l2/sub")), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bind_copies_are_idmapped_then_released() {
        let dir = std::env::temp_dir().join(format!("corral-idmap-bind-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("shm")).unwrap();
        std::fs::write(dir.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        let ns = Userns::new();
        let mut spec = ns.spec();
        let userns = PodUserns::from_spec(&spec).unwrap().unwrap();
        let map = spec["linux"]["uidMappings"].clone();
        spec["mounts"] = json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/hosts", "type": "bind", "source": dir.join("hosts"),
             "options": ["rbind", "rprivate", "ro"], "uidMappings": map, "gidMappings": map},
            {"destination": "/dev/shm", "type": "bind", "source": dir.join("shm"), "options": ["rbind", "idmap"]},
            {"destination": "/data", "type": "bind", "source": dir.join("shm"), "options": ["rbind"]},
        ]);
        let mut copies = BindCopies::prepare(&mut spec, Some(&userns)).unwrap();
        let hosts = PathBuf::from(spec["mounts"][1]["source"].as_str().unwrap());
        let shm = PathBuf::from(spec["mounts"][2]["source"].as_str().unwrap());
        assert!(hosts.starts_with(COPIES_DIR) && shm.starts_with(COPIES_DIR));
        assert_eq!(owner(&hosts), (196608, 196608));
        assert_eq!(owner(&shm), (196608, 196608));
        assert_eq!(std::fs::read_to_string(&hosts).unwrap(), "127.0.0.1 localhost\n");
        assert_eq!(spec["mounts"][1]["options"], json!(["rbind", "rprivate", "ro"]));
        assert!(spec["mounts"][1].get("uidMappings").is_none());
        assert_eq!(spec["mounts"][2]["options"], json!(["rbind"]));
        assert_eq!(spec["mounts"][3]["source"], json!(dir.join("shm")), "not asked: untouched");
        copies.release().unwrap();
        assert!(!hosts.exists() && !hosts.parent().unwrap().exists(), "copies and their directory removed");
        assert_eq!(owner(&dir.join("hosts")), (0, 0), "the source is not chowned");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_copies_directory_is_roots_and_unlistable() {
        let dir = std::env::temp_dir().join(format!("corral-idmap-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        std::fs::remove_dir_all(&dir).unwrap();
        // Others may pass through to a set they own (a container's root), never list it.
        assert_eq!(mode, 0o711);
    }

    #[test]
    fn sweeps_the_copies_of_dead_shims_only() {
        let base = std::env::temp_dir().join(format!("corral-idmap-sweep-{}", std::process::id()));
        let source = base.join("source");
        std::fs::create_dir_all(source.join("keep")).unwrap();
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        let stale = base.join(format!("{dead_pid}-1-0"));
        let live = base.join(set_name(0));
        // This pid, another start time: a dead shim whose pid is ours now.
        let reused = base.join(format!("{}-{}-0", std::process::id(), ProcessId::current().start + 1));
        for dir in [&stale, &live, &reused] {
            std::fs::create_dir_all(dir.join("0")).unwrap();
        }
        let bind = nix::mount::MsFlags::MS_BIND;
        nix::mount::mount(Some(&source), &stale.join("0"), None::<&str>, bind, None::<&str>).unwrap();
        sweep_stale(&base);
        assert!(!stale.exists(), "a dead shim's copies are detached and removed");
        assert!(!reused.exists(), "so are those of a dead shim whose pid was reused");
        assert!(source.join("keep").exists(), "through the mount nothing was removed");
        assert!(live.join("0").exists(), "a live shim's copies stay");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_idmaps_it_cannot_make() {
        let ns = Userns::new();
        let mut spec = ns.spec();
        let userns = PodUserns::from_spec(&spec).unwrap().unwrap();
        let other = json!([{"containerID": 0, "hostID": 500000, "size": 65536}]);
        spec["mounts"] = json!([{"destination": "/x", "type": "bind", "source": "/tmp", "options": ["rbind"],
                                 "uidMappings": other, "gidMappings": other}]);
        let err = BindCopies::prepare(&mut spec, Some(&userns)).unwrap_err().to_string();
        assert!(err.starts_with("config.json: mounts[0]: idmapping"), "{err}");
        spec["mounts"] =
            json!([{"destination": "/x", "type": "tmpfs", "source": "tmpfs", "options": ["idmap"]}]);
        let err = BindCopies::prepare(&mut spec, Some(&userns)).unwrap_err().to_string();
        assert!(err.contains("mounts[0]: idmapped mounts of type \"tmpfs\" are not supported"), "{err}");
        spec["mounts"] =
            json!([{"destination": "/x", "type": "bind", "source": "/tmp", "options": ["idmap"]}]);
        let err = BindCopies::prepare(&mut spec, None).unwrap_err().to_string();
        assert!(err.contains("needs the container to join an existing user namespace"), "{err}");
    }
}
