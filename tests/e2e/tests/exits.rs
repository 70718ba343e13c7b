//! How containers end, through CRI, on both handlers (corral must match containerd's runc shim):
//! an init that exits while its children live on in the pod's shared pid namespace takes them
//! with it; a container stopped with SIGTERM reports 143. And Task.Pids, through containerd's
//! tasks API (`ctr tasks ps`), lists a container's processes, its execs marked as such.

use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::{container_config, container_ns, pod_ns};
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::NamespaceMode;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_shared_pid_namespace_the_init_takes_its_children_and_sigterm_is_143() -> Result<()> {
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    for (i, handler) in ["corral", "runc"].into_iter().enumerate() {
        let name = format!("exits-{handler}");
        let mut cfg = rig.pod_config(&name);
        pod_ns(&mut cfg).pid = NamespaceMode::Pod as i32;
        let shared = |script: &str, name: &str| {
            let mut c = container_config(name, script);
            container_ns(&mut c).pid = NamespaceMode::Pod as i32;
            c
        };
        let pod = cri.run_pod(&cfg, handler).await?;

        // The init exits 3 and leaves a child that would live on in the pod's pid namespace.
        let marker = format!("{}", 300_000 + std::process::id() * 2 + i as u32);
        let c = cri.run_container(&pod, &cfg, &shared(&format!("sleep {marker} & exit 3"), "leaver")).await?;
        assert_eq!(cri.wait_exited(&c, T).await?, 3, "{handler}");
        eventually(Duration::from_secs(2), || {
            let left = probe::pids_with_cmdline(&marker);
            (!left.is_empty()).then(|| format!("{handler}: the init's child lives on: {left:?}"))
        })
        .await?;

        // Not pid 1 of its namespace, `sleep` dies of StopContainer's SIGTERM: 128 + 15.
        let c = cri.run_container(&pod, &cfg, &shared("exec sleep 1000", "stopped")).await?;
        cri.stop_container(&c).await?;
        assert_eq!(cri.wait_exited(&c, T).await?, 143, "{handler}");
        cri.stop_and_remove_pod(&pod).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_lists_the_container_processes_and_marks_execs() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("pids");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let marker = format!("{}", 400_000 + std::process::id());
    let c = cri
        .run_container(&pod, &cfg, &container_config("app", &format!("sleep {marker} & exec sleep 1000")))
        .await?;
    let init = cri.container_pid(&c).await?;
    let exec_marker = format!("{}", 500_000 + std::process::id());
    // An exec that runs while Pids is asked.
    let mut exec_cri = cri.clone();
    let (exec_c, exec_cmd) = (c.clone(), exec_marker.clone());
    let exec = tokio::spawn(async move { exec_cri.exec_sync(&exec_c, &["sleep", &exec_cmd]).await });
    eventually(T, || {
        probe::pids_with_cmdline(&exec_marker).is_empty().then(|| "exec not running yet".into())
    })
    .await?;

    let child = probe::pids_with_cmdline(&marker)[0] as u32;
    let exec_pid = probe::pids_with_cmdline(&exec_marker)[0] as u32;
    let listed = rig.ctr(&["tasks", "ps", &c])?;
    let rows: Vec<Vec<&str>> = listed.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let pids: Vec<u32> = rows.iter().filter_map(|r| r.first()?.parse().ok()).collect();
    let mut expected = vec![init, child, exec_pid];
    expected.sort();
    let mut got = pids.clone();
    got.sort();
    assert_eq!(got, expected, "ctr tasks ps:\n{listed}");
    // The exec's row names its exec id; the others have no details.
    let exec_row = rows.iter().find(|r| r[0] == exec_pid.to_string()).unwrap();
    assert!(exec_row.len() > 1 && exec_row[1] != "-", "exec row: {exec_row:?}\n{listed}");
    let init_row = rows.iter().find(|r| r[0] == init.to_string()).unwrap();
    assert_eq!(init_row.get(1), Some(&"-"), "{listed}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(exec_pid as i32), nix::sys::signal::Signal::SIGKILL)?;
    let _ = exec.await?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

/// Children of `parent` in state Z, from /proc.
fn zombie_children_of(parent: u32) -> Vec<u32> {
    probe::all_pids()
        .into_iter()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let fields: Vec<&str> =
                stat.rsplit_once(')').map(|(_, f)| f.split_whitespace().collect()).unwrap_or_default();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str())
        })
        .collect()
}

/// In a hostPID container, a process whose parent exits is reparented to the shim (a
/// subreaper), as under containerd's runc shim: the shim must reap it when it exits, or zombies
/// pile up for the pod's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_of_a_host_pid_container_are_reaped_by_the_shim() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("orphans");
    pod_ns(&mut cfg).pid = NamespaceMode::Node as i32;
    let pod = cri.run_pod(&cfg, "corral").await?;
    let shim = probe::shim_of(&pod).expect("the pod's shim");

    // Two double-forked sleeps: their parent subshells exit at once.
    let marker = format!("1.{}", 600_000 + std::process::id());
    let script = format!("(sleep {marker} &); (sleep {marker} &); exec sleep 1000");
    let mut config = container_config("daemonizer", &script);
    container_ns(&mut config).pid = NamespaceMode::Node as i32;
    cri.run_container(&pod, &cfg, &config).await?;
    eventually(T, || {
        let orphans = probe::pids_with_cmdline(&marker);
        let adopted = orphans.iter().filter(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            status.lines().any(|l| l == format!("PPid:\t{shim}"))
        });
        (adopted.count() < 2).then(|| format!("orphans {orphans:?} not yet the shim's children"))
    })
    .await?;
    // They exit after a second; the shim reaps them.
    eventually(T, || (!probe::pids_with_cmdline(&marker).is_empty()).then(|| "still sleeping".into()))
        .await?;
    eventually(Duration::from_secs(2), || {
        let zombies = zombie_children_of(shim);
        (!zombies.is_empty()).then(|| format!("zombie children of the shim: {zombies:?}"))
    })
    .await?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
