//! Namespace modes other than kubelet's default: a shared pod PID namespace
//! (`shareProcessNamespace`), whose pid 1 is the holder and reaps orphans, and hostIPC.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, container_ns, pod_ns};
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::{ContainerConfig, NamespaceMode, PodSandboxConfig};

fn set_modes(pod: &mut PodSandboxConfig, pid: NamespaceMode, ipc: NamespaceMode) {
    let ns = pod_ns(pod);
    (ns.pid, ns.ipc) = (pid as i32, ipc as i32);
}

fn set_container_modes(c: &mut ContainerConfig, pid: NamespaceMode, ipc: NamespaceMode) {
    let ns = container_ns(c);
    (ns.pid, ns.ipc) = (pid as i32, ipc as i32);
}

fn state_of(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|s| s.trim_start().chars().next()).unwrap_or('?')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_pid_namespace_has_the_holder_as_pid_1_reaping_orphans() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("shared-pid");
    set_modes(&mut cfg, NamespaceMode::Pod, NamespaceMode::Pod);
    let pod = cri.run_pod(&cfg, "corral").await?;

    // Container a leaves an orphan behind: `sleep 0.2` outlives its parent shell.
    let mut a = container_config("a", "sh -c 'sleep 0.2 &'; exec sleep 1000");
    set_container_modes(&mut a, NamespaceMode::Pod, NamespaceMode::Pod);
    let mut b = container_config("b", "exec sleep 1001");
    set_container_modes(&mut b, NamespaceMode::Pod, NamespaceMode::Pod);
    let ca = cri.run_container(&pod, &cfg, &a).await?;
    let cb = cri.run_container(&pod, &cfg, &b).await?;

    let (pa, pb) = (cri.container_pid(&ca).await?, cri.container_pid(&cb).await?);
    let pod_pidns = probe::ns(pa, "pid")?;
    assert_eq!(probe::ns(pb, "pid")?, pod_pidns, "both containers share the pod's pid namespace");
    assert_ne!(probe::ns(std::process::id(), "pid")?, pod_pidns);

    // Inside, pid 1 is corral's holder, and each container sees the other's process.
    let (_, pid1, _) = cri.exec_sync(&ca, &["cat", "/proc/1/cmdline"]).await?;
    let pid1: Vec<&str> = pid1.split('\0').collect();
    assert_eq!(pid1.get(1..3), Some(&["holder", pod.as_str()][..]), "pid 1 is the holder: {pid1:?}");
    let (_, ps, _) = cri.exec_sync(&ca, &["ps", "-o", "args"]).await?;
    assert!(ps.contains("sleep 1001"), "a sees b's process: {ps}");

    // The orphan was reparented to the holder and reaped: no zombie in the pod.
    eventually(Duration::from_secs(5), || {
        let zombies: Vec<u32> = probe::all_pids()
            .into_iter()
            .filter(|p| {
                probe::ns(*p, "pid").ok().as_deref() == Some(pod_pidns.as_str()) && state_of(*p) == 'Z'
            })
            .collect();
        (!zombies.is_empty()).then(|| format!("zombies in the pod: {zombies:?}"))
    })
    .await?;

    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_ipc_uses_the_node_ipc_namespace_and_dev_shm() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("host-ipc");
    set_modes(&mut cfg, NamespaceMode::Container, NamespaceMode::Node);
    let pod = cri.run_pod(&cfg, "corral").await?;
    let mut c = container_config("app", "exec sleep 1000");
    set_container_modes(&mut c, NamespaceMode::Container, NamespaceMode::Node);
    let c = cri.run_container(&pod, &cfg, &c).await?;

    let pid = cri.container_pid(&c).await?;
    assert_eq!(probe::ns(pid, "ipc")?, probe::ns(std::process::id(), "ipc")?, "host IPC namespace");
    assert_ne!(probe::ns(pid, "net")?, probe::ns(std::process::id(), "net")?, "but the pod's network");
    let note = format!("/dev/shm/corral-host-ipc-{}", std::process::id());
    std::fs::write(&note, "from the node\n")?;
    let (_, seen, _) = cri.exec_sync(&c, &["cat", &note]).await?;
    std::fs::remove_file(&note)?;
    assert_eq!(seen, "from the node\n", "the node's /dev/shm");
    // No pod shm was mounted for a hostIPC pod.
    assert!(
        probe::mounts_containing(&pod).iter().all(|m| !m.ends_with("/shm")),
        "{:?}",
        probe::mounts_containing(&pod)
    );

    cri.stop_and_remove_pod(&pod).await.context("teardown")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_pid_mode_joins_another_container_and_host_pid_uses_the_node() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;

    // TARGET (ephemeral containers): b joins a's pid namespace.
    let cfg = rig.pod_config("target");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let a = cri.run_container(&pod, &cfg, &container_config("a", "exec sleep 1000")).await?;
    let mut b = container_config("b", "exec sleep 1001");
    container_ns(&mut b).pid = NamespaceMode::Target as i32;
    container_ns(&mut b).target_id = a.clone();
    let b = cri.run_container(&pod, &cfg, &b).await?;
    let (pa, pb) = (cri.container_pid(&a).await?, cri.container_pid(&b).await?);
    assert_eq!(probe::ns(pb, "pid")?, probe::ns(pa, "pid")?, "b is in a's pid namespace");
    let (_, ps, _) = cri.exec_sync(&b, &["ps", "-o", "args"]).await?;
    assert!(ps.contains("sleep 1000"), "b sees a's init: {ps}");
    cri.stop_and_remove_pod(&pod).await?;

    // hostPID: the holder stays in the node's pid namespace, and so do NODE-mode containers.
    let mut cfg = rig.pod_config("host-pid");
    set_modes(&mut cfg, NamespaceMode::Node, NamespaceMode::Pod);
    let pod = cri.run_pod(&cfg, "corral").await?;
    let mut c = container_config("app", "exec sleep 1000");
    set_container_modes(&mut c, NamespaceMode::Node, NamespaceMode::Pod);
    let c = cri.run_container(&pod, &cfg, &c).await?;
    let pid = cri.container_pid(&c).await?;
    assert_eq!(probe::ns(pid, "pid")?, probe::ns(std::process::id(), "pid")?, "node pid namespace");
    let (_, out, _) = cri.exec_sync(&c, &["cat", &format!("/proc/{}/comm", std::process::id())]).await?;
    assert!(!out.is_empty(), "the container sees node processes");
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_tries_to_be_the_last_oom_victim_and_a_refusal_does_not_fail_the_pod() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("oom-adj");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let holder = probe::holder_of(&pod).context("holder")?;
    let adj: i32 = std::fs::read_to_string(format!("/proc/{holder}/oom_score_adj"))?.trim().parse()?;
    // Where the host allows it, -998 (as the pause container); root without CAP_SYS_RESOURCE
    // (this machine) keeps the inherited value, and the pod is READY either way.
    let inherited: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")?.trim().parse()?;
    assert!(adj == -998 || adj == inherited, "oom_score_adj {adj}");
    assert!(cri.pod_ready(&pod).await?);
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
