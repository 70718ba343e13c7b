//! Calls into the OCI runtime binary (runc by default; `corral-oci`, corral's builtin runtime,
//! speaks the same command line).
//!
//! corral drives runc's CLI directly instead of through the `runc` crate: it needs six
//! subcommands, its stdio handling is the container's (the FIFOs are handed straight to runc), and
//! the crate would bring a second `nix` major version and its own process-monitor design that
//! conflicts with corral's pidfd-based exit watching. Errors carry runc's own last error line, not
//! just an exit status.
//!
//! Logs: `create` and `exec` give runc's stderr to the container, so their errors go to a JSON log
//! file in the bundle. The other subcommands log JSON to stderr, because `delete` may run while
//! containerd removes the bundle (after a shim crash) and runc refuses to start without its log.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::error::{Error, IoContext, Result};

/// Where libcontainer's (corral-oci's) created init waits for its start, in the container's
/// state directory.
const NOTIFY_SOCKET: &str = "notify.sock";

/// How long a start waits for the init to take it.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
    /// Decides whether containers get runc's systemd cgroup manager (see [`Runc::create`]).
    pub cgroup_driver: crate::config::Driver,
}

/// The process's stdio, handed to runc and inherited by the container's process.
pub struct CreateIo {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
    /// For a tty process: where runc sends the terminal's master (the streams are then unused).
    pub console_socket: Option<PathBuf>,
}

impl CreateIo {
    /// A tty process: runc hands its terminal to `socket`.
    pub fn console(socket: &Path) -> CreateIo {
        CreateIo {
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
            console_socket: Some(socket.to_path_buf()),
        }
    }
}

impl Runc {
    /// The runtime of the configuration, with one state root per containerd namespace.
    pub fn for_namespace(config: &crate::config::Config, namespace: &str) -> Self {
        Runc {
            binary: config.runtime.program(),
            root: config.runtime.state_root().join(namespace),
            cgroup_driver: config.cgroup.driver,
        }
    }

