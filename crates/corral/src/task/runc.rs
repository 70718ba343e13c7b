//! Calls into the OCI runtime binary (runc by default).
//!
//! corral drives runc's CLI directly instead of through the `runc` crate: it needs five
//! subcommands, its stdio handling is the container's (the FIFOs are handed straight to runc), and
//! the crate would bring a second `nix` major version and its own process-monitor design that
//! conflicts with corral's pidfd-based exit watching. Errors carry runc's own last error line,
//! read from its JSON log, not just an exit status.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::error::{Error, IoContext, Result};

/// Where corral keeps runc's state: one root per containerd namespace, on tmpfs, stable across
/// containerd restarts so `delete` can find containers without the server.
pub const DEFAULT_ROOT: &str = "/run/corral/runc";

#[derive(Clone, Debug)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
}

/// The container's stdio, handed to `runc create` and inherited by the container's init.
pub struct CreateIo {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

impl Runc {
    pub fn new(binary: impl Into<PathBuf>, namespace: &str) -> Self {
        Runc {
            binary: binary.into(),
            root: Path::new(DEFAULT_ROOT).join(namespace),
        }
    }

    fn command(&self, log: &Path) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(log)
            .arg("--log-format")
            .arg("json");
        cmd.kill_on_drop(false);
        cmd
    }

    /// `runc create`: the container's init waits on runc's exec FIFO until `start`.
    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        io: CreateIo,
    ) -> Result<()> {
        let log = bundle.join("runc-log.json");
        let _ = std::fs::remove_file(&log);
        let mut cmd = self.command(&log);
        cmd.args(["create", "--bundle"])
            .arg(bundle)
            .arg("--pid-file")
            .arg(pid_file)
            .arg(id);
        cmd.stdin(io.stdin).stdout(io.stdout).stderr(io.stderr);
        let status = cmd.status().await.with_path("run", &self.binary)?;
        if status.success() {
            return Ok(());
        }
        Err(Error::Runtime {
            op: "create",
            id: id.into(),
            message: last_error(&log, &status.to_string()),
        })
    }

    pub async fn start(&self, id: &str, bundle: &Path) -> Result<()> {
        self.simple("start", id, bundle, &["start", id]).await
    }

    pub async fn kill(&self, id: &str, bundle: &Path, signal: u32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, sig.as_str()]);
        self.simple("kill", id, bundle, &args).await
    }

    /// `runc delete --force`: removes the container, killing what is left of it.
    pub async fn delete(&self, id: &str, bundle: &Path) -> Result<()> {
        self.simple("delete", id, bundle, &["delete", "--force", id])
            .await
    }

    /// The host pids of the container's processes.
    pub async fn ps(&self, id: &str, bundle: &Path) -> Result<Vec<u32>> {
        let log = bundle.join("runc-log.json");
        let out = self
            .command(&log)
            .args(["ps", "--format", "json", id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .with_path("run", &self.binary)?;
        if !out.status.success() {
            let message = last_error(&log, &String::from_utf8_lossy(&out.stderr));
            return Err(Error::Runtime {
                op: "ps",
                id: id.into(),
                message,
            });
        }
        serde_json::from_slice::<Option<Vec<u32>>>(&out.stdout)
            .map(Option::unwrap_or_default)
            .map_err(|e| Error::Runtime {
                op: "ps",
                id: id.into(),
                message: format!("unreadable output: {e}"),
            })
    }

    async fn simple(&self, op: &'static str, id: &str, bundle: &Path, args: &[&str]) -> Result<()> {
        // A bundle may be gone (delete after a crash); runc's log then goes to the runc root.
        let log = if bundle.is_dir() {
            bundle.join("runc-log.json")
        } else {
            self.root.join("corral-log.json")
        };
        let out = self
            .command(&log)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .with_path("run", &self.binary)?;
        if out.status.success() {
            return Ok(());
        }
        let message = last_error(&log, &String::from_utf8_lossy(&out.stderr));
        Err(Error::Runtime {
            op,
            id: id.into(),
            message,
        })
    }
}

/// runc's last `"level":"error"` message from its JSON log, else `fallback`.
fn last_error(log: &Path, fallback: &str) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_string))
        .unwrap_or_else(|| fallback.trim().to_string())
}

/// Whether a runc error means the container does not exist (any more).
pub fn is_not_exist(err: &Error) -> bool {
    matches!(err, Error::Runtime { message, .. } if message.contains("does not exist") || message.contains("not exist"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_takes_runc_own_message() {
        let dir = std::env::temp_dir().join(format!("corral-runc-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log.json");
        std::fs::write(
            &log,
            concat!(
                "{\"level\":\"warning\",\"msg\":\"w\"}\n",
                "{\"level\":\"error\",\"msg\":\"namespace path: lstat /proc/0/ns/net: no such file or directory\"}\n",
                "not json\n"
            ),
        )
        .unwrap();
        assert_eq!(
            last_error(&log, "exit status 1"),
            "namespace path: lstat /proc/0/ns/net: no such file or directory"
        );
        assert_eq!(
            last_error(&dir.join("none"), " exit status 1\n"),
            "exit status 1"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
