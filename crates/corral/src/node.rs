//! Node mode's shared state on disk: where the node's one server listens, the lock that makes
//! `start` and the server's idle exit race-free, and the registrations by which `start` tells the
//! server which bundle a new sandbox id owns.
//!
//! Layout, one directory per server (`/run/corral/node/<key>`, 0700):
//! - `lock`: flock held by `start` while it checks, spawns or registers, and by the server while
//!   it decides to exit; so two `start`s end with one server, and no `start` registers a pod
//!   with a server that is leaving.
//! - `pods/<sandbox id>`: the bundle `start` ran in (containerd's cwd for it). CreateSandbox
//!   accepts a bundle_path only if it is the registered one, as pod mode accepts only its cwd.
//! - `corral-options.json`: the handler's options the server was started with.
//! - `socket`: where the server listens (its directory can differ between containerds).
//!
//! The key hashes containerd's address, the namespace, corral's version and the effective
//! settings: pods of handlers with different settings (or of another containerd) get servers
//! of their own, and after an upgrade new pods go to a new server while old pods keep theirs.
//!
//! A sandbox bundle of a node-mode pod holds `corral-node.json` (this struct) so `delete` knows
//! the pod shares its server: it must release the pod, never the server.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{IoContext, Result};

/// Where node servers keep their lock and registrations.
pub const NODE_DIR: &str = "/run/corral/node";
/// The marker `start` leaves in a node-mode sandbox bundle.
pub const MARKER_FILE: &str = "corral-node.json";

/// A registration whose CreateSandbox never came (containerd died between `start` and it) stops
/// keeping an idle server alive after this long.
pub const REGISTRATION_GRACE: Duration = Duration::from_secs(60);

/// One node server: its socket and its directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeServer {
    pub socket: PathBuf,
    pub dir: PathBuf,
}

/// Held until dropped.
pub struct NodeLock {
    _file: File,
}

impl NodeServer {
    /// The server for pods of containerd `address`, `namespace`, with `config`; its socket is in
    /// `socket_dir`, its directory under `node_root`.
    pub fn locate(
        socket_dir: &Path,
        node_root: &Path,
        address: &str,
        namespace: &str,
        config: &Config,
    ) -> Self {
        let key = format!("node\0{address}\0{namespace}\0{}\0{config:?}", env!("CARGO_PKG_VERSION"));
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        NodeServer { socket: socket_dir.join(&hex), dir: node_root.join(&hex) }
    }

    /// A short name for logs and file names.
    pub fn key(&self) -> String {
        let name = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.chars().take(12).collect()
    }

    /// The server's log file in `dir` (`log.node_dir`).
    pub fn log_file(&self, dir: &Path) -> PathBuf {
        dir.join(format!("node-{}.log", self.key()))
    }

    fn pods_dir(&self) -> PathBuf {
        self.dir.join("pods")
    }

    /// Creates the directory (0700) and takes its lock, waiting for it.
    pub fn lock(&self) -> Result<NodeLock> {
        let path = self.dir.join("lock");
        loop {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.pods_dir())
                .with_path("create node directory", &self.pods_dir())?;
            // A leaving server removes the directory under the lock (see `remove`): a lock taken
            // on a file no longer at its path locks nothing; take the new one.
            if let Some(file) = crate::sys::lock::lock_file(&path).with_path("lock", &path)? {
                let same = match (file.metadata(), std::fs::symlink_metadata(&path)) {
                    (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
                    _ => false,
                };
                if same {
                    return Ok(NodeLock { _file: file });
                }
            }
        }
    }

