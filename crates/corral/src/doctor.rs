//! `containerd-shim-corral-v2 doctor [-containerd-config PATH]`: checks a node for what corral
//! needs and says what is wrong and how to fix it. Each check is a pure function of what it
//! reads, so the checks are unit tested on sample inputs.

use std::path::Path;

use crate::config::Driver;

/// One finding: `Ok` lines inform, `Problem` lines fail the run.
#[derive(Debug, PartialEq, Eq)]
pub enum Finding {
    Ok(String),
    Problem { what: String, fix: String },
}

fn ok(s: impl Into<String>) -> Finding {
    Finding::Ok(s.into())
}

fn problem(what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding::Problem { what: what.into(), fix: fix.into() }
}

/// "containerd github.com/containerd/containerd/v2 2.1.9+unknown ..." -> (2, 1).
pub fn containerd_minor(version_output: &str) -> Option<(u32, u32)> {
    let v = version_output.split_whitespace().nth(2)?;
    let mut parts = v.trim_start_matches('v').split(['.', '+', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The handler tables of a containerd config whose runtime_type resolves to corral.
/// Whether a runtime_type runs corral: Some(true) for the node-mode name, Some(false) for the
/// per-pod one.
fn is_corral(runtime_type: &str) -> Option<bool> {
    match runtime_type {
        "io.containerd.corral.v2" => Some(false),
        "io.containerd.corral-node.v2" => Some(true),
        t if t.ends_with(crate::shim::NODE_BINARY_NAME) => Some(true),
        t if t.ends_with(crate::shim::BINARY_NAME) => Some(false),
        _ => None,
    }
}

/// Node-mode servers running now: their directories under [`crate::node::NODE_DIR`], the pods
/// registered in each, and whether a server answers on its socket.
pub fn check_node_servers(node_root: &Path, log_dir: &Path) -> Finding {
    let mut servers = Vec::new();
    for dir in std::fs::read_dir(node_root).into_iter().flatten().flatten() {
        let key: String = dir.file_name().to_string_lossy().chars().take(12).collect();
        let pods = std::fs::read_dir(dir.path().join("pods")).map(|d| d.count()).unwrap_or(0);
        let socket = Path::new(crate::shim::start::SOCKET_DIR).join(dir.file_name());
        let up = std::os::unix::net::UnixStream::connect(&socket).is_ok();
        servers.push(format!(
            "{key} ({pods} pod(s), {}, log {}/node-{key}.log)",
            if up { "serving" } else { "not answering" },
            log_dir.display()
        ));
    }
    match servers.is_empty() {
        true => ok("node mode: no node server running"),
        false => ok(format!("node mode servers: {}", servers.join("; "))),
    }
}

pub fn check_containerd_config(text: &str, version: Option<(u32, u32)>) -> Vec<Finding> {
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            return vec![problem(
                format!("containerd config does not parse: {}", e.message()),
                "fix the TOML syntax",
            )]
        }
    };
    // v3 (containerd 2.x) and v2 (1.7) layouts of the CRI runtimes table.
    let runtimes = ["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"].iter().find_map(|plugin| {
        table.get("plugins")?.get(*plugin)?.get("containerd")?.get("runtimes")?.as_table().cloned()
    });
    let Some(runtimes) = runtimes else {
        return vec![problem(
            "containerd config has no CRI runtimes table",
            "add [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral] (see README)",
        )];
    };
    let corral: Vec<_> = runtimes
        .iter()
        .filter(|(_, v)| {
            v.get("runtime_type").and_then(|t| t.as_str()).is_some_and(|t| is_corral(t).is_some())
        })
        .collect();
    if corral.is_empty() {
        return vec![problem(
            "no runtime handler uses corral",
            "add [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral] with runtime_type = 'io.containerd.corral.v2' and sandboxer = 'shim'",
        )];
    }
    let mut out = Vec::new();
    for (name, handler) in corral {
        let sandboxer = handler.get("sandboxer").and_then(|s| s.as_str()).unwrap_or("podsandbox");
        let node = handler.get("runtime_type").and_then(|t| t.as_str()).and_then(is_corral) == Some(true);
        if sandboxer == "shim" {
            let mode = if node { " in node mode (one server for all its pods)" } else { "" };
            out.push(ok(format!("handler {name:?} uses corral as its sandboxer{mode}")));
        } else {
            out.push(problem(
                format!("handler {name:?} has sandboxer = {sandboxer:?}: containerd would start a pause container and use corral as a plain runtime"),
                format!("set sandboxer = 'shim' in the {name} table"),
            ));
        }
        let old = version.is_some_and(|v| v < (2, 4));
        if handler.get("options").is_some() && old {
            out.push(problem(
                format!("handler {name:?} has an options table: containerd before 2.4 then fails StartContainer (can't unmarshal runtimeoptions.v1.Options)"),
                format!("remove [..runtimes.{name}.options]; put corral's settings in /etc/corral/config.toml"),
            ));
        }
    }
    out
}

pub fn check_containerd_version(version: Option<(u32, u32)>) -> Finding {
    match version {
        Some(v) if v >= (2, 1) => {
            ok(format!("containerd {}.{} (Sandbox API with sandboxer = shim)", v.0, v.1))
        }
        Some(v) => {
            problem(format!("containerd {}.{} is too old", v.0, v.1), "install containerd 2.1 or later")
        }
        None => problem(
            "containerd not found or its version unreadable",
            "install containerd 2.1+ and put it on PATH",
        ),
    }
}

pub fn check_runtime(binary: &str, version_output: Option<&str>, features_ok: bool) -> Vec<Finding> {
    match version_output {
        None if binary.ends_with(crate::config::BUILTIN_HELPER) => vec![problem(
            format!("builtin OCI runtime {binary:?} cannot be run"),
            "install corral-oci beside containerd-shim-corral-v2, or set runtime.binary to runc",
        )],
        None => vec![problem(
            format!("OCI runtime {binary:?} cannot be run"),
            "install runc (apt-get install runc) or set runtime.binary in /etc/corral/config.toml",
        )],
        Some(v) => {
            let first = v.lines().next().unwrap_or("").to_string();
            let mut out = vec![ok(first)];
            if !features_ok {
                out.push(ok(format!(
                    "{binary} has no `features` command: -info reports no runtime features"
                )));
            }
            out
        }
    }
}

/// Kernel facilities corral uses: namespaces under /proc/self/ns and pidfds.
pub fn check_kernel(ns_dir: &Path, pidfd_works: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    let missing: Vec<_> = ["net", "ipc", "uts", "pid", "user", "mnt"]
        .into_iter()
        .filter(|k| !ns_dir.join(k).exists())
        .collect();
    if missing.is_empty() {
        out.push(ok("namespaces: net, ipc, uts, pid, user, mnt"));
    } else {
        out.push(problem(
            format!("kernel lacks namespaces: {missing:?}"),
            "use a kernel with CONFIG_NAMESPACES and all namespace types",
        ));
    }
    if pidfd_works {
        out.push(ok("pidfd_open works"));
    } else {
        out.push(problem("pidfd_open is unavailable (kernel older than 5.3?)", "use Linux 5.3 or later"));
    }
    out
}

/// Where the pods' files go must be a disk: on a memory filesystem a container writing its
/// /etc/resolv.conf fills the node's memory. `fs_type` is statfs's f_type of the nearest
/// existing directory of `root`.
pub fn check_files_root(root: &Path, fs_type: Option<i64>) -> Finding {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    match fs_type {
        Some(TMPFS_MAGIC | RAMFS_MAGIC) => problem(
            format!("pod.files_root {} is on a memory filesystem", root.display()),
            "set pod.files_root in /etc/corral/config.toml to a directory on disk (default /var/lib/corral/pods)",
        ),
        Some(_) => ok(format!("pod files under {} (on disk)", root.display())),
        None => problem(format!("pod.files_root {}: no existing directory on its path", root.display()), "create /var/lib"),
    }
}

/// The holder confines itself with a seccomp filter and every pod needs it: the kernel must
/// have seccomp filters (`Seccomp:` in /proc/self/status). User-namespaced pods need idmapped
/// mounts of tmpfs (6.3+): informational, corral claims them only where they work.
pub fn check_confinement(status: &str, kernel_release: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        out.push(ok("seccomp filters (the holder confines itself with one)"));
    } else {
        out.push(problem(
            "the kernel has no seccomp filters: every pod's holder would fail to confine itself",
            "use a kernel with CONFIG_SECCOMP_FILTER",
        ));
    }
    let release = kernel_release.trim();
    if crate::shim::info::kernel_idmaps(release) {
        out.push(ok(format!(
            "kernel {release}: idmapped mounts for user-namespaced (hostUsers: false) pods"
        )));
    } else {
        out.push(ok(format!(
            "kernel {release}: no idmapped tmpfs (6.3+), so corral does not claim user namespace support"
        )));
    }
    out
}

