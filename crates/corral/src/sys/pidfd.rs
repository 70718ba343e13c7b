//! Watching a process through a pidfd (Linux 5.3+).
//!
//! corral never calls `waitpid(-1)`: tokio reaps the runc commands it spawns by pid, and every
//! other child (holder, container inits reparented to corral as subreaper) is watched and reaped
//! through its own pidfd, claimed from the orphan reaper (see `sys::reaper`) while it is. So no
//! reaper can steal another's exit status.

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use tokio::io::unix::AsyncFd;

/// An open pidfd, readable once the process has exited.
pub struct PidFd {
    pid: i32,
    fd: AsyncFd<OwnedFd>,
}

impl PidFd {
    /// Opens a pidfd for `pid`. Works on a zombie too, so an exit between the fork and this call is
    /// not lost.
    pub fn open(pid: i32) -> io::Result<Self> {
        // SAFETY: pidfd_open takes a pid and a flags word and returns a new fd or -1; no pointers.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so it stays open and refers to the
        // same pidfd for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        super::reaper::claim(pid);
        Ok(PidFd { pid, fd })
    }

    /// Whether this kernel has pidfd_open (Linux 5.3+), tried on our own pid.
    pub fn probe() -> bool {
        // SAFETY: pidfd_open with our own pid and no flags; the fd, if any, is closed at once.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id() as i32, 0) };
        if raw >= 0 {
            // SAFETY: a fresh fd we own.
            drop(unsafe { OwnedFd::from_raw_fd(raw as i32) });
        }
        raw >= 0
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends `signal` to the process; cannot hit a recycled pid.
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        super::process::send_signal(self.fd.get_ref(), signal)
    }

    /// Waits for the exit and reaps the process if it is corral's child. Returns the exit code as
    /// a shell reports it (128 + signal for a killed process); 255 when the status is unknown
    /// (the process was not corral's child).
    pub async fn wait(&self) -> u32 {
        loop {
            let mut guard = match self.fd.readable().await {
                Ok(guard) => guard,
                Err(_) => return 255,
            };
            match waitid(Id::PIDFd(self.fd.get_ref().as_fd()), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG) {
                Ok(WaitStatus::StillAlive) => guard.clear_ready(),
                Ok(status) => return exit_code(status),
                Err(nix::errno::Errno::EINTR) => continue,
                // Not our child (or reaped elsewhere): the pidfd being readable means it exited.
                Err(_) => return 255,
            }
        }
    }
}

/// Once nobody watches the process, an exit left unreaped is the orphan reaper's.
impl Drop for PidFd {
    fn drop(&mut self) {
        super::reaper::release(self.pid);
    }
}

/// The exit code containerd expects: the code, or 128 + signal.
pub fn exit_code(status: WaitStatus) -> u32 {
    match status {
        WaitStatus::Exited(_, code) => code as u32,
        WaitStatus::Signaled(_, sig, _) => 128 + sig as u32,
        _ => 255,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    // The children are reaped through their pidfds, which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    async fn reports_exit_codes_and_signals() {
        let child = std::process::Command::new("/bin/sh").args(["-c", "exit 7"]).spawn().unwrap();
        let pidfd = PidFd::open(child.id() as i32).unwrap();
        assert_eq!(pidfd.wait().await, 7);

        let child = std::process::Command::new("/bin/sleep").arg("100").spawn().unwrap();
        let pidfd = PidFd::open(child.id() as i32).unwrap();
        pidfd.signal(Signal::SIGKILL).unwrap();
        assert_eq!(pidfd.wait().await, 137);
        // Signalling a reaped process is not an error.
        pidfd.signal(Signal::SIGKILL).unwrap();
    }
}
