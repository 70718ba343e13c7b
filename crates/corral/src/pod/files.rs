//! The pod's files (`/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`) and its `/dev/shm`.
//!
//! CRI writes none of them in shim mode, so corral does. The files live on disk, in a directory
//! of their own under `pod.files_root` (`/var/lib/corral/pods/<namespace>/<sandbox id>`), not in
//! the sandbox bundle: the bundle is on /run, a tmpfs that is a share of the node's memory, and a
//! container that may write its /etc/resolv.conf could fill it and break every new pod. Files are
//! created with `O_EXCL | O_NOFOLLOW` inside a directory corral just created, so a symlink planted
//! in advance cannot redirect a write. Mounts (the shm tmpfs, the namespace pins) live below
//! `<bundle>/rootfs`, where containerd's recursive unmount on bundle removal is a safety net if
//! corral itself is gone.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use crate::error::{IoContext, Result};
use crate::pod::spec::Dns;
use crate::sys::mount::{remove_empty_dir, unmount_if_mounted};

/// Where a pod's files and mounts live.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodPaths {
    /// The sandbox bundle containerd made (on /run).
    pub bundle: PathBuf,
    /// The pod's own directory for its files, on disk (see the module doc).
    pub files: PathBuf,
}

impl PodPaths {
    /// The paths of pod `id` of containerd namespace `namespace` in `bundle`, its files below
    /// `files_root`.
    pub fn new(bundle: impl Into<PathBuf>, files_root: &Path, namespace: &str, id: &str) -> Self {
        PodPaths { bundle: bundle.into(), files: files_root.join(namespace).join(id) }
    }
    pub fn files_dir(&self) -> &Path {
        &self.files
    }
    pub fn hostname(&self) -> PathBuf {
        self.files.join("hostname")
    }
    pub fn hosts(&self) -> PathBuf {
        self.files.join("hosts")
    }
    pub fn resolv_conf(&self) -> PathBuf {
        self.files.join("resolv.conf")
    }
    /// Mount points live below rootfs (see the module doc).
    pub fn mounts_dir(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }
    pub fn shm(&self) -> PathBuf {
        self.mounts_dir().join("shm")
    }
    pub fn ns_dir(&self) -> PathBuf {
        self.mounts_dir().join("ns")
    }
    pub fn ns_pin(&self, kind: &str) -> PathBuf {
        self.ns_dir().join(kind)
    }
    /// corral's record of the pod, read by `delete` when the server is gone.
    pub fn state_file(&self) -> PathBuf {
        state_file(&self.bundle)
    }
}

/// corral's record of the pod in `bundle`.
pub fn state_file(bundle: &Path) -> PathBuf {
    bundle.join("corral.json")
}

/// The node's files copied into pods, as containerd does.
const NODE_HOSTS: &str = "/etc/hosts";
const NODE_RESOLV_CONF: &str = "/etc/resolv.conf";

/// Writes hostname, hosts and resolv.conf for the pod into a directory it creates, which must not
/// exist yet. All or nothing: on failure the directory is gone again (if this call made it).
pub fn write_files(paths: &PodPaths, hostname: &str, dns: Option<&Dns>) -> Result<()> {
    let dir = paths.files_dir();
    if let Some(parent) = dir.parent() {
        // Traversable, not listable, by others: what a container's runtime needs to reach them.
        DirBuilder::new().mode(0o711).recursive(true).create(parent).with_path("create", parent)?;
    }
    // A fresh directory: if anything is already there, refuse rather than reuse it.
    DirBuilder::new().mode(0o755).create(dir).with_path("create pod files directory", dir)?;
    let written = write_each(paths, hostname, dns);
    if written.is_err() {
        let _ = remove_files(paths);
    }
    written
}

fn write_each(paths: &PodPaths, hostname: &str, dns: Option<&Dns>) -> Result<()> {
    write_new(&paths.hostname(), format!("{hostname}\n").as_bytes())?;
    let hosts = std::fs::read(NODE_HOSTS).unwrap_or_else(|_| default_hosts().into_bytes());
    write_new(&paths.hosts(), &hosts)?;
    let resolv = match dns {
        Some(dns) => resolv_conf(dns).into_bytes(),
        None => std::fs::read(NODE_RESOLV_CONF).unwrap_or_default(),
    };
    write_new(&paths.resolv_conf(), &resolv)?;
    // Not mounted anywhere: tells a later sweep whose pod this was (see sweep_orphans).
    write_new(&paths.files.join(OWNER_FILE), paths.bundle.as_os_str().as_encoded_bytes())
}

