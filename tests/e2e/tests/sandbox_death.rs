//! The holder is the pod: when it dies (SIGKILL), WaitSandbox returns and the pod is NOTREADY;
//! kubelet then creates the pod again (attempt 1) and removes the old one, and nothing of the
//! old pod is left.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::container_config;
use corral_rig::{eventually, probe, Options, Rig};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_ends_the_pod_and_kubelet_recreates_it() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("phoenix");
    let old = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&old, &cfg, &container_config("app", "exec sleep 1000")).await?;

    kill(Pid::from_raw(probe::holder_of(&old).context("holder")? as i32), Signal::SIGKILL)?;
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(5));
    while cri.pod_ready(&old).await? {
        assert!(std::time::Instant::now() < deadline, "pod still READY after its holder died");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // kubelet: a new sandbox (attempt 1), then the old one stopped and removed.
    cfg.metadata.as_mut().unwrap().attempt = 1;
    let new = cri.run_pod(&cfg, "corral").await?;
    assert_ne!(new, old);
    cri.stop_container(&c).await?;
    cri.remove_container(&c).await?;
    cri.stop_and_remove_pod(&old).await?;
    assert!(cri.pod_ready(&new).await?, "the new pod is READY");
    let c2 = cri.run_container(&new, &cfg, &container_config("app", "exec sleep 1000")).await?;
    assert_eq!(cri.exec_sync(&c2, &["hostname"]).await?.1, "phoenix\n");

    eventually(Duration::from_secs(3), || {
        let left = probe::pids_with_cmdline(&old);
        (!left.is_empty()).then(|| format!("processes of the old pod: {left:?}"))
    })
    .await?;
    assert!(probe::mounts_containing(&old).is_empty(), "{:?}", probe::mounts_containing(&old));
    cri.stop_and_remove_pod(&new).await?;
    Ok(())
}
