//! The pod cgroup: the holder lives in `<cgroup_parent>/<sandbox id>` with the pod's resources;
//! CRI's PodSandboxStats (2.1: reads cgroup_parent) and ContainerStats (Task.Stats) and the
//! SandboxMetrics RPC (what containerd 2.4 calls) report the pod; the cgroup goes with the pod.

use std::time::Duration;

use anyhow::{Context, Result};
use containerd_shim_protos::cgroups::metrics::Metrics as V1Metrics;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::sandbox_api::SandboxMetricsRequest;
use containerd_shim_protos::sandbox_async::SandboxClient;
use corral_rig::cri::container_config;
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::{ContainerStatsRequest, LinuxContainerResources, PodSandboxStatsRequest};

fn v1_dir(controller: &str, rel: &str) -> std::path::PathBuf {
    // /sys/fs/cgroup/<controller> is the mount or a symlink to it (cpu -> cpu,cpuacct).
    std::path::Path::new("/sys/fs/cgroup").join(controller).join(rel.trim_start_matches('/'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_lives_in_the_pod_cgroup_and_stats_report_the_pod() -> Result<()> {
    if std::fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains("cgroup2"))
    {
        // Assertions below read v1 files; the v2 code is unit tested on recorded files.
        anyhow::bail!("this test reads cgroup v1 files; run it on a v1 or hybrid host");
    }
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
    let sandbox_cg = format!("{parent}/{pod}");
    let cgroup = std::fs::read_to_string(format!("/proc/{holder}/cgroup"))?;
    assert!(cgroup.lines().any(|l| l.ends_with(&format!(":memory:{sandbox_cg}"))), "{cgroup}");
    assert_eq!(
        std::fs::read_to_string(v1_dir("memory", &sandbox_cg).join("memory.limit_in_bytes"))?,
        "268435456\n"
    );
    assert_eq!(std::fs::read_to_string(v1_dir("cpu", &sandbox_cg).join("cpu.shares"))?, "512\n");

    // A container that burns a little CPU and holds a little memory, then sleeps.
    let script = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/dev/shm/ballast bs=1M count=8 2>/dev/null; exec sleep 1000";
    let c = cri.run_container(&pod, &cfg, &container_config("busy", script)).await?;
    let mut cpu = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
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
    let limit =
        std::fs::read_to_string(v1_dir("memory", &format!("{parent}/{c}")).join("memory.limit_in_bytes"))?;
    assert_eq!(limit.trim(), (128u64 << 20).to_string());

    let pod_stats = cri
        .runtime
        .pod_sandbox_stats(PodSandboxStatsRequest { pod_sandbox_id: pod.clone() })
        .await?
        .into_inner()
        .stats
        .and_then(|s| s.linux)
        .context("linux pod stats")?;
    let pod_cpu = pod_stats.cpu.and_then(|c| c.usage_core_nano_seconds).map_or(0, |v| v.value);
    assert!(pod_cpu >= cpu, "the pod cgroup includes the container: {pod_cpu} < {cpu}");

    // SandboxMetrics, as containerd 2.4 asks for it, straight over ttrpc.
    let shim = probe::shim_of(&pod).context("shim")?;
    let socket = probe::shim_socket(shim).context("-socket")?;
    let client = SandboxClient::new(ttrpc::asynchronous::Client::connect(&format!("unix://{socket}")).await?);
    let req = SandboxMetricsRequest { sandbox_id: pod.clone(), ..Default::default() };
    let resp = client.sandbox_metrics(ttrpc::context::with_timeout(5_000_000_000), &req).await?;
    let data = resp.metrics.data.clone().into_option().context("metric data")?;
    assert_eq!(data.type_url, "io.containerd.cgroups.v1.Metrics");
    let metrics = V1Metrics::parse_from_bytes(&data.value)?;
    assert!(metrics.memory.usage.usage > 0 && metrics.cpu.usage.total >= cpu, "{metrics:?}");

    cri.stop_and_remove_pod(&pod).await?;
    eventually(Duration::from_secs(3), || {
        let left: Vec<_> = ["memory", "cpu", "pids", "cpuset"]
            .iter()
            .map(|c| v1_dir(c, &sandbox_cg))
            .filter(|d| d.exists())
            .collect();
        (!left.is_empty()).then(|| format!("pod cgroup left: {left:?}"))
    })
    .await?;
    // The parent is kubelet's to remove (the rig does it).
    Ok(())
}
