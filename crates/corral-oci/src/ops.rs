//! One libcontainer call per subcommand, with runc's semantics where corral relies on them.

use std::error::Error;
use std::path::{Path, PathBuf};

use libcgroups::common::{
    create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt,
};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::LinuxResources;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;

use crate::args::{Command, Global};
use crate::spec;

pub fn run(global: &Global, command: Command) -> Result<(), String> {
    match command {
        Command::Create { id, bundle, pid_file, console_socket } => {
            create(global, &id, &bundle, pid_file, console_socket).map_err(|e| chain(&*e))
        }
        Command::Exec { id, process, pid_file, console_socket } => {
            crate::exec::run(global, &id, &process, pid_file, console_socket).map_err(|e| chain(&*e))
        }
        Command::Start { id } => load(global, &id)?.start().map_err(|e| chain(&e)),
        Command::Kill { id, signal, all } => {
            let signal = parse_signal(&signal)?;
            load(global, &id)?.kill(signal, all).map_err(|e| chain(&e))
        }
        Command::Delete { id, force } => delete(global, &id, force),
        Command::Pause { id } => load(global, &id)?.pause().map_err(|e| chain(&e)),
        Command::Resume { id } => load(global, &id)?.resume().map_err(|e| chain(&e)),
        Command::Update { id, resources } => update(global, &id, &resources),
        Command::Ps { id } => ps(global, &id),
    }
}

pub type Failure = Box<dyn Error>;

/// The container's init, created and waiting for `start`; it inherits this process's fds 0-2
/// (the container's stdio, as corral hands them to runc) and becomes a child of this process,
/// so it is reparented to corral (a subreaper) when this process exits, as runc's init is.
fn create(
    global: &Global,
    id: &str,
    bundle: &Path,
    pid_file: Option<PathBuf>,
    console_socket: Option<PathBuf>,
) -> Result<(), Failure> {
    let config = spec::read(bundle)?;
    let v2 = cgroup_v2();
    spec::refuse_unsupported(&config, global.systemd_cgroup, v2)?;
    let devices = spec::device_rules(&config)?;
    if v2 && !global.systemd_cgroup {
        make_cgroup_parents(&config)?;
    }
    make_root(&global.root)?;
    // Kept open until the container's init has joined its namespaces.
    let (bundle, _namespace_files) = match userns_bundle(bundle, config)? {
        Some((adapted, files)) => (adapted, files),
        None => (bundle.to_path_buf(), Vec::new()),
    };
    ContainerBuilder::new(id.to_string(), SyscallType::Linux)
        .with_root_path(&global.root)?
        .with_pid_file(pid_file)?
        .with_console_socket(console_socket)
        .validate_id()?
        .as_init(&bundle)
        // libcontainer's default is systemd's cgroup manager; corral says which it wants.
        .with_systemd(global.systemd_cgroup)
        .with_detach(true)
        .build()?;
    if global.systemd_cgroup && v2 {
        if let Err(e) = systemd_v2_devices(&devices, id, &global.root) {
            // Never leave a container without its device rules: remove it.
            if let Ok(mut container) = Container::load(global.root.join(id)) {
                let _ = container.delete(true);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// libcgroups' v2 manager creates each missing directory of a container's cgroup path with a
/// check-then-mkdir, so two containers started at once under a parent neither made (containerd's
/// `/k8s.io` for pods without a cgroup parent) race, and the loser fails with EEXIST. The
/// parents are made here first, where an existing one is no error.
fn make_cgroup_parents(config: &serde_json::Value) -> Result<(), Failure> {
    let Some(path) = config.pointer("/linux/cgroupsPath").and_then(serde_json::Value::as_str) else {
        return Ok(());
    };
    let Some(parent) = Path::new(path).parent().filter(|p| p.is_absolute() && *p != Path::new("/")) else {
        return Ok(());
    };
    let relative = parent.strip_prefix("/")?;
    if !relative.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        return Err(format!("config.json: linux.cgroupsPath {path:?}: not a plain path").into());
    }
    let dir = Path::new("/sys/fs/cgroup").join(relative);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create cgroup {}: {e}", dir.display()))?;
    Ok(())
}

fn cgroup_v2() -> bool {
    matches!(libcgroups::common::get_cgroup_setup(), Ok(libcgroups::common::CgroupSetup::Unified))
}

/// On cgroup v2 with systemd's driver, libcgroups 0.7 gives the container's scope its
/// resources but no device rules (its cgroupfs manager attaches the BPF device program; its
/// systemd manager does not), which would let a container with CAP_MKNOD reach any host device.
/// runc attaches the program in both cases; so does this, to the scope systemd made, while the
/// init still waits for `start`.
fn systemd_v2_devices(
    devices: &Option<Vec<libcontainer::oci_spec::runtime::LinuxDeviceCgroup>>,
    id: &str,
    root: &Path,
) -> Result<(), Failure> {
    let pid = Container::load(root.join(id))?.pid().ok_or("the created container has no pid")?;
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let relative = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| format!("no cgroup v2 entry in /proc/{pid}/cgroup"))?;
    let dir = Path::new("/sys/fs/cgroup").join(relative.trim_start_matches('/'));
    libcgroups::v2::devices::Devices::apply_devices(&dir, devices)
        .map_err(|e| format!("device rules for {}: {}", dir.display(), chain(&e)))?;
    Ok(())
}

/// Where the bundle's spec lives for a container that joins a user namespace by path, with its
/// other namespace files open in this process; `None` for other containers.
///
/// libcontainer joins the user namespace first and opens every other namespace file only
/// then, as the namespace's root, which may not search the host-root-owned directories above
/// corral's pins (in containerd's sandbox bundle): EACCES. runc opens them
/// all before it joins any. The same here: this process opens them as the host's root, and
/// the spec names them as `/proc/self/fd/N`, which the intermediate and init processes (clones
/// of this one, with copies of its fd table) open without a path walk. The adapted spec goes
/// to `<bundle>/corral-oci/config.json` with the root made absolute; the bundle's own
/// config.json stays as corral wrote it.
fn userns_bundle(
    bundle: &Path,
    mut spec: serde_json::Value,
) -> Result<Option<(PathBuf, Vec<std::fs::File>)>, Failure> {
    if !spec::joins_user_namespace(&spec) {
        return Ok(None);
    }
    let files = open_namespaces_by_fd(&mut spec, bundle)?;
    let adapted = bundle.join("corral-oci");
    let _ = std::fs::remove_dir_all(&adapted);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&adapted)
            .map_err(|e| format!("create {}: {e}", adapted.display()))?;
    }
    let out = adapted.join("config.json");
    std::fs::write(&out, spec.to_string()).map_err(|e| format!("write {}: {e}", out.display()))?;
    Ok(Some((adapted, files)))
}

