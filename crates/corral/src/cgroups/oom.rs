//! OOM kills in a container's cgroup, reported as `/tasks/oom` (CRI then gives the container the
//! reason `OOMKilled`). v1: an eventfd registered on `memory.oom_control`; v2: inotify on
//! `memory.events`. Both confirm with the `oom_kill` counter, so a cgroup's removal (which also
//! signals a v1 eventfd) is not taken for an OOM.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tokio::io::unix::AsyncFd;

use super::Mode;
use crate::error::{Error, IoContext, Result};

/// Watches one cgroup for OOM kills.
pub struct OomWatch {
    fd: AsyncFd<OwnedFd>,
    counter: PathBuf,
    seen: u64,
    v2: bool,
    // Keeps the v1 oom_control file open while the eventfd is registered on it.
    _control: Option<File>,
}

/// The `oom_kill` count in memory.oom_control (v1) or memory.events (v2).
pub fn oom_kills(text: &str) -> u64 {
    super::stats::flat_keyed(text).get("oom_kill").copied().unwrap_or(0)
}

impl OomWatch {
    /// Starts watching cgroup `rel`; None when the host has no memory controller for it.
    pub fn new(mode: &Mode, rel: &str) -> Result<Option<OomWatch>> {
        let Some(dir) = mode.dir_of("memory", rel) else {
            return Ok(None);
        };
        if !dir.is_dir() {
            return Ok(None);
        }
        let (fd, counter, control, v2) = match mode {
            Mode::V1(_) => {
                let control_path = dir.join("memory.oom_control");
                let control = File::open(&control_path).with_path("open", &control_path)?;
                let efd = eventfd()?;
                let line = format!("{} {}", efd.as_raw_fd(), control.as_raw_fd());
                let event_control = dir.join("cgroup.event_control");
                std::fs::write(&event_control, line).with_path("register OOM eventfd in", &event_control)?;
                (efd, control_path, Some(control), false)
            }
            Mode::V2(_) => {
                let events = dir.join("memory.events");
                let ino = nix::sys::inotify::Inotify::init(
                    nix::sys::inotify::InitFlags::IN_CLOEXEC | nix::sys::inotify::InitFlags::IN_NONBLOCK,
                )
                .with_path("inotify_init for", &events)?;
                ino.add_watch(&events, nix::sys::inotify::AddWatchFlags::IN_MODIFY)
                    .with_path("watch", &events)?;
                // nix's Inotify offers no into-fd conversion: duplicate its fd and let it go.
                let fd = ino.as_fd().try_clone_to_owned().with_path("dup inotify fd for", &events)?;
                (fd, events, None, true)
            }
        };
        let seen = oom_kills(&std::fs::read_to_string(&counter).unwrap_or_default());
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd; it stays open for its whole life.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| Error::io("register OOM watch", e.into_parts().1))?;
        Ok(Some(OomWatch { fd, counter, seen, v2, _control: control }))
    }

    /// An OOM kill not reported yet, read now without waiting (the container's exit may win the
    /// race against the notification).
    pub fn check_now(&mut self) -> Option<u64> {
        let now = oom_kills(&std::fs::read_to_string(&self.counter).ok()?);
        (now > self.seen).then(|| {
            self.seen = now;
            now
        })
    }

    /// Resolves at the next OOM kill in the cgroup; None when the cgroup is gone.
    pub async fn next(&mut self) -> Option<u64> {
        loop {
            let mut guard = self.fd.readable().await.ok()?;
            let mut buf = [0u8; 4096];
            let n = nix::unistd::read(self.fd.get_ref().as_fd().as_raw_fd(), &mut buf);
            guard.clear_ready();
            if matches!(n, Err(nix::errno::Errno::EAGAIN)) {
                continue;
            }
            if !Path::new(&self.counter).exists() {
                return None;
            }
            let now = oom_kills(&std::fs::read_to_string(&self.counter).unwrap_or_default());
            if now > self.seen {
                self.seen = now;
                return Some(now);
            }
            // v1 eventfds also fire on cgroup removal; v2 on any memory.events change.
            if !self.v2 && n.is_err() {
                return None;
            }
        }
    }
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd takes an initial value and flags and returns a new fd or -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(Error::io("eventfd", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_oom_kill_counter_of_both_versions() {
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3);
        assert_eq!(oom_kills("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n"), 2);
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), 0);
    }
}
