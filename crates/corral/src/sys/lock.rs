//! Exclusive file locks (flock). The bundle lock (`<bundle>/corral.lock`) is held while a pod's
//! resources are released: `delete` can run twice, concurrently, or while the server is still
//! releasing after ShutdownSandbox (containerd starts it as soon as the reply arrives).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Held until dropped.
pub struct BundleLock {
    _file: File,
}

impl BundleLock {
    /// Blocks until the lock is ours. None when the bundle is gone (nothing left to release).
    pub fn acquire(bundle: &Path) -> std::io::Result<Option<BundleLock>> {
        Ok(lock_file(&bundle.join("corral.lock"))?.map(|file| BundleLock { _file: file }))
    }
}

/// Opens (creating it, 0600, never through a symlink) and exclusively flocks `path`, waiting for
/// the lock; the lock lasts as long as the returned file. None when its directory is gone.
pub fn lock_file(path: &Path) -> std::io::Result<Option<File>> {
    let file = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    loop {
        // SAFETY: flock on an fd we own, with an integer operation.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Some(file));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn excludes_a_second_holder_until_the_first_drops() {
        let dir = std::env::temp_dir().join(format!("corral-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = BundleLock::acquire(&dir).unwrap().unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let (d, i) = (dir.clone(), inside.clone());
        let second = std::thread::spawn(move || {
            let _lock = BundleLock::acquire(&d).unwrap().unwrap();
            i.fetch_add(1, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(inside.load(Ordering::SeqCst), 0, "the second waits");
        drop(first);
        second.join().unwrap();
        assert_eq!(inside.load(Ordering::SeqCst), 1);
        assert!(BundleLock::acquire(&dir.join("gone")).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