/// Opens every namespace file the spec names but the user namespace's, as this process (the
/// host's root), and names each by its fd (`spec::name_namespaces_by_fd`). The files must stay
/// open until the container's processes have joined the namespaces.
pub fn open_namespaces_by_fd(
    spec: &mut serde_json::Value,
    bundle: &Path,
) -> Result<Vec<std::fs::File>, String> {
    let mut files = Vec::new();
    spec::name_namespaces_by_fd(spec, bundle, |kind, path| {
        let file = std::fs::File::open(path).map_err(|e| format!("open {kind} namespace {path}: {e}"))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        files.push(file);
        Ok(fd)
    })?;
    Ok(files)
}

/// As `runc delete`: a container whose state is gone (or was never written, after a create
/// that failed early) only has its directory removed; with `force` that is success.
fn delete(global: &Global, id: &str, force: bool) -> Result<(), String> {
    let dir = global.root.join(id);
    if !dir.join("state.json").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        return if force { Ok(()) } else { Err(format!("container {id:?} does not exist")) };
    }
    load(global, id)?.delete(force).map_err(|e| chain(&e))
}

fn update(global: &Global, id: &str, resources: &Path) -> Result<(), String> {
    let text = if resources == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("read resources from stdin: {e}"))?
    } else {
        std::fs::read_to_string(resources).map_err(|e| format!("read {}: {e}", resources.display()))?
    };
    let resources: LinuxResources = serde_json::from_str(&text)
        .map_err(|e| format!("resources: not an OCI LinuxResources document: {e}"))?;
    let manager = cgroup_manager(global, id)?;
    let options = ControllerOpt {
        resources: &resources,
        disable_oom_killer: false,
        oom_score_adj: None,
        freezer_state: None,
    };
    manager.apply(&options).map_err(|e| chain(&e))
}

/// The host pids of the container's processes, as a JSON array (runc's `ps --format json`).
fn ps(global: &Global, id: &str) -> Result<(), String> {
    let pids: Vec<i32> = cgroup_manager(global, id)?
        .get_all_pids()
        .map_err(|e| chain(&e))?
        .iter()
        .map(|p| p.as_raw())
        .collect();
    println!("{}", serde_json::to_string(&pids).expect("a list of numbers serializes"));
    Ok(())
}

fn cgroup_manager(global: &Global, id: &str) -> Result<AnyCgroupManager, String> {
    let container = load(global, id)?;
    let spec = container.spec().map_err(|e| chain(&e))?;
    create_cgroup_manager(CgroupConfig {
        cgroup_path: spec.cgroup_path,
        systemd_cgroup: container.systemd(),
        container_name: id.to_string(),
    })
    .map_err(|e| chain(&e))
}

