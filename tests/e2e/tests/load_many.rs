//! Many pods at once: 50 pods up together (started 8 at a time, each with a container), then
//! removed 8 at a time; afterwards every leak check of load.rs is back at its baseline. In node
//! mode all of them share one server, which leaves with the last. `CORRAL_LOAD_PODS` changes the
//! number.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::leaks::{eventually_stable, snapshot};
use corral_rig::{eventually, probe, Options, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pods_up_together_then_removed_leave_nothing() -> Result<()> {
    let pods: usize = std::env::var("CORRAL_LOAD_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let rig = Arc::new(Rig::start(Options::default()).await?);
    let containerd = rig.pid().unwrap_or(0);
    let baseline = eventually_stable(&rig, containerd).await;

    let permits = Arc::new(tokio::sync::Semaphore::new(8));
    let starts: Vec<_> = (0..pods)
        .map(|i| {
            let (rig, permits) = (rig.clone(), permits.clone());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await?;
                let mut cri = rig.cri().await?;
                let name = format!("many{i}");
                let mut cfg = rig.pod_config(&name);
                cfg.linux.as_mut().unwrap().cgroup_parent = rig.cgroup_parent(&name);
                let pod = cri.run_pod(&cfg, "corral").await?;
                cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
                anyhow::Ok((name, pod))
            })
        })
        .collect();
    let mut up = Vec::new();
    for (i, s) in starts.into_iter().enumerate() {
        up.push(s.await?.map_err(|e| e.context(format!("pod {i}")))?);
    }
    let servers: std::collections::HashSet<u32> =
        up.iter().map(|(_, pod)| probe::shim_of(pod).unwrap_or(0)).collect();
    let expected = if corral_rig::node_mode() { 1 } else { pods };
    assert_eq!(servers.len(), expected, "servers for {pods} pods: {servers:?}");
    let holders = up.iter().filter(|(_, pod)| probe::holder_of(pod).is_some()).count();
    assert_eq!(holders, pods, "a holder per pod");

    let removals: Vec<_> = up
        .into_iter()
        .map(|(name, pod)| {
            let (rig, permits) = (rig.clone(), permits.clone());
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await?;
                let mut cri = rig.cri().await?;
                cri.stop_and_remove_pod(&pod).await?;
                rig.remove_cgroup_parent(&name).await
            })
        })
        .collect();
    for r in removals {
        r.await??;
    }
    eventually(Duration::from_secs(10), || {
        let now = snapshot(&rig, containerd);
        let diff: Vec<_> = now.iter().zip(&baseline).filter(|(a, b)| a.1 != b.1).collect();
        (!diff.is_empty()).then(|| format!("after {pods} pods, not back at baseline: {diff:?}"))
    })
    .await
}
