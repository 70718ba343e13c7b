//! Log lines the way runc writes them with `--log-format json`: corral's client reads the last
//! line whose `level` is `error` and quotes its `msg`.
//!
//! libcontainer's own diagnostics (tracing events, also from the container's intermediate and
//! init processes, which inherit this process's memory through clone) go to the same place as
//! plain text lines, at the level `CORRAL_OCI_LOG` names (default `error`: at `warn` every
//! operation logs the cgroup v1 controllers it does not use). This process is
//! single-threaded, so the lock around the writer cannot be held by a thread that a clone lost.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

pub struct Sink {
    file: Option<File>,
}

impl Sink {
    pub fn stderr() -> Sink {
        Sink { file: None }
    }

    /// Appends to `path` (runc appends too); stderr when there is none or it cannot be opened.
    pub fn open(path: Option<&Path>) -> Sink {
        let file = path.and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok());
        Sink { file }
    }

    /// The first error libcontainer's processes logged, as text: their errors reach this
    /// process as the top-level message alone ("failed to prepare rootfs"), while the line
    /// logged where it happened names the cause (the mount, the path, the errno).
    pub fn first_logged_error(path: &Path) -> Option<String> {
        let text = std::fs::read_to_string(path).ok()?;
        text.lines()
            .filter(|l| !l.starts_with('{'))
            .find_map(|l| l.split_once(" ERROR ").map(|(_, rest)| rest.trim().to_string()))
    }

    pub fn error(&self, message: &str) {
        let line = serde_json::json!({ "level": "error", "msg": message }).to_string();
        self.write_line(&line);
    }

    fn write_line(&self, line: &str) {
        let line = format!("{line}\n");
        match &self.file {
            Some(file) => {
                let _ = (&*file).write_all(line.as_bytes());
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    }

    pub fn install_tracing(&self) {
        let level = std::env::var("CORRAL_OCI_LOG")
            .ok()
            .and_then(|l| l.parse::<tracing::Level>().ok())
            .unwrap_or(tracing::Level::ERROR);
        let builder = tracing_subscriber::fmt().with_ansi(false).with_max_level(level).with_target(false);
        let _ = match self.file.as_ref().and_then(|f| f.try_clone().ok()) {
            Some(file) => builder.with_writer(Mutex::new(file)).try_init(),
            None => builder.with_writer(std::io::stderr).try_init(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_are_runc_json() {
        let dir = std::env::temp_dir().join(format!("corral-oci-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.json");
        std::fs::write(&path, "{\"level\":\"info\",\"msg\":\"before\"}\n").unwrap();
        Sink::open(Some(&path)).error("container \"x\" does not exist");
        let text = std::fs::read_to_string(&path).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["level"], "error");
        assert_eq!(last["msg"], "container \"x\" does not exist");
        assert!(text.starts_with("{\"level\":\"info\""), "appends: {text}");
        assert_eq!(Sink::first_logged_error(&path), None);
        std::fs::write(
            &path,
            "2026-12-01T23:36:23Z  WARN cgroup hugetlb not supported\n2026-12-01T23:36:23Z ERROR failed to mount /proc err=EPERM\n2026-12-01T23:36:23Z ERROR failed to prepare rootfs\n",
        )
        .unwrap();
        assert_eq!(Sink::first_logged_error(&path).as_deref(), Some("failed to mount /proc err=EPERM"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
