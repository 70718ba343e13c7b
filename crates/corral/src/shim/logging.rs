//! Logs go to the `log` FIFO containerd opened in the bundle before `start`; containerd copies
//! them into its own log. Level: debug when containerd passed `-debug`, info otherwise
//! (`log.level` or `CORRAL_LOG` set a filter: a level, or `target=level` pairs).
//!
//! A node-mode server outlives any one pod's FIFO: it appends to a file of its own instead
//! (`/var/log/corral/node-<key>.log`, 0600, one old generation kept past 16 MiB).
//!
//! The filter is tracing-subscriber's `Targets`, not `EnvFilter`: EnvFilter's span and field
//! matching brings a regex engine (~240 KiB of code, measured with cargo-bloat), and the shim's
//! resident memory per pod is mostly its code pages.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Past this size a node server's log is moved to `<name>.1` when the server starts.
const LOG_FILE_MAX: u64 = 16 << 20;

/// Installs the global subscriber: the bundle's FIFO, or `file` for a node server. Without a
/// reader on the FIFO, logs are dropped.
pub fn init(debug: bool, sandbox_id: &str, level: &str, file: Option<&std::path::Path>) {
    // containerd's -debug raises the configured level to debug.
    let filter = match debug {
        true => Targets::new().with_default(LevelFilter::DEBUG),
        false => crate::config::parse_filter(level)
            .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO)),
    };
    // Non-blocking: if containerd stops reading (restart), a full pipe drops lines instead of
    // stalling the pod's RPCs.
    let fifo = match file {
        None => OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open("log"),
        Some(path) => open_log_file(path),
    };
    let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_target(false);
    let _ = match fifo {
        Ok(file) => {
            tracing_subscriber::registry().with(layer.with_writer(Mutex::new(file))).with(filter).try_init()
        }
        Err(_) => {
            tracing_subscriber::registry().with(layer.with_writer(std::io::sink)).with(filter).try_init()
        }
    };
    match file {
        None => tracing::debug!(sandbox = sandbox_id, "logging to the bundle's log FIFO"),
        Some(path) => tracing::debug!(file = %path.display(), "logging to a file"),
    }
}

fn open_log_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.len() > LOG_FILE_MAX) {
        let _ = std::fs::rename(path, path.with_extension("log.1"));
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}
