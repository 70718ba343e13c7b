//! The long-running server: one ttrpc server on the socket `start` bound, serving the Sandbox
//! API and the Task API (v3, and the same handlers under the v2 name). A current-thread runtime
//! keeps the per-pod footprint small; blocking work (the holder) goes to the blocking pool.
//!
//! Exit rule: only when the last pod was shut down (ShutdownSandbox, or containerd reaping an
//! orphan), or on SIGTERM/SIGINT from the node. In node mode, one server serves every pod (of one
//! containerd, namespace and configuration) on a multi-thread runtime, and exits when it holds no
//! pod and no `start` has registered one it has yet to create (decided under the node lock).

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use containerd_shim_protos::sandbox_async::create_sandbox;
use containerd_shim_protos::shim_async::create_task;
use tokio::signal::unix::{signal, SignalKind};

use super::args::{Action, Args};
use super::start::{LISTEN_FD, READY_FD};
use crate::error::{Error, IoContext, Result};
use crate::events::Publisher;
use crate::node::NodeServer;
use crate::pod::files::state_file;
use crate::pod::persist::Record;
use crate::service::sandbox::SandboxService;
use crate::service::task::TaskService;
use crate::service::Shim;
use crate::sys::process::ProcessId;
use crate::task::runc::Runc;

pub fn run(args: &Args) -> Result<()> {
    // Pod mode: the sandbox bundle. Node mode: the node directory (see crate::node).
    let workdir = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context(|| "current directory".into())?,
    };
    let node = (args.action == Action::ServeNode)
        .then(|| NodeServer { socket: args.socket.clone().unwrap_or_default(), dir: workdir.clone() });
    let config = crate::config::init(crate::config::RuntimeOptions::saved(&workdir)?.as_ref())?;
    match &node {
        None => super::logging::init(args.debug, &args.id, &config.log.level, None),
        Some(node) => super::logging::init(
            args.debug,
            "",
            &config.log.level,
            Some(&node.log_file(&config.log.node_dir)),
        ),
    }
    // Container inits are reparented to corral when `runc create` exits; the subreaper bit makes
    // them corral's children so their exit status can be collected.
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(Error::io("become child subreaper", std::io::Error::last_os_error()));
    }
    // A current-thread runtime keeps the footprint small, in node mode too: every runc call and
    // wait is asynchronous and the holder's spawn goes to the blocking pool, so one pod's slow
    // step does not hold up the others' requests.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .context(|| "build async runtime".into())?;
    let result = runtime.block_on(serve(args, config, node.clone()));
    if let Some(socket) = &args.socket {
        // A node server removed its socket under the node lock when it decided to exit; by now
        // a new server may listen on that path.
        if node.is_none() {
            let _ = std::fs::remove_file(socket);
        }
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "server failed");
    }
    result
}

async fn serve(args: &Args, config: &'static crate::config::Config, node: Option<NodeServer>) -> Result<()> {
    crate::sys::reaper::spawn().context(|| "watch SIGCHLD for orphans".into())?;
    let events = Publisher::spawn(std::env::var("TTRPC_ADDRESS").ok(), args.namespace.clone());
    let runc = Runc::for_namespace(config, &args.namespace);
    std::fs::create_dir_all(&runc.root).with_path("create runc root", &runc.root)?;
    // A first record, before any pod exists: if CreateSandbox fails, containerd's `delete` still
    // finds this server and its socket. The pod's record replaces it. (A node server belongs to
    // no bundle.)
    if node.is_none() {
        let me = ProcessId::current();
        Record {
            sandbox_id: args.id.clone(),
            server_pid: me.pid,
            server_start: me.start,
            socket: args.socket.clone(),
            runc_binary: runc.binary.clone(),
            runc_root: runc.root.clone(),
            ..Record::default()
        }
        .save(&state_file(Path::new(".")))?;
    }
    let shim = Shim::new(config, args.namespace.clone(), runc, args.socket.clone(), node.clone(), events);

    let tasks = Arc::new(TaskService { shim: shim.clone() });
    let mut services = create_task(tasks.clone());
    // Same messages, older service name: containerd < 2.0 or a version-2 fallback.
    for (name, service) in create_task(tasks) {
        services.insert(name.replace(".v3.", ".v2."), service);
    }
    services.extend(create_sandbox(Arc::new(SandboxService { shim: shim.clone() })));

    // `start` had to hand the listener over without close-on-exec; set it again so that runc,
    // the holder and logging programs do not inherit it (a child holding it would keep the
    // socket accepting after this server died, and containerd's reconnect would hang).
    // SAFETY: fcntl on an fd number with integer arguments only.
    if unsafe { libc::fcntl(LISTEN_FD, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(Error::io("mark the listener close-on-exec", std::io::Error::last_os_error()));
    }
    // SAFETY: `start` placed a listening unix socket on LISTEN_FD for this process alone.
    let server = unsafe { ttrpc::asynchronous::Server::new().add_unix_listener(LISTEN_FD) }
        .map_err(|e| Error::invalid(format!("listener on fd {LISTEN_FD}: {e}")))?;
    let mut server = server.register_service(services);
    server.start().await.map_err(|e| Error::invalid(format!("start ttrpc server: {e}")))?;

    // SAFETY: `start` placed the write end of its readiness pipe on READY_FD for us alone.
    let mut ready = unsafe { std::fs::File::from_raw_fd(READY_FD) };
    let _ = ready.write_all(b"R");
    drop(ready);
    match &node {
        None => tracing::info!(sandbox = %args.id, pid = std::process::id(), "serving"),
        Some(node) => {
            tracing::info!(node = %node.key(), pid = std::process::id(), socket = %node.socket.display(), "serving the node's pods");
            // A registered sandbox whose CreateSandbox never comes must not keep it forever.
            tokio::spawn(shim.clone().exit_when_idle_every(Duration::from_secs(15)));
        }
    }
    // Pod files left by pods whose bundles are gone (a reboot empties /run, not the disk).
    let files_root = config.pod.files_root.clone();
    // And node servers' directories that nothing will release any more (see crate::node).
    let socket_dir = args.socket.as_ref().and_then(|s| s.parent()).map(Path::to_path_buf);
    tokio::task::spawn_blocking(move || {
        match crate::pod::files::sweep_orphans(&files_root) {
            0 => {}
            n => tracing::info!(removed = n, "swept files of pods whose bundles are gone"),
        }
        if let Some(socket_dir) = socket_dir {
            match NodeServer::sweep_dead(Path::new(crate::node::NODE_DIR), &socket_dir) {
                0 => {}
                n => tracing::info!(removed = n, "swept directories of dead node servers"),
            }
        }
    });

    let mut term = signal(SignalKind::terminate()).context(|| "watch SIGTERM".into())?;
    let mut int = signal(SignalKind::interrupt()).context(|| "watch SIGINT".into())?;
    tokio::select! {
        _ = shim.exit.notified() => tracing::info!("last pod shut down; exiting"),
        _ = term.recv() => tracing::info!("SIGTERM; exiting"),
        _ = int.recv() => tracing::info!("SIGINT; exiting"),
    }
    // Let the ShutdownSandbox reply reach containerd before connections close.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), server.shutdown()).await;
    Ok(())
}
