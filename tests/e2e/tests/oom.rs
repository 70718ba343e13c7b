//! A container that exceeds its memory limit is killed by the kernel; corral's `/tasks/oom`
//! event makes CRI report the reason `OOMKilled`.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::container_config;
use corral_rig::{Options, Rig};
use k8s_cri::v1::LinuxContainerResources;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_over_its_memory_limit_is_reported_oom_killed() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("oom");
    cfg.linux.as_mut().unwrap().cgroup_parent = rig.cgroup_parent("oom");
    let pod = cri.run_pod(&cfg, "corral").await?;

    // The shell keeps 64 MiB in a variable under a 32 MiB limit.
    let mut hog = container_config("hog", "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived");
    hog.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 32 << 20,
        memory_swap_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    let c = cri.run_container(&pod, &cfg, &hog).await?;
    let code = cri.wait_exited(&c, Duration::from_secs(30)).await?;
    assert_eq!(code, 137);
    // The reason comes with the OOM event (v1: the memory.oom_control eventfd; v2: the
    // oom_kill count in memory.events), which may land just after the exit.
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(15));
    loop {
        let status = cri.container_status(&c).await?.status.context("status")?;
        if status.reason == "OOMKilled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "reason {:?}, not OOMKilled", status.reason);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    cri.remove_container(&c).await?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
