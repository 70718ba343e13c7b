//! Below CRI: a corral shim driven directly over ttrpc, as containerd does. Covers what CRI
//! cannot reach on containerd 2.1.9 (hostNetwork pods crash it before any shim runs), the
//! grouped-shim rule (TaskService.Shutdown after a container's deletion must not end the shim;
//! containerd main sends it every time), precise errors, and the `delete` subcommand run twice.

use std::time::Duration;

use anyhow::{Context, Result};
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::sandbox_api::*;
use corral_rig::cri::{pod_config, pod_ns};
use corral_rig::direct::{ctx, DirectShim};
use corral_rig::{cgroup, eventually, probe};
use k8s_cri::v1::NamespaceMode;

fn host(kind: &str) -> String {
    probe::ns(std::process::id(), kind).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_and_its_container_use_the_node_network_and_uts() -> Result<()> {
    let id = format!("hostnet-{}", std::process::id());
    let shim = DirectShim::start(&id).await?;
    let mut cfg = pod_config("hostnet", &shim.dir);
    pod_ns(&mut cfg).network = NamespaceMode::Node as i32;
    let holder = shim.run_pod(&cfg, "").await?;
    assert_eq!(probe::ns(holder, "net")?, host("net"), "hostNetwork: node network");
    assert_eq!(probe::ns(holder, "uts")?, host("uts"), "hostNetwork: node UTS, as containerd does");
    assert_ne!(probe::ns(holder, "ipc")?, host("ipc"), "but the pod's own IPC");

    // A container whose spec names a hostname would rename the node's UTS namespace it joins
    // (runc and corral-oci both call sethostname in a joined one): refused, naming the field,
    // and the node keeps its name.
    let node_name = nix::unistd::gethostname()?;
    let renamer = format!("{id}-renamer");
    let (bundle, rootfs) = corral_rig::direct::container_bundle(&shim.dir, &renamer, holder, &["true"])?;
    let config = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&config)?)?;
    spec["hostname"] = "renamed-by-a-pod".into();
    std::fs::write(&config, serde_json::to_vec(&spec)?)?;
    let err = shim
        .create_task(&renamer, &bundle, rootfs)
        .await
        .expect_err("a hostname in the node's UTS namespace");
    let err = err.to_string();
    assert!(err.contains("config.json: hostname: ") && err.contains("renamed-by-a-pod"), "{err}");
    assert_eq!(nix::unistd::gethostname()?, node_name, "the node keeps its name");
    assert!(probe::mounts_containing(&renamer).is_empty(), "nothing mounted for the refused container");

    // A container, created the way containerd's task manager does it.
    let cid = format!("{id}-c1");
    let (bundle, created_pid) = shim.run_container(&cid, holder, &["sleep", "1000"]).await?;
    assert_eq!(probe::ns(created_pid, "net")?, host("net"));
    assert_eq!(probe::ns(created_pid, "uts")?, host("uts"));
    assert_eq!(probe::ns(created_pid, "ipc")?, probe::ns(holder, "ipc")?);

    // Pause and Resume freeze and thaw the container's cgroup (v1 freezer.state, v2
    // cgroup.freeze, read back from cgroup.events); State says PAUSED meanwhile.
    let cg = corral_rig::direct::container_cgroup(&cid);
    assert!(!cgroup::frozen(&cg)?, "{cg} not frozen before Pause");
    shim.task.pause(ctx(), &PauseRequest { id: cid.clone(), ..Default::default() }).await?;
    assert!(cgroup::frozen(&cg)?, "{cg} frozen after Pause");
    let state = shim.task.state(ctx(), &StateRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(state.status, containerd_shim_protos::types::task::Status::PAUSED.into());
    shim.task.resume(ctx(), &ResumeRequest { id: cid.clone(), ..Default::default() }).await?;
    assert!(!cgroup::frozen(&cg)?, "{cg} thawed after Resume");

    // Update applies new resources (OCI LinuxResources JSON, as containerd sends them).
    let mut resources = containerd_shim_protos::protobuf::well_known_types::any::Any::new();
    resources.type_url = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into();
    resources.value = br#"{"memory":{"limit":67108864}}"#.to_vec();
    let update =
        UpdateTaskRequest { id: cid.clone(), resources: Some(resources).into(), ..Default::default() };
    shim.task.update(ctx(), &update).await?;
    assert_eq!(cgroup::memory_limit(&cg)?, "67108864");
    let mut bad = update.clone();
    bad.resources.as_mut().unwrap().value = b"[1]".to_vec();
    let err = shim.task.update(ctx(), &bad).await.unwrap_err();
    assert!(format!("{err:?}").contains("resources.value: not a JSON object"), "{err:?}");

    // Unknown ids are NotFound, by name.
    let err =
        shim.task.state(ctx(), &StateRequest { id: "nope".into(), ..Default::default() }).await.unwrap_err();
    assert!(
        format!("{err:?}").contains("NOT_FOUND") && format!("{err:?}").contains("container nope: not found"),
        "{err:?}"
    );

    shim.task.kill(ctx(), &KillRequest { id: cid.clone(), signal: 9, ..Default::default() }).await?;
    let waited = shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(waited.exit_status, 137);
    let deleted = shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(deleted.exit_status, 137);
    // runc removed the container's cgroup, and on a systemd node its scope unit.
    eventually(Duration::from_secs(5), || cgroup::exists(&cg).then(|| format!("{cg} left after Delete")))
        .await?;
    let scope = format!("corral-direct-{cid}.scope");
    eventually(Duration::from_secs(5), || {
        let left = cgroup::units(&scope);
        (!left.is_empty()).then(|| format!("units left after Delete: {left:?}"))
    })
    .await?;

    // containerd main: Shutdown after every task deletion. The pod lives on, and so does the shim.
    shim.task.shutdown(ctx(), &ShutdownRequest { id: cid.clone(), ..Default::default() }).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = shim
        .sandbox
        .sandbox_status(ctx(), &SandboxStatusRequest { sandbox_id: id.clone(), ..Default::default() })
        .await?;
    assert_eq!(status.state, "SANDBOX_READY", "the shim survived TaskService.Shutdown");

    // And a new container in the same pod works.
    let cid2 = format!("{id}-c2");
    shim.run_container(&cid2, holder, &["sh", "-c", "exit 4"]).await?;
    let waited = shim.task.wait(ctx(), &WaitRequest { id: cid2.clone(), ..Default::default() }).await?;
    assert_eq!(waited.exit_status, 4);
    shim.task.delete(ctx(), &DeleteRequest { id: cid2.clone(), ..Default::default() }).await?;

    shim.sandbox
        .stop_sandbox(ctx(), &StopSandboxRequest { sandbox_id: id.clone(), ..Default::default() })
        .await?;
    let status = shim
        .sandbox
        .sandbox_status(ctx(), &SandboxStatusRequest { sandbox_id: id.clone(), ..Default::default() })
        .await?;
    assert_eq!(status.state, "SANDBOX_NOTREADY");
    shim.shutdown_sandbox().await?;
    let socket = shim.socket.clone();
    eventually(Duration::from_secs(3), || {
        socket.exists().then(|| "socket still there: the shim did not exit".into())
    })
    .await?;
    // No process of the pod is left (a SIGKILLed process may take a moment to be gone).
    eventually(Duration::from_secs(3), || {
        let left: Vec<_> =
            probe::pids_with_cmdline(&id).into_iter().map(|p| (p, probe::cmdline(p as u32))).collect();
        (!left.is_empty()).then(|| format!("processes of the pod left: {left:?}"))
    })
    .await?;

    // containerd then runs `delete`; it must succeed with nothing to do, twice, and print a
    // DeleteResponse.
    for _ in 0..2 {
        let (ok, out) = shim.delete_command(&id, &shim.bundle)?;
        assert!(ok, "delete failed");
        let resp = DeleteResponse::parse_from_bytes(&out).context("DeleteResponse")?;
        assert_eq!(resp.exit_status, 137);
    }
    let (ok, _) = shim.delete_command(&cid, &bundle)?;
    assert!(ok, "delete for a container id");
    assert!(probe::mounts_containing(&id).is_empty(), "{:?}", probe::mounts_containing(&id));
    Ok(())
}

