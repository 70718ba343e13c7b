//! The foundation: a real pod on the private containerd through CRI, with no pause container.
//! Every fact is read from /proc, the mount table, containerd's stores or the CRI log file.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, log_dir, pod_config, wait_for_text};
use corral_rig::{eventually, probe, Options, Rig, PAUSE};

const HANDLER: &str = "corral";

/// The container's init as the kernel sees it: the process in the container's cgroup whose
/// parent is not.
fn init_pid(cid: &str) -> Result<u32> {
    let pids = probe::pids_in_cgroup_of(cid);
    pids.iter()
        .copied()
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid: u32 = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            !pids.contains(&ppid)
        })
        .with_context(|| format!("no process in the cgroup of {cid}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_two_containers_shares_the_pod_namespaces_and_leaves_nothing() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let images = cri.image_names().await?;
    assert!(!images.iter().any(|i| i == PAUSE), "the pause image must not be present: {images:?}");

    let logs = log_dir(&rig.dir, "twins");
    let pod_cfg = pod_config("twins", &logs);
    let pod = cri.run_pod(&pod_cfg, HANDLER).await?;
    assert!(cri.pod_ready(&pod).await?, "pod is READY after RunPodSandbox");
    let holder = probe::holder_of(&pod).context("a holder process for the pod")?;

    let script =
        "echo hello-from-one; echo host=$(hostname); echo file=$(cat /etc/hostname); exec sleep 1000";
    let c1 = cri.run_container(&pod, &pod_cfg, &container_config("one", script)).await?;
    let c2 = cri.run_container(&pod, &pod_cfg, &container_config("two", "exec sleep 1000")).await?;

    let (p1, p2) = (init_pid(&c1)?, init_pid(&c2)?);
    assert_eq!(cri.container_pid(&c1).await?, p1, "CRI's task pid is the container's init");
    let host = std::process::id();
    for kind in ["net", "ipc", "uts"] {
        let sandbox_ns = probe::ns(holder, kind)?;
        assert_eq!(probe::ns(p1, kind)?, sandbox_ns, "{kind}: container one joins the pod");
        assert_eq!(probe::ns(p2, kind)?, sandbox_ns, "{kind}: container two joins the pod");
        assert_ne!(probe::ns(host, kind)?, sandbox_ns, "{kind}: the pod is not the host");
    }
    // kubelet's default: each container has its own pid namespace.
    assert_ne!(probe::ns(p1, "pid")?, probe::ns(p2, "pid")?);
    assert_ne!(probe::ns(p1, "pid")?, probe::ns(host, "pid")?);

    // The container's stdout reaches the CRI log file, and it sees the pod's hostname.
    let log = wait_for_text(&logs.join("one.log"), "file=", Duration::from_secs(10)).await?;
    assert!(log.contains("stdout F hello-from-one"), "{log}");
    assert!(log.contains("host=twins"), "{log}");
    assert!(log.contains("file=twins"), "{log}");

    // No pause container: containerd has no container record for the sandbox id.
    let containers = rig.ctr(&["containers", "ls", "-q"])?;
    assert!(!containers.contains(&pod), "sandbox id among containers: {containers}");
    assert!(containers.contains(&c1) && containers.contains(&c2), "{containers}");
    // A pause container would need containerd's runc shim: none runs for this containerd.
    let runc_shims: Vec<_> = probe::pids_with_cmdline(&rig.socket.display().to_string())
        .into_iter()
        .filter(|p| probe::cmdline(*p as u32).first().is_some_and(|a| a.contains("containerd-shim-runc")))
        .collect();
    assert!(runc_shims.is_empty(), "containerd-shim-runc-v2 running: {runc_shims:?}");
    let shim = probe::shim_of(&pod).context("the corral shim runs with the sandbox id")?;

    let socket = probe::shim_socket(shim).context("-socket argument")?;

    // The shim's socket is root's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket {socket} has mode {mode:o}");

    cri.stop_pod(&pod).await?;
    assert!(!cri.pod_ready(&pod).await?, "NOTREADY after StopPodSandbox");
    assert!(probe::holder_of(&pod).is_none(), "StopPodSandbox ends the holder");
    cri.remove_pod(&pod).await?;

    assert!(probe::holder_of(&pod).is_none(), "holder gone");
    eventually(Duration::from_secs(3), || {
        let left = probe::pids_with_cmdline(&pod);
        (!left.is_empty()).then(|| {
            format!(
                "corral processes left: {left:?} {:?}",
                left.iter().map(|p| probe::cmdline(*p as u32)).collect::<Vec<_>>()
            )
        })
    })
    .await?;
    assert!(
        probe::pids_in_cgroup_of(&c1).is_empty() && probe::pids_in_cgroup_of(&c2).is_empty(),
        "container processes gone"
    );
    let left = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(left.is_empty(), "mounts left under containerd's dirs: {left:?}");
    assert!(
        probe::mounts_containing(&pod).is_empty(),
        "pins or shm left: {:?}",
        probe::mounts_containing(&pod)
    );
    assert!(!std::path::Path::new(&socket).exists(), "socket {socket} left");
    let runc = probe::corral_runc_containers();
    assert!(!runc.contains(&c1) && !runc.contains(&c2), "runc containers left: {runc:?}");
    Ok(())
}
