//! Namespace pins: bind mounts of the holder's `/proc/<pid>/ns/*` in a directory of the sandbox
//! bundle. They
//! keep the namespaces reachable by path for the life of the pod, let container specs name them
//! without a pid (no pid-reuse hazard), and are what `delete` and ShutdownSandbox unmount.

use std::fs::OpenOptions;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use crate::error::{IoContext, Result};
use crate::sys::mount::{remove_empty_dir, unmount_if_mounted};

/// Pins `kinds` (names under /proc/<pid>/ns) of `pid` in a directory it creates (which must not
/// exist yet). All or nothing: on failure the directory and its pins are gone again.
pub fn pin(dir: &Path, pid: i32, kinds: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    std::fs::DirBuilder::new().mode(0o700).create(dir).with_path("create namespace pin directory", dir)?;
    let made: Result<Vec<_>> =
        kinds.iter().map(|kind| pin_one(dir, pid, kind).map(|target| (kind.to_string(), target))).collect();
    if made.is_err() {
        // The directory is this call's: everything in it is a pin it made.
        let _ = unpin_all(dir);
    }
    made
}

fn pin_one(dir: &Path, pid: i32, kind: &str) -> Result<PathBuf> {
    let source = PathBuf::from(format!("/proc/{pid}/ns/{kind}"));
    let target = dir.join(kind);
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

/// Unmounts every namespace pin, then removes the pin files and their directory. A pin that
/// stays mounted keeps its file, and the directory.
pub fn unpin_all(dir: &Path) -> Result<()> {
    let mut first_err = None;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let pin = entry.path();
            let released = unmount_if_mounted(&pin).and_then(|()| match std::fs::remove_file(&pin) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_path("remove pin", &pin),
                _ => Ok(()),
            });
            if let Err(e) = released {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => remove_empty_dir(dir),
    }
}