/// corral starts a created container itself (no runtime process), which would skip the
/// poststart hooks a runtime's own `start` runs (libcontainer's does; runc 1.1 runs them at
/// create): a spec with such hooks is started by the runtime, and its hook runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poststart_hook_has_run_once_the_container_is_started() -> Result<()> {
    let id = format!("hooks-{}", std::process::id());
    let shim = DirectShim::start(&id).await?;
    let netns = corral_rig::direct::TestNetns::new(&format!("crl-hooks-{}", std::process::id()))?;
    let holder = shim.run_pod(&pod_config("hooks", &shim.dir), &netns.path.display().to_string()).await?;
    let cid = format!("{id}-c1");
    let (bundle, rootfs) = corral_rig::direct::container_bundle(&shim.dir, &cid, holder, &["sleep", "1000"])?;
    let marker = shim.dir.join("poststart-ran");
    let config = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&config)?)?;
    // Hooks run in the runtime's namespaces and get the container's state on stdin.
    spec["hooks"] = serde_json::json!({"poststart": [{
        "path": "/bin/sh",
        "args": ["sh", "-c", format!("cat > {}", marker.display())],
    }]});
    std::fs::write(&config, serde_json::to_vec(&spec)?)?;
    shim.create_task(&cid, &bundle, rootfs).await?;
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;
    let state = std::fs::read_to_string(&marker).context("the poststart hook did not run")?;
    assert!(state.contains(&cid), "the hook got the container's state: {state}");

    shim.task.kill(ctx(), &KillRequest { id: cid.clone(), signal: 9, ..Default::default() }).await?;
    shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.shutdown_sandbox().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletes_after_a_crash_release_everything() -> Result<()> {
    let id = format!("racing-{}", std::process::id());
    let shim = DirectShim::start(&id).await?;
    let netns = corral_rig::direct::TestNetns::new(&format!("crl-race-{}", std::process::id()))?;
    let cfg = pod_config("racing", &shim.dir);
    let holder = shim.run_pod(&cfg, &netns.path.display().to_string()).await?;
    let cid = format!("{id}-c");
    let (_, created_pid) = shim.run_container(&cid, holder, &["sleep", "1000"]).await?;

    // The shim dies; containerd then runs `delete` (and may run it again, or concurrently).
    let server = probe::shim_of(&id).context("server")?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server as i32), nix::sys::signal::Signal::SIGKILL)?;
    let (a, b) = std::thread::scope(|s| {
        let one = s.spawn(|| shim.delete_command(&id, &shim.bundle));
        let two = s.spawn(|| shim.delete_command(&id, &shim.bundle));
        (one.join().unwrap(), two.join().unwrap())
    });
    assert!(a?.0 && b?.0, "both deletes succeed");
    eventually(Duration::from_secs(3), || {
        let alive: Vec<u32> =
            [holder, created_pid].into_iter().filter(|p| probe::ns(*p, "net").is_ok()).collect();
        (!alive.is_empty()).then(|| format!("still alive: {alive:?}"))
    })
    .await?;
    assert!(probe::mounts_containing(&id).is_empty(), "{:?}", probe::mounts_containing(&id));
    assert!(!probe::corral_runc_containers_in(corral_rig::direct::NAMESPACE).contains(&cid));
    assert!(!shim.socket.exists(), "socket removed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_the_process_and_close_io_ends_it_and_file_stdio_works() -> Result<()> {
    let id = format!("stdio-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "stdio").await?;

    // `cat` reads containerd's stdin FIFO and writes to a file:// log (as ctr and nerdctl use).
    let cid = format!("{id}-cat");
    let stdin = shim.dir.join("stdin.fifo");
    nix::unistd::mkfifo(&stdin, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let log = shim.dir.join("logs/cat.log");
    let (bundle, rootfs) = corral_rig::direct::container_bundle(&shim.dir, &cid, holder, &["cat"])?;
    std::fs::write(bundle.join("sandbox"), &shim.id)?;
    let create = CreateTaskRequest {
        id: cid.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        stdin: stdin.display().to_string(),
        stdout: format!("file://{}", log.display()),
        ..Default::default()
    };
    shim.task.create(ctx(), &create).await?;
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;
    // containerd's side of stdin: a writer on the FIFO.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&stdin)?;
    std::io::Write::write_all(&mut writer, b"hello through stdin\n")?;
    eventually(Duration::from_secs(5), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (!text.contains("hello through stdin")).then(|| format!("log has {text:?}"))
    })
    .await?;
    let state = shim.task.state(ctx(), &StateRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(
        state.status,
        containerd_shim_protos::types::task::Status::RUNNING.into(),
        "cat waits for more input"
    );

    // CloseIO: cat sees the end of its input and exits 0, although containerd's writer is open.
    shim.task.close_io(ctx(), &CloseIORequest { id: cid.clone(), stdin: true, ..Default::default() }).await?;
    let waited = tokio::time::timeout(
        Duration::from_secs(5),
        shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }),
    )
    .await??;
    assert_eq!(waited.exit_status, 0);
    drop(writer);
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.shutdown_sandbox().await?;
    Ok(())
}

