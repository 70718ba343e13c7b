//! Containers over a pod's life: exit codes, replacing a container in a running pod (the shim must
//! not exit when its last container goes), and pods side by side.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, log_dir, pod_config, wait_for_text};
use corral_rig::{eventually, probe, Options, Rig};

const HANDLER: &str = "corral";

/// The pod's server: its own, or in node mode the node's.
fn shim_pids(sandbox: &str) -> Vec<u32> {
    probe::shim_of(sandbox).into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_exit_code_is_reported() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("exits");
    let pod = cri.run_pod(&cfg, HANDLER).await?;

    let c = cri.run_container(&pod, &cfg, &container_config("three", "echo bye; exit 3")).await?;
    assert_eq!(cri.wait_exited(&c, Duration::from_secs(10)).await?, 3);
    // Killed from the node (inside its pid namespace, pid 1 would ignore the signal).
    let killed = cri.run_container(&pod, &cfg, &container_config("killed", "exec sleep 1000")).await?;
    let pid = cri.container_pid(&killed).await?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)?;
    assert_eq!(cri.wait_exited(&killed, Duration::from_secs(10)).await?, 137, "128 + SIGKILL");
    // The pod outlives its containers.
    assert!(cri.pod_ready(&pod).await?);

    cri.remove_container(&c).await?;
    cri.remove_container(&killed).await?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_is_replaced_in_the_same_pod_without_the_shim_exiting() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let logs = log_dir(&rig.dir, "restarts");
    let cfg = pod_config("restarts", &logs);
    let pod = cri.run_pod(&cfg, HANDLER).await?;
    let shim = shim_pids(&pod);
    assert_eq!(shim.len(), 1, "one shim server per pod: {shim:?}");

    let first = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    cri.stop_container(&first).await?;
    cri.remove_container(&first).await?;
    // The pod has no container now; it must still be there and serve a new one (attempt 1).
    assert!(cri.pod_ready(&pod).await?);
    let mut again = container_config("app", "echo second-life; exec sleep 1000");
    again.metadata.as_mut().context("metadata")?.attempt = 1;
    again.log_path = "app-1.log".into();
    let second = cri.run_container(&pod, &cfg, &again).await?;
    wait_for_text(&logs.join("app-1.log"), "second-life", Duration::from_secs(10)).await?;
    assert_eq!(shim_pids(&pod), shim, "the same shim process serves the pod");

    cri.stop_container(&second).await?;
    cri.remove_container(&second).await?;
    cri.stop_and_remove_pod(&pod).await?;
    // Its last pod gone, the server exits (in node mode too: this rig has no other pod).
    eventually(Duration::from_secs(3), || {
        let left: Vec<_> = shim.iter().filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
        (!left.is_empty()).then(|| format!("shim still running: {left:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_pod_runs_beside_the_first_in_its_own_namespaces() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let (cfg_a, cfg_b) = (rig.pod_config("alpha"), rig.pod_config("beta"));
    let a = cri.run_pod(&cfg_a, HANDLER).await?;
    let ca = cri.run_container(&a, &cfg_a, &container_config("app", "exec sleep 1000")).await?;
    let b = cri.run_pod(&cfg_b, HANDLER).await?;
    let cb = cri.run_container(&b, &cfg_b, &container_config("app", "exec sleep 1000")).await?;

    assert!(cri.pod_ready(&a).await? && cri.pod_ready(&b).await?);
    let (pa, pb) = (cri.container_pid(&ca).await?, cri.container_pid(&cb).await?);
    for kind in ["net", "ipc", "uts"] {
        assert_ne!(probe::ns(pa, kind)?, probe::ns(pb, kind)?, "{kind}: pods are isolated");
    }
    match corral_rig::node_mode() {
        false => assert_ne!(shim_pids(&a), shim_pids(&b), "one shim per pod"),
        true => assert_eq!(shim_pids(&a), shim_pids(&b), "node mode: one server for both pods"),
    }

    cri.stop_and_remove_pod(&a).await?;
    // Removing one pod leaves the other untouched.
    assert!(cri.pod_ready(&b).await?);
    assert!(std::path::Path::new(&format!("/proc/{pb}")).exists(), "pod b's container still runs");
    cri.stop_and_remove_pod(&b).await?;
    Ok(())
}
