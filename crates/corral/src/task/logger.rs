//! `binary://` stdio: a logging program started per process, as containerd's shims do (`ctr run
//! --log-uri binary:///path?key=value`, nerdctl's log drivers).
//!
//! The protocol: the program is run with each query pair as two arguments, an environment of only
//! CONTAINER_ID (the process id: the container's, or the exec's) and CONTAINER_NAMESPACE, the
//! read ends of the process's stdout and stderr pipes as fds 3 and 4, and the write end of a
//! readiness pipe as fd 5, which it closes (or writes a byte to) once it is ready to read. When
//! the process is deleted, the program gets time to drain its pipes, then SIGTERM, then SIGKILL.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::error::{Error, IoContext, Result};

/// How long the program has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// After the process is deleted: time to finish reading on its own, then after SIGTERM (what
/// containerd's runc shim gives it), before SIGKILL.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const TERM_GRACE: Duration = Duration::from_secs(12);

/// A `binary://` URI: the program and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggerSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl LoggerSpec {
    /// Parses what follows `binary://`: an absolute, percent-encoded path and an optional query.
    pub fn parse(field: &str, rest: &str) -> Result<LoggerSpec> {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let program = percent_encoding::percent_decode_str(path)
            .decode_utf8()
            .map_err(|_| Error::invalid(format!("{field}: binary:// path is not UTF-8")))?;
        if !program.starts_with('/') {
            return Err(Error::invalid(format!(
                "{field}: binary://{rest}: the program path is not absolute"
            )));
        }
        let args = form_urlencoded::parse(query.as_bytes())
            .flat_map(|(k, v)| {
                let v = (!v.is_empty()).then(|| v.into_owned());
                std::iter::once(k.into_owned()).chain(v)
            })
            .collect();
        Ok(LoggerSpec { program: PathBuf::from(program.into_owned()), args })
    }
}

/// A running logging program.
pub struct Logger {
    child: tokio::process::Child,
    pid: i32,
}

/// The write ends the process gets as its stdout and stderr.
pub struct LoggerPipes {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl Logger {
    /// Starts the program and waits until it is ready.
    pub async fn start(
        spec: &LoggerSpec,
        process_id: &str,
        namespace: &str,
    ) -> Result<(Logger, LoggerPipes)> {
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).context(|| "create a logger pipe".into());
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (ready_r, ready_w) = pipe()?;
        // Above the three target numbers, so the dup2 calls in the child cannot clobber a source.
        let high =
            |fd: &OwnedFd| fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(10)).context(|| "dup".into());
        let sources = [high(&out_r)?, high(&err_r)?, high(&ready_w)?];
        let _busy = crate::sys::reaper::Busy::new();
        let mut cmd = tokio::process::Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .env("CONTAINER_ID", process_id)
            .env("CONTAINER_NAMESPACE", namespace)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(false);
        // SAFETY: the closure only calls dup2, which is async-signal-safe, on fds that stay open
        // in the parent until spawn returns.
        unsafe {
            cmd.as_std_mut().pre_exec(move || {
                for (target, source) in (3..).zip(sources) {
                    if libc::dup2(source, target) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        for fd in sources {
            // SAFETY: fds made by F_DUPFD_CLOEXEC above, owned by nothing else.
            drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        }
        drop((out_r, err_r, ready_w));
        let child = spawned.with_path("start the logging program", &spec.program)?;
        // tokio reaps it; the orphan reaper must leave it alone.
        let pid = child.id().unwrap_or_default() as i32;
        crate::sys::reaper::claim(pid);
        let mut logger = Logger { child, pid };
        if let Err(e) = wait_ready(ready_r).await {
            let _ = logger.child.start_kill();
            let _ = logger.child.wait().await;
            crate::sys::reaper::release(pid);
            return Err(Error::io(format!("logging program {}", spec.program.display()), e));
        }
        Ok((logger, LoggerPipes { stdout: out_w, stderr: err_w }))
    }

    /// Lets the program finish in the background: time to drain, then SIGTERM, then SIGKILL.
    pub fn stop(mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let _ = self.child.start_kill();
            return;
        };
        runtime.spawn(async move {
            self.finish().await;
            crate::sys::reaper::release(self.pid);
        });
    }

    async fn finish(&mut self) {
        if tokio::time::timeout(DRAIN_GRACE, self.child.wait()).await.is_ok() {
            return;
        }
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(TERM_GRACE, self.child.wait()).await.is_err() {
            tracing::warn!("the logging program ignored SIGTERM; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// One byte or end of file on the readiness pipe.
async fn wait_ready(ready: OwnedFd) -> io::Result<()> {
    use tokio::io::AsyncReadExt;
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(ready)?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(READY_TIMEOUT, rx.read(&mut byte)).await {
        Ok(read) => read.map(drop),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "not ready within 10 s (fd 5 still open)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_uris() {
        let spec = LoggerSpec::parse("stdout", "/usr/local/bin/my%20logger?dir=%2Fvar%2Flog&flag").unwrap();
        assert_eq!(spec.program, PathBuf::from("/usr/local/bin/my logger"));
        assert_eq!(spec.args, ["dir", "/var/log", "flag"]);
        assert_eq!(LoggerSpec::parse("stdout", "/bin/l").unwrap().args, Vec::<String>::new());
        let err = LoggerSpec::parse("stdout", "relative?x=1").unwrap_err().to_string();
        assert!(err.contains("stdout") && err.contains("not absolute"), "{err}");
    }
}