/// `seq 1 n` as busybox prints it.
fn seq(n: u32) -> String {
    (1..=n).map(|i| format!("{i}\n")).collect()
}

/// Compares a big log with what it must hold, printing only where they part.
fn assert_log(what: &str, got: &str, want: &str) {
    if got != want {
        let at = got.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
        let around = |s: &str| s.get(at.saturating_sub(40)..(at + 40).min(s.len())).unwrap_or("").to_string();
        panic!(
            "{what}: {} bytes, want {}; first difference at byte {at}: got {:?}, want {:?}",
            got.len(),
            want.len(),
            around(got),
            around(want)
        );
    }
}

/// An exec's OCI process, as containerd sends it.
fn exec_spec(args: &[&str], terminal: bool) -> containerd_shim_protos::protobuf::well_known_types::any::Any {
    let mut any = containerd_shim_protos::protobuf::well_known_types::any::Any::new();
    any.type_url = "types.containerd.io/opencontainers/runtime-spec/1/Process".into();
    any.value = serde_json::to_vec(&serde_json::json!({
        "args": args, "terminal": terminal, "cwd": "/", "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0},
    }))
    .unwrap();
    any
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_output_goes_through_a_pipe_and_is_all_in_the_file_when_the_exit_is_answered() -> Result<()> {
    // 348,894 bytes of output per process: five times a pipe's buffer.
    const LINES: u32 = 60_000;
    let id = format!("filelog-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "filelog").await?;
    let file_uri = |name: &str| format!("file://{}", shim.dir.join("logs").join(name).display());
    let read_log = |name: &str| std::fs::read_to_string(shim.dir.join("logs").join(name));

    // The init waits for a line on stdin (so its fds can be looked at), then writes to stdout and
    // stderr, both one file:// URI as `ctr run --log-uri` sends them.
    let cid = format!("{id}-seq");
    let stdin = shim.dir.join("seq-stdin");
    nix::unistd::mkfifo(&stdin, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let script = format!("read go; busybox seq 1 {LINES}; echo tail-on-stderr >&2");
    let (bundle, rootfs) =
        corral_rig::direct::container_bundle(&shim.dir, &cid, holder, &["sh", "-c", &script])?;
    let create = CreateTaskRequest {
        id: cid.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        stdin: stdin.display().to_string(),
        stdout: file_uri("init.log"),
        stderr: file_uri("init.log"),
        ..Default::default()
    };
    let pid = shim.task.create(ctx(), &create).await?.pid;
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;

    // On the host, the container's fds 1 and 2 are one pipe, and no fd of it is the log file.
    let link = |fd: &str| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).map(|p| p.display().to_string());
    let stdout = link("1")?;
    assert!(stdout.starts_with("pipe:["), "the container's fd 1 is {stdout:?}, not a pipe");
    assert_eq!(link("2")?, stdout, "stdout and stderr share one pipe, as they share one file");
    let log_path = shim.dir.join("logs/init.log").display().to_string();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        assert_ne!(target.display().to_string(), log_path, "the container holds the host's log file");
    }

    // An exec without a terminal: its own fd 1 is a pipe too, and all it wrote is in the file as
    // soon as Wait answers (no polling).
    let exec_script = format!("readlink /proc/self/fd/1; busybox seq 1 {LINES}");
    for (exec_id, terminal) in [("plain", false), ("tty", true)] {
        let exec = ExecProcessRequest {
            id: cid.clone(),
            exec_id: exec_id.into(),
            terminal,
            stdout: file_uri(&format!("{exec_id}.log")),
            spec: Some(exec_spec(&["sh", "-c", &exec_script], terminal)).into(),
            ..Default::default()
        };
        shim.task.exec(ctx(), &exec).await?;
        shim.task
            .start(ctx(), &StartRequest { id: cid.clone(), exec_id: exec_id.into(), ..Default::default() })
            .await?;
        let waited = tokio::time::timeout(
            Duration::from_secs(30),
            shim.task
                .wait(ctx(), &WaitRequest { id: cid.clone(), exec_id: exec_id.into(), ..Default::default() }),
        )
        .await??;
        assert_eq!(waited.exit_status, 0, "exec {exec_id}");
        // A terminal turns each newline into CRLF.
        let text = read_log(&format!("{exec_id}.log"))?.replace("\r\n", "\n");
        let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
        if terminal {
            assert!(first.starts_with("/dev/pts/"), "the tty exec's fd 1 is {first:?}");
        } else {
            assert!(first.starts_with("pipe:["), "the exec's fd 1 is {first:?}, not a pipe");
        }
        assert_log(&format!("exec {exec_id}'s log"), rest, &seq(LINES));
        shim.task
            .delete(ctx(), &DeleteRequest { id: cid.clone(), exec_id: exec_id.into(), ..Default::default() })
            .await?;
    }

    // Now the init writes; its whole output, stderr's tail last, is there when Wait answers.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&stdin)?;
    std::io::Write::write_all(&mut writer, b"go\n")?;
    let waited = tokio::time::timeout(
        Duration::from_secs(30),
        shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }),
    )
    .await??;
    assert_eq!(waited.exit_status, 0);
    assert_log("the init's log", &read_log("init.log")?, &(seq(LINES) + "tail-on-stderr\n"));
    drop(writer);
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.shutdown_sandbox().await?;
    Ok(())
}
