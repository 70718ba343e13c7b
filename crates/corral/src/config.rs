//! corral's own settings. containerd 2.1 cannot pass handler options to a shim, so corral reads
//! a TOML file: `CORRAL_CONFIG`, else `/etc/corral/config.toml` (absent = defaults). Unknown keys
//! are errors naming the key. The environment (containerd's shim-manager `env`) overrides the
//! file: `CORRAL_RUNC`, `CORRAL_SHM_SIZE`, `CORRAL_LOG`.
//!
//! ```toml
//! [runtime]
//! binary = "runc"              # OCI runtime, a name on PATH or a path
//! root = "/run/corral/runc"    # its state root (one directory per containerd namespace below)
//! [pod]
//! shm_size = "64Mi"            # each pod's /dev/shm
//! default_sysctls = true       # containerd's unprivileged-port and ping defaults
//! [log]
//! level = "info"               # a tracing filter; containerd's -debug raises it to debug
//! [cgroup]
//! driver = "auto"              # auto (from the path's shape), cgroupfs or systemd
//! ```

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::error::{Error, Result};

pub const DEFAULT_PATH: &str = "/etc/corral/config.toml";

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub runtime: Runtime,
    pub pod: Pod,
    pub log: Log,
    pub cgroup: Cgroup,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Runtime {
    pub binary: String,
    pub root: PathBuf,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Pod {
    pub shm_size: String,
    pub default_sysctls: bool,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    pub level: String,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    #[default]
    Auto,
    Cgroupfs,
    Systemd,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Cgroup {
    pub driver: Driver,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime { binary: "runc".into(), root: PathBuf::from(crate::task::runc::DEFAULT_ROOT) }
    }
}

impl Default for Pod {
    fn default() -> Self {
        Pod { shm_size: "64Mi".into(), default_sysctls: true }
    }
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into() }
    }
}

impl Config {
    /// Parses a config file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config> {
        let config: Config = toml::from_str(text)
            .map_err(|e| Error::invalid(format!("config {}: {}", origin.display(), e.message())))?;
        config.validate(origin)?;
        Ok(config)
    }

    /// The file (if any), then the environment.
    pub fn load() -> Result<Config> {
        let explicit = std::env::var_os("CORRAL_CONFIG").map(PathBuf::from);
        let path = explicit.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
        let mut config = match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text, &path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => Config::default(),
            Err(e) => return Err(Error::io(format!("read config {}", path.display()), e)),
        };
        if let Ok(binary) = std::env::var("CORRAL_RUNC") {
            config.runtime.binary = binary;
        }
        if let Ok(size) = std::env::var("CORRAL_SHM_SIZE") {
            config.pod.shm_size = size;
        }
        if let Ok(level) = std::env::var("CORRAL_LOG") {
            config.log.level = level;
        }
        config.validate(&path)?;
        Ok(config)
    }

    fn validate(&self, origin: &Path) -> Result<()> {
        if crate::pod::files::parse_size_kib(&self.pod.shm_size).is_none() {
            return Err(Error::invalid(format!(
                "config {}: pod.shm_size: {:?} is not a size (e.g. 65536k, 64Mi, 1G)",
                origin.display(),
                self.pod.shm_size
            )));
        }
        if self.runtime.binary.is_empty() || !self.runtime.root.is_absolute() {
            return Err(Error::invalid(format!(
                "config {}: runtime.binary must be set and runtime.root absolute",
                origin.display()
            )));
        }
        Ok(())
    }

    pub fn shm_size_kib(&self) -> u64 {
        crate::pod::files::parse_size_kib(&self.pod.shm_size).unwrap_or(crate::pod::files::SHM_SIZE_KIB)
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Loads the configuration once for this process; later calls return the same result.
pub fn init() -> Result<&'static Config> {
    if let Some(c) = CONFIG.get() {
        return Ok(c);
    }
    let loaded = Config::load()?;
    Ok(CONFIG.get_or_init(|| loaded))
}

/// The process's configuration (defaults if [`init`] was never called).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| Config::load().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key_and_defaults_the_rest() {
        let c = Config::parse(
            "[runtime]\nbinary = \"crun\"\n[pod]\nshm_size = \"16Mi\"\ndefault_sysctls = false\n[cgroup]\ndriver = \"systemd\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(c.runtime.binary, "crun");
        assert_eq!(c.runtime.root, PathBuf::from("/run/corral/runc"));
        assert_eq!(c.shm_size_kib(), 16384);
        assert!(!c.pod.default_sysctls);
        assert_eq!(c.cgroup.driver, Driver::Systemd);
        assert_eq!(c.log.level, "info");
        assert_eq!(Config::parse("", Path::new("t.toml")).unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = |t: &str| Config::parse(t, Path::new("/etc/corral/config.toml")).unwrap_err().to_string();
        assert!(
            err("[pod]\nshm = \"1G\"\n").contains("unknown field `shm`"),
            "{}",
            err("[pod]\nshm = \"1G\"\n")
        );
        assert!(err("[runtimes]\n").contains("unknown field `runtimes`"));
        assert!(err("[pod]\nshm_size = \"lots\"\n").contains("pod.shm_size"));
        assert!(err("[cgroup]\ndriver = \"magic\"\n").contains("magic"));
        assert!(err("[runtime]\nroot = \"relative\"\n").contains("runtime.root"));
    }
}