/// The holder moves into an empty root with pivot_root, which the kernel refuses when the node's
/// root is the initial ramfs itself (no switch_root at boot). `mountinfo`: /proc/self/mountinfo.
pub fn check_root_mount(mountinfo: &str) -> Finding {
    // The last mount on "/" is the visible one; its type follows " - ".
    let root_type = mountinfo
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|rest| rest.split(' ').next());
    match root_type {
        Some("rootfs") => problem(
            "the node's root is the initial ramfs: the holder's pivot_root into its empty root would fail",
            "boot with a root filesystem (switch_root), as every distribution does",
        ),
        Some(t) => ok(format!("root filesystem {t} (the holder can pivot_root)")),
        None => problem("no root mount in /proc/self/mountinfo", "mount /proc"),
    }
}

/// statfs f_type of `path` or of its nearest existing ancestor.
// f_type is i64 on 64-bit Linux targets but narrower elsewhere.
/// The systemd driver needs systemd, reachable on its private socket, for the holders' scopes:
/// `init` is pid 1's name, `answer` systemd's version or why it could not be asked.
pub fn check_systemd(
    init: &str,
    driver: Driver,
    answer: impl FnOnce() -> Result<String, String>,
) -> Option<Finding> {
    let socket = crate::cgroups::scope::SYSTEMD_SOCKET;
    if init != "systemd" {
        return (driver == Driver::Systemd).then(|| {
            problem(
                format!("cgroup.driver = systemd, but pid 1 is {init:?}, not systemd"),
                "set cgroup.driver = \"cgroupfs\" (or \"auto\")",
            )
        });
    }
    Some(match answer() {
        Ok(version) => {
            ok(format!("systemd {version} answers at {socket}: pods in slices get a holder scope"))
        }
        Err(e) => problem(
            format!("systemd does not answer at {socket}: {e}"),
            "pods whose cgroup_parent is a slice need it: run corral as root on the host's /run",
        ),
    })
}

