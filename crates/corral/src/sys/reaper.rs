//! Reaping the orphans corral inherits as a subreaper.
//!
//! corral is a child subreaper so that container inits become its children once `runc create`
//! exits (their exit status is only readable by a parent). The same bit makes corral the parent
//! of any orphan of a container that shares the node's pid namespace (hostPID): a daemon's
//! double fork, or what `runc kill --all` killed after its init exited. Nothing else waits for
//! those, so without this module they would stay zombies as long as the pod lives.
//!
//! Every other child has an owner that reaps it by pid: tokio (runc commands, logging programs)
//! and the pidfd watchers (container processes, the holder). The reaper must never take their
//! exit status, so it reaps only zombie children that are
//! - not claimed: owners of long-lived children claim their pids ([`claim`]), and
//! - not possibly someone's new child: while any child is being spawned or waited for by its
//!   owner ([`Busy`]), the reaper does not run; it runs once all such work is done, by then
//!   every new child is reaped by its owner or claimed.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use tokio::sync::Notify;

static CLAIMED: Mutex<Option<HashSet<i32>>> = Mutex::new(None);
static BUSY: AtomicUsize = AtomicUsize::new(0);

fn idle() -> &'static Notify {
    static IDLE: OnceLock<Notify> = OnceLock::new();
    IDLE.get_or_init(Notify::new)
}

/// Marks `pid` as a child its owner will reap.
pub fn claim(pid: i32) {
    CLAIMED.lock().unwrap().get_or_insert_with(HashSet::new).insert(pid);
}

/// The owner reaped `pid`.
pub fn release(pid: i32) {
    if let Some(set) = CLAIMED.lock().unwrap().as_mut() {
        set.remove(&pid);
    }
}

/// Held while a child is spawned and until its owner has reaped or claimed it.
pub struct Busy(());

impl Busy {
    pub fn new() -> Busy {
        BUSY.fetch_add(1, Ordering::SeqCst);
        Busy(())
    }
}

impl Default for Busy {
    fn default() -> Self {
        Busy::new()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if BUSY.fetch_sub(1, Ordering::SeqCst) == 1 {
            idle().notify_one();
        }
    }
}

/// Runs the reaper for the server's life: a pass on every SIGCHLD and whenever the last [`Busy`]
/// ends.
pub fn spawn() -> std::io::Result<()> {
    let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sigchld.recv() => {}
                _ = idle().notified() => {}
            }
            if BUSY.load(Ordering::SeqCst) == 0 {
                reap_orphans();
            }
        }
    });
    Ok(())
}

/// Reaps every zombie child nobody claimed; returns how many.
pub fn reap_orphans() -> usize {
    reap(zombie_children())
}

fn reap(zombies: impl IntoIterator<Item = i32>) -> usize {
    let mut reaped = 0;
    for pid in zombies {
        let claimed = CLAIMED.lock().unwrap().as_ref().is_some_and(|s| s.contains(&pid));
        if !claimed && waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok() {
            tracing::debug!(pid, "reaped an orphan");
            reaped += 1;
        }
    }
    reaped
}

/// corral's children in state Z, from /proc/self/task/*/children (or a /proc scan on kernels
/// without that file).
fn zombie_children() -> Vec<i32> {
    let children: Vec<i32> = match std::fs::read_dir("/proc/self/task") {
        Ok(tasks) => tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|list| list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<_>>())
            .collect(),
        Err(_) => Vec::new(),
    };
    let children = if children.is_empty() && !std::path::Path::new("/proc/self/task/1/children").exists() {
        children_by_scan()
    } else {
        children
    };
    children.into_iter().filter(|pid| state_of(*pid) == Some('Z')).collect()
}

fn children_by_scan() -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| parent_of(*pid) == Some(me))
        .collect()
}

/// Fields after the command name in /proc/<pid>/stat: state, ppid, ...
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().map(str::to_string).collect())
}

fn state_of(pid: i32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // The children are reaped by the code under test, which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    fn reaps_unclaimed_zombies_only() {
        let orphan = std::process::Command::new("/bin/true").spawn().unwrap();
        let owned = std::process::Command::new("/bin/true").spawn().unwrap();
        claim(owned.id() as i32);
        // Both exit at once; wait until both are zombies.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while [orphan.id(), owned.id()].iter().any(|p| state_of(*p as i32) != Some('Z')) {
            assert!(std::time::Instant::now() < deadline, "children did not exit");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Only these two: other tests of this process have children of their own.
        let mine = [orphan.id() as i32, owned.id() as i32];
        assert_eq!(reap(zombie_children().into_iter().filter(|p| mine.contains(p))), 1);
        assert_eq!(state_of(orphan.id() as i32), None, "the orphan is reaped");
        assert_eq!(state_of(owned.id() as i32), Some('Z'), "the claimed child is left to its owner");
        release(owned.id() as i32);
        let status = waitpid(Pid::from_raw(owned.id() as i32), None).unwrap();
        assert!(matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)));
    }
}
