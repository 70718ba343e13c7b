//! Node mode (`CORRAL_MODE=node` in the shim-manager environment): one corral server serves every
//! pod of a containerd. These tests run in node mode whatever mode the rest of the suite runs in:
//! one server, started once even when pods start together, gone with the last pod; a pod's
//! failure, a panic, a dead holder or a slow runtime call costs that pod alone; the server's
//! death ends every pod, `delete` releases each, and the next pod starts a new server.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, Cri};
use corral_rig::{eventually, probe, Options, Rig};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn node_options(extra_env: &[String]) -> Options {
    let mut shim_env = vec!["CORRAL_MODE=node".to_string()];
    shim_env.extend_from_slice(extra_env);
    Options { shim_env, ..Default::default() }
}

/// Node servers of this rig's containerd (their argv names its address).
fn servers_of(rig: &Rig) -> Vec<u32> {
    let address = rig.socket.display().to_string();
    probe::node_servers().into_iter().filter(|p| probe::cmdline(*p).contains(&address)).collect()
}

/// The one node server of `rig`.
fn the_server(rig: &Rig) -> Result<u32> {
    let servers = servers_of(rig);
    anyhow::ensure!(servers.len() == 1, "node servers of this containerd: {servers:?}");
    Ok(servers[0])
}

/// The node directory (lock, registrations) of a server.
fn node_dir(server: u32) -> Result<PathBuf> {
    let socket = probe::shim_socket(server).context("-socket argument")?;
    let key = Path::new(&socket).file_name().context("socket name")?.to_owned();
    Ok(Path::new(probe::NODE_DIR).join(key))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn pod_with_container(rig: &Rig, cri: &mut Cri, name: &str) -> Result<(String, String)> {
    let cfg = rig.pod_config(name);
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    Ok((pod, c))
}

async fn assert_serves(cri: &mut Cri, pod: &str, container: &str) -> Result<()> {
    assert!(cri.pod_ready(pod).await?, "pod {pod} READY");
    let (code, out, err) = cri.exec_sync(container, &["echo", "still here"]).await?;
    assert_eq!((code, out.trim()), (0, "still here"), "exec in {container}: {err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_started_together_share_one_server_which_leaves_with_the_last() -> Result<()> {
    let rig = Arc::new(Rig::start(node_options(&[])).await?);
    // Six RunPodSandbox at once: six concurrent `start`s must end with one server.
    let runs: Vec<_> = (0..6)
        .map(|i| {
            let rig = rig.clone();
            tokio::spawn(async move {
                let mut cri = rig.cri().await?;
                cri.run_pod(&rig.pod_config(&format!("share{i}")), "corral").await
            })
        })
        .collect();
    let mut pods = Vec::new();
    for run in runs {
        pods.push(run.await??);
    }
    let server = the_server(&rig)?;
    let holders: HashSet<u32> =
        pods.iter().map(|p| probe::holder_of(p).context("holder")).collect::<Result<_>>()?;
    assert_eq!(holders.len(), pods.len(), "a holder per pod");
    for pod in &pods {
        assert_eq!(probe::shim_of(pod), Some(server), "pod {pod} is served by the node server");
    }
    let dir = node_dir(server)?;
    let socket = probe::shim_socket(server).context("socket")?;
    // Its log: a file of its own (no pod's FIFO outlives it), where CORRAL_NODE_LOG_DIR says
    // (the rig's directory; /var/log/corral by default).
    let key: String = dir.file_name().context("key")?.to_string_lossy().chars().take(12).collect();
    let log = rig.dir.join("node-logs").join(format!("node-{key}.log"));
    let text = std::fs::read_to_string(&log).with_context(|| format!("{}", log.display()))?;
    assert!(text.contains("serving the node's pods"), "{text}");
    assert_eq!(std::fs::metadata(&log)?.permissions().mode() & 0o777, 0o600);

    // Containers in two of them, each in its own pod's namespaces.
    let mut cri = rig.cri().await?;
    let cfg0 = rig.pod_config("share0");
    let c0 = cri.run_container(&pods[0], &cfg0, &container_config("app", "exec sleep 1000")).await?;
    let cfg1 = rig.pod_config("share1");
    let c1 = cri.run_container(&pods[1], &cfg1, &container_config("app", "exec sleep 1000")).await?;
    let (p0, p1) = (cri.container_pid(&c0).await?, cri.container_pid(&c1).await?);
    assert_ne!(probe::ns(p0, "net")?, probe::ns(p1, "net")?, "each pod has its own network namespace");
    assert_eq!(probe::ns(p0, "net")?, probe::ns(probe::holder_of(&pods[0]).unwrap(), "net")?);

    // Removing pods one by one: the server stays, the others keep working.
    let last = pods.pop().expect("pods");
    for pod in &pods {
        cri.stop_and_remove_pod(pod).await?;
        assert_eq!(the_server(&rig)?, server, "the server lives while pods remain");
        assert!(cri.pod_ready(&last).await?, "the other pods stay READY");
    }
    assert!(dir.join("pods").join(&last).exists(), "the last pod is still registered");
    cri.stop_and_remove_pod(&last).await?;
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        let left = (alive(server), Path::new(&socket).exists(), dir.exists());
        (left != (false, false, false)).then(|| format!("server alive, socket, node dir: {left:?}"))
    })
    .await?;

    // The next pod starts a new server.
    let (pod, c) = pod_with_container(&rig, &mut cri, "after").await?;
    let next = the_server(&rig)?;
    assert_ne!(next, server);
    assert_serves(&mut cri, &pod, &c).await?;
    cri.stop_and_remove_pod(&pod).await?;
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        alive(next).then(|| "the new server outlived its last pod".into())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fails_leaves_the_other_pods_and_the_server_untouched() -> Result<()> {
    let rig = Rig::start(node_options(&[])).await?;
    let mut cri = rig.cri().await?;
    let (pod, c) = pod_with_container(&rig, &mut cri, "steady").await?;
    let server = the_server(&rig)?;

    let mut bad_sysctl = rig.pod_config("badsysctl");
    bad_sysctl.linux.as_mut().unwrap().sysctls = HashMap::from([("kernel.panic".into(), "1".into())]);
    let err = cri.run_pod(&bad_sysctl, "corral").await.unwrap_err().to_string();
    assert!(err.contains("kernel.panic"), "{err}");
    let mut bad_hostname = rig.pod_config("badhost");
    bad_hostname.hostname = "not a hostname!".into();
    let err = cri.run_pod(&bad_hostname, "corral").await.unwrap_err().to_string();
    assert!(err.contains("hostname"), "{err}");

    assert_eq!(the_server(&rig)?, server, "the same server serves on");
    assert_serves(&mut cri, &pod, &c).await?;
    // The failed pods left no registration behind (nothing would keep the server alive later).
    let registered: Vec<String> = std::fs::read_dir(node_dir(server)?.join("pods"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(registered, vec![pod.clone()]);
    cri.stop_and_remove_pod(&pod).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_one_request_and_the_server_serves_on() -> Result<()> {
    // The test build's failpoint (see corral's service::failpoint): a file of `panic <rpc> <id>`.
    let failpoint = std::env::temp_dir().join(format!("corral-failpoint-{}", std::process::id()));
    std::fs::write(&failpoint, "")?;
    let rig = Rig::start(node_options(&[format!("CORRAL_FAILPOINT={}", failpoint.display())])).await?;
    let mut cri = rig.cri().await?;
    let (a, ca) = pod_with_container(&rig, &mut cri, "panics").await?;
    let (b, cb) = pod_with_container(&rig, &mut cri, "calm").await?;
    let server = the_server(&rig)?;

    std::fs::write(&failpoint, format!("panic SandboxStatus {a}\n"))?;
    let err = cri.pod_status(&a).await.unwrap_err().to_string();
    assert!(err.contains("panicked"), "the request fails naming the panic: {err}");
    assert!(alive(server), "the server survived the panic");
    assert_serves(&mut cri, &b, &cb).await?;

    std::fs::write(&failpoint, "")?;
    assert_serves(&mut cri, &a, &ca).await?;
    assert_eq!(the_server(&rig)?, server);
    cri.stop_and_remove_pod(&a).await?;
    cri.stop_and_remove_pod(&b).await?;
    let _ = std::fs::remove_file(&failpoint);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_runtime_call_of_one_pod_does_not_hold_up_the_others() -> Result<()> {
    // runc behind a wrapper that stalls `create` for containers named "slow" until the test
    // releases it (not for a fixed time: serving pod b takes seconds under emulation).
    let wrapper_dir = PathBuf::from("/var/lib/corral-rig").join(format!("slow-runc-{}", std::process::id()));
    std::fs::create_dir_all(&wrapper_dir)?;
    let started = wrapper_dir.join("slow-started");
    let release = wrapper_dir.join("slow-release");
    let wrapper = wrapper_dir.join("runc");
    std::fs::write(
        &wrapper,
        format!(
            r#"#!/bin/sh
bundle=""; prev=""; create=0
for a in "$@"; do
  [ "$prev" = "--bundle" ] && bundle="$a"
  [ "$a" = "create" ] && create=1
  prev="$a"
done
if [ "$create" = 1 ] && grep -q '"io.kubernetes.cri.container-name":"slow"' "$bundle/config.json" 2>/dev/null; then
  touch {started}
  i=0; while [ ! -e {release} ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
fi
exec runc "$@"
"#,
            started = started.display(),
            release = release.display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let rig = Arc::new(Rig::start(node_options(&[format!("CORRAL_RUNC={}", wrapper.display())])).await?);
    let mut cri = rig.cri().await?;
    let (b, cb) = pod_with_container(&rig, &mut cri, "quick").await?;
    let cfg = rig.pod_config("stalled");
    let a = cri.run_pod(&cfg, "corral").await?;

    let slow = {
        let (rig, a, cfg) = (rig.clone(), a.clone(), cfg.clone());
        tokio::spawn(async move {
            let mut cri = rig.cri().await?;
            cri.run_container(&a, &cfg, &container_config("slow", "exec sleep 1000")).await
        })
    };
    eventually(corral_rig::scaled(Duration::from_secs(10)), || {
        (!started.exists()).then(|| "the slow runc create has not begun".into())
    })
    .await?;
    // While pod a's runc create stalls, pod b is served: status, exec, a new container. Were
    // they queued behind pod a's create, they would wait for the release below, which comes
    // only after them: the timeout names that.
    let serve_b = async {
        assert_serves(&mut cri, &b, &cb).await?;
        let cfg_b = rig.pod_config("quick");
        cri.run_container(&b, &cfg_b, &container_config("second", "exec sleep 1000")).await
    };
    let another = tokio::time::timeout(corral_rig::scaled(Duration::from_secs(30)), serve_b)
        .await
        .context("pod b was not served while pod a's runc create was held")??;
    assert!(!slow.is_finished(), "pod a's runc create is still held");
    std::fs::write(&release, "")?;
    let slow_container = slow.await??;
    assert!(cri.container_pid(&slow_container).await? > 0);
    assert!(cri.container_pid(&another).await? > 0);
    cri.stop_and_remove_pod(&a).await?;
    cri.stop_and_remove_pod(&b).await?;
    let _ = std::fs::remove_dir_all(&wrapper_dir);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_ends_its_pod_only() -> Result<()> {
    let rig = Rig::start(node_options(&[])).await?;
    let mut cri = rig.cri().await?;
    let (a, _) = pod_with_container(&rig, &mut cri, "loses").await?;
    let (b, cb) = pod_with_container(&rig, &mut cri, "keeps").await?;
    let server = the_server(&rig)?;
    let holder = probe::holder_of(&a).context("holder")?;
    kill(Pid::from_raw(holder as i32), Signal::SIGKILL)?;
    cri.wait_not_ready(&a, corral_rig::scaled(Duration::from_secs(10))).await?;
    assert_serves(&mut cri, &b, &cb).await?;
    assert_eq!(the_server(&rig)?, server);
    cri.stop_and_remove_pod(&a).await?;
    cri.stop_and_remove_pod(&b).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_death_ends_every_pod_and_the_next_pod_starts_a_new_server() -> Result<()> {
    let rig = Rig::start(node_options(&[])).await?;
    let mut cri = rig.cri().await?;
    let (a, ca) = pod_with_container(&rig, &mut cri, "first").await?;
    let (b, cb) = pod_with_container(&rig, &mut cri, "second").await?;
    let server = the_server(&rig)?;
    let dir = node_dir(server)?;
    let inits = [cri.container_pid(&ca).await?, cri.container_pid(&cb).await?];

    kill(Pid::from_raw(server as i32), Signal::SIGKILL)?;
    // containerd sees every pod of the server NOTREADY, and each pod's `delete` releases it from
    // its record: holder, containers, mounts; the last one also the dead server's socket and
    // directory.
    for pod in [&a, &b] {
        cri.wait_not_ready(pod, corral_rig::scaled(Duration::from_secs(10))).await?;
    }
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        let holders = [probe::holder_of(&a), probe::holder_of(&b)];
        let living: Vec<_> = inits.iter().filter(|p| alive(**p)).collect();
        let mounts = [probe::mounts_containing(&a), probe::mounts_containing(&b)].concat();
        (holders.iter().any(Option::is_some) || !living.is_empty() || !mounts.is_empty() || dir.exists())
            .then(|| {
                format!(
                    "holders {holders:?}, containers {living:?}, mounts {mounts:?}, node dir {}",
                    dir.exists()
                )
            })
    })
    .await?;

    // CRI marks the containers EXITED after its exit-event backoff (containerd's, as in
    // shim_crash); only then does it let kubelet remove them.
    for container in [&ca, &cb] {
        cri.wait_exited(container, corral_rig::scaled(Duration::from_secs(30))).await?;
    }

    let (c, cc) = pod_with_container(&rig, &mut cri, "third").await?;
    let next = the_server(&rig)?;
    assert_ne!(next, server, "a new server");
    assert_serves(&mut cri, &c, &cc).await?;
    for pod in [&a, &b, &c] {
        cri.stop_and_remove_pod(pod).await?;
    }
    let left = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(left.is_empty(), "mounts left under containerd's dirs: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corral_node_handler_serves_its_pods_from_one_server_beside_per_pod_corral() -> Result<()> {
    // No CORRAL_MODE at all: the handler's binary name (`io.containerd.corral-node.v2` runs the
    // containerd-shim-corral-node-v2 link) chooses the mode, per handler, on one containerd.
    let rig = Rig::start(Options { env_remove: vec!["CORRAL_MODE".into()], ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let mut pods = Vec::new();
    for (name, handler) in [("own", "corral"), ("shared1", "corral-node"), ("shared2", "corral-node")] {
        let cfg = rig.pod_config(name);
        let pod = cri.run_pod(&cfg, handler).await?;
        let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
        assert_serves(&mut cri, &pod, &c).await?;
        pods.push(pod);
    }
    let own = probe::shim_of(&pods[0]).context("per-pod server")?;
    assert_eq!(probe::cmdline(own).last().map(String::as_str), Some("serve"), "corral: a server of its own");
    let server = the_server(&rig)?;
    assert_eq!(probe::shim_of(&pods[1]), Some(server));
    assert_eq!(probe::shim_of(&pods[2]), Some(server), "corral-node: one server for both pods");
    for pod in &pods {
        cri.stop_and_remove_pod(pod).await?;
    }
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        (alive(own) || alive(server)).then(|| "a server outlived its pods".into())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stays_for_a_pod_start_registered_while_its_last_pod_goes() -> Result<()> {
    // Below CRI, the order containerd can produce when one pod goes as another comes: `start`
    // for pod b answers (b registered, the server reused) before b's CreateSandbox arrives, and
    // meanwhile the server's last pod, a, is shut down. The server must stay for b.
    use corral_rig::cri::pod_config;
    use corral_rig::direct::{DirectShim, TestNetns};
    let tag = std::process::id();
    let address = PathBuf::from(format!("/run/corral-rig/direct/window-{tag}.sock"));
    let node = [("CORRAL_MODE", "node")];
    let a = DirectShim::start_with(&format!("window-a-{tag}"), &address, &node).await?;
    let netns_a = TestNetns::new(&format!("crl-wa-{tag}"))?;
    a.run_pod(&pod_config("a", &a.dir), &netns_a.path.display().to_string()).await?;
    let server = probe::shim_of(&a.id).context("node server")?;

    let b = DirectShim::start_with(&format!("window-b-{tag}"), &address, &node).await?;
    assert_eq!(b.socket, a.socket, "b was given the same server");
    a.shutdown_sandbox().await?;
    // The server checks for idleness right after the shutdown and every 15 s; give it time
    // to do the wrong thing (leave), then b's CreateSandbox must find it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(alive(server), "the server left although pod b was registered");
    let netns_b = TestNetns::new(&format!("crl-wb-{tag}"))?;
    let holder = b.run_pod(&pod_config("b", &b.dir), &netns_b.path.display().to_string()).await?;
    assert!(alive(holder));
    assert_eq!(probe::shim_of(&b.id), Some(server));

    // b gone too: now the server leaves.
    b.shutdown_sandbox().await?;
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        alive(server).then(|| "the server outlived its last pod".into())
    })
    .await
}
