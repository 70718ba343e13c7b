//! containerd restarts (SIGKILL and SIGTERM) while ten corral pods run: the pods stay READY, their
//! containers RUNNING, execs work, logs keep flowing, and teardown afterwards leaves nothing.
//!
//! `CORRAL_RESTART_PODS` sets the number of pods: containerd reloads every task with its own
//! fixed deadlines (10 s per container in CRI's recovery), which software emulation cannot meet
//! for twenty containers at once, so scripts/test-vm.sh runs fewer there.

use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::{container_config, log_dir, wait_for_text};
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::ContainerState;
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_survive_containerd_restarts() -> Result<()> {
    let mut rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut pods = Vec::new();
    let n: usize = std::env::var("CORRAL_RESTART_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    for i in 0..n {
        let name = format!("survivor{i}");
        let logs = log_dir(&rig.dir, &name);
        let cfg = rig.pod_config(&name);
        let pod = cri.run_pod(&cfg, "corral").await?;
        // One container ticks into its log every 100 ms from a child process (pid 1 of a pid
        // namespace would not die of SIGPIPE; a child does, and then pid 1 exits); the other
        // just sleeps.
        let script = "( i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.1; done ); exit 7";
        let ticker = cri.run_container(&pod, &cfg, &container_config("ticker", script)).await?;
        let sleeper = cri.run_container(&pod, &cfg, &container_config("sleeper", "exec sleep 1000")).await?;
        let ticker_pid = cri.container_pid(&ticker).await?;
        pods.push((pod, ticker, sleeper, logs, ticker_pid));
    }

    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        // Long enough for the ticker to write many times while containerd reads nothing.
        rig.restart(signal, Duration::from_millis(1500)).await?;
        let mut cri = rig.cri().await?;
        for (pod, ticker, sleeper, logs, ticker_pid) in &pods {
            let stat = std::fs::read_to_string(format!("/proc/{ticker_pid}/stat")).unwrap_or_default();
            assert!(!stat.is_empty() && !stat.contains(") Z"), "{signal}: the ticker's process lives on");
            assert!(cri.pod_ready(pod).await?, "{signal}: pod {pod} READY after the restart");
            for c in [ticker, sleeper] {
                let state = cri.container_status(c).await?.status.map(|s| s.state);
                assert_eq!(state, Some(ContainerState::ContainerRunning as i32), "{signal}: {c} RUNNING");
            }
            let (code, out, _) = cri.exec_sync(sleeper, &["echo", "still-here"]).await?;
            assert_eq!((code, out.as_str()), (0, "still-here\n"));
            // Logs flow again: a tick written after the restart reaches the CRI log.
            let log = logs.join("ticker.log");
            let before = std::fs::read_to_string(&log)?.lines().count();
            eventually(Duration::from_secs(5), || {
                let now = std::fs::read_to_string(&log).unwrap_or_default().lines().count();
                (now <= before + 2).then(|| format!("{signal}: ticker log stuck at {now} lines"))
            })
            .await?;
            wait_for_text(&log, "tick-", Duration::from_secs(1)).await?;
            // Nothing written while containerd was down is lost: the ticks are consecutive.
            let ticks: Vec<u64> = std::fs::read_to_string(&log)?
                .lines()
                .filter_map(|l| l.rsplit("tick-").next()?.trim().parse().ok())
                .collect();
            let gaps: Vec<_> = ticks.windows(2).filter(|w| w[1] != w[0] + 1).collect();
            assert!(gaps.is_empty(), "{signal}: ticks lost across the restart: {gaps:?}");
        }
    }

    let mut cri = rig.cri().await?;
    for (pod, ..) in &pods {
        cri.stop_and_remove_pod(pod).await?;
    }
    eventually(Duration::from_secs(5), || {
        let left: Vec<_> = pods.iter().flat_map(|(pod, ..)| probe::pids_with_cmdline(pod)).collect();
        (!left.is_empty()).then(|| format!("processes left: {left:?}"))
    })
    .await?;
    let mounts = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    Ok(())
}