    /// Removes the directory of a server that is leaving, under its lock: nothing in it is
    /// needed once no pod is registered, and a node with many containerds or settings over time
    /// would otherwise collect them.
    pub fn remove(&self, _lock: &NodeLock) {
        for entry in std::fs::read_dir(self.pods_dir()).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let _ = std::fs::remove_dir(self.pods_dir());
        let _ = std::fs::remove_file(self.dir.join(crate::config::OPTIONS_FILE));
        let _ = std::fs::remove_file(self.dir.join("socket"));
        let _ = std::fs::remove_file(self.dir.join("lock"));
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// Notes where the server listens, for [`NodeServer::sweep_dead`]. Call with the lock held.
    pub fn save_socket_path(&self) -> Result<()> {
        let path = self.dir.join("socket");
        std::fs::write(&path, self.socket.as_os_str().as_encoded_bytes()).with_path("write", &path)
    }

    /// Records that sandbox `id` owns `bundle` (canonical). Call with the lock held.
    pub fn register(&self, id: &str, bundle: &Path) -> Result<()> {
        crate::ids::validate("sandbox id", id)?;
        let bundle = bundle.canonicalize().with_path("resolve bundle", bundle)?;
        let path = self.pods_dir().join(id);
        let tmp = self.pods_dir().join(format!(".{id}.tmp"));
        std::fs::write(&tmp, bundle.as_os_str().as_encoded_bytes()).with_path("write", &tmp)?;
        std::fs::rename(&tmp, &path).with_path("register", &path)
    }

    /// The bundle `start` registered for `id`.
    pub fn registered_bundle(&self, id: &str) -> Option<PathBuf> {
        crate::ids::validate("sandbox id", id).ok()?;
        let data = std::fs::read(self.pods_dir().join(id)).ok()?;
        Some(PathBuf::from(String::from_utf8(data).ok()?))
    }

    /// Forgets `id` (idempotent).
    pub fn deregister(&self, id: &str) {
        if crate::ids::validate("sandbox id", id).is_ok() {
            let _ = std::fs::remove_file(self.pods_dir().join(id));
        }
    }

    /// Registrations of pods the server does not hold (`live`) that may still come: their bundle
    /// exists and they are younger than [`REGISTRATION_GRACE`]. Others are removed. Call with
    /// the lock held.
    pub fn pending(&self, live: &HashSet<String>) -> Vec<String> {
        let mut pending = Vec::new();
        for entry in std::fs::read_dir(self.pods_dir()).into_iter().flatten().flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if id.starts_with('.') || live.contains(&id) {
                continue;
            }
            let young = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age < REGISTRATION_GRACE);
            let bundle_exists = self.registered_bundle(&id).is_some_and(|b| b.is_dir());
            if young && bundle_exists {
                pending.push(id);
            } else {
                tracing::debug!(sandbox = %id, young, bundle_exists, "dropping a stale registration");
                self.deregister(&id);
            }
        }
        pending
    }

    /// After a pod's `delete`: if the server is dead (it refuses connections, checked under the
    /// lock so no `start` is spawning one), removes its socket, and its directory once no pod
    /// is registered.
    pub fn clean_up_if_dead(&self) {
        if !self.dir.exists() {
            return;
        }
        let Ok(lock) = self.lock() else { return };
        if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
            return;
        }
        let _ = std::fs::remove_file(&self.socket);
        let registered = std::fs::read_dir(self.pods_dir()).map(|d| d.count()).unwrap_or(0);
        if registered == 0 {
            self.remove(&lock);
        }
    }

    /// Removes what dead node servers left when nothing ran their pods' `delete` (containerd
    /// gone too, or a test's teardown): a directory under `node_root` whose server does not
    /// answer on `socket_dir/<key>` and that registers no pod still to come. Returns how many.
    pub fn sweep_dead(node_root: &Path, socket_dir: &Path) -> usize {
        let mut removed = 0;
        for entry in std::fs::read_dir(node_root).into_iter().flatten().flatten() {
            let key = entry.file_name();
            let Some(name) = key.to_str() else { continue };
            if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            // The socket's directory can differ between containerds (2.3+ may pass one): the
            // server's own `socket` file says where it listens.
            let socket = std::fs::read(entry.path().join("socket"))
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .map(PathBuf::from)
                .unwrap_or_else(|| socket_dir.join(name));
            let node = NodeServer { socket, dir: entry.path() };
            let Ok(lock) = node.lock() else { continue };
            if std::os::unix::net::UnixStream::connect(&node.socket).is_ok()
                || !node.pending(&HashSet::new()).is_empty()
            {
                continue;
            }
            let _ = std::fs::remove_file(&node.socket);
            node.remove(&lock);
            removed += 1;
        }
        removed
    }

    /// Leaves the marker in a pod's bundle.
    pub fn save_marker(&self, bundle: &Path) -> Result<()> {
        let path = bundle.join(MARKER_FILE);
        let data = serde_json::to_vec(self).expect("NodeServer serializes");
        std::fs::write(&path, data).with_path("write", &path)
    }

    /// The node server of the pod whose bundle is `bundle`, if it is a node-mode pod.
    /// Only a directory of [`NODE_DIR`] named by a key is taken: `delete` removes files in it.
    pub fn from_marker(bundle: &Path) -> Option<NodeServer> {
        Self::from_marker_in(bundle, Path::new(NODE_DIR))
    }

    fn from_marker_in(bundle: &Path, node_root: &Path) -> Option<NodeServer> {
        let data = std::fs::read(bundle.join(MARKER_FILE)).ok()?;
        let node: NodeServer = serde_json::from_slice(&data).ok()?;
        let key = node.dir.file_name()?.to_str()?;
        let is_key = key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit());
        (is_key && node.dir.parent() == Some(node_root)).then_some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_separates_containerds_namespaces_and_settings() {
        let c = Config::default();
        let (s, n) = (Path::new("/run/corral/s"), Path::new(NODE_DIR));
        let a = NodeServer::locate(s, n, "/run/containerd/containerd.sock", "k8s.io", &c);
        assert_eq!(a, NodeServer::locate(s, n, "/run/containerd/containerd.sock", "k8s.io", &c));
        assert_ne!(a, NodeServer::locate(s, n, "/run/other.sock", "k8s.io", &c));
        assert_ne!(a, NodeServer::locate(s, n, "/run/containerd/containerd.sock", "moby", &c));
        let mut other = c.clone();
        other.pod.shm_size = "128Mi".into();
        assert_ne!(a, NodeServer::locate(s, n, "/run/containerd/containerd.sock", "k8s.io", &other));
        assert!(a.socket.as_os_str().len() < 108);
        assert_eq!(a.socket.file_name(), a.dir.file_name());
        assert_eq!(a.key().len(), 12);
    }

    #[test]
    fn registrations_and_markers() {
        let root = std::env::temp_dir().join(format!("corral-node-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let node = NodeServer::locate(&root, &root.join("node"), "/a.sock", "ns", &Config::default());
        let bundle = root.join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let lock = node.lock().unwrap();
        node.register("pod-a", &bundle).unwrap();
        assert!(node.register("../x", &bundle).is_err(), "ids are checked");
        assert_eq!(node.registered_bundle("pod-a"), Some(bundle.canonicalize().unwrap()));
        assert_eq!(node.registered_bundle("pod-b"), None);
        assert_eq!(node.pending(&HashSet::new()), vec!["pod-a".to_string()]);
        assert!(node.pending(&HashSet::from(["pod-a".to_string()])).is_empty(), "live pods are not pending");

        // A leaving server removes the directory; a `start` waiting on the old lock then takes
        // the new one instead of sharing a lock nobody else sees.
        let waiter = {
            let node = node.clone();
            std::thread::spawn(move || {
                let _held = node.lock().unwrap();
                node.dir.join("lock").exists()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        node.remove(&lock);
        assert!(!node.dir.exists());
        drop(lock);
        assert!(waiter.join().unwrap(), "the waiter locked a file that is at its path");
        node.register("pod-a", &bundle).unwrap();
        // A dead server (nothing listens on its socket) that registers a pod still to come stays.
        assert_eq!(NodeServer::sweep_dead(&root.join("node"), &root), 0);
        assert!(node.dir.exists());

        node.save_marker(&bundle).unwrap();
        assert_eq!(NodeServer::from_marker_in(&bundle, &root.join("node")), Some(node.clone()));
        assert_eq!(NodeServer::from_marker_in(&root, &root.join("node")), None, "no marker");
        assert_eq!(NodeServer::from_marker(&bundle), None, "a directory outside the node root");
        let forged = NodeServer { socket: node.socket.clone(), dir: root.join("node").join("etc") };
        forged.save_marker(&bundle).unwrap();
        assert_eq!(NodeServer::from_marker_in(&bundle, &root.join("node")), None, "not a key");
        node.save_marker(&bundle).unwrap();

        // A registration whose bundle is gone is stale: dropped.
        std::fs::remove_dir_all(&bundle).unwrap();
        assert!(node.pending(&HashSet::new()).is_empty());
        assert_eq!(node.registered_bundle("pod-a"), None);
        node.deregister("pod-a");
        // Nothing registered and nobody listening: swept (its socket found through its `socket`
        // file, not the sweeper's socket directory).
        drop(node.lock().unwrap());
        node.save_socket_path().unwrap();
        std::fs::write(&node.socket, b"").unwrap();
        assert_eq!(NodeServer::sweep_dead(&root.join("node"), Path::new("/nonexistent")), 1);
        assert!(!node.dir.exists() && !node.socket.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
