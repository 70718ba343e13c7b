//! Load: create/start/stop/remove pod cycles, four at a time, each with one container. Every
//! cycle succeeds and afterwards every leak check is back at its baseline: mounts, processes,
//! runc containers, cgroups (and on a systemd node the pods' slices and containers' scopes),
//! containerd's open fds, bundles, network namespaces, sockets, pod file directories.
//!
//! CI runs 24 cycles; `CORRAL_LOAD_CYCLES=200 cargo test -p corral-e2e --test load` runs the
//! full one. (load_many.rs holds 50 pods up at once.)

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::leaks::{eventually_stable, snapshot};
use corral_rig::{eventually, Options, Rig};

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
