//! Facts read from the system itself: /proc, the mount table, runc's state. Tests assert on these,
//! not on what corral says about itself.

use std::path::Path;

/// The inode of `/proc/<pid>/ns/<kind>` (e.g. "net:[4026532]").
pub fn ns(pid: u32, kind: &str) -> std::io::Result<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).map(|p| p.display().to_string())
}

/// The argv of a process, or empty.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Processes whose command line contains `needle` (as a whole argument or inside one).
pub fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| cmdline(*pid).iter().any(|a| a.contains(needle)))
        .map(|p| p as i32)
        .collect()
}

/// Processes whose cgroup path mentions `id` (a container's processes, found by the kernel's
/// own accounting).
pub fn pids_in_cgroup_of(id: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id)))
        .collect()
}

/// Mount points below any of `dirs`, in mount-table order.
pub fn mounts_under(dirs: &[&Path]) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| dirs.iter().any(|d| Path::new(mp).starts_with(d)))
        .map(str::to_string)
        .collect()
}

/// Mount points whose path contains `needle`.
pub fn mounts_containing(needle: &str) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Container ids the OCI runtime knows in corral's runtime root for namespace k8s.io.
pub fn corral_runc_containers() -> Vec<String> {
    corral_runc_containers_in("k8s.io")
}

/// Container ids the OCI runtime knows in corral's runtime root for a containerd namespace: for
/// runc what `runc list` shows, for the builtin runtime every directory of its root (a
/// container's state directory, complete or not).
pub fn corral_runc_containers_in(namespace: &str) -> Vec<String> {
    if crate::builtin_runtime() {
        let root = std::path::Path::new("/run/corral/oci").join(namespace);
        let entries = std::fs::read_dir(root).into_iter().flatten().flatten();
        return entries
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
    }
    let root = format!("/run/corral/runc/{namespace}");
    let out = std::process::Command::new("runc").args(["--root", &root, "list", "-q"]).output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect(),
        Err(_) => Vec::new(),
    }
}

/// The holder of `sandbox`: argv `corral-holder holder <sandbox>`.
pub fn holder_of(sandbox: &str) -> Option<u32> {
    all_pids().into_iter().find(|p| {
        let argv = cmdline(*p);
        argv.get(1).is_some_and(|a| a == "holder") && argv.get(2).is_some_and(|a| a == sandbox)
    })
}

/// The shim server of `sandbox`: argv `... -id <sandbox> ... serve`.
/// In node mode, the node's one server (see [`node_server_of`]).
pub fn shim_of(sandbox: &str) -> Option<u32> {
    pids_with_cmdline(sandbox)
        .into_iter()
        .map(|p| p as u32)
        .find(|p| cmdline(*p).last().is_some_and(|a| a == "serve"))
        .or_else(|| node_server_of(sandbox))
}

/// The node-mode server serving `sandbox`: argv `... -socket /run/corral/s/<key> serve-node`,
/// where `/run/corral/node/<key>/pods/<sandbox>` registers the sandbox.
pub fn node_server_of(sandbox: &str) -> Option<u32> {
    let key = std::fs::read_dir(NODE_DIR)
        .ok()?
        .flatten()
        .find(|d| d.path().join("pods").join(sandbox).exists())?
        .file_name()
        .to_string_lossy()
        .into_owned();
    node_servers().into_iter().find(|p| shim_socket(*p).is_some_and(|s| s.ends_with(&key)))
}

/// Every node-mode server on the machine.
pub fn node_servers() -> Vec<u32> {
    all_pids().into_iter().filter(|p| cmdline(*p).last().is_some_and(|a| a == "serve-node")).collect()
}

/// corral's node-mode directories (one per node server).
pub const NODE_DIR: &str = "/run/corral/node";

/// The socket a shim server listens on (its `-socket` argument).
pub fn shim_socket(shim: u32) -> Option<String> {
    cmdline(shim).windows(2).find(|w| w[0] == "-socket").map(|w| w[1].clone())
}

/// Files named `name` anywhere below `dir` (symlinks not followed).
pub fn files_named(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => found.extend(files_named(&path, name)),
            Ok(_) if entry.file_name() == name => found.push(path),
            _ => {}
        }
    }
    found
}

/// The sockets among `pid`'s open files, as their links read ("socket:[inode]").
pub fn socket_inodes(pid: u32) -> std::collections::HashSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .filter(|l| l.starts_with("socket:"))
                .collect()
        })
        .unwrap_or_default()
}
