//! Logs go to the `log` FIFO containerd opened in the bundle before `start`; containerd copies
//! them into its own log. Level: debug when containerd passed `-debug`, info otherwise
//! (`log.level` or `CORRAL_LOG` set a filter: a level, or `target=level` pairs).
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

/// Installs the global subscriber. Without a reader on the FIFO, logs are dropped.
pub fn init(debug: bool, sandbox_id: &str, level: &str) {
    // containerd's -debug raises the configured level to debug.
    let filter = match debug {
        true => Targets::new().with_default(LevelFilter::DEBUG),
        false => crate::config::parse_filter(level)
            .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO)),
    };
    // Non-blocking: if containerd stops reading (restart), a full pipe drops lines instead of
    // stalling the pod's RPCs.
    let fifo = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open("log");
    let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_target(false);
    let _ = match fifo {
        Ok(file) => {
            tracing_subscriber::registry().with(layer.with_writer(Mutex::new(file))).with(filter).try_init()
        }
        Err(_) => {
            tracing_subscriber::registry().with(layer.with_writer(std::io::sink)).with(filter).try_init()
        }
    };
    tracing::debug!(sandbox = sandbox_id, "logging to the bundle's log FIFO");
}