    /// `runc --root R --log-format json [--log L]`; without a log file runc logs to stderr.
    fn command(&self, log: Option<&Path>) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root").arg(&self.root).arg("--log-format").arg("json");
        if let Some(log) = log {
            cmd.arg("--log").arg(log);
        }
        cmd.kill_on_drop(false);
        cmd
    }

    /// `runc create`: the container's init waits on runc's exec FIFO until `start`.
    /// `systemd_cgroup`: the spec's cgroupsPath is a systemd unit (`slice:prefix:name`), which only
    /// runc's systemd cgroup manager creates; runc keeps that choice in its state for later
    /// commands, as containerd's runc shim relies on.
    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        io: CreateIo,
        systemd_cgroup: bool,
    ) -> Result<()> {
        let mut args = Vec::new();
        if systemd_cgroup {
            args.push("--systemd-cgroup".to_string());
        }
        args.extend(["create".into(), "--bundle".into(), bundle.display().to_string()]);
        args.extend(console_args(&io));
        args.extend(["--pid-file".into(), pid_file.display().to_string(), id.into()]);
        self.with_container_stdio("create", id, bundle, &args, io).await
    }

    /// `runc exec --detach`: runs the process described by `process_json` in the container.
    pub async fn exec(
        &self,
        id: &str,
        bundle: &Path,
        process_json: &Path,
        pid_file: &Path,
        io: CreateIo,
    ) -> Result<()> {
        let mut args =
            vec!["exec".into(), "--detach".into(), "--process".into(), process_json.display().to_string()];
        args.extend(console_args(&io));
        args.extend(["--pid-file".into(), pid_file.display().to_string(), id.into()]);
        self.with_container_stdio("exec", id, bundle, &args, io).await
    }

    async fn with_container_stdio(
        &self,
        op: &'static str,
        id: &str,
        bundle: &Path,
        args: &[String],
        io: CreateIo,
    ) -> Result<()> {
        // Until runc is reaped and the process it made is claimed by its caller.
        let _busy = crate::sys::reaper::Busy::new();
        let log = bundle.join("runc-log.json");
        let _ = std::fs::remove_file(&log);
        let mut cmd = self.command(Some(&log));
        cmd.args(args).stdin(io.stdin).stdout(io.stdout).stderr(io.stderr);
        let status = cmd.status().await.with_path("run", &self.binary)?;
        if status.success() {
            return Ok(());
        }
        Err(self.failed(op, id, last_error(&log, &status.to_string())))
    }

    /// Starts a created container.
    ///
    /// Both runtimes' `start` only tell the waiting init to go on, which corral does itself,
    /// saving the runtime's process (runc ~10 ms, corral-oci ~2 ms, measured in the bench):
    /// - runc's init waits for a reader of `exec.fifo` in runc's state directory;
    /// - corral-oci's (libcontainer's) init waits for a message on `notify.sock` there.
    ///
    /// Otherwise (another runtime or layout, or poststart hooks that the runtime's `start` runs)
    /// corral runs `<runtime> start`. `alive` tells whether the container's init still runs.
    pub async fn start(&self, id: &str, poststart_hooks: bool, alive: impl Fn() -> bool) -> Result<()> {
        let dir = self.root.join(id);
        let (fifo, notify) = (dir.join("exec.fifo"), dir.join(NOTIFY_SOCKET));
        if !poststart_hooks && fifo.exists() {
            self.read_exec_fifo(id, &fifo, alive).await
        } else if !poststart_hooks && notify.exists() {
            self.notify_start(id, &notify).await
        } else {
            self.simple("start", id, &["start", id]).await.map(drop)
        }
    }

    async fn read_exec_fifo(&self, id: &str, fifo: &Path, alive: impl Fn() -> bool) -> Result<()> {
        let failed = |message: String| self.failed("start", id, message);
        let mut rx = tokio::net::unix::pipe::OpenOptions::new()
            .open_receiver(fifo)
            .map_err(|e| failed(format!("open {}: {e}", fifo.display())))?;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(START_TIMEOUT, async {
            use tokio::io::AsyncReadExt;
            loop {
                match rx.read(&mut byte).await {
                    // End of file before the init's write end is open (its blocked open
                    // completes just after ours) or because it died: wait if it lives.
                    Ok(0) if alive() => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
                    other => return other,
                }
            }
        })
        .await;
        match read {
            Ok(Ok(1)) => {
                let _ = std::fs::remove_file(fifo);
                Ok(())
            }
            Ok(Ok(_)) => Err(failed("the container's init exited before it was started".into())),
            Ok(Err(e)) => Err(failed(format!("read {}: {e}", fifo.display()))),
            Err(_) => Err(failed("the container's init did not answer within 30 s".into())),
        }
    }

    /// libcontainer's init accepts one connection on `notify.sock`, reads it to its end and
    /// execs. The socket is removed once the message is sent: corral-oci takes a created
    /// container without it for a started one, as runc does a container without `exec.fifo`.
    async fn notify_start(&self, id: &str, socket: &Path) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let failed = |message: String| self.failed("start", id, message);
        let sent = tokio::time::timeout(START_TIMEOUT, async {
            // Refused: the init, which holds the listening socket, is gone.
            let mut stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "the container's init exited before it was started".to_string()
                }
                _ => format!("connect to {}: {e}", socket.display()),
            })?;
            stream
                .write_all(b"start container")
                .await
                .map_err(|e| format!("write {}: {e}", socket.display()))?;
            stream.shutdown().await.map_err(|e| format!("close {}: {e}", socket.display()))
        })
        .await;
        match sent {
            Ok(Ok(())) => {
                let _ = std::fs::remove_file(socket);
                Ok(())
            }
            Ok(Err(message)) => Err(failed(message)),
            Err(_) => Err(failed("the container's init did not answer within 30 s".into())),
        }
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, sig.as_str()]);
        self.simple("kill", id, &args).await.map(drop)
    }

    /// `runc delete --force`: removes the container, killing what is left of it.
    pub async fn delete(&self, id: &str) -> Result<()> {
        self.simple("delete", id, &["delete", "--force", id]).await.map(drop)
    }

    /// Freezes the container (cgroup freezer).
    pub async fn pause(&self, id: &str) -> Result<()> {
        self.simple("pause", id, &["pause", id]).await.map(drop)
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        self.simple("resume", id, &["resume", id]).await.map(drop)
    }

    /// `runc update --resources -` with an OCI LinuxResources JSON document on stdin.
    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        self.run("update", id, &["update", "--resources", "-", id], Some(resources_json)).await.map(drop)
    }

    /// The host pids of the container's processes.
    pub async fn ps(&self, id: &str) -> Result<Vec<u32>> {
        let out = self.simple("ps", id, &["ps", "--format", "json", id]).await?;
        serde_json::from_slice::<Option<Vec<u32>>>(&out)
            .map(Option::unwrap_or_default)
            .map_err(|e| self.failed("ps", id, format!("unreadable output: {e}")))
    }

    /// Runs a subcommand that needs no container stdio; returns its stdout.
    async fn simple(&self, op: &'static str, id: &str, args: &[&str]) -> Result<Vec<u8>> {
        self.run(op, id, args, None).await
    }

    /// Runs a subcommand with `input` on its stdin; returns its stdout.
    async fn run(&self, op: &'static str, id: &str, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>> {
        use tokio::io::AsyncWriteExt;
        let _busy = crate::sys::reaper::Busy::new();
        let mut child = self
            .command(None)
            .args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_path("run", &self.binary)?;
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(data).await.with_path("write to", &self.binary)?;
        }
        let out = child.wait_with_output().await.with_path("run", &self.binary)?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let message = last_error_in(&String::from_utf8_lossy(&out.stderr));
        Err(self.failed(op, id, message))
    }

    /// An error of `op` on container `id`, naming the runtime by its program's file name.
    fn failed(&self, op: &'static str, id: &str, message: String) -> Error {
        let runtime =
            self.binary.file_name().map_or_else(|| "runtime".into(), |n| n.to_string_lossy().into_owned());
        Error::Runtime { runtime, op, id: id.into(), message }
    }
}

