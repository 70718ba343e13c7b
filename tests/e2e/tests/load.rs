//! Load: create/start/stop/remove pod cycles, four at a time, each with one container. Every
//! cycle succeeds and afterwards every leak check is back at its baseline: mounts, processes,
//! runc containers, cgroups (and on a systemd node the pods' slices and containers' scopes),
//! containerd's open fds, bundles, network namespaces, sockets, pod file directories.
//!
//! CI runs 24 cycles; `CORRAL_LOAD_CYCLES=200 cargo test -p corral-e2e --test load` runs the
//! full one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::{cgroup, eventually, probe, Options, Rig};

fn count(dir: impl AsRef<Path>) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Everything a leaked pod could leave, as numbers.
fn snapshot(rig: &Rig, containerd: u32) -> Vec<(&'static str, usize)> {
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
        // systemd nodes: pod slices and container scopes, in any state.
        ("systemd units", rig.units().len()),
        ("containerd fds", count(format!("/proc/{containerd}/fd"))),
        ("sandbox bundles", count(rig.state.join("io.containerd.sandbox.controller.v1.shim/k8s.io"))),
        ("task bundles", count(rig.state.join("io.containerd.runtime.v2.task/k8s.io"))),
        ("network namespaces", count("/run/netns")),
        ("shim sockets", count("/run/corral/s")),
        ("pod file directories", count(corral_rig::CORRAL_POD_FILES)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cycles_under_load_leave_nothing() -> Result<()> {
    let cycles: usize = std::env::var("CORRAL_LOAD_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let rig = Arc::new(Rig::start(Options::default()).await?);
    let containerd = rig.pid().unwrap_or(0);
    let cycle = |i: usize| {
        let rig = rig.clone();
        async move {
            let mut cri = rig.cri().await?;
            let name = format!("load{i}");
            let mut cfg = rig.pod_config(&name);
            cfg.linux.as_mut().unwrap().cgroup_parent = rig.cgroup_parent(&name);
            let pod = cri.run_pod(&cfg, "corral").await?;
            let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
            cri.stop_container(&c).await?;
            cri.remove_container(&c).await?;
            cri.stop_and_remove_pod(&pod).await?;
            rig.remove_cgroup_parent(&name).await?;
            anyhow::Ok(())
        }
    };
    cycle(usize::MAX).await?; // warm-up, so lazily opened containerd fds count in the baseline
    let baseline = eventually_stable(&rig, containerd).await;

    let permits = Arc::new(tokio::sync::Semaphore::new(4));
    let tasks: Vec<_> = (0..cycles)
        .map(|i| {
            let permits = permits.clone();
            let run = cycle(i);
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await?;
                run.await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        t.await?.map_err(|e| e.context(format!("cycle {i}")))?;
    }

    eventually(Duration::from_secs(10), || {
        let now = snapshot(&rig, containerd);
        let diff: Vec<_> = now.iter().zip(&baseline).filter(|(a, b)| a.1 != b.1).collect();
        (!diff.is_empty()).then(|| format!("after {cycles} cycles, not back at baseline: {diff:?}"))
    })
    .await
}

/// The baseline once the warm-up's teardown has settled.
async fn eventually_stable(rig: &Rig, containerd: u32) -> Vec<(&'static str, usize)> {
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
