//! A pod's shim dies (SIGKILL): containerd notices, runs `delete`, and corral's `delete` releases
//! the pod from its record with no server alive: holder, containers, mounts, pins, socket.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::container_config;
use corral_rig::{eventually, probe, Options, Rig};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shim_is_cleaned_up_by_delete_and_the_pod_goes_notready() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("crash");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    let init = cri.container_pid(&c).await?;
    let shim = probe::shim_of(&pod).context("shim server")?;
    let socket = probe::shim_socket(shim).context("-socket argument")?;
    assert!(probe::holder_of(&pod).is_some());

    kill(Pid::from_raw(shim as i32), Signal::SIGKILL)?;

    // CRI learns it through the broken WaitSandbox and reports the pod NOTREADY within 1 s.
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(1));
    // (Right after the crash PodSandboxStatus may fail once: the connection is closing.)
    while cri.pod_ready(&pod).await.unwrap_or(true) {
        assert!(std::time::Instant::now() < deadline, "pod still READY 1 s after its shim died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // containerd's `delete` killed the holder and the container, and removed the socket.
    eventually(Duration::from_secs(5), || {
        let holder = probe::holder_of(&pod);
        let alive = std::path::Path::new(&format!("/proc/{init}")).exists();
        (holder.is_some() || alive || std::path::Path::new(&socket).exists())
            .then(|| format!("holder {holder:?}, container alive {alive}, socket exists"))
    })
    .await?;
    assert!(
        probe::mounts_containing(&pod).is_empty(),
        "pins or shm left: {:?}",
        probe::mounts_containing(&pod)
    );
    assert!(!probe::corral_runc_containers().contains(&c), "runc container left");

    // CRI's Task.Wait broke with the shim: it marks the container exited (255).
    assert_eq!(cri.wait_exited(&c, Duration::from_secs(5)).await?, 255);
    // kubelet then stops and removes the pod: both succeed.
    cri.stop_container(&c).await?;
    cri.remove_container(&c).await?;
    cri.stop_and_remove_pod(&pod).await?;
    let left = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(left.is_empty(), "mounts left under containerd's dirs: {left:?}");
    Ok(())
}