fn console_args(io: &CreateIo) -> Vec<String> {
    match &io.console_socket {
        Some(socket) => vec!["--console-socket".into(), socket.display().to_string()],
        None => Vec::new(),
    }
}

/// runc's last error from its JSON log file, else `fallback`.
fn last_error(log: &Path, fallback: &str) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    json_error(&text).unwrap_or_else(|| fallback.trim().to_string())
}

/// runc's last error from JSON log lines on its stderr, else the stderr text itself.
fn last_error_in(stderr: &str) -> String {
    json_error(stderr).unwrap_or_else(|| stderr.trim().to_string())
}

fn json_error(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_string))
}

/// Whether a runc error means the container does not exist (any more).
pub fn is_not_exist(err: &Error) -> bool {
    matches!(err, Error::Runtime { message, .. } if message.contains("does not exist"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_runc_own_messages() {
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
        assert_eq!(last_error(&dir.join("none"), " exit status 1\n"), "exit status 1");
        assert_eq!(
            last_error_in("{\"level\":\"error\",\"msg\":\"container \\\"x\\\" does not exist\"}\n"),
            "container \"x\" does not exist"
        );
        assert_eq!(last_error_in("plain text\n"), "plain text");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn not_exist_is_recognised() {
        let runc =
            Runc { binary: "/usr/sbin/runc".into(), root: "/r".into(), cgroup_driver: Default::default() };
        let err = runc.failed("delete", "x", "container \"x\" does not exist".into());
        assert_eq!(err.to_string(), "runc delete x: container \"x\" does not exist");
        assert!(is_not_exist(&err));
        let builtin = Runc { binary: "/usr/local/bin/corral-oci".into(), ..runc };
        let err = builtin.failed("delete", "x", "permission denied".into());
        assert_eq!(err.to_string(), "corral-oci delete x: permission denied");
        assert!(!is_not_exist(&err));
    }
}
