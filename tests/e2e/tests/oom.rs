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

    let c = cri.run_container(&pod, &cfg, &hog("hog")).await?;
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

/// A container whose shell keeps 64 MiB in a variable under a 32 MiB limit.
fn hog(name: &str) -> k8s_cri::v1::ContainerConfig {
    let mut hog = container_config(name, "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived");
    hog.linux.as_mut().unwrap().resources = Some(LinuxContainerResources {
        memory_limit_in_bytes: 32 << 20,
        memory_swap_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    hog
}

/// Waits for the container's exit and returns the reason CRI gives it once the OOM event, if
/// any, has had time to land (the reason only ever changes to OOMKilled).
async fn settled_reason(cri: &mut corral_rig::cri::Cri, c: &str) -> Result<String> {
    cri.wait_exited(c, corral_rig::scaled(Duration::from_secs(30))).await?;
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(3));
    loop {
        let reason = cri.container_status(c).await?.status.context("status")?.reason;
        if reason == "OOMKilled" || std::time::Instant::now() >= deadline {
            return Ok(reason);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Under systemd a container's scope goes as soon as it is empty, and can take the OOM kill
/// count with it before corral reads it. The test build's failpoint `lose-oom <container>` makes
/// corral lose that race every time. On v2 the kill is still found in the pod's cgroup (its
/// memory.events counts the containers' kills), and given only to a container that a kill no
/// other container's watch reported can belong to; v1 counts kills per cgroup only, so there a
/// lost count stays lost (no v1 driver here removes a cgroup before corral has read it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_whose_cgroup_went_first_is_found_in_the_pod_and_given_once() -> Result<()> {
    let failpoint = std::env::temp_dir().join(format!("corral-failpoint-oom-{}", std::process::id()));
    std::fs::write(&failpoint, "")?;
    let options =
        Options { shim_env: vec![format!("CORRAL_FAILPOINT={}", failpoint.display())], ..Default::default() };
    let rig = Rig::start(options).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("oomlost");
    cfg.linux.as_mut().unwrap().cgroup_parent = rig.cgroup_parent("oomlost");
    let pod = cri.run_pod(&cfg, "corral").await?;
    // a: an OOM kill its own watch reads.
    let a = cri.run_container(&pod, &cfg, &hog("a")).await?;
    assert_eq!(settled_reason(&mut cri, &a).await?, "OOMKilled");

    // b: SIGKILLed from the node, its count lost: a's kill is a's, not b's.
    let b = cri.create_container(&pod, &cfg, &container_config("b", "exec sleep 1000")).await?;
    std::fs::write(&failpoint, format!("lose-oom {b}\n"))?;
    cri.start_container(&b).await?;
    let pid = nix::unistd::Pid::from_raw(cri.container_pid(&b).await? as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)?;
    assert_eq!(cri.wait_exited(&b, corral_rig::scaled(Duration::from_secs(10))).await?, 137);
    assert_eq!(settled_reason(&mut cri, &b).await?, "Error", "b was killed, not by the OOM killer");

    // c: an OOM kill whose own count is lost.
    let c = cri.create_container(&pod, &cfg, &hog("c")).await?;
    std::fs::write(&failpoint, format!("lose-oom {c}\n"))?;
    cri.start_container(&c).await?;
    let expected = if corral_rig::cgroup::is_v2() { "OOMKilled" } else { "Error" };
    assert_eq!(settled_reason(&mut cri, &c).await?, expected, "cgroup v2: {}", corral_rig::cgroup::is_v2());

    for id in [a, b, c] {
        cri.remove_container(&id).await?;
    }
    cri.stop_and_remove_pod(&pod).await?;
    let _ = std::fs::remove_file(&failpoint);
    Ok(())
}
