//! Below CRI, over ttrpc as containerd's task manager drives a shim: the stdio modes CRI does not
//! use. `binary://` logging programs (`ctr run --log-uri`, nerdctl's log drivers) and CloseIO on
//! a terminal (the client of `kubectl exec -it` went away: the shell is hung up).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::Result;
use containerd_shim_protos::api::*;
use corral_rig::direct::{container_bundle, ctx, DirectShim};
use corral_rig::{eventually, probe};

const T: Duration = Duration::from_secs(5);

/// A tty container: the request and the spec both ask for a terminal.
fn make_terminal(bundle: &std::path::Path) -> Result<()> {
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["terminal"] = serde_json::json!(true);
    std::fs::write(&path, serde_json::to_vec(&spec)?)?;
    Ok(())
}

fn fifo(path: &std::path::Path) -> Result<()> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_logger_gets_both_streams_and_the_ids_and_ends_with_the_process() -> Result<()> {
    let id = format!("binlog-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "binlog").await?;

    // The logging program records what the protocol gives it: arguments, environment, fds 3 and 4;
    // closing fd 5 says it is ready.
    let out = shim.dir.join("logger-out");
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(shim.program_dir())?;
    let logger = shim.program_dir().join("logger.sh");
    std::fs::write(
        &logger,
        "#!/bin/sh\nexec 5>&-\necho \"$@\" > \"$2/args\"\n/usr/bin/env > \"$2/env\"\n\
         /bin/cat <&3 > \"$2/stdout\" &\n/bin/cat <&4 > \"$2/stderr\" &\nwait\necho done > \"$2/done\"\n",
    )?;
    std::fs::set_permissions(&logger, std::fs::Permissions::from_mode(0o755))?;
    let uri = format!("binary://{}?dir={}", logger.display(), out.display());

    let cid = format!("{id}-c");
    let (bundle, rootfs) =
        container_bundle(&shim.dir, &cid, holder, &["sh", "-c", "echo to-stdout; echo to-stderr >&2"])?;
    std::fs::write(bundle.join("sandbox"), &id)?;
    let create = CreateTaskRequest {
        id: cid.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        stdout: uri.clone(),
        stderr: uri,
        ..Default::default()
    };
    shim.task.create(ctx(), &create).await?;
    // The program runs (it said it is ready) and holds none of the server's sockets.
    let server = probe::shim_of(&id).expect("server");
    let loggers = probe::pids_with_cmdline(&logger.display().to_string());
    assert!(!loggers.is_empty(), "the logging program runs");
    for pid in loggers {
        let shared: Vec<_> =
            probe::socket_inodes(pid as u32).intersection(&probe::socket_inodes(server)).cloned().collect();
        assert!(shared.is_empty(), "the logging program holds the server's sockets {shared:?}");
    }
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;
    let waited = shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(waited.exit_status, 0);
    // The program sees the end of both streams when the process exits, and finishes by itself.
    eventually(T, || (!out.join("done").exists()).then(|| "logger still running".into())).await?;
    assert_eq!(std::fs::read_to_string(out.join("stdout"))?, "to-stdout\n");
    assert_eq!(std::fs::read_to_string(out.join("stderr"))?, "to-stderr\n");
    assert_eq!(std::fs::read_to_string(out.join("args"))?, format!("dir {}\n", out.display()));
    let mut env: Vec<String> =
        std::fs::read_to_string(out.join("env"))?.lines().map(str::to_string).collect();
    env.retain(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="));
    env.sort();
    assert_eq!(env, [format!("CONTAINER_ID={cid}"), "CONTAINER_NAMESPACE=corral-direct".to_string()]);
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    assert!(probe::pids_with_cmdline(&logger.display().to_string()).is_empty(), "no logger left");

    // A program that never gets ready is an error naming it, and leaves nothing behind.
    let stuck = shim.program_dir().join("stuck.sh");
    let marker = format!("{}", 200_000 + std::process::id());
    std::fs::write(&stuck, format!("#!/bin/sh\nexec /bin/sleep {marker}\n"))?;
    std::fs::set_permissions(&stuck, std::fs::Permissions::from_mode(0o755))?;
    let cid2 = format!("{id}-stuck");
    let (bundle, rootfs) = container_bundle(&shim.dir, &cid2, holder, &["sh", "-c", "true"])?;
    std::fs::write(bundle.join("sandbox"), &id)?;
    let create = CreateTaskRequest {
        id: cid2.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        stdout: format!("binary://{}", stuck.display()),
        ..Default::default()
    };
    let err = shim.task.create(ttrpc::context::with_timeout(20_000_000_000), &create).await.unwrap_err();
    assert!(err.to_string().contains("stuck.sh") && err.to_string().contains("not ready"), "{err}");
    assert!(!probe::corral_runc_containers_in(corral_rig::direct::NAMESPACE).contains(&cid2));
    let left = probe::pids_with_cmdline(&marker);
    assert!(left.is_empty(), "the stuck logger was left running: {left:?}");

    shim.shutdown_sandbox().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tty_container_gets_its_input_and_close_io_hangs_its_terminal_up() -> Result<()> {
    let id = format!("ttyio-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "ttyio").await?;

    let cid = format!("{id}-cat");
    let (stdin, stdout) = (shim.dir.join("stdin"), shim.dir.join("stdout"));
    fifo(&stdin)?;
    fifo(&stdout)?;
    // containerd's reader is open before Create, as CRI does.
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&stdout)?;
    let (bundle, rootfs) = container_bundle(&shim.dir, &cid, holder, &["cat"])?;
    make_terminal(&bundle)?;
    std::fs::write(bundle.join("sandbox"), &id)?;
    let create = CreateTaskRequest {
        id: cid.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        stdin: stdin.display().to_string(),
        stdout: stdout.display().to_string(),
        terminal: true,
        ..Default::default()
    };
    shim.task.create(ctx(), &create).await?;
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.task
        .resize_pty(ctx(), &ResizePtyRequest { id: cid.clone(), width: 80, height: 24, ..Default::default() })
        .await?;

    let mut writer = std::fs::OpenOptions::new().write(true).open(&stdin)?;
    std::io::Write::write_all(&mut writer, b"typed line\n")?;
    // The terminal echoes the line and cat writes it back: twice, with the tty's CRLF.
    let mut seen = String::new();
    eventually(T, || {
        let mut buf = [0u8; 4096];
        if let Ok(n) = reader.read(&mut buf) {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        (seen.matches("typed line\r\n").count() < 2).then(|| format!("output so far {seen:?}"))
    })
    .await?;

    // CloseIO with containerd's writer still open: the terminal is hung up. cat is pid 1 of its
    // pid namespace, so the kernel's SIGHUP does not kill it; its next read fails and it exits 1.
    shim.task.close_io(ctx(), &CloseIORequest { id: cid.clone(), stdin: true, ..Default::default() }).await?;
    let waited = tokio::time::timeout(
        T,
        shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }),
    )
    .await??;
    assert_eq!(waited.exit_status, 1);
    drop(writer);
    // A hung-up terminal cannot be resized: a precise error.
    let err = shim
        .task
        .resize_pty(ctx(), &ResizePtyRequest { id: cid.clone(), width: 1, height: 1, ..Default::default() })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("hung up"), "{err}");
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.shutdown_sandbox().await?;
    Ok(())
}
