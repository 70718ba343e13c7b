//! The node's cgroup setup as kubelet would be configured for it, and the cgroup facts tests
//! read. A cgroup v1 (or hybrid) node without systemd is a **cgroupfs** node: pod cgroup
//! parents are plain paths and containers' cgroups are `<parent>/<id>`. A cgroup v2 node with
//! systemd as pid 1 is a **systemd** node, as current Kubernetes nodes are: containerd's runc
//! handler runs with `SystemdCgroup = true`, pod parents are slices named as kubelet names them
//! (`kubepods-besteffort-pod<uid>.slice`, which the rig, as kubelet, starts before the pod and
//! stops after it), and containers' cgroups are the scopes `cri-containerd-<id>.scope` that
//! runc asks systemd for, from the `slice:cri-containerd:<id>` paths CRI writes.
//!
//! `CORRAL_RIG_CGROUP=systemd|cgroupfs` names the driver instead of detecting it; naming
//! systemd on a node that cannot have it is an error, not a quiet fallback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const ROOT: &str = "/sys/fs/cgroup";

/// How pod and container cgroups are managed on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// The node's driver, detected once (see the module's documentation).
pub fn driver() -> Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    *DRIVER.get_or_init(|| {
        let systemd_node = is_v2() && systemd_is_init();
        match std::env::var("CORRAL_RIG_CGROUP").as_deref() {
            Ok("systemd") if systemd_node => Driver::Systemd,
            Ok("systemd") => {
                panic!("CORRAL_RIG_CGROUP=systemd, but this node is not cgroup v2 with systemd as pid 1")
            }
            Ok("cgroupfs") => Driver::Cgroupfs,
            Ok(other) => panic!("CORRAL_RIG_CGROUP={other:?}: expected systemd or cgroupfs"),
            Err(_) if systemd_node => Driver::Systemd,
            Err(_) => Driver::Cgroupfs,
        }
    })
}

pub fn is_systemd() -> bool {
    driver() == Driver::Systemd
}

/// Whether /sys/fs/cgroup is the unified hierarchy (cgroup2fs), not v1 or hybrid.
pub fn is_v2() -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
    statfs(ROOT).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Whether systemd is pid 1 here.
pub fn systemd_is_init() -> bool {
    std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
}

/// The cgroupfs path of a systemd slice: `a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice`.
pub fn slice_path(slice: &str) -> String {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push_str(&format!("/{prefix}.slice"));
    }
    path
}

/// The cgroup of a pod's `cgroup_parent` as given to CRI (a slice is expanded).
pub fn parent_path(parent: &str) -> String {
    if parent.ends_with(".slice") && !parent.contains('/') {
        slice_path(parent)
    } else {
        parent.to_string()
    }
}

/// The holder's cgroup, where corral puts it: `<parent>/<sandbox id>`, or under systemd the
/// transient scope `corral-<sandbox id>.scope` in the pod's slice.
pub fn pod_cgroup(parent: &str, sandbox: &str) -> String {
    if parent.ends_with(".slice") && !parent.contains('/') {
        format!("{}/corral-{sandbox}.scope", slice_path(parent))
    } else {
        format!("{}/{sandbox}", parent_path(parent))
    }
}

/// The cgroup of container `id` of a pod with `parent`, as containerd and runc make it:
/// `<parent>/<id>`, or under systemd the scope `cri-containerd-<id>.scope` in the slice.
pub fn container_cgroup(parent: &str, id: &str) -> String {
    if parent.ends_with(".slice") && !parent.contains('/') {
        format!("{}/cri-containerd-{id}.scope", slice_path(parent))
    } else {
        format!("{}/{id}", parent.trim_end_matches('/'))
    }
}

/// The directory of cgroup `rel` holding `controller`'s files (v2: the one directory;
/// v1: /sys/fs/cgroup/<controller> is the mount or a symlink to it, cpu -> cpu,cpuacct).
pub fn dir(controller: &str, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    if is_v2() {
        Path::new(ROOT).join(rel)
    } else {
        Path::new(ROOT).join(controller).join(rel)
    }
}

fn read(controller: &str, rel: &str, file: &str) -> Result<String> {
    let path = dir(controller, rel).join(file);
    Ok(std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?.trim().to_string())
}

/// The memory limit of cgroup `rel` in bytes (v1 memory.limit_in_bytes, v2 memory.max).
pub fn memory_limit(rel: &str) -> Result<String> {
    read("memory", rel, if is_v2() { "memory.max" } else { "memory.limit_in_bytes" })
}

