//! What a pod can reach of the node through corral, looked at as an attacker in the pod would:
//! the holder (pid 1 of a shared-PID pod) is confined like a pause container, no process but the
//! server holds the server's sockets, a dead server's socket refuses connections, the pod's files
//! are on disk and go with the pod, and `delete` signals only the processes it recorded.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use corral_rig::cri::{container_config, container_ns, pod_ns};
use corral_rig::direct::{ctx, DirectShim};
use corral_rig::{eventually, probe, Options, Rig};
use k8s_cri::v1::{Capability, NamespaceMode};

/// Lines of /proc/<pid>/status, by key.
fn status_field(pid: u32, key: &str) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// The holder as the node sees it: no capability in any set, no_new_privs, a seccomp filter, a
/// name that says what it is, nothing open but /dev/null, and a root that is not the node's.
fn assert_confined(holder: u32, sandbox: &str) -> Result<()> {
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(holder, set)?, "0000000000000000", "holder {set}");
    }
    assert_eq!(status_field(holder, "NoNewPrivs")?, "1");
    assert_eq!(status_field(holder, "Seccomp")?, "2", "a seccomp filter");
    assert_eq!(std::fs::read_to_string(format!("/proc/{holder}/comm"))?.trim(), "corral-holder");
    assert_eq!(probe::cmdline(holder), ["corral-holder", "holder", sandbox]);
    let mut fds = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{holder}/fd"))? {
        let entry = entry?;
        fds.push((entry.file_name().to_string_lossy().into_owned(), std::fs::read_link(entry.path())?));
    }
    fds.sort();
    let null = PathBuf::from("/dev/null");
    assert_eq!(
        fds,
        vec![("0".into(), null.clone()), ("1".into(), null.clone()), ("2".into(), null)],
        "the holder keeps nothing open but /dev/null"
    );
    let mounts = std::fs::read_to_string(format!("/proc/{holder}/mountinfo"))?;
    assert_eq!(mounts.lines().count(), 1, "one mount in the holder's namespace: {mounts}");
    assert!(mounts.contains(" / / ro,") && mounts.contains(" - tmpfs "), "an empty read-only root: {mounts}");
    assert_ne!(probe::ns(holder, "mnt")?, probe::ns(std::process::id(), "mnt")?);
    // The node (root, CAP_SYS_PTRACE) still reaches what it needs of the holder.
    let root: Vec<_> = std::fs::read_dir(format!("/proc/{holder}/root"))?.collect();
    assert!(root.is_empty(), "the holder's root is empty: {root:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_shows_a_shared_pid_pod_nothing_of_the_node() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("confined");
    pod_ns(&mut cfg).pid = NamespaceMode::Pod as i32;
    let pod = cri.run_pod(&cfg, "corral").await?;
    let holder = probe::holder_of(&pod).context("holder")?;
    assert_confined(holder, &pod)?;

    // A root container granted SYS_PTRACE (what would reach /proc/1/root of an unconfined pid 1),
    // and an unprivileged one: any user can read another process's mountinfo.
    let mut tracer = container_config("tracer", "exec sleep 1000");
    container_ns(&mut tracer).pid = NamespaceMode::Pod as i32;
    let sc = tracer.linux.as_mut().unwrap().security_context.as_mut().unwrap();
    sc.capabilities = Some(Capability { add_capabilities: vec!["SYS_PTRACE".into()], ..Default::default() });
    let mut nobody = container_config("nobody", "exec sleep 1000");
    container_ns(&mut nobody).pid = NamespaceMode::Pod as i32;
    let sc = nobody.linux.as_mut().unwrap().security_context.as_mut().unwrap();
    sc.run_as_user = Some(k8s_cri::v1::Int64Value { value: 65534 });
    let tracer = cri.run_container(&pod, &cfg, &tracer).await?;
    let nobody = cri.run_container(&pod, &cfg, &nobody).await?;

    for c in [&tracer, &nobody] {
        let (code, comm, _) = cri.exec_sync(c, &["cat", "/proc/1/comm"]).await?;
        assert_eq!((code, comm.trim()), (0, "corral-holder"), "pid 1 says what it is");
        let (code, mounts, err) = cri.exec_sync(c, &["cat", "/proc/1/mountinfo"]).await?;
        assert_eq!(code, 0, "{err}");
        assert_eq!(mounts.lines().count(), 1, "pid 1's mount table is its empty root only: {mounts}");
        for node_path in ["/run", "/var/lib", "containerd", "netns", "corral"] {
            assert!(!mounts.contains(node_path), "pid 1's mounts name {node_path}: {mounts}");
        }
        let (_, status, _) = cri.exec_sync(c, &["cat", "/proc/1/status"]).await?;
        assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    }
    // With SYS_PTRACE the root is reachable, and empty.
    let (code, listing, err) = cri.exec_sync(&tracer, &["ls", "-A", "/proc/1/root/"]).await?;
    assert_eq!((code, listing.trim()), (0, ""), "pid 1's root is empty: {err}");
    // Without it, not reachable at all (pid 1 is not dumpable).
    let (code, listing, _) = cri.exec_sync(&nobody, &["ls", "-A", "/proc/1/root/"]).await?;
    assert!(code != 0 && listing.is_empty(), "nobody lists pid 1's root: {code} {listing}");

    // containerd still joins the pod's namespaces through /proc/<holder>/ns (exec above worked),
    // and a default pod's holder is confined the same way.
    let other_cfg = rig.pod_config("confined-default");
    let other = cri.run_pod(&other_cfg, "corral").await?;
    assert_confined(probe::holder_of(&other).context("holder")?, &other)?;
    cri.stop_and_remove_pod(&other).await?;
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_process_holds_the_servers_sockets() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("sockets");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    let (code, _, _) = cri.exec_sync(&c, &["true"]).await?;
    assert_eq!(code, 0);

    let server = probe::shim_of(&pod).context("server")?;
    let ours = probe::socket_inodes(server);
    assert!(!ours.is_empty(), "the server has sockets");
    let holders: Vec<(u32, Vec<String>)> = probe::all_pids()
        .into_iter()
        .filter(|p| *p != server)
        .map(|p| (p, probe::socket_inodes(p).intersection(&ours).cloned().collect::<Vec<_>>()))
        .filter(|(_, shared)| !shared.is_empty())
        .map(|(p, shared)| (p, [probe::cmdline(p), shared].concat()))
        .collect();
    assert!(holders.is_empty(), "processes holding the server's sockets: {holders:?}");
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_servers_socket_refuses_connections_at_once() -> Result<()> {
    let id = format!("deadsock-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "deadsock").await?;
    shim.run_container(&format!("{id}-c"), holder, &["sleep", "1000"]).await?;
    let server = probe::shim_of(&id).context("server")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server as i32), nix::sys::signal::Signal::SIGKILL)?;
    // Wait until no thread of the server is left but zombies: an exiting process loses its
    // cmdline (its memory) before its fds, and a zombie leader's other threads still share its
    // fd table (the listener) until each of them has exited too.
    eventually(corral_rig::scaled(Duration::from_secs(5)), || {
        let living: Vec<(String, Option<char>)> = std::fs::read_dir(format!("/proc/{server}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let state = stat.rsplit(')').next().and_then(|s| s.trim_start().chars().next());
                (t.file_name().to_string_lossy().into_owned(), state)
            })
            .filter(|(_, state)| !matches!(state, None | Some('Z') | Some('X')))
            .collect();
        (!living.is_empty()).then(|| format!("server {server} threads still exiting: {living:?}"))
    })
    .await?;

    // The holder and the container live on; nothing of theirs keeps the listener.
    assert!(Path::new(&format!("/proc/{holder}")).exists());
    // Refused, not accepted into a backlog nobody serves (which is what makes a caller hang).
    let socket = shim.socket.clone();
    let connected =
        tokio::task::spawn_blocking(move || std::os::unix::net::UnixStream::connect(socket)).await?;
    match connected {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        Err(e) => bail!("connect failed, but not as refused: {e}"),
        Ok(_) => bail!("a dead server's socket accepted a connection"),
    }

    // containerd's `delete` then releases the pod from its record.
    let (ok, _) = shim.delete_command(&id, &shim.bundle)?;
    assert!(ok, "delete");
    eventually(Duration::from_secs(5), || {
        Path::new(&format!("/proc/{holder}")).exists().then(|| "holder still alive".into())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_files_live_on_disk_and_go_with_the_pod() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("files-on-disk");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;

    let files = Path::new(corral_rig::CORRAL_POD_FILES).join(&pod);
    for name in ["hostname", "hosts", "resolv.conf"] {
        assert!(files.join(name).is_file(), "{} exists", files.join(name).display());
        let (code, fs, err) = cri.exec_sync(&c, &["stat", "-f", "-c", "%T", &format!("/etc/{name}")]).await?;
        assert_eq!(code, 0, "{err}");
        assert_ne!(fs.trim(), "tmpfs", "/etc/{name} is backed by a memory filesystem");
    }
    // Still writable, as on the pause sandbox, and what the container writes is the node's file.
    let (code, _, err) =
        cri.exec_sync(&c, &["sh", "-c", "echo 'nameserver 192.0.2.1' >> /etc/resolv.conf"]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(files.join("resolv.conf"))?.contains("192.0.2.1"));
    // Nothing of the pod's files is in the bundle on /run (the server runs in it).
    let bundle = rig.state.join("io.containerd.sandbox.controller.v1.shim/k8s.io").join(&pod);
    assert!(bundle.join("config.json").exists() || bundle.join("corral.json").exists(), "{bundle:?}");
    for name in ["hostname", "hosts", "resolv.conf"] {
        let found = probe::files_named(&bundle, name);
        assert!(found.is_empty(), "pod files in the bundle: {found:?}");
    }

    cri.stop_and_remove_pod(&pod).await?;
    assert!(!files.exists(), "{} is left after removal", files.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sandbox_in_the_same_bundle_is_refused_and_leaves_the_first_intact() -> Result<()> {
    use containerd_shim_protos::sandbox_api::CreateSandboxRequest;
    let id = format!("twice-{}", std::process::id());
    let (shim, netns, holder) = DirectShim::with_pod(&id, "twice").await?;
    let mounts = |shim: &DirectShim| probe::mounts_under(&[&shim.bundle]);
    let before = mounts(&shim);
    assert!(before.len() >= 3, "pins and shm are mounted: {before:?}");

    let cfg = corral_rig::cri::pod_config("twice", &shim.dir);
    let second = CreateSandboxRequest {
        sandbox_id: format!("{id}-2"),
        bundle_path: shim.bundle.display().to_string(),
        options: corral_rig::direct::pod_options(&cfg),
        netns_path: netns.path.display().to_string(),
        ..Default::default()
    };
    let err = shim.sandbox.create_sandbox(ctx(), &second).await.unwrap_err().to_string();
    match corral_rig::node_mode() {
        false => assert!(err.contains("already holds sandbox") && err.contains(&id), "{err}"),
        // Node mode refuses it earlier: `start` registered this bundle for the first id only.
        true => assert!(err.contains("is not the bundle `start` registered"), "{err}"),
    }
    assert_eq!(mounts(&shim), before, "the first pod's pins and shm");
    assert!(Path::new(&format!("/proc/{holder}")).exists(), "the first pod's holder");
    shim.run_container(&format!("{id}-c"), holder, &["sleep", "1"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_signals_only_the_processes_it_recorded() -> Result<()> {
    // A pod's record names a server and a holder; by the time `delete` runs their pids may belong
    // to other processes, which may even carry the argv corral looks for.
    let id = format!("decoy-{}", std::process::id());
    let dir = PathBuf::from("/run/corral-rig/decoy").join(&id);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rootfs"))?;
    // A shell blocked reading its stdin keeps the forged argv (no exec, no child).
    let spawn_decoy = |role: &str| {
        std::process::Command::new("/bin/sh")
            .arg0("corral-holder")
            .args(["-c", "read line", role, &id])
            .stdin(std::process::Stdio::piped())
            .spawn()
    };
    let mut server = spawn_decoy("serve")?;
    let mut holder = spawn_decoy("holder")?;
    let start = |pid: u32| -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        Ok(stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(19)).context("stat")?.parse()?)
    };
    // Right pids, other start times: a recycled pid.
    let record = serde_json::json!({
        "sandbox_id": id, "server_pid": server.id(), "server_start": start(server.id())? + 1,
        "holder_pid": holder.id(), "holder_start": start(holder.id())? + 1,
        "runc_binary": "runc", "runc_root": "/run/corral-rig/decoy/runc", "containers": [],
    });
    std::fs::write(dir.join("corral.json"), record.to_string())?;
    let out = std::process::Command::new(corral_rig::direct::shim_binary())
        .args(["-namespace", "corral-direct", "-address", "/run/corral-rig/direct/none.sock"])
        .args(["-publish-binary", "/bin/true", "-id", &id, "-bundle"])
        .arg(&dir)
        .arg("delete")
        .output()?;
    assert!(out.status.success(), "delete: {}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(200));
    let alive = (server.try_wait()?.is_none(), holder.try_wait()?.is_none());
    let _ = (server.kill(), holder.kill(), server.wait(), holder.wait());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(alive, (true, true), "delete killed a process that only looked like the pod's");
    Ok(())
}
