//! The pod cgroup: the holder lives in `<cgroup_parent>/<sandbox id>` (under systemd, in the scope
//! `corral-<sandbox id>.scope` systemd made in the pod's slice) with the pod's resources;
//! CRI's PodSandboxStats (2.1: reads cgroup_parent) and ContainerStats (Task.Stats) and the
//! SandboxMetrics RPC (what containerd 2.4 calls) report the pod; the cgroup goes with the pod.

use std::time::Duration;

use anyhow::{Context, Result};
use containerd_shim_protos::cgroups::metrics::Metrics as V1Metrics;
use containerd_shim_protos::cgroups_v2::metrics::Metrics as V2Metrics;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::sandbox_api::SandboxMetricsRequest;
use containerd_shim_protos::sandbox_async::SandboxClient;
use corral_rig::cri::container_config;
use corral_rig::{cgroup, eventually, probe, Options, Rig};
use k8s_cri::v1::{ContainerStatsRequest, LinuxContainerResources, PodSandboxStatsRequest};

/// On a cgroupfs node (v1 here) the parent is a path and the container's cgroup
/// `<parent>/<id>`; on a systemd node (v2) a slice, and the container's cgroup the scope runc
/// asked systemd for. The holder's is `<parent>/<sandbox id>`, or the scope corral asked systemd
/// for, whose resources outlive systemd re-reading its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_lives_in_the_pod_cgroup_and_stats_report_the_pod() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let parent = rig.cgroup_parent("cg");
    let mut cfg = rig.pod_config("cg");
    let linux = cfg.linux.as_mut().unwrap();
    linux.cgroup_parent = parent.clone();
    linux.resources = Some(LinuxContainerResources {
        cpu_shares: 512,
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    });
    let pod = cri.run_pod(&cfg, "corral").await?;
    let holder = probe::holder_of(&pod).context("holder")?;
    let sandbox_cg = cgroup::pod_cgroup(&parent, &pod);
    assert_eq!(cgroup::of_pid(holder)?, sandbox_cg, "the holder's cgroup");
    assert_eq!(cgroup::memory_limit(&sandbox_cg)?, "268435456");
    assert_eq!(cgroup::cpu_share(&sandbox_cg)?, cgroup::expected_cpu_share(512), "cpu.shares / cpu.weight");
    if cgroup::is_systemd() {
        let scope = format!("corral-{pod}.scope");
        assert_eq!(cgroup::units(&scope), vec![scope.clone()], "corral asked systemd for the holder's scope");
        assert_eq!(cgroup::unit_property(&scope, "Slice")?, parent, "the scope is in the pod's slice");
        assert_eq!(cgroup::unit_property(&scope, "KillSignal")?, "9", "a stop kills the holder at once");
        // systemd re-realizes every unit's cgroup on a reload: what a unit of its own asked for
        // stays (a directory systemd did not make could lose its controllers here).
        cgroup::daemon_reload()?;
        assert_eq!(cgroup::memory_limit(&sandbox_cg)?, "268435456", "after a daemon-reload");
        assert_eq!(cgroup::cpu_share(&sandbox_cg)?, cgroup::expected_cpu_share(512), "after a daemon-reload");
    }

    // A container that burns a little CPU and holds a little memory, then sleeps.
    let script = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/dev/shm/ballast bs=1M count=8 2>/dev/null; exec sleep 1000";
    let c = cri.run_container(&pod, &cfg, &container_config("busy", script)).await?;
    let container_cg = cgroup::container_cgroup(&parent, &c);
    let init = probe::pids_in_cgroup_of(&c);
    assert!(!init.is_empty(), "no process in the cgroup of {c}");
    assert_eq!(cgroup::of_pid(init[0])?, container_cg, "the container's cgroup");
    if cgroup::is_systemd() {
        let scope = format!("cri-containerd-{c}.scope");
        assert_eq!(cgroup::units(&scope), vec![scope.clone()], "runc asked systemd for the scope");
    }
    let mut cpu = 0;
    let deadline = std::time::Instant::now() + corral_rig::scaled(Duration::from_secs(20));
    while cpu < 100_000_000 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stats = cri
            .runtime
            .container_stats(ContainerStatsRequest { container_id: c.clone() })
            .await?
            .into_inner();
        let stats = stats.stats.context("container stats")?;
        cpu = stats.cpu.and_then(|c| c.usage_core_nano_seconds).map_or(0, |v| v.value);
        let mem = stats.memory.and_then(|m| m.working_set_bytes).map_or(0, |v| v.value);
        assert!(mem > 0, "container memory working set is reported");
    }
    assert!(cpu >= 100_000_000, "container CPU time reported by CRI: {cpu} ns");

    // UpdateContainerResources reaches the container's cgroup (Task.Update -> runc update).
    cri.runtime
        .update_container_resources(k8s_cri::v1::UpdateContainerResourcesRequest {
            container_id: c.clone(),
            linux: Some(LinuxContainerResources { memory_limit_in_bytes: 128 << 20, ..Default::default() }),
            ..Default::default()
        })
        .await?;
    assert_eq!(cgroup::memory_limit(&container_cg)?, (128u64 << 20).to_string());

    // CRI's PodSandboxStats: containerd 2.1 reads cgroup_parent itself, for every handler, and
    // its cgroup v2 loader takes only a path: a slice (what kubelet sends on a systemd node)
    // fails there before any runtime is asked. containerd 2.4 asks the sandbox controller, which
    // is SandboxMetrics below.
    let pod_stats =
        cri.runtime.pod_sandbox_stats(PodSandboxStatsRequest { pod_sandbox_id: pod.clone() }).await;
    if cgroup::is_systemd() {
        let err = pod_stats.expect_err("containerd 2.1 cannot load a slice as a v2 cgroup").to_string();
        assert!(err.contains("failed to load sandbox cgroup") && err.contains("invalid group path"), "{err}");
    } else {
        let pod_stats = pod_stats?.into_inner().stats.and_then(|s| s.linux).context("linux pod stats")?;
        let pod_cpu = pod_stats.cpu.and_then(|c| c.usage_core_nano_seconds).map_or(0, |v| v.value);
        assert!(pod_cpu >= cpu, "the pod cgroup includes the container: {pod_cpu} < {cpu}");
    }

    // SandboxMetrics, as containerd 2.4 asks for it, straight over ttrpc.
    let shim = probe::shim_of(&pod).context("shim")?;
    let socket = probe::shim_socket(shim).context("-socket")?;
    let client = SandboxClient::new(ttrpc::asynchronous::Client::connect(&format!("unix://{socket}")).await?);
    let req = SandboxMetricsRequest { sandbox_id: pod.clone(), ..Default::default() };
    let resp = client.sandbox_metrics(ttrpc::context::with_timeout(5_000_000_000), &req).await?;
    let data = resp.metrics.data.clone().into_option().context("metric data")?;
    if cgroup::is_v2() {
        // v2: the pod's memory.current and cpu.stat's usage_usec (microseconds).
        assert_eq!(data.type_url, "io.containerd.cgroups.v2.Metrics");
        let metrics = V2Metrics::parse_from_bytes(&data.value)?;
        assert!(metrics.memory.usage > 0 && metrics.cpu.usage_usec * 1000 >= cpu, "{metrics:?}");
        assert!(metrics.pids.current >= 2, "the holder and the container: {:?}", metrics.pids);
    } else {
        assert_eq!(data.type_url, "io.containerd.cgroups.v1.Metrics");
        let metrics = V1Metrics::parse_from_bytes(&data.value)?;
        assert!(metrics.memory.usage.usage > 0 && metrics.cpu.usage.total >= cpu, "{metrics:?}");
    }

    cri.stop_and_remove_pod(&pod).await?;
    eventually(Duration::from_secs(5), || {
        let left: Vec<_> = [&sandbox_cg, &container_cg].into_iter().filter(|cg| cgroup::exists(cg)).collect();
        (!left.is_empty()).then(|| format!("cgroups left: {left:?}"))
    })
    .await?;
    let units = rig.units().into_iter().filter(|u| u.ends_with(".scope")).collect::<Vec<_>>();
    assert!(units.is_empty(), "scopes left: {units:?}");
    // The parent is kubelet's: removing it as kubelet does finds it empty.
    rig.remove_cgroup_parent("cg").await?;
    Ok(())
}
