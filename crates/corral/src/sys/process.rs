//! A process named for later: its pid and its start time. `delete` runs long after the server
//! recorded a pid, when that pid may belong to anything (recycled, or a process that forged the
//! cmdline corral looks for). The start time (clock ticks after boot, field 22 of
//! /proc/<pid>/stat) is not something a process can choose, and a recycled pid has another one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: i32,
    /// 0 when unknown (a record from before corral kept it).
    pub start: u64,
}

impl ProcessId {
    /// `pid` as it is now; None if it does not exist.
    pub fn of(pid: i32) -> Option<ProcessId> {
        start_time(pid).map(|start| ProcessId { pid, start })
    }

    /// This process.
    pub fn current() -> ProcessId {
        let pid = std::process::id() as i32;
        ProcessId::of(pid).unwrap_or(ProcessId { pid, start: 0 })
    }

    /// Sends `signal` if the process is still the one recorded and `also` accepts it (given its
    /// argv). The check and the signal go through one pidfd, opened first, so they cannot land on
    /// two different processes. Returns whether it signalled.
    pub fn signal_if(&self, signal: Signal, also: impl Fn(&[Vec<u8>]) -> bool) -> io::Result<bool> {
        if self.pid <= 0 {
            return Ok(false);
        }
        // SAFETY: pidfd_open takes a pid and a flags word and returns a new fd or -1; no pointers.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        if raw < 0 {
            let err = io::Error::last_os_error();
            return if err.raw_os_error() == Some(libc::ESRCH) { Ok(false) } else { Err(err) };
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // Read after the pidfd exists: if the pid was recycled before, this sees the newcomer and
        // refuses; if after, the pidfd still names the recorded process, now gone.
        let same_start = self.start == 0 || start_time(self.pid) == Some(self.start);
        if !same_start || !also(&argv(self.pid)) {
            return Ok(false);
        }
        send_signal(&pidfd, signal).map(|()| true)
    }
}

/// pidfd_send_signal; a process that is already gone is not an error.
pub fn send_signal(pidfd: &impl AsRawFd, signal: Signal) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a pidfd, a signal number, a null siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as i32,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// Field 22 of /proc/<pid>/stat. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last ')'.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name; 22 is the 20th.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// The arguments of `pid`, empty if it is gone.
pub fn argv(pid: i32) -> Vec<Vec<u8>> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_counted_past_a_tricky_name() {
        let stat = "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_start_time(stat), Some(98765));
        assert_eq!(parse_start_time("42 (x"), None);
        assert!(start_time(std::process::id() as i32).is_some());
    }

    #[test]
    // Reaped below with wait(), which clippy cannot see through the pidfd.
    #[allow(clippy::zombie_processes)]
    fn signals_only_the_recorded_process() {
        let mut child = std::process::Command::new("/bin/sleep").arg("100").spawn().unwrap();
        // Until the child has executed sleep, its argv is the test binary's.
        while !argv(child.id() as i32).iter().any(|a| a == b"100") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let id = ProcessId::of(child.id() as i32).unwrap();
        let stale = ProcessId { start: id.start + 1, ..id };
        assert!(!stale.signal_if(Signal::SIGKILL, |_| true).unwrap(), "another start time");
        assert!(!id.signal_if(Signal::SIGKILL, |argv| argv.iter().any(|a| a == b"nope")).unwrap());
        assert!(id.signal_if(Signal::SIGKILL, |argv| argv.iter().any(|a| a == b"100")).unwrap());
        assert!(!child.wait().unwrap().success());
        assert!(!id.signal_if(Signal::SIGKILL, |_| true).unwrap(), "gone");
    }
}
