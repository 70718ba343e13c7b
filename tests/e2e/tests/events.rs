//! Task events reach containerd's event stream (what `ctr events`, nerdctl and monitors read):
//! corral forwards them over containerd's ttrpc events service.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::{eventually, Options, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_events_reach_a_real_subscriber() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let out = rig.dir.join("events.txt");
    let mut subscriber = Command::new("ctr")
        .arg("--address")
        .arg(&rig.socket)
        .arg("events")
        .stdout(std::fs::File::create(&out)?)
        .stderr(Stdio::null())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cfg = rig.pod_config("events");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    cri.exec_sync(&c, &["true"]).await?;
    cri.stop_container(&c).await?;
    cri.remove_container(&c).await?;

    let wanted = [
        "/tasks/create",
        "/tasks/start",
        "/tasks/exec-added",
        "/tasks/exec-started",
        "/tasks/exit",
        "/tasks/delete",
    ];
    let result = eventually(Duration::from_secs(5), || {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let missing: Vec<_> = wanted
            .iter()
            .filter(|topic| !text.lines().any(|l| l.contains(&format!(" {topic} ")) && l.contains(&c)))
            .collect();
        (!missing.is_empty()).then(|| format!("topics missing for {c}: {missing:?}\n{text}"))
    })
    .await;
    let _ = subscriber.kill();
    let _ = subscriber.wait();
    result?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
