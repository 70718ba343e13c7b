//! OOM kills in a container's cgroup, reported as `/tasks/oom` (CRI then gives the container the
//! reason `OOMKilled`). v1: an eventfd registered on `memory.oom_control`; v2: inotify on
//! `memory.events`. Both confirm with the `oom_kill` counter, so a cgroup's removal (which also
//! signals a v1 eventfd) is not taken for an OOM.
//!
//! Under systemd a container's cgroup is a scope that systemd removes as soon as its last process
//! has exited, which can be before the watch has read the kill from the scope's own
//! `memory.events` (seen in the cgroup v2 + systemd VM: the reason came back "Error"). v2 counts
//! kills hierarchically, so the pod's cgroup still has it: a [`PodOomLedger`] keeps how many of the
//! pod's kills the containers' own watches explained, and a kill nobody explained is the
//! container's whose cgroup went with its SIGKILLed init.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;

use super::Mode;
use crate::error::{Error, IoContext, Result};

/// Watches one cgroup for OOM kills.
pub struct OomWatch {
    fd: AsyncFd<OwnedFd>,
    counter: PathBuf,
    seen: u64,
    v2: bool,
    /// v2: the memory.events of the cgroup above (the pod's), and what the pod's watches explained.
    pod: Option<(PathBuf, Arc<PodOomLedger>)>,
    // Keeps the v1 oom_control file open while the eventfd is registered on it.
    _control: Option<File>,
}

/// The `oom_kill` count of a pod's cgroup (v2, hierarchical) up to which every kill has been
/// reported: by a container's own watch, or claimed by a container whose cgroup was gone.
#[derive(Debug, Default)]
pub struct PodOomLedger(Mutex<Option<u64>>);

impl PodOomLedger {
    /// Starts counting from the pod cgroup's count now (once per pod).
    fn start(&self, pod_count: u64) {
        self.0.lock().unwrap().get_or_insert(pod_count);
    }

    /// A container's own watch reported `kills` more.
    fn explained(&self, kills: u64) {
        if let Some(count) = self.0.lock().unwrap().as_mut() {
            *count += kills;
        }
    }

    /// Claims the kills of the pod's count `now` nobody has explained; whether there were any.
    fn claim(&self, now: u64) -> bool {
        let mut count = self.0.lock().unwrap();
        match count.as_mut() {
            Some(explained) if now > *explained => {
                *explained = now;
                true
            }
            _ => false,
        }
    }
}

/// SIGKILL's exit status, what every OOM kill ends an init with.
const KILLED: u32 = 128 + 9;

/// The `oom_kill` count in memory.oom_control (v1) or memory.events (v2).
pub fn oom_kills(text: &str) -> u64 {
    super::stats::flat_keyed(text).get("oom_kill").copied().unwrap_or(0)
}

impl OomWatch {
    /// Starts watching cgroup `rel`, a container of the pod whose kills `ledger` keeps; None
    /// when the host has no memory controller for it.
    pub fn new(mode: &Mode, rel: &str, ledger: &Arc<PodOomLedger>) -> Result<Option<OomWatch>> {
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
        let pod = match dir.parent() {
            Some(parent) if v2 => {
                let events = parent.join("memory.events");
                std::fs::read_to_string(&events).ok().map(|text| {
                    ledger.start(oom_kills(&text));
                    (events, ledger.clone())
                })
            }
            _ => None,
        };
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd; it stays open for its whole life.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|e| Error::io("register OOM watch", e.into_parts().1))?;
        Ok(Some(OomWatch { fd, counter, seen, v2, pod, _control: control }))
    }

    /// Reads the own count from nowhere from now on: what the test build's failpoint uses to
    /// make the watch lose the race with a cgroup's removal.
    pub fn lose_own_count(&mut self) {
        self.counter = self.counter.with_file_name("memory.events.lost");
    }

    /// After the init exited with `status` (or the cgroup went, which needs its processes gone):
    /// whether an OOM kill is still to report. Reads the cgroup's own count if it is still there,
    /// else (v2) claims a kill of the pod's count no container's watch explained, if the init
    /// was SIGKILLed.
    pub fn check_at_exit(&mut self, status: u32) -> bool {
        if Path::new(&self.counter).exists() {
            return self.check_now().is_some();
        }
        let Some((events, ledger)) = &self.pod else { return false };
        let Ok(text) = std::fs::read_to_string(events) else { return false };
        status == KILLED && ledger.claim(oom_kills(&text))
    }

    /// An OOM kill not reported yet, read now without waiting (the container's exit may win the
    /// race against the notification).
    pub fn check_now(&mut self) -> Option<u64> {
        let now = oom_kills(&std::fs::read_to_string(&self.counter).ok()?);
        self.advance(now)
    }

    /// Takes a reading of the own count: Some(count) when it grew, which the pod's ledger learns.
    fn advance(&mut self, now: u64) -> Option<u64> {
        if now <= self.seen {
            return None;
        }
        if let Some((_, ledger)) = &self.pod {
            ledger.explained(now - self.seen);
        }
        self.seen = now;
        Some(now)
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
            if let Some(now) = self.advance(now) {
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

    #[test]
    fn a_pods_ledger_gives_each_unexplained_kill_once() {
        let ledger = PodOomLedger::default();
        assert!(!ledger.claim(5), "nothing is claimed before the pod's count is taken");
        ledger.start(2);
        ledger.start(7); // a later container's watch does not move the start
        ledger.explained(1); // container A reported its own kill: the pod counts 3
        assert!(!ledger.claim(3), "A's kill is A's");
        assert!(ledger.claim(4), "a fourth kill no watch read is the gone container's");
        assert!(!ledger.claim(4), "and only one container's");
    }
}
