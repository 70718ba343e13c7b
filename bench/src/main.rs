//! `corral-bench`: corral, per pod (`corral`) and in node mode (`corral-node`), against
//! containerd's default pause sandbox (the `runc` handler with a pause image), side by side on one
//! private containerd, alternating handlers so drift hits all. It measures and reports; it
//! asserts nothing.
//!
//! Then pod to RUNNING once more with corral's builtin OCI runtime (`corral-oci`) against the
//! pause sandbox, on a second containerd, and where a container start goes with each runtime.
//!
//! Usage: corral-bench [--pods N] [--parallel N] [--out DIR]

mod measure;
mod report;
mod shimlog;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, Cri};
use corral_rig::{probe, Options, Rig};
use measure::{PodProcesses, Usage};
use report::{Figure, Report};

/// corral per pod, corral in node mode (the `corral-node` handler), and the baseline last.
const HANDLERS: [&str; 3] = ["corral", "corral-node", "runc"];

struct Args {
    pods: usize,
    parallel: usize,
    out: PathBuf,
}

fn args() -> Result<Args> {
    let mut a = Args { pods: 30, parallel: 20, out: PathBuf::from("target/bench") };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--pods" => a.pods = it.next().context("--pods N")?.parse()?,
            "--parallel" => a.parallel = it.next().context("--parallel N")?.parse()?,
            "--out" => a.out = it.next().context("--out DIR")?.into(),
            "-h" | "--help" => {
                println!("usage: corral-bench [--pods N] [--parallel N] [--out DIR]");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}

/// Waits up to 60 s for the 1-minute load to drop below 1.0; returns the load seen.
async fn wait_for_idle() -> f64 {
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while load() >= 1.0 && Instant::now() < deadline {
        progress(&format!("load {:.2}: waiting for an idle machine", load()));
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let l = load();
    if l >= 1.0 {
        progress(&format!("WARNING: the machine is busy (load {l:.2}); figures will be noisy"));
    }
    l
}

/// What all of `handler`'s pods cost together: the processes that exist because of them (for
/// corral-node the one node server, counted once, and each pod's holder).
fn usage_of(rig: &Rig, handler: &str, pods: &[String]) -> Result<Usage> {
    let mut pids: Vec<u32> = pods.iter().flat_map(|p| PodProcesses::find(handler, p).pids).collect();
    if handler == "corral-node" {
        let address = rig.socket.display().to_string();
        pids.extend(probe::node_servers().into_iter().filter(|p| probe::cmdline(*p).contains(&address)));
    }
    pids.sort_unstable();
    pids.dedup();
    PodProcesses { pids }.measure()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    let n = args.pods;
    let load_before = wait_for_idle().await;
    progress("starting a private containerd with the corral, corral-node and runc handlers");
    // The handler's name alone chooses corral's mode here.
    let options = Options { pause_image: true, env_remove: vec!["CORRAL_MODE".into()], ..Default::default() };
    let rig = Rig::start(options).await?;
    let mut cri = rig.cri().await?;
    let containerd = rig.pid().context("containerd pid")?;
    let mut report = Report::new(n, &HANDLERS, load_before);

    warm(&rig, &mut cri).await?;

    // 1. RunPodSandbox, sequential, alternating; n pods per handler, measured; n more, measured
    //    again: the difference over n is what one more pod costs (a node server is shared).
    let mut latency: [Vec<f64>; 3] = Default::default();
    let mut pods: [Vec<String>; 3] = Default::default();
    let mut at_n: Vec<Usage> = Vec::new();
    for round in 0..2 {
        for i in 0..n {
            for (k, h) in HANDLERS.iter().enumerate() {
                let started = Instant::now();
                let (pod, _) = run_pod(&rig, &mut cri, h, &format!("seq{round}-{i}")).await?;
                latency[k].push(started.elapsed().as_secs_f64() * 1000.0);
                pods[k].push(pod);
            }
        }
        progress(&format!("RunPodSandbox: {} pods per handler", n * (round + 1)));
        if round == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            at_n = HANDLERS
                .iter()
                .enumerate()
                .map(|(k, h)| usage_of(&rig, h, &pods[k]))
                .collect::<Result<_>>()?;
        }
    }
    report.latency("RunPodSandbox", "ms", &latency);

    // 2. Memory and CPU of the processes that exist because of the pods (not the app).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at_2n: Vec<Usage> =
        HANDLERS.iter().enumerate().map(|(k, h)| usage_of(&rig, h, &pods[k])).collect::<Result<_>>()?;
    let per = |f: fn(&Usage) -> f64, div: f64| -> Vec<f64> { at_2n.iter().map(|u| f(u) / div).collect() };
    let marginal = |f: fn(&Usage) -> f64| -> Vec<f64> {
        at_2n.iter().zip(&at_n).map(|(two, one)| (f(two) - f(one)) / n as f64).collect()
    };
    let two_n = 2.0 * n as f64;
    report.push(Figure::single(
        &format!("marginal RSS per pod ({n} to {})", 2 * n),
        "MiB",
        &marginal(|u| u.rss_kib / 1024.0),
    ));
    report.push(Figure::single(
        &format!("marginal PSS per pod ({n} to {})", 2 * n),
        "MiB",
        &marginal(|u| u.pss_kib / 1024.0),
    ));
    report.push(Figure::single("per-pod RSS", "MiB", &per(|u| u.rss_kib / 1024.0, two_n)));
    report.push(Figure::single("per-pod PSS", "MiB", &per(|u| u.pss_kib / 1024.0, two_n)));
    report.push(Figure::single("per-pod CPU time", "ms", &per(|u| u.cpu_ms, two_n)));
    report.push(Figure::single("per-pod processes", "count", &per(|u| u.processes as f64, two_n)));

    // 3. Teardown, alternating.
    let mut teardown: [Vec<f64>; 3] = Default::default();
    for i in 0..2 * n {
        for (samples, handler_pods) in teardown.iter_mut().zip(&pods) {
            let started = Instant::now();
            cri.stop_and_remove_pod(&handler_pods[i]).await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    progress("teardown measured");

    // 4. Full pod to RUNNING: RunPodSandbox + CreateContainer + StartContainer.
    let full = pod_to_running(&rig, &mut cri, "full", n).await?;
    report.latency("pod to RUNNING", "ms", &full);
    report.latency("Stop+RemovePodSandbox", "ms", &teardown);
    progress("pod to RUNNING measured");

    // 5. Throughput: `parallel` RunPodSandbox, 4 at a time; then containerd's growth with them.
    //    With more calls in flight than cores the wall time follows the CPU the node spends, so
    //    that is measured too: all of it, and containerd's share (with the CNI plugins and shim
    //    `start` runs it reaps), which, but for `start`, no sandbox implementation can take away.
    let p = args.parallel;
    let mut wall = [0.0; 3];
    let mut growth = [0.0; 3];
    let mut node_cpu = [0.0; 3];
    let mut containerd_cpu = [0.0; 3];
    for round in 0..2 {
        for (k, h) in HANDLERS.iter().enumerate() {
            let rss_before = measure::rss_kib(containerd);
            let (busy_before, containerd_before) =
                (measure::machine_busy_ms(), measure::with_reaped_children_ms(containerd));
            let started = Instant::now();
            let created = parallel_pods(&rig, &cri, h, &format!("par{round}"), p, 4).await?;
            wall[k] += started.elapsed().as_secs_f64() * 1000.0 / 2.0;
            let per_pod = 2.0 * p as f64;
            node_cpu[k] += (measure::machine_busy_ms() - busy_before) / per_pod;
            containerd_cpu[k] += (measure::with_reaped_children_ms(containerd) - containerd_before) / per_pod;
            growth[k] += (measure::rss_kib(containerd) - rss_before) / 1024.0 / 2.0;
            for pod in created {
                cri.stop_and_remove_pod(&pod).await?;
            }
        }
    }
    report.push(Figure::single(&format!("{p} RunPodSandbox, 4 parallel"), "ms", &wall));
    report.push(Figure::single("  node CPU per pod, all processes", "ms", &node_cpu));
    report.push(Figure::single("  node CPU per pod, containerd + CNI + shim start", "ms", &containerd_cpu));
    report.push(Figure::single(&format!("containerd RSS growth, {p} pods"), "MiB", &growth));
    progress("throughput measured");

    report.load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    std::fs::create_dir_all(&args.out)?;
    println!("{}", report.table());
    std::fs::write(args.out.join("bench.json"), serde_json::to_string_pretty(&report.json())?)?;
    std::fs::write(args.out.join("bench.svg"), report.svg())?;
    progress(&format!("wrote {}/bench.json and bench.svg", args.out.display()));
    drop(cri);
    drop(rig);

    // 6. The same pod to RUNNING with corral's builtin OCI runtime, on a second containerd.
    let builtin = builtin_runtime(n).await?;
    println!("{}", builtin.table());
    std::fs::write(args.out.join("bench-builtin.json"), serde_json::to_string_pretty(&builtin.json())?)?;
    println!("{}", start_split(n, Runtime::Runc).await?);
    println!("{}", start_split(n, Runtime::Builtin).await?);
    Ok(())
}

/// The OCI runtime corral's servers use: runc, or corral's builtin runtime (`corral-oci`).
#[derive(Clone, Copy, PartialEq)]
enum Runtime {
    Runc,
    Builtin,
}

impl Runtime {
    /// The shims' environment that selects it (the runc handler's shim ignores it).
    fn shim_env(self) -> Vec<String> {
        match self {
            Runtime::Runc => Vec::new(),
            Runtime::Builtin => vec!["CORRAL_RUNC=builtin".into()],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Builtin => "builtin (corral-oci)",
        }
    }
}

/// Pod to RUNNING with corral's builtin OCI runtime against the pause sandbox, alternating on
/// a containerd whose shims get `CORRAL_RUNC=builtin`: a handler cannot choose the runtime on
/// containerd 2.1 (no handler options reach a shim), so the runtime is the containerd's.
async fn builtin_runtime(n: usize) -> Result<Report> {
    let load = wait_for_idle().await;
    progress("builtin OCI runtime: a second containerd whose corral servers use corral-oci");
    let options = Options {
        pause_image: true,
        env_remove: vec!["CORRAL_MODE".into(), "CORRAL_RUNC".into()],
        shim_env: Runtime::Builtin.shim_env(),
        ..Default::default()
    };
    let rig = Rig::start(options).await?;
    let mut cri = rig.cri().await?;
    warm(&rig, &mut cri).await?;
    let full = pod_to_running(&rig, &mut cri, "builtin", n).await?;
    let mut report = Report::new(n, &["corral+builtin", "corral-node+builtin", "runc"], load);
    report.latency("pod to RUNNING", "ms", &full);
    report.load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    progress("builtin OCI runtime measured");
    Ok(report)
}

/// Where a container start goes for each corral handler, from its servers' debug lines (every
/// RPC's duration, and the runtime's share of Task.Create), on a second containerd: debug lines
/// cost the servers CPU, so the figures above are measured without them. A pod to RUNNING is
/// RunPodSandbox, then CRI's CreateContainer (Task.Create inside it) and StartContainer
/// (Task.Start); the rest is CRI's and containerd's own work (from medians: approximate).
async fn start_split(n: usize, runtime: Runtime) -> Result<String> {
    progress(&format!(
        "where a container start goes with {}: another containerd, corral at debug level",
        runtime.name()
    ));
    let mut shim_env = vec!["CORRAL_LOG=debug".to_string()];
    shim_env.extend(runtime.shim_env());
    let options = Options {
        env_remove: vec!["CORRAL_MODE".into(), "CORRAL_RUNC".into()],
        shim_env,
        ..Default::default()
    };
    let rig = Rig::start(options).await?;
    let mut cri = rig.cri().await?;
    let corral = &HANDLERS[..2];
    let mut containers: [Vec<String>; 2] = Default::default();
    let mut sandbox: [Vec<f64>; 2] = Default::default();
    let mut full: [Vec<f64>; 2] = Default::default();
    for i in 0..n {
        for (k, h) in corral.iter().enumerate() {
            let started = Instant::now();
            let (pod, cfg) = run_pod(&rig, &mut cri, h, &format!("split{i}")).await?;
            sandbox[k].push(started.elapsed().as_secs_f64() * 1000.0);
            containers[k]
                .push(cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?);
            full[k].push(started.elapsed().as_secs_f64() * 1000.0);
            cri.stop_and_remove_pod(&pod).await?;
        }
    }
    // Per-pod servers log through containerd (its stderr, the rig's log); the node server to
    // its own file.
    let mut text = std::fs::read_to_string(&rig.log).unwrap_or_default();
    for entry in std::fs::read_dir(rig.dir.join("node-logs")).into_iter().flatten().flatten() {
        text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
    }
    let mut out = format!(
        "where a container start goes with {} ({n} per handler, corral at debug level), p50 ms:\n  {:<12} {:>11} {:>23} {:>10} {:>41}\n",
        runtime.name(),
        "handler", "Task.Create", "of which runtime create", "Task.Start", "rest of pod to RUNNING (CRI, containerd)"
    );
    for (k, h) in corral.iter().enumerate() {
        let split = shimlog::StartSplit::from_log(&text, &containers[k]);
        let Some((create, runtime, start)) = split.medians() else {
            out.push_str(&format!("  {h:<12} no debug lines found\n"));
            continue;
        };
        let p50 = |v: &[f64]| measure::percentile(v, 50.0);
        let rest = p50(&full[k]) - p50(&sandbox[k]) - create - start;
        out.push_str(&format!("  {h:<12} {create:>11.1} {runtime:>23.1} {start:>10.2} {rest:>41.1}\n"));
    }
    if runtime == Runtime::Runc {
        out.push_str("  runc         (containerd's runc shim logs no such split)\n");
    }
    Ok(out)
}

/// Warms caches for each handler: one pod with a container, then gone.
async fn warm(rig: &Rig, cri: &mut Cri) -> Result<()> {
    for h in HANDLERS {
        let (pod, cfg) = run_pod(rig, cri, h, "warm").await?;
        cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
        cri.stop_and_remove_pod(&pod).await?;
    }
    Ok(())
}

/// RunPodSandbox + CreateContainer + StartContainer, `n` per handler, alternating; ms each.
async fn pod_to_running(rig: &Rig, cri: &mut Cri, tag: &str, n: usize) -> Result<[Vec<f64>; 3]> {
    let mut full: [Vec<f64>; 3] = Default::default();
    for i in 0..n {
        for (k, h) in HANDLERS.iter().enumerate() {
            let started = Instant::now();
            let (pod, cfg) = run_pod(rig, cri, h, &format!("{tag}{i}")).await?;
            cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
            full[k].push(started.elapsed().as_secs_f64() * 1000.0);
            cri.stop_and_remove_pod(&pod).await?;
        }
    }
    Ok(full)
}

async fn run_pod(
    rig: &Rig,
    cri: &mut Cri,
    handler: &str,
    name: &str,
) -> Result<(String, k8s_cri::v1::PodSandboxConfig)> {
    let name = format!("{handler}-{name}");
    let cfg = rig.pod_config(&name);
    Ok((cri.run_pod(&cfg, handler).await?, cfg))
}

/// Creates `n` pods with at most `width` RunPodSandbox calls in flight.
async fn parallel_pods(
    rig: &Rig,
    cri: &Cri,
    handler: &str,
    tag: &str,
    n: usize,
    width: usize,
) -> Result<Vec<String>> {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(width));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut cri = cri.clone();
            let name = format!("{handler}-{tag}-{i}");
            let cfg = rig.pod_config(&name);
            let handler = handler.to_string();
            let permits = permits.clone();
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await?;
                cri.run_pod(&cfg, &handler).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}