#[allow(clippy::unnecessary_cast)]
fn fs_type_of(path: &Path) -> Option<i64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    nix::sys::statfs::statfs(existing).ok().map(|s| s.filesystem_type().0 as i64)
}

/// Runs every check on this node; returns the findings.
pub fn run(containerd_config: &Path) -> Vec<Finding> {
    use std::process::Command;
    let output = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let mut findings = Vec::new();
    let version_text = output("containerd", &["--version"]);
    let version = version_text.as_deref().and_then(containerd_minor);
    findings.push(check_containerd_version(version));
    match std::fs::read_to_string(containerd_config) {
        Ok(text) => findings.extend(check_containerd_config(&text, version)),
        Err(e) => findings.push(problem(
            format!("cannot read containerd config {}: {e}", containerd_config.display()),
            "pass -containerd-config PATH",
        )),
    }
    match crate::config::Config::load(None) {
        Ok(c) => {
            findings.push(ok(format!(
                "corral config: mode {:?}, runtime {}, shm {}, cgroup driver {:?}",
                c.shim.mode, c.runtime.binary, c.pod.shm_size, c.cgroup.driver
            )));
            findings.push(check_files_root(&c.pod.files_root, fs_type_of(&c.pod.files_root)));
            let program = c.runtime.program().display().to_string();
            let features = output(&program, &["features"]).is_some();
            findings.extend(check_runtime(&program, output(&program, &["--version"]).as_deref(), features));
        }
        Err(e) => findings
            .push(problem(format!("{e}"), "fix /etc/corral/config.toml (or the file CORRAL_CONFIG names)")),
    }
    match crate::cgroups::Mode::detect() {
        Ok(m) if m.is_v2() => findings.push(ok("cgroup v2 (unified)")),
        Ok(_) => findings.push(ok("cgroup v1 (or hybrid)")),
        Err(e) => findings.push(problem(format!("cgroups: {e}"), "mount cgroupfs at /sys/fs/cgroup")),
    }
    let init = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    let driver = crate::config::Config::load(None).map(|c| c.cgroup.driver).unwrap_or_default();
    let answer = || crate::cgroups::scope::systemd_version().map_err(|e| e.to_string());
    findings.extend(check_systemd(init.trim(), driver, answer));
    let pidfd = crate::sys::pidfd::PidFd::probe();
    findings.extend(check_kernel(Path::new("/proc/self/ns"), pidfd));
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    findings.extend(check_confinement(&read("/proc/self/status"), &read("/proc/sys/kernel/osrelease")));
    findings.push(check_root_mount(&read("/proc/self/mountinfo")));
    let log_dir = crate::config::Config::load(None).map(|c| c.log.node_dir).unwrap_or_default();
    findings.push(check_node_servers(Path::new(crate::node::NODE_DIR), &log_dir));
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral]
  runtime_type = 'io.containerd.corral.v2'
  sandboxer = 'shim'
