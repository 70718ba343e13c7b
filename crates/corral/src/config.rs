//! corral's own settings. containerd 2.1 cannot pass handler options to a shim, so corral reads
//! a TOML file: `CORRAL_CONFIG`, else `/etc/corral/config.toml` (absent = defaults). Unknown keys
//! are errors naming the key.
//!
//! Where containerd does pass handler options (an `options` table under the handler, containerd
//! 2.4+; 2.1.9 breaks StartContainer with one), they arrive on `start`'s stdin as a
//! `runtimeoptions.v1.Options`: `ConfigPath` names a file to read instead of the default, and
//! otherwise the table itself comes as TOML text (`config_body`) in the same format as the file,
//! so a handler can carry its own settings:
//!
//! ```toml
//! [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral.options.pod]
//!   shm_size = "128Mi"
//! ```
//!
//! Later wins: defaults, the file, the handler's options, then the environment (containerd's
//! shim-manager `env`: `CORRAL_RUNC`, `CORRAL_SHM_SIZE`, `CORRAL_LOG`, `CORRAL_MODE`,
//! `CORRAL_NODE_LOG_DIR`). `start` keeps the options
//! in the sandbox bundle (`corral-options.json`) for the server and `delete`.
//!
//! ```toml
//! [runtime]
//! binary = "runc"              # OCI runtime, a name on PATH or a path; "builtin": corral-oci
//! root = "/run/corral/runc"    # its state root (one directory per containerd namespace below;
//!                              # the builtin runtime's default is /run/corral/oci)
//! [pod]
//! shm_size = "64Mi"            # each pod's /dev/shm
//! default_sysctls = true       # containerd's unprivileged-port and ping defaults
//! files_root = "/var/lib/corral/pods"  # pods' hostname/hosts/resolv.conf, on disk (not /run)
//! [log]
//! level = "info"               # a tracing filter; containerd's -debug raises it to debug
//! node_dir = "/var/log/corral" # node mode: where node servers write their logs
//! [cgroup]
//! driver = "auto"              # auto (from the path's shape), cgroupfs or systemd
//! [shim]
//! mode = "pod"                 # pod: a server per pod; node: one server for every pod
//! ```

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use tracing_subscriber::filter::{LevelFilter, Targets};

use crate::error::{Error, Result};

pub const DEFAULT_PATH: &str = "/etc/corral/config.toml";

/// Where corral keeps runc's state (`runtime.root`): one root per containerd namespace, on tmpfs,
/// stable across containerd restarts so `delete` can find containers without the server.
pub const DEFAULT_RUNC_ROOT: &str = "/run/corral/runc";

/// The `runtime.binary` (or `CORRAL_RUNC`) that selects corral's builtin runtime: the
/// `corral-oci` helper installed beside the shim, which speaks runc's command line.
pub const BUILTIN_RUNTIME: &str = "builtin";
pub const BUILTIN_HELPER: &str = "corral-oci";
/// The builtin runtime's state root when `runtime.root` is left at runc's default: its state
/// is libcontainer's, which runc cannot read, so a node that switches runtimes never mixes them.
pub const DEFAULT_BUILTIN_ROOT: &str = "/run/corral/oci";

/// Default root of the pods' file directories (`pod.files_root`).
pub const FILES_ROOT: &str = "/var/lib/corral/pods";

/// Where node-mode servers write their logs by default (`log.node_dir`): no pod's log FIFO
/// outlives a node server.
pub const NODE_LOG_DIR: &str = "/var/log/corral";

/// Default size of the pod's /dev/shm, as containerd's podsandbox controller uses.
pub const SHM_SIZE_KIB: u64 = 65536;

/// "67108864", "65536k", "64Mi", "1G" -> KiB (at least 4 KiB).
pub fn parse_size_kib(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let bytes = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => n,
        "k" | "ki" | "kb" => n.checked_mul(1 << 10)?,
        "m" | "mi" | "mb" => n.checked_mul(1 << 20)?,
        "g" | "gi" | "gb" => n.checked_mul(1 << 30)?,
        _ => return None,
    };
    (bytes >= 4096).then_some(bytes / 1024)
}