pub fn load(global: &Global, id: &str) -> Result<Container, String> {
    let dir = global.root.join(id);
    if !dir.join("state.json").exists() {
        return Err(format!("container {id:?} does not exist"));
    }
    let mut container = Container::load(dir).map_err(|e| chain(&e))?;
    if started_by_its_caller(&container) {
        // In memory only: operations that change the state save it, and a load that wrote
        // would race another corral-oci reading state.json at the same moment.
        container.set_status(ContainerStatus::Running);
    }
    Ok(container)
}

/// corral starts a created container itself, as runc's `start` would: it sends the init the
/// start message on `notify.sock` and removes the socket (its `task::runc::Runc::start`). A
/// created container whose init lives and whose socket is gone has therefore been started;
/// libcontainer, which saves `running` only in its own `start`, would still call it created.
fn started_by_its_caller(container: &Container) -> bool {
    container.status() == ContainerStatus::Created
        && !container.root.join(libcontainer::notify_socket::NOTIFY_FILE).exists()
}

fn make_root(root: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| format!("create state root {}: {e}", root.display()))?;
    Ok(())
}

/// A number or a name, as runc's `kill` takes it.
fn parse_signal(text: &str) -> Result<Signal, String> {
    let parsed = match text.parse::<i32>() {
        Ok(number) => Signal::try_from(number).map_err(|e| e.to_string()),
        Err(_) => Signal::try_from(text).map_err(|e| e.to_string()),
    };
    parsed.map_err(|e| format!("kill: {e}"))
}

/// libcontainer's init reports a failed chdir or exec by the call alone ("failed to chdir
/// e=ENOTDIR"); runc names the path. Adds the spec's `process.cwd` or `process.args[0]` when the
/// message is about one of them.
pub fn with_process_context(message: String, bundle: &Path) -> String {
    let spec = std::fs::read_to_string(bundle.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    match spec.as_ref().and_then(|s| process_context(&message, &s["process"])) {
        Some(context) => format!("{message}: {context}"),
        None => message,
    }
}

/// What `with_process_context` adds. Every failure of the container's init says "exec process
/// failed" (libcontainer's name for that process), so only the exec call's own words
/// (`execvp`, `executable`) point at the program.
fn process_context(message: &str, process: &serde_json::Value) -> Option<String> {
    if message.contains("chdir") {
        return process["cwd"].as_str().map(|cwd| format!("process.cwd {cwd:?}"));
    }
    let about_the_program = message.contains("execvp") || message.contains("executable");
    let arg0 = process["args"][0].as_str().filter(|a| about_the_program && !message.contains(*a))?;
    Some(format!("process.args[0] {arg0:?}"))
}

/// The error and its causes, each once: libcontainer's errors are often `transparent`, so a
/// cause's text may already be part of its parent's.
fn chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_number_or_name() {
        // Signal has no PartialEq; its Debug names the signal.
        let name = |s: Signal| format!("{s:?}");
        assert_eq!(name(parse_signal("9").unwrap()), "Signal(SIGKILL)");
        assert_eq!(name(parse_signal("TERM").unwrap()), "Signal(SIGTERM)");
        assert!(parse_signal("SIGNOPE").unwrap_err().starts_with("kill: invalid signal"));
        assert!(parse_signal("999").is_err());
    }

    #[test]
    fn causes_are_kept_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "mount /proc")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = Outer(std::io::Error::from_raw_os_error(2));
        assert_eq!(chain(&err), "mount /proc: No such file or directory (os error 2)");
    }

    #[test]
    fn only_a_failed_chdir_or_exec_gets_the_process_named() {
        let process = serde_json::json!({"cwd": "/etc/passwd", "args": ["/bin/app", "-x"]});
        let cases = [
            ("failed to chdir e=ENOTDIR", Some("process.cwd \"/etc/passwd\"")),
            ("failed to execvp e=EACCES", Some("process.args[0] \"/bin/app\"")),
            ("error 'ENOENT' executing '\"/bin/app\"'", None),
            ("exec process failed with error ... failed to set groups err=EINVAL", None),
            ("exec process failed with error failed to prepare rootfs", None),
        ];
        for (message, expected) in cases {
            assert_eq!(process_context(message, &process).as_deref(), expected, "{message}");
        }
        assert_eq!(process_context("failed to chdir", &serde_json::json!({})), None);
    }

    #[test]
    fn missing_containers_are_named_as_runc_names_them() {
        let root = std::env::temp_dir().join(format!("corral-oci-ops-{}", std::process::id()));
        let global = Global { root: root.clone(), log: None, systemd_cgroup: false };
        assert_eq!(load(&global, "gone").unwrap_err(), "container \"gone\" does not exist");
        assert_eq!(delete(&global, "gone", false).unwrap_err(), "container \"gone\" does not exist");
        std::fs::create_dir_all(root.join("half")).unwrap();
        delete(&global, "half", true).unwrap();
        assert!(!root.join("half").exists(), "a directory without state is removed");
        let _ = std::fs::remove_dir_all(&root);
    }
}