"#;

    fn problems(f: &[Finding]) -> Vec<&str> {
        f.iter()
            .filter_map(|f| match f {
                Finding::Problem { what, .. } => Some(what.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn reads_containerd_versions() {
        assert_eq!(
            containerd_minor("containerd github.com/containerd/containerd/v2 2.1.9+unknown \n"),
            Some((2, 1))
        );
        assert_eq!(containerd_minor("containerd containerd.io v2.4.0-beta.0 abc"), Some((2, 4)));
        assert_eq!(containerd_minor("garbage"), None);
    }

    #[test]
    fn a_good_handler_passes() {
        assert!(problems(&check_containerd_config(GOOD, Some((2, 1)))).is_empty());
        let both = format!(
            "{GOOD}[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral-node]\n  runtime_type = 'io.containerd.corral-node.v2'\n  sandboxer = 'shim'\n"
        );
        let found = check_containerd_config(&both, Some((2, 1)));
        assert!(problems(&found).is_empty());
        assert!(
            matches!(&found[1], Finding::Ok(s) if s.contains("\"corral-node\"") && s.contains("node mode")),
            "{found:?}"
        );
        let none = std::env::temp_dir().join(format!("corral-doctor-node-{}", std::process::id()));
        let found = check_node_servers(&none, Path::new(crate::config::NODE_LOG_DIR));
        assert!(matches!(found, Finding::Ok(s) if s.contains("no node server")));
    }

    #[test]
    fn finds_a_missing_handler_a_wrong_sandboxer_and_an_options_table() {
        let none = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n";
        assert_eq!(
            problems(&check_containerd_config(none, Some((2, 1)))),
            ["no runtime handler uses corral"]
        );
        let podsandbox = GOOD.replace("sandboxer = 'shim'", "");
        assert!(problems(&check_containerd_config(&podsandbox, Some((2, 1))))[0]
            .contains("sandboxer = \"podsandbox\""));
        let options = format!(
            "{GOOD}[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral.options]\n  X = 1\n"
        );
        assert!(problems(&check_containerd_config(&options, Some((2, 1))))[0].contains("options table"));
        assert!(
            problems(&check_containerd_config(&options, Some((2, 4)))).is_empty(),
            "2.4 tolerates options"
        );
        assert!(problems(&check_containerd_config("[[[", None))[0].contains("does not parse"));
    }

    #[test]
    fn pod_files_must_be_on_disk_and_the_holder_needs_seccomp() {
        let root = Path::new("/var/lib/corral/pods");
        assert!(matches!(check_files_root(root, Some(0xEF53)), Finding::Ok(_)), "ext4");
        assert!(problems(&[check_files_root(root, Some(0x0102_1994))])[0].contains("memory filesystem"));
        assert!(matches!(check_files_root(root, None), Finding::Problem { .. }));
        let with = "Name:\tx\nSeccomp:\t0\n";
        assert!(problems(&check_confinement(with, "6.18.0")).is_empty());
        assert!(problems(&check_confinement("Name:\tx\n", "6.18.0"))[0].contains("seccomp"));
        let old = check_confinement(with, "6.1.0-28-amd64");
        assert!(problems(&old).is_empty(), "no user namespaces is not a problem");
        assert!(matches!(&old[1], Finding::Ok(s) if s.contains("does not claim")));
        let disk = "21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n";
        assert!(matches!(check_root_mount(disk), Finding::Ok(_)));
        let ramfs = "1 1 0:1 / / rw shared:1 - rootfs rootfs rw\n";
        assert!(problems(&[check_root_mount(ramfs)])[0].contains("initial ramfs"));
    }

    #[test]
    fn the_systemd_driver_needs_systemd_to_answer() {
        let asked = || -> Result<String, String> { panic!("systemd is not init: nothing to ask") };
        assert!(check_systemd("init", Driver::Auto, asked).is_none());
        let f = [check_systemd("init", Driver::Systemd, asked).unwrap()];
        assert!(problems(&f)[0].contains("pid 1 is \"init\""), "{:?}", problems(&f));
        let f = [check_systemd("systemd", Driver::Auto, || Ok("252.39-1~deb12u1".into())).unwrap()];
        assert!(problems(&f).is_empty());
        let f = [check_systemd("systemd", Driver::Auto, || Err("connection refused".into())).unwrap()];
        assert!(problems(&f)[0].contains("connection refused"), "{:?}", problems(&f));
    }

    #[test]
    fn finds_a_missing_runtime_and_an_old_containerd() {
        assert!(problems(&check_runtime("/no/runc", None, false))[0].contains("cannot be run"));
        assert!(matches!(check_containerd_version(Some((1, 7))), Finding::Problem { .. }));
        assert!(matches!(check_containerd_version(Some((2, 1))), Finding::Ok(_)));
    }
}