/// Parses a log filter: a level (`debug`) or `target=level` pairs (`corral=debug,info`). Every
/// part must name a level (a bare word would silently mean "that target at trace").
pub fn parse_filter(text: &str) -> Result<Targets, String> {
    for part in text.split(',') {
        let level = part.rsplit_once('=').map_or(part, |(_, level)| level);
        level.trim().parse::<LevelFilter>().map_err(|_| format!("{level:?} is not a level"))?;
    }
    text.parse::<Targets>().map_err(|e| e.to_string())
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub runtime: Runtime,
    pub pod: Pod,
    pub log: Log,
    pub cgroup: Cgroup,
    pub shim: Shim,
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
    /// Each pod's files go to `<files_root>/<namespace>/<sandbox id>`.
    pub files_root: PathBuf,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    pub level: String,
    /// Node mode: the directory of the node servers' log files.
    pub node_dir: PathBuf,
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

/// How corral's servers map to pods.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One server per pod: a crash or a bug costs one pod (the default).
    #[default]
    Pod,
    /// One server for every pod of a containerd namespace: a pod costs only its holder.
    Node,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s {
            "pod" => Ok(Mode::Pod),
            "node" => Ok(Mode::Node),
            other => Err(format!("{other:?} is not a mode (pod or node)")),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Shim {
    pub mode: Mode,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime { binary: "runc".into(), root: PathBuf::from(DEFAULT_RUNC_ROOT) }
    }
}

impl Runtime {
    pub fn is_builtin(&self) -> bool {
        self.binary == BUILTIN_RUNTIME
    }

    /// The program corral runs for container operations: for the builtin runtime the helper in
    /// this executable's directory (containerd finds the shim by its path, and the helper is
    /// installed with it), else `binary` as configured (a name on PATH or a path).
    pub fn program(&self) -> PathBuf {
        if !self.is_builtin() {
            return PathBuf::from(&self.binary);
        }
        let dir = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
        dir.unwrap_or_default().join(BUILTIN_HELPER)
    }

    /// The state root (one directory per containerd namespace goes below it).
    pub fn state_root(&self) -> PathBuf {
        if self.is_builtin() && self.root == Path::new(DEFAULT_RUNC_ROOT) {
            return PathBuf::from(DEFAULT_BUILTIN_ROOT);
        }
        self.root.clone()
    }
}

impl Default for Pod {
    fn default() -> Self {
        Pod { shm_size: "64Mi".into(), default_sysctls: true, files_root: PathBuf::from(FILES_ROOT) }
    }
}

impl Default for Log {
    fn default() -> Self {
        Log { level: "info".into(), node_dir: PathBuf::from(NODE_LOG_DIR) }
    }
}

impl Config {
    /// Parses a config file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config> {
        let origin_name = origin.display().to_string();
        let config = from_table(parse_table(text, &origin_name)?, &origin_name)?;
        config.validate(origin)?;
        Ok(config)
    }

    /// The file (if any), then the handler's options (if any), then the environment.
    pub fn load(options: Option<&RuntimeOptions>) -> Result<Config> {
        let from_options =
            options.map(|o| PathBuf::from(&o.config_path)).filter(|p| !p.as_os_str().is_empty());
        let explicit = from_options.or_else(|| std::env::var_os("CORRAL_CONFIG").map(PathBuf::from));
        let path = explicit.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
        let mut table = match std::fs::read_to_string(&path) {
            Ok(text) => parse_table(&text, &path.display().to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => toml::Table::new(),
            Err(e) => return Err(Error::io(format!("read config {}", path.display()), e)),
        };
        if let Some(body) = options.map(|o| o.config_body.as_str()).filter(|b| !b.trim().is_empty()) {
            let origin = "runtime options (the handler's options table)";
            let overlay = parse_table(body, origin)?;
            merge(&mut table, overlay);
        }
        let mut config = from_table(table, &path.display().to_string())?;
        if let Ok(binary) = std::env::var("CORRAL_RUNC") {
            config.runtime.binary = binary;
        }
        if let Ok(size) = std::env::var("CORRAL_SHM_SIZE") {
            config.pod.shm_size = size;
        }
        if let Ok(level) = std::env::var("CORRAL_LOG") {
            config.log.level = level;
        }
        if let Some(dir) = std::env::var_os("CORRAL_NODE_LOG_DIR") {
            config.log.node_dir = PathBuf::from(dir);
        }
        if let Ok(mode) = std::env::var("CORRAL_MODE") {
            config.shim.mode =
                mode.parse().map_err(|e| Error::invalid(format!("environment CORRAL_MODE: {e}")))?;
        }
        config.validate(&path)?;
        Ok(config)
    }

    fn validate(&self, origin: &Path) -> Result<()> {
        if parse_size_kib(&self.pod.shm_size).is_none() {
            return Err(Error::invalid(format!(
                "config {}: pod.shm_size: {:?} is not a size (e.g. 65536k, 64Mi, 1G)",
                origin.display(),
                self.pod.shm_size
            )));
        }
        if let Err(e) = parse_filter(&self.log.level) {
            return Err(Error::invalid(format!(
                "config {}: log.level: {:?} is not a level or target=level list: {e}",
                origin.display(),
                self.log.level
            )));
        }
        if !self.pod.files_root.is_absolute() || self.pod.files_root.parent().is_none() {
            return Err(Error::invalid(format!(
                "config {}: pod.files_root: {:?} is not an absolute directory below /",
                origin.display(),
                self.pod.files_root
            )));
        }
        if !self.log.node_dir.is_absolute() {
            return Err(Error::invalid(format!(
                "config {}: log.node_dir: {:?} is not an absolute directory",
                origin.display(),
                self.log.node_dir
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
        parse_size_kib(&self.pod.shm_size).unwrap_or(SHM_SIZE_KIB)
    }
}

/// Parses TOML into a table, checking it against corral's schema so that an unknown key is named
/// with the place it came from.
fn parse_table(text: &str, origin: &str) -> Result<toml::Table> {
    let table: toml::Table = toml::from_str(text)
        .map_err(|e: toml::de::Error| Error::invalid(format!("config {origin}: {}", e.message())))?;
    from_table(table.clone(), origin)?;
    Ok(table)
}

/// The settings of a TOML table; an unknown key or a wrong type is named with `origin`.
fn from_table(table: toml::Table, origin: &str) -> Result<Config> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| Error::invalid(format!("config {origin}: {}", e.message())))
}

/// Lays `overlay` over `base`, key by key in nested tables.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(over)) => merge(inner, over),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// containerd's `runtimeoptions.v1.Options`: what a handler's `options` table becomes for a shim
/// that is not runc.
#[derive(Clone, PartialEq, prost::Message, serde::Serialize, Deserialize)]
pub struct RuntimeOptions {
    #[prost(string, tag = "1")]
    #[serde(default)]
    pub type_url: String,
    #[prost(string, tag = "2")]
    #[serde(default)]
    pub config_path: String,
    #[prost(string, tag = "3")]
    #[serde(default)]
    pub config_body: String,
}

/// Where `start` keeps the handler's options in the sandbox bundle.
pub const OPTIONS_FILE: &str = "corral-options.json";

impl RuntimeOptions {
    /// Decodes the options `start` received; `None` for other kinds of options (runc's, which
    /// carry nothing for corral).
    pub fn from_any(type_url: &str, value: &[u8]) -> Result<Option<RuntimeOptions>> {
        if !type_url.ends_with("runtimeoptions.v1.Options") {
            return Ok(None);
        }
        let options = <RuntimeOptions as prost::Message>::decode(value)
            .map_err(|e| Error::invalid(format!("runtime options: not a runtimeoptions.v1.Options: {e}")))?;
        if !options.config_path.is_empty() && !Path::new(&options.config_path).is_absolute() {
            return Err(Error::invalid(format!(
                "runtime options: ConfigPath {:?} is not an absolute path",
                options.config_path
            )));
        }
        Ok(Some(options))
    }

    /// Keeps the options in `bundle` for the server and `delete`.
    pub fn save(&self, bundle: &Path) -> Result<()> {
        let path = bundle.join(OPTIONS_FILE);
        let data = serde_json::to_vec(self).expect("options serialize");
        std::fs::write(&path, data).map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    /// The options `start` kept in `bundle`, if any.
    pub fn saved(bundle: &Path) -> Result<Option<RuntimeOptions>> {
        let path = bundle.join(OPTIONS_FILE);
        match std::fs::read(&path) {
            Ok(data) => serde_json::from_slice(&data)
                .map(Some)
                .map_err(|e| Error::invalid(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Loads the configuration once for this process, with the handler's options if containerd
/// passed some; later calls return the same result.
pub fn init(options: Option<&RuntimeOptions>) -> Result<&'static Config> {
    if let Some(c) = CONFIG.get() {
        return Ok(c);
    }
    let loaded = Config::load(options)?;
    Ok(CONFIG.get_or_init(|| loaded))
}

/// The process's configuration (defaults if [`init`] was never called).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| Config::load(None).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shm_sizes() {
        assert_eq!(parse_size_kib("67108864"), Some(65536));
        assert_eq!(parse_size_kib("65536k"), Some(65536));
        assert_eq!(parse_size_kib("64Mi"), Some(65536));
        assert_eq!(parse_size_kib("1G"), Some(1 << 20));
        assert_eq!(parse_size_kib("12"), None, "below a page");
        assert_eq!(parse_size_kib("64 lots"), None);
        assert_eq!(parse_size_kib(""), None);
    }

    #[test]
    fn builtin_runtime_is_the_helper_beside_this_executable_with_its_own_root() {
        let builtin = Runtime { binary: BUILTIN_RUNTIME.into(), ..Default::default() };
        let exe = std::env::current_exe().unwrap();
        assert_eq!(builtin.program(), exe.parent().unwrap().join("corral-oci"));
        assert_eq!(builtin.state_root(), PathBuf::from(DEFAULT_BUILTIN_ROOT));
        let rooted = Runtime { root: "/srv/oci".into(), ..builtin };
        assert_eq!(rooted.state_root(), PathBuf::from("/srv/oci"), "a configured root is kept");
        let runc = Runtime::default();
        assert_eq!(
            (runc.program(), runc.state_root()),
            (PathBuf::from("runc"), PathBuf::from(DEFAULT_RUNC_ROOT))
        );
    }

    #[test]
    fn parses_every_key_and_defaults_the_rest() {
        let c = Config::parse(
            "[runtime]\nbinary = \"crun\"\n[pod]\nshm_size = \"16Mi\"\ndefault_sysctls = false\nfiles_root = \"/srv/pods\"\n[cgroup]\ndriver = \"systemd\"\n",
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(c.runtime.binary, "crun");
        assert_eq!(c.runtime.root, PathBuf::from("/run/corral/runc"));
        assert_eq!(c.shm_size_kib(), 16384);
        assert!(!c.pod.default_sysctls);
        assert_eq!(c.pod.files_root, PathBuf::from("/srv/pods"));
        assert_eq!(Config::default().pod.files_root, PathBuf::from("/var/lib/corral/pods"));
        assert_eq!(c.cgroup.driver, Driver::Systemd);
        assert_eq!(c.log.level, "info");
        assert_eq!(c.shim.mode, Mode::Pod);
        assert_eq!(Config::parse("[shim]\nmode = \"node\"\n", Path::new("t")).unwrap().shim.mode, Mode::Node);
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
        assert!(err("[pod]\nfiles_root = \"pods\"\n").contains("pod.files_root"));
        assert!(err("[pod]\nfiles_root = \"/\"\n").contains("pod.files_root"));
        assert!(err("[log]\nlevel = \"loud\"\n").contains("log.level"));
        assert!(err("[shim]\nmode = \"cluster\"\n").contains("cluster"));
        assert!(err("[log]\nnode_dir = \"logs\"\n").contains("log.node_dir"));
        assert_eq!("node".parse::<Mode>(), Ok(Mode::Node));
        assert_eq!("Node".parse::<Mode>(), Err("\"Node\" is not a mode (pod or node)".into()));
        assert!(Config::parse("[log]\nlevel = \"corral=debug,info\"\n", Path::new("t")).is_ok());
    }

    fn options_any(config_path: &str, config_body: &str) -> Vec<u8> {
        let o = RuntimeOptions {
            type_url: String::new(),
            config_path: config_path.into(),
            config_body: config_body.into(),
        };
        prost::Message::encode_to_vec(&o)
    }

    /// What containerd 2.4 sends for a handler with an options table, decoded and laid over the file.
    #[test]
    fn handler_options_override_the_file() {
        let dir = std::env::temp_dir().join(format!("corral-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(
            &file,
            "[pod]\nshm_size = \"16Mi\"\ndefault_sysctls = false\n[log]\nlevel = \"debug\"\n",
        )
        .unwrap();

        // ConfigPath: a file of the handler's own.
        let o =
            RuntimeOptions::from_any("runtimeoptions.v1.Options", &options_any(file.to_str().unwrap(), ""))
                .unwrap()
                .unwrap();
        let c = Config::load(Some(&o)).unwrap();
        assert_eq!((c.shm_size_kib(), c.pod.default_sysctls, c.log.level.as_str()), (16384, false, "debug"));

        // config_body: the options table as TOML, over the file, key by key.
        let body = "[pod]\nshm_size = \"128Mi\"\n";
        let o =
            RuntimeOptions { config_path: String::new(), config_body: body.into(), type_url: String::new() };
        let base = Config::load(None).unwrap();
        let c = Config::load(Some(&o)).unwrap();
        assert_eq!(c.shm_size_kib(), 131072);
        assert_eq!(c.pod.default_sysctls, base.pod.default_sysctls, "untouched keys keep the file's value");

        // Errors name where the bad key came from.
        let o = RuntimeOptions { config_body: "[pod]\nshm = 1\n".into(), ..o };
        let err = Config::load(Some(&o)).unwrap_err().to_string();
        assert!(err.contains("runtime options") && err.contains("unknown field `shm`"), "{err}");
        let err = RuntimeOptions::from_any("runtimeoptions.v1.Options", &options_any("rel.toml", ""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ConfigPath") && err.contains("absolute"), "{err}");
        assert!(RuntimeOptions::from_any("runtimeoptions.v1.Options", &[0xff]).is_err());
        assert_eq!(RuntimeOptions::from_any("containerd.runc.v1.Options", &[1, 2]).unwrap(), None);

        // start keeps them for the server and delete.
        o.save(&dir).unwrap();
        assert_eq!(RuntimeOptions::saved(&dir).unwrap(), Some(o));
        assert_eq!(RuntimeOptions::saved(&dir.join("none")).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
