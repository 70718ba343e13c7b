//! Logs go to the `log` FIFO containerd opened in the bundle before `start`; containerd copies
//! them into its own log. Level: debug when containerd passed `-debug`, info otherwise
//! (`log.level` or `CORRAL_LOG` set a filter: a level, or `target=level` pairs).
//!
//! A node-mode server outlives any one pod's FIFO: it appends to a file of its own instead
//! (`/var/log/corral/node-<key>.log`, 0600), moved to `node-<key>.log.1` whenever it passes
//! 16 MiB, so a server that lives for months keeps at most two generations.
//!
//! The filter is tracing-subscriber's `Targets`, not `EnvFilter`: EnvFilter's span and field
//! matching brings a regex engine (~240 KiB of code, measured with cargo-bloat), and the shim's
//! resident memory per pod is mostly its code pages.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Past this size a node server's log is moved to `<name>.1`.
const LOG_FILE_MAX: u64 = 16 << 20;

/// Installs the global subscriber: the bundle's FIFO, or `file` for a node server. Without a
/// reader on the FIFO, logs are dropped.
pub fn init(debug: bool, sandbox_id: &str, level: &str, file: Option<&Path>) {
    // containerd's -debug raises the configured level to debug.
    let filter = match debug {
        true => Targets::new().with_default(LevelFilter::DEBUG),
        false => crate::config::parse_filter(level)
            .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO)),
    };
    let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_target(false);
    let _ = match file {
        // Non-blocking: if containerd stops reading (restart), a full pipe drops lines instead of
        // stalling the pod's RPCs.
        None => match OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open("log") {
            Ok(fifo) => tracing_subscriber::registry()
                .with(layer.with_writer(Mutex::new(fifo)))
                .with(filter)
                .try_init(),
            Err(_) => {
                tracing_subscriber::registry().with(layer.with_writer(std::io::sink)).with(filter).try_init()
            }
        },
        Some(path) => match RotatingFile::open(path, LOG_FILE_MAX) {
            Ok(log) => tracing_subscriber::registry().with(layer.with_writer(log)).with(filter).try_init(),
            Err(_) => {
                tracing_subscriber::registry().with(layer.with_writer(std::io::sink)).with(filter).try_init()
            }
        },
    };
    match file {
        None => tracing::debug!(sandbox = sandbox_id, "logging to the bundle's log FIFO"),
        Some(path) => tracing::debug!(file = %path.display(), "logging to a file"),
    }
}

/// A log file moved to `<name>.1` (replacing the older one) when a write would take it past
/// `max` bytes.
struct RotatingFile {
    path: PathBuf,
    max: u64,
    /// The open file and its size.
    file: Mutex<(File, u64)>,
}

impl RotatingFile {
    fn open(path: &Path, max: u64) -> std::io::Result<RotatingFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = Self::append(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile { path: path.to_path_buf(), max, file: Mutex::new((file, size)) })
    }

    fn append(path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    }
}

impl Write for &RotatingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A panic elsewhere while logging must not silence the log for good.
        let mut open = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if open.1 > 0 && open.1 + buf.len() as u64 > self.max {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            if std::fs::rename(&self.path, &old).is_ok() {
                if let Ok(file) = RotatingFile::append(&self.path) {
                    *open = (file, 0);
                }
            }
        }
        let n = open.0.write(buf)?;
        open.1 += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RotatingFile {
    type Writer = &'a RotatingFile;
    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_file_past_its_size_moves_to_dot_1() {
        let dir = std::env::temp_dir().join(format!("corral-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("node-abc.log");
        let log = RotatingFile::open(&path, 100).unwrap();
        for line in ["a".repeat(59), "b".repeat(59), "c".repeat(59)] {
            (&log).write_all(format!("{line}\n").as_bytes()).unwrap();
        }
        let old = std::fs::read_to_string(dir.join("node-abc.log.1")).unwrap();
        assert_eq!(old, format!("{}\n", "b".repeat(59)), "the previous generation");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{}\n", "c".repeat(59)));
        // Reopened (a new server): it appends and knows the size it starts from.
        drop(log);
        let log = RotatingFile::open(&path, 100).unwrap();
        (&log).write_all(format!("{}\n", "d".repeat(59)).as_bytes()).unwrap();
        assert!(std::fs::read_to_string(dir.join("node-abc.log.1")).unwrap().starts_with('c'));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
