//! corral's record of a pod, kept in the sandbox bundle. `delete` reads it when the server is
//! gone (crash, or racing the server's exit) to find and release what the pod still holds.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub sandbox_id: String,
    pub server_pid: i32,
    /// The server's socket, removed by `delete` if the server could not.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    pub holder_pid: i32,
    /// The holder's cgroup (a cgroupfs path), removed by `delete`.
    #[serde(default)]
    pub cgroup: Option<String>,
    pub runc_binary: PathBuf,
    pub runc_root: PathBuf,
    /// (container id, bundle)
    pub containers: Vec<(String, PathBuf)>,
}

impl Record {
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
            sandbox_id: "sb".into(),
            server_pid: 1,
            socket: Some("/run/corral/s/x".into()),
            holder_pid: 2,
            cgroup: Some("/kubepods/pod1/sb".into()),
            runc_binary: "runc".into(),
            runc_root: "/run/corral/runc/k8s.io".into(),
            containers: vec![("c1".into(), "/b/c1".into())],
        };
        rec.save(&path).unwrap();
        assert_eq!(Record::load(&path), Some(rec));
        assert_eq!(Record::load(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
