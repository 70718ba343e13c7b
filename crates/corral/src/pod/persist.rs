//! corral's record of a pod, kept in the sandbox bundle. `delete` reads it when the server is
//! gone (crash, or racing the server's exit) to find and release what the pod still holds.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result};
use crate::sys::process::ProcessId;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub sandbox_id: String,
    pub server_pid: i32,
    /// The server's start time (see sys::process), so `delete` never signals a recycled pid.
    #[serde(default)]
    pub server_start: u64,
    /// The server's socket, removed by `delete` if the server could not (pod mode only).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Node mode: the shared server's directory. `delete` then releases the pod alone and never
    /// signals the server, which serves other pods.
    #[serde(default)]
    pub node_dir: Option<PathBuf>,
    pub holder_pid: i32,
    #[serde(default)]
    pub holder_start: u64,
    /// The pod's files directory (on disk, outside the bundle), removed by `delete`.
    #[serde(default)]
    pub files_dir: Option<PathBuf>,
    /// The holder's cgroup (a cgroupfs path), removed by `delete`.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// The systemd scope holding that cgroup (systemd driver), stopped by `delete`.
    #[serde(default)]
    pub cgroup_unit: Option<String>,
    pub runc_binary: PathBuf,
    pub runc_root: PathBuf,
    /// (container id, bundle)
    pub containers: Vec<(String, PathBuf)>,
}

/// Which server serves a pod, as its record keeps it.
#[derive(Clone, Debug, Default)]
pub struct ServedBy {
    /// A pod's own server's socket.
    pub socket: Option<PathBuf>,
    /// The node server's directory (node mode).
    pub node_dir: Option<PathBuf>,
}

impl Record {
    pub fn server(&self) -> ProcessId {
        ProcessId { pid: self.server_pid, start: self.server_start }
    }

    pub fn holder(&self) -> ProcessId {
        ProcessId { pid: self.holder_pid, start: self.holder_start }
    }

    /// Writes atomically (temp file + rename) so a crash never leaves half a record.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.tmp");
        let data = serde_json::to_vec_pretty(self).expect("Record serializes");
        std::fs::write(&tmp, data).with_path("write", &tmp)?;
        std::fs::rename(&tmp, path).with_path("rename into", path)
    }

    pub fn load(path: &Path) -> Option<Record> {
        let data = std::fs::read(path).ok()?;
        serde_json::from_slice(&data).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let dir = std::env::temp_dir().join(format!("corral-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("corral.json");
        let rec = Record {
            node_dir: None,
            sandbox_id: "sb".into(),
            server_pid: 1,
            server_start: 11,
            socket: Some("/run/corral/s/x".into()),
            holder_pid: 2,
            holder_start: 22,
            files_dir: Some("/var/lib/corral/pods/k8s.io/sb".into()),
            cgroup: Some("/kubepods/pod1/sb".into()),
            cgroup_unit: None,
            runc_binary: "runc".into(),
            runc_root: "/run/corral/runc/k8s.io".into(),
            containers: vec![("c1".into(), "/b/c1".into())],
        };
        rec.save(&path).unwrap();
        assert_eq!(Record::load(&path), Some(rec));
        assert_eq!(Record::load(&dir.join("missing")), None);
        // A record from before start times and the files directory were kept still loads.
        std::fs::write(&path, r#"{"sandbox_id":"sb","server_pid":1,"holder_pid":2,"runc_binary":"runc","runc_root":"/r","containers":[]}"#).unwrap();
        let old = Record::load(&path).unwrap();
        assert_eq!((old.holder(), old.files_dir), (ProcessId { pid: 2, start: 0 }, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
