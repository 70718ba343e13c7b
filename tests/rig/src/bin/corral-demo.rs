//! The demo: a private containerd, one pod on the `corral` handler with two busybox containers,
//! then the pod's processes and namespaces as /proc shows them, then teardown.

use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, log_dir, pod_config, wait_for_text};
use corral_rig::{probe, Options, Rig};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn row(role: &str, pid: u32) -> String {
    let ns: Vec<String> = ["net", "ipc", "uts", "pid"]
        .iter()
        .map(|k| probe::ns(pid, k).unwrap_or_default())
        .map(|s| s.split(['[', ']']).nth(1).unwrap_or("?").to_string())
        .collect();
    let argv = probe::cmdline(pid).join(" ");
    let argv: String = argv.chars().take(60).collect();
    format!(
        "{role:<12} {pid:>7} {:>8} {:>11} {:>11} {:>11} {:>11}  {argv}",
        rss_kib(pid),
        ns[0],
        ns[1],
        ns[2],
        ns[3]
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    println!("starting a private containerd (handlers: corral, runc) ...");
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let logs = log_dir(&rig.dir, "demo");
    let cfg = pod_config("demo", &logs);
    let started = std::time::Instant::now();
    let pod = cri.run_pod(&cfg, "corral").await?;
    println!("RunPodSandbox (corral): {pod} in {:?}", started.elapsed());
    let web = cri
        .run_container(
            &pod,
            &cfg,
            &container_config("web", "echo web says hello from $(hostname); exec sleep 1000"),
        )
        .await?;
    let side = cri.run_container(&pod, &cfg, &container_config("sidecar", "exec sleep 1000")).await?;
    let line = wait_for_text(&logs.join("web.log"), "hello", Duration::from_secs(10)).await?;
    println!("web's CRI log: {}", line.trim());

    let shim = probe::shim_of(&pod).context("shim process")?;
    let holder = probe::holder_of(&pod).context("holder process")?;
    println!(
        "\n{:<12} {:>7} {:>8} {:>11} {:>11} {:>11} {:>11}  command",
        "role", "pid", "rss KiB", "net", "ipc", "uts", "pid ns"
    );
    println!("{}", row("node", std::process::id()));
    println!("{}", row("corral shim", shim));
    println!("{}", row("holder", holder));
    println!("{}", row("web", cri.container_pid(&web).await?));
    println!("{}", row("sidecar", cri.container_pid(&side).await?));
    let containers = rig.ctr(&["containers", "ls", "-q"])?;
    println!(
        "\ncontainerd's containers: {} (the sandbox id is {}among them: no pause container)",
        containers.lines().count(),
        if containers.contains(&pod) { "" } else { "not " }
    );

    // `corral-demo --hold SECS`: keep the pod running to look around before teardown.
    let hold: u64 =
        std::env::args().skip_while(|a| a != "--hold").nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    if hold > 0 {
        println!("holding the pod for {hold} s (sandbox {pod})");
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    cri.stop_and_remove_pod(&pod).await?;
    corral_rig::eventually(Duration::from_secs(3), || {
        let left = probe::pids_with_cmdline(&pod);
        (!left.is_empty()).then(|| format!("corral processes left: {left:?}"))
    })
    .await?;
    println!("pod stopped and removed; no corral process, holder or container left");
    Ok(())
}
