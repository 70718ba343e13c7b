//! What a leaked pod could leave, counted machine-wide: the load tests compare these numbers
//! before and after. (Machine-wide: one such test at a time, each in its own test binary.)

use std::path::Path;
use std::time::Duration;

use crate::{cgroup, probe, Rig};

fn count(dir: impl AsRef<Path>) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Everything a leaked pod could leave, as numbers.
pub fn snapshot(rig: &Rig, containerd: u32) -> Vec<(&'static str, usize)> {
    let marker = rig.socket.display().to_string();
    let holders = probe::all_pids()
        .into_iter()
        .filter(|p| probe::cmdline(*p).first().is_some_and(|a| a == "corral-holder"))
        .count();
    // The pods' cgroup parents (kubelet's, here the rig's, removed after each cycle as kubelet
    // does) and the cgroups below them: the sandbox's and the containers'.
    let parents = rig.pod_parent_cgroups();
    let cgroups = parents.len() + parents.iter().map(|p| cgroup::children(p).len()).sum::<usize>();
    vec![
        ("mounts under containerd's dirs", probe::mounts_under(&[&rig.state, &rig.root]).len()),
        ("mounts naming corral", probe::mounts_containing("corral/").len()),
        ("shim processes", probe::pids_with_cmdline(&marker).len()),
        ("holders", holders),
        ("runc containers", probe::corral_runc_containers().len()),
        ("pod parents, pod and container cgroups", cgroups),
        // systemd nodes: pod slices, container and holder scopes, in any state.
        ("systemd units", rig.units().len()),
        ("containerd fds", count(format!("/proc/{containerd}/fd"))),
        ("sandbox bundles", count(rig.state.join("io.containerd.sandbox.controller.v1.shim/k8s.io"))),
        ("task bundles", count(rig.state.join("io.containerd.runtime.v2.task/k8s.io"))),
        ("network namespaces", count("/run/netns")),
        ("shim sockets", count("/run/corral/s")),
        ("pod file directories", count(crate::CORRAL_POD_FILES)),
        ("node server directories", count(probe::NODE_DIR)),
    ]
}

/// The baseline once the warm-up's teardown has settled.
pub async fn eventually_stable(rig: &Rig, containerd: u32) -> Vec<(&'static str, usize)> {
    let mut last = snapshot(rig, containerd);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = snapshot(rig, containerd);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}
