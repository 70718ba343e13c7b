//! A stopped pod (kubelet stops the sandbox of a finished Job's pod and may remove it days later)
//! holds nothing but its shim server: no holder, no container, no namespace pin, no shm. Its
//! status, its removal and containerd's `delete` after a crash of that server still work.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::container_config;
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::PodSandboxState;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A pod (in its own cgroup parent) with two running containers; returns (pod, containers, parent).
async fn pod_with_two_containers(
    rig: &Rig,
    cri: &mut corral_rig::Cri,
    name: &str,
) -> Result<(String, Vec<String>, String)> {
    let mut cfg = rig.pod_config(name);
    let parent = rig.cgroup_parent(name);
    cfg.linux.as_mut().unwrap().cgroup_parent = parent.clone();
    let pod = cri.run_pod(&cfg, "corral").await?;
    let mut containers = Vec::new();
    for c in ["a", "b"] {
        containers.push(cri.run_container(&pod, &cfg, &container_config(c, "exec sleep 1000")).await?);
    }
    Ok((pod, containers, parent))
}

/// What of the pod is left on the node besides its shim server: processes (by cgroup and by
/// command line) and mounts (by sandbox or container id). Empty when nothing is.
fn leftovers(pod: &str, containers: &[String], parent: &str, shim: Option<u32>) -> Vec<String> {
    let mut left = Vec::new();
    for pid in probe::pids_in_cgroup_of(parent) {
        left.push(format!("process {pid} {:?} in the pod's cgroups", probe::cmdline(pid)));
    }
    for pid in probe::pids_with_cmdline(pod) {
        if Some(pid as u32) != shim {
            left.push(format!("process {pid} {:?}", probe::cmdline(pid as u32)));
        }
    }
    for id in std::iter::once(&pod.to_string()).chain(containers) {
        left.extend(probe::mounts_containing(id).into_iter().map(|m| format!("mount {m}")));
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pod_keeps_only_its_server_and_still_answers_and_goes() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let (pod, containers, parent) = pod_with_two_containers(&rig, &mut cri, "stopped").await?;
    let shim = probe::shim_of(&pod).context("shim server")?;
    assert!(
        !leftovers(&pod, &containers, &parent, Some(shim)).is_empty(),
        "a running pod has a holder and pins"
    );

    cri.stop_pod(&pod).await?;
    eventually(Duration::from_secs(2), || {
        let left = leftovers(&pod, &containers, &parent, Some(shim));
        (!left.is_empty()).then(|| format!("after StopPodSandbox: {left:?}"))
    })
    .await?;
    assert_eq!(probe::shim_of(&pod), Some(shim), "the stopped pod's server still answers for it");

    // Status still works (and says NOTREADY), as do its containers' statuses.
    let status = cri.pod_status(&pod).await?.status.context("status")?;
    assert_eq!(status.state, PodSandboxState::SandboxNotready as i32);
    for c in &containers {
        cri.wait_exited(c, Duration::from_secs(2)).await?;
    }
    // Removal releases the rest: the server, its socket, the bundle.
    let socket = probe::shim_socket(shim).context("-socket")?;
    cri.remove_pod(&pod).await?;
    eventually(Duration::from_secs(5), || {
        let alive = std::path::Path::new(&format!("/proc/{shim}")).exists();
        let left = leftovers(&pod, &containers, &parent, None);
        (alive || std::path::Path::new(&socket).exists() || !left.is_empty())
            .then(|| format!("server alive {alive}, socket, {left:?}"))
    })
    .await?;
    assert!(!probe::corral_runc_containers().iter().any(|c| containers.contains(c)), "runc containers left");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_still_releases_a_stopped_pod_whose_server_died() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let (pod, containers, parent) = pod_with_two_containers(&rig, &mut cri, "stopped-crash").await?;
    let shim = probe::shim_of(&pod).context("shim server")?;
    let socket = probe::shim_socket(shim).context("-socket")?;
    cri.stop_pod(&pod).await?;

    // The server dies while the pod is stopped: containerd runs `delete` from the pod's record.
    kill(Pid::from_raw(shim as i32), Signal::SIGKILL)?;
    eventually(Duration::from_secs(5), || {
        let left = leftovers(&pod, &containers, &parent, None);
        (std::path::Path::new(&socket).exists() || !left.is_empty()).then(|| format!("socket or {left:?}"))
    })
    .await?;
    // Right after the server dies a status call may fail while containerd's connection to it
    // closes ("ttrpc: closed", seen once in node mode): kubelet asks again, and so does this.
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(5));
    let status = loop {
        match cri.pod_status(&pod).await {
            Ok(status) => break status,
            Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("ttrpc: closed") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(e),
        }
    };
    let status = status.status.context("status")?;
    assert_eq!(status.state, PodSandboxState::SandboxNotready as i32);
    cri.remove_pod(&pod).await?;
    let left = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(left.is_empty(), "mounts left under containerd's dirs: {left:?}");
    Ok(())
}