/// In each pod's files directory: the sandbox bundle of the pod it belongs to.
const OWNER_FILE: &str = ".bundle";

/// Removes the files directories below `files_root` whose pod's bundle is gone: after a reboot
/// (bundles live on /run, the files on disk) or a bundle removed without `delete`, nothing else
/// would, and containers can write these files. A directory without an owner file, or one being
/// written right now, is left alone. Returns how many it removed.
pub fn sweep_orphans(files_root: &Path) -> usize {
    let mut removed = 0;
    for ns in std::fs::read_dir(files_root).into_iter().flatten().flatten() {
        for pod in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            let Ok(owner) = std::fs::read(pod.path().join(OWNER_FILE)) else { continue };
            let bundle = Path::new(std::ffi::OsStr::from_bytes(&owner));
            if bundle.is_absolute() && !bundle.exists() && std::fs::remove_dir_all(pod.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

fn default_hosts() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_string()
}

/// resolv.conf from the pod's DNS config, in the format containerd writes.
pub fn resolv_conf(dns: &Dns) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for server in &dns.servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// Creates `path` (which must not exist, and is never followed if it is a symlink) with `data`.
fn write_new(path: &Path, data: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_path("create pod file", path)?;
    file.write_all(data).with_path("write pod file", path)
}

/// Mounts the pod's /dev/shm tmpfs (mode 1777, nosuid, nodev, noexec). All or nothing.
pub fn mount_shm(paths: &PodPaths, size_kib: u64) -> Result<()> {
    let target = paths.shm();
    DirBuilder::new().mode(0o755).create(&target).with_path("create shm mount point", &target)?;
    let mounted = mount(
        Some("shm"),
        &target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=1777,size={size_kib}k").as_str()),
    )
    .with_path("mount pod shm tmpfs on", &target);
    if mounted.is_err() {
        let _ = remove_empty_dir(&target);
    }
    mounted
}

/// Removes the pod's files directory. Nothing else lives there: it is not bind-mounted as a
/// directory, only its files are.
pub fn remove_files(paths: &PodPaths) -> Result<()> {
    match std::fs::remove_dir_all(paths.files_dir()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_path("remove pod files directory", paths.files_dir())
        }
        _ => Ok(()),
    }
}

/// Unmounts the pod's shm and removes its (then empty) mount point.
pub fn remove_shm(paths: &PodPaths) -> Result<()> {
    unmount_if_mounted(&paths.shm())?;
    remove_empty_dir(&paths.shm())
}

/// Releases everything [`write_files`], [`mount_shm`] and the namespace pins created. Tries every
/// step and reports the first failure, so one stuck mount does not keep the rest alive.
pub fn remove_all(paths: &PodPaths) -> Result<()> {
    let results = [remove_shm(paths), crate::holder::pins::unpin_all(&paths.ns_dir()), remove_files(paths)];
    results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_has_search_nameservers_and_options() {
        let dns = Dns {
            servers: vec!["10.96.0.10".into(), "10.96.0.11".into()],
            searches: vec!["ns.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver 10.96.0.11\noptions ndots:5\n"
        );
        assert_eq!(resolv_conf(&Dns::default()), "");
    }

    #[test]
    fn orphaned_pod_files_are_swept_and_live_ones_kept() {
        let root = std::env::temp_dir().join(format!("corral-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let live_bundle = root.join("bundles/live");
        std::fs::create_dir_all(&live_bundle).unwrap();
        let files_root = root.join("pods");
        let live = PodPaths::new(&live_bundle, &files_root, "k8s.io", "live");
        let gone = PodPaths::new(root.join("bundles/gone"), &files_root, "k8s.io", "gone");
        write_files(&live, "h", None).unwrap();
        write_files(&gone, "h", None).unwrap();
        let unowned = files_root.join("k8s.io/unowned");
        std::fs::create_dir_all(&unowned).unwrap();
        assert_eq!(sweep_orphans(&files_root), 1);
        let left = (live.hostname().exists(), gone.files_dir().exists(), unowned.exists());
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(left, (true, false, true));
    }

    #[test]
    fn write_new_refuses_a_planted_symlink() {
        let dir = std::env::temp_dir().join(format!("corral-files-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = dir.join("hosts");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(write_new(&link, b"evil").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
