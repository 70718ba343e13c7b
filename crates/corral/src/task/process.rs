//! A process of a container (its init or an exec): stdio paths, pid, lifecycle and exit.
//!
//! Lifecycle: Created -> Running -> Stopped. The exit is observed once through the process's
//! pidfd (corral is a subreaper, so inits and execs become its children when runc exits) and
//! broadcast to every waiter, once the output corral copies (files, a terminal) holds everything
//! the process wrote.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;

use crate::error::{Error, IoContext, Result};
use crate::sys::pidfd::PidFd;
use crate::task::stdio::{Kept, Request as Stdio};

/// How long an exit waits for corral's output copies. A copy only has the pipe's or terminal's
/// buffer to write out, so this is only reached when the destination itself blocks (a terminal's
/// containerd FIFO that nobody reads while containerd is down).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub status: u32,
    pub at: SystemTime,
}

pub struct Process {
    /// The container id for an init, the exec id for an exec.
    pub id: String,
    pub stdio: Stdio,
    pid: AtomicU32,
    status: Mutex<Status>,
    exit: watch::Sender<Option<ExitInfo>>,
    pidfd: OnceLock<PidFd>,
    /// What corral holds for the process's stdio while it lives (see `task::stdio`).
    kept_io: Mutex<Kept>,
}

impl Process {
    pub fn new(id: &str, stdio: Stdio) -> Process {
        Process {
            id: id.to_string(),
            stdio,
            pid: AtomicU32::new(0),
            status: Mutex::new(Status::Created),
            exit: watch::channel(None).0,
            pidfd: OnceLock::new(),
            kept_io: Mutex::new(Default::default()),
        }
    }

    /// Holds the stdio resources until [`Process::release_io`].
    pub fn keep_io(&self, kept: Kept) {
        *self.kept_io.lock().unwrap() = kept;
    }

    /// Gives the process the end of its stdin (CloseIO).
    pub fn close_stdin(&self) {
        self.kept_io.lock().unwrap().close_stdin();
    }

    /// Sets the size of the process's terminal (ResizePty).
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        match &self.kept_io.lock().unwrap().console {
            Some(console) => console.resize(width, height),
            None => Err(Error::precondition(format!("{}: the process has no terminal", self.id))),
        }
    }

    /// Releases the stdio resources (the process was deleted).
    pub fn release_io(&self) {
        drop(std::mem::take(&mut *self.kept_io.lock().unwrap()));
    }

    /// Records the process runc created, and starts watching it.
    pub fn attach(&self, pid: u32) -> Result<()> {
        let pidfd = PidFd::open(pid as i32).context(|| format!("pidfd_open {} (pid {pid})", self.id))?;
        self.pid.store(pid, Ordering::SeqCst);
        let _ = self.pidfd.set(pidfd);
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    pub fn status(&self) -> Status {
        *self.status.lock().unwrap()
    }

    /// Created -> Running, unless the process already exited.
    pub fn set_running(&self) {
        let mut status = self.status.lock().unwrap();
        if *status == Status::Created {
            *status = Status::Running;
        }
    }

    pub fn exit(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// Waits for the exit through the pidfd and for the output corral copies to hold all the
    /// process wrote, and returns its status, without recording it. Run once per process, in its
    /// own task; then [`Process::mark_exited`].
    pub async fn observe_exit(&self) -> u32 {
        let status = match self.pidfd.get() {
            Some(pidfd) => pidfd.wait().await,
            None => 255,
        };
        self.flush_output().await;
        status
    }

    async fn flush_output(&self) {
        let flushers = self.kept_io.lock().unwrap().flushers();
        let all = async {
            for flusher in &flushers {
                flusher.flush().await;
            }
        };
        if tokio::time::timeout(FLUSH_TIMEOUT, all).await.is_err() {
            tracing::warn!(process = %self.id, "output copies did not flush within {FLUSH_TIMEOUT:?}");
        }
    }

    /// Records an exit (also for a process that never started).
    pub fn mark_exited(&self, status: u32) -> ExitInfo {
        let info = ExitInfo { status, at: SystemTime::now() };
        *self.status.lock().unwrap() = Status::Stopped;
        self.exit.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(info);
                true
            } else {
                false
            }
        });
        self.exit().unwrap_or(info)
    }

    /// Resolves when the process has exited.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit.subscribe();
        let exit = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.expect("waited for Some"),
            Err(_) => unreachable!("the exit sender lives as long as the process"),
        };
        exit
    }

    /// Signals the process; NotFound once it has exited (containerd treats that as done).
    pub fn signal(&self, signal: u32) -> Result<()> {
        if self.exit().is_some() || self.status() == Status::Stopped {
            return Err(Error::not_found(format!("{}: process already finished", self.id)));
        }
        let sig = Signal::try_from(signal as i32)
            .map_err(|_| Error::invalid(format!("signal: {signal} is not a signal")))?;
        let pidfd =
            self.pidfd.get().ok_or_else(|| Error::precondition(format!("{}: not started", self.id)))?;
        pidfd.signal(sig).context(|| format!("signal {}", self.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    // The child is reaped through its pidfd, which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    async fn the_exit_is_observed_once_the_output_file_holds_all_the_process_wrote() {
        let dir = std::env::temp_dir().join(format!("corral-process-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let want: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
        // Whether the copy is behind at the exit is up to the scheduler: try it often enough
        // that a missing flush shows.
        for round in 0..10 {
            let path = dir.join(format!("out-{round}.log"));
            let uri = format!("file://{}", path.display());
            let stdio = Stdio::checked("", &uri, &uri, false).unwrap();
            let (io, kept) = crate::task::stdio::open(&stdio, "p", "ns").await.unwrap();
            let child = std::process::Command::new("/usr/bin/seq")
                .args(["1", "100000"])
                .stdout(io.stdout)
                .stderr(io.stderr)
                .spawn()
                .unwrap();
            let process = Process::new("p", stdio);
            process.keep_io(kept);
            process.attach(child.id()).unwrap();
            assert_eq!(process.observe_exit().await, 0);
            let got = std::fs::read_to_string(&path).unwrap();
            assert!(
                got == want,
                "round {round}: the file has {} of {} bytes at the exit",
                got.len(),
                want.len()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
