//! Logs go to the `log` FIFO containerd opened in the bundle before `start`; containerd copies
//! them into its own log. Level: debug when containerd passed `-debug`, info otherwise
//! (`CORRAL_LOG` overrides with a tracing filter).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Without a reader on the FIFO, logs are dropped.
pub fn init(debug: bool, sandbox_id: &str, level: &str) {
    // containerd's -debug raises the configured level to debug.
    let filter = if debug {
        EnvFilter::new("debug")
    } else {
        EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"))
    };
    // Non-blocking: if containerd stops reading (restart), a full pipe drops lines instead of
    // stalling the pod's RPCs.
    let fifo = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open("log");
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_target(false);
    let _ = match fifo {
        Ok(file) => builder.with_writer(Mutex::new(file)).try_init(),
        Err(_) => builder.with_writer(std::io::sink).try_init(),
    };
    tracing::debug!(sandbox = sandbox_id, "logging to the bundle's log FIFO");
}
