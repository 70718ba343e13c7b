//! `corral-bench`: corral against containerd's default pause sandbox (the `runc` handler with a
//! pause image), side by side on one private containerd, alternating handlers so drift hits both.
//! It measures and reports; it asserts nothing.
//!
//! Usage: corral-bench [--pods N] [--out DIR]

mod measure;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, Cri};
use corral_rig::{Options, Rig};
use measure::{PodProcesses, Usage};
use report::{Figure, Report};

const HANDLERS: [&str; 2] = ["corral", "runc"];

struct Args {
    pods: usize,
    out: PathBuf,
}

fn args() -> Result<Args> {
    let mut a = Args { pods: 30, out: PathBuf::from("target/bench") };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--pods" => a.pods = it.next().context("--pods N")?.parse()?,
            "--out" => a.out = it.next().context("--out DIR")?.into(),
            "-h" | "--help" => {
                println!("usage: corral-bench [--pods N] [--out DIR]");
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    let n = args.pods;
    let load_before = wait_for_idle().await;
    progress("starting a private containerd with the corral and runc handlers");
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let containerd = rig.pid().context("containerd pid")?;
    let mut report = Report::new(n, load_before);

    // Warm caches for both: one pod with a container each, then gone.
    for h in HANDLERS {
        let (pod, cfg) = run_pod(&rig, &mut cri, h, "warm").await?;
        cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
        cri.stop_and_remove_pod(&pod).await?;
    }

    // 1. RunPodSandbox, sequential, alternating; the pods stay for the memory figures.
    let mut latency: [Vec<f64>; 2] = Default::default();
    let mut pods: [Vec<String>; 2] = Default::default();
    for i in 0..n {
        for (k, h) in HANDLERS.iter().enumerate() {
            let started = Instant::now();
            let (pod, _) = run_pod(&rig, &mut cri, h, &format!("seq{i}")).await?;
            latency[k].push(started.elapsed().as_secs_f64() * 1000.0);
            pods[k].push(pod);
        }
        if (i + 1) % 10 == 0 {
            progress(&format!("RunPodSandbox: {} of {n} pods per handler", i + 1));
        }
    }
    report.latency("RunPodSandbox", "ms", &latency);

    // 2. Memory and CPU of the processes that exist because of each pod (not the app).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut usage: [Usage; 2] = Default::default();
    for (k, h) in HANDLERS.iter().enumerate() {
        for pod in &pods[k] {
            usage[k].add(&PodProcesses::find(h, pod).measure()?);
        }
    }
    let per_pod = |u: &Usage, f: fn(&Usage) -> f64| f(u) / n as f64;
    report.push(Figure::single(
        "per-pod RSS",
        "MiB",
        per_pod(&usage[0], |u| u.rss_kib / 1024.0),
        per_pod(&usage[1], |u| u.rss_kib / 1024.0),
    ));
    report.push(Figure::single(
        "per-pod PSS",
        "MiB",
        per_pod(&usage[0], |u| u.pss_kib / 1024.0),
        per_pod(&usage[1], |u| u.pss_kib / 1024.0),
    ));
    report.push(Figure::single(
        "per-pod CPU time",
        "ms",
        per_pod(&usage[0], |u| u.cpu_ms),
        per_pod(&usage[1], |u| u.cpu_ms),
    ));
    report.push(Figure::single(
        "per-pod processes",
        "count",
        per_pod(&usage[0], |u| u.processes as f64),
        per_pod(&usage[1], |u| u.processes as f64),
    ));

    // 3. Teardown, alternating.
    let mut teardown: [Vec<f64>; 2] = Default::default();
    for (corral_pod, pause_pod) in pods[0].iter().zip(&pods[1]) {
        for (k, pod) in [corral_pod, pause_pod].into_iter().enumerate() {
            let started = Instant::now();
            cri.stop_and_remove_pod(pod).await?;
            teardown[k].push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    progress("teardown measured");

    // 4. Full pod to RUNNING: RunPodSandbox + CreateContainer + StartContainer.
    let mut full: [Vec<f64>; 2] = Default::default();
    for i in 0..n {
        for (k, h) in HANDLERS.iter().enumerate() {
            let started = Instant::now();
            let (pod, cfg) = run_pod(&rig, &mut cri, h, &format!("full{i}")).await?;
            cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
            full[k].push(started.elapsed().as_secs_f64() * 1000.0);
            cri.stop_and_remove_pod(&pod).await?;
        }
    }
    report.latency("pod to RUNNING", "ms", &full);
    report.latency("Stop+RemovePodSandbox", "ms", &teardown);
    progress("pod to RUNNING measured");

    // 5. Throughput: n RunPodSandbox, 4 at a time; then containerd's growth with n pods.
    let mut wall = [0.0; 2];
    let mut growth = [0.0; 2];
    for round in 0..2 {
        for (k, h) in HANDLERS.iter().enumerate() {
            let rss_before = measure::rss_kib(containerd);
            let started = Instant::now();
            let created = parallel_pods(&rig, &cri, h, &format!("par{round}"), n, 4).await?;
            wall[k] += started.elapsed().as_secs_f64() * 1000.0 / 2.0;
            growth[k] += (measure::rss_kib(containerd) - rss_before) / 1024.0 / 2.0;
            for pod in created {
                cri.stop_and_remove_pod(&pod).await?;
            }
        }
    }
    report.push(Figure::single(&format!("{n} RunPodSandbox, 4 parallel"), "ms", wall[0], wall[1]));
    report.push(Figure::single(&format!("containerd RSS growth, {n} pods"), "MiB", growth[0], growth[1]));
    progress("throughput measured");

    report.load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    std::fs::create_dir_all(&args.out)?;
    println!("{}", report.table());
    std::fs::write(args.out.join("bench.json"), serde_json::to_string_pretty(&report.json())?)?;
    std::fs::write(args.out.join("bench.svg"), report.svg())?;
    progress(&format!("wrote {}/bench.json and bench.svg", args.out.display()));
    Ok(())
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