/// The CPU share of cgroup `rel` in the node's unit: v1 cpu.shares, v2 cpu.weight.
pub fn cpu_share(rel: &str) -> Result<u64> {
    Ok(read("cpu", rel, if is_v2() { "cpu.weight" } else { "cpu.shares" })?.parse()?)
}

/// What CRI's `cpu_shares` becomes in the node's unit (v2: runc's conversion to cpu.weight).
pub fn expected_cpu_share(shares: u64) -> u64 {
    if is_v2() {
        1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142
    } else {
        shares
    }
}

/// Whether cgroup `rel` is frozen (v1 freezer.state, v2 the `frozen` key of cgroup.events).
pub fn frozen(rel: &str) -> Result<bool> {
    if is_v2() {
        let events = read("", rel, "cgroup.events")?;
        Ok(events.lines().any(|l| l == "frozen 1"))
    } else {
        Ok(read("freezer", rel, "freezer.state")? == "FROZEN")
    }
}

/// Whether cgroup `rel` exists in any hierarchy.
pub fn exists(rel: &str) -> bool {
    ["memory", "cpu", "pids", "cpuset"].iter().any(|c| dir(c, rel).exists())
}

/// The memory cgroup of process `pid`, from /proc/<pid>/cgroup (v2: the unified line).
pub fn of_pid(pid: u32) -> Result<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let want = |l: &&str| if is_v2() { l.starts_with("0::") } else { l.split(':').nth(1) == Some("memory") };
    let line = text.lines().find(want).with_context(|| format!("no memory cgroup in {text:?}"))?;
    Ok(line.splitn(3, ':').nth(2).unwrap_or_default().to_string())
}

/// One property of a systemd unit (`systemctl show -p <name> --value`).
pub fn unit_property(unit: &str, name: &str) -> Result<String> {
    let out = Command::new("systemctl").args(["show", "-p", name, "--value", unit]).output()?;
    anyhow::ensure!(out.status.success(), "systemctl show {unit}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `systemctl daemon-reload`: systemd reloads its units and re-realizes their cgroups.
pub fn daemon_reload() -> Result<()> {
    let status = Command::new("systemctl").arg("daemon-reload").status()?;
    anyhow::ensure!(status.success(), "systemctl daemon-reload: {status}");
    Ok(())
}

/// Loaded systemd units matching `pattern` (any state); none on a cgroupfs node.
pub fn units(pattern: &str) -> Vec<String> {
    if !is_systemd() {
        return Vec::new();
    }
    let out = Command::new("systemctl")
        .args(["list-units", "--all", "--plain", "--no-legend", "--no-pager", pattern])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Starts slice `name` as kubelet's systemd cgroup manager does before a pod's sandbox: a
/// transient unit with accounting on, its parents (kubepods.slice, ...) made by systemd.
pub fn start_slice(name: &str) -> Result<()> {
    if Path::new(ROOT).join(slice_path(name).trim_start_matches('/')).is_dir() {
        return Ok(());
    }
    let out = Command::new("busctl")
        .args([
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            name,
            "replace",
            "5",
            "Description",
            "s",
            "corral test pod (kubelet-like)",
            "DefaultDependencies",
            "b",
            "false",
            "MemoryAccounting",
            "b",
            "true",
            "CPUAccounting",
            "b",
            "true",
            "TasksAccounting",
            "b",
            "true",
            "0",
        ])
        .output()
        .context("busctl")?;
    // Another thread may have started it first; that is the same slice.
    if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("already exists") {
        bail!("StartTransientUnit {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // The job runs after the call returns.
    let path = Path::new(ROOT).join(slice_path(name).trim_start_matches('/'));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.is_dir() {
        if Instant::now() > deadline {
            bail!("slice {name}: no cgroup {} after 20 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Stops systemd units (a slice also stops whatever is still in it), waiting for the jobs.
pub fn stop_units(names: &[String]) {
    if names.is_empty() || !is_systemd() {
        return;
    }
    let _ = Command::new("systemctl").arg("stop").args(names).output();
}

/// The child cgroups of `dir` (directories only).
pub fn children(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_and_container_cgroups_as_systemd_and_cri_make_them() {
        assert_eq!(
            slice_path("kubepods-besteffort-podab_1.slice"),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab_1.slice"
        );
        assert_eq!(
            container_cgroup("kubepods-pod1.slice", "c1"),
            "/kubepods.slice/kubepods-pod1.slice/cri-containerd-c1.scope"
        );
        assert_eq!(container_cgroup("/corral-e2e/r1/p", "c1"), "/corral-e2e/r1/p/c1");
        assert_eq!(
            pod_cgroup("kubepods-pod1.slice", "s"),
            "/kubepods.slice/kubepods-pod1.slice/corral-s.scope"
        );
    }
}
