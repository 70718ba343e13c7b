//! Namespace pins: bind mounts of the holder's `/proc/<pid>/ns/*` under the sandbox bundle. They
//! keep the namespaces reachable by path for the life of the pod, let container specs name them
//! without a pid (no pid-reuse hazard), and are what `delete` and ShutdownSandbox unmount.

use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use nix::mount::{mount, MsFlags};

use crate::error::{IoContext, Result};
use crate::pod::files::{remove_pins, PodPaths};

/// Pins `kinds` (names under /proc/<pid>/ns) of `pid` in a directory it creates (which must not
/// exist yet). All or nothing: on failure the directory and its pins are gone again.
pub fn pin(paths: &PodPaths, pid: i32, kinds: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let dir = paths.ns_dir();
    std::fs::DirBuilder::new().mode(0o700).create(&dir).with_path("create namespace pin directory", &dir)?;
    let made: Result<Vec<_>> =
        kinds.iter().map(|kind| pin_one(paths, pid, kind).map(|target| (kind.to_string(), target))).collect();
    if made.is_err() {
        // The directory is this call's: everything in it is a pin it made.
        let _ = remove_pins(paths);
    }
    made
}

fn pin_one(paths: &PodPaths, pid: i32, kind: &str) -> Result<PathBuf> {
    let source = PathBuf::from(format!("/proc/{pid}/ns/{kind}"));
    let target = paths.ns_pin(kind);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)
        .with_path("create namespace pin", &target)?;
    mount(Some(&source), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_path(&format!("bind {} on", source.display()), &target)?;
    Ok(target)
}
