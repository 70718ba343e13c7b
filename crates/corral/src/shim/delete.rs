//! `delete`: containerd runs it after every sandbox shutdown, shim crash, and (after a containerd
//! restart) container task deletion, with `-id` a sandbox id or a container id. It must work with
//! no server, partial state, concurrently and twice. It releases what it finds and prints a
//! DeleteResponse.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::Message;
use nix::sys::signal::Signal;

use super::args::Args;
use crate::error::{IoContext, Result};
use crate::events::timestamp;
use crate::node::NodeServer;
use crate::pod::files::{self, state_file, PodPaths};
use crate::pod::persist::Record;
use crate::sys::mount::is_mount_point;
use crate::task::rootfs::unmount_rootfs;
use crate::task::runc::{is_not_exist, Runc};

pub fn run(args: &Args) -> Result<()> {
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context(|| "current directory".into())?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context(|| "build async runtime".into())?;
    // Node mode: the server serves other pods and must live on. If it is alive it still knows
    // this pod (containerd only runs `delete` when its connection closed, which a live server
    // does not cause): ask it to release the pod, before taking the bundle lock its release
    // takes too. Whatever it cannot release is in the record, below.
    if let Some(node) = NodeServer::from_marker(&bundle) {
        runtime.block_on(ask_node_server(&node, &args.id));
        node.deregister(&args.id);
        node.clean_up_if_dead();
    }
    // Serialises concurrent deletes and the server's own release (see sys::lock).
    let _lock = crate::sys::lock::BundleLock::acquire(&bundle).with_path("lock", &bundle)?;
    // containerd does not give `delete` the shim-manager environment: the file and the defaults
    // decide (a pod's record names its own runtime and files).
    let config = crate::config::get();
    let default_paths = PodPaths::new(&bundle, &config.pod.files_root, &args.namespace, &args.id);
    match Record::load(&state_file(&bundle)) {
        Some(record) => {
            let paths = PodPaths { files: record.files_dir.clone().unwrap_or(default_paths.files), bundle };
            runtime.block_on(release_pod(&args.id, &paths, &record))
        }
        None => {
            let runc = Runc::for_namespace(config, &args.namespace);
            runtime.block_on(release_container(&runc, &args.id, &bundle));
            // A container bundle whose rootfs is still mounted is left alone: what is below it
            // is the container's filesystem, not corral's pins or shm.
            if is_mount_point(&default_paths.mounts_dir()) {
                tracing::warn!(id = %args.id, "delete: rootfs still mounted; leaving the bundle to containerd");
            } else {
                // A sandbox bundle without a record was released by ShutdownSandbox, or never got
                // that far; whatever is left of it is here.
                let _ = files::remove_all(&default_paths);
            }
        }
    }
    let resp = DeleteResponse {
        pid: 0,
        exit_status: 128 + Signal::SIGKILL as u32,
        exited_at: timestamp(SystemTime::now()),
        ..Default::default()
    };
    let bytes = resp.write_to_bytes().expect("DeleteResponse encodes");
    use std::io::Write;
    std::io::stdout().write_all(&bytes).context(|| "write DeleteResponse".into())
}

/// Whether `argv` is a corral process of `role` ("serve" or "holder") for sandbox `id`. Checked
/// together with the recorded start time (see sys::process), through a pidfd.
fn is_ours(argv: &[Vec<u8>], role: &str, id: &str) -> bool {
    argv.iter().any(|a| a == role.as_bytes()) && argv.iter().any(|a| a == id.as_bytes())
}

/// ShutdownSandbox to a live node server, bounded: `delete` itself runs under containerd's
/// 5 s deadline. A dead server refuses the connection at once.
async fn ask_node_server(node: &NodeServer, id: &str) {
    use containerd_shim_protos::sandbox_api::ShutdownSandboxRequest;
    use containerd_shim_protos::sandbox_async::SandboxClient;
    let address = format!("unix://{}", node.socket.display());
    let asked = async {
        let client = ttrpc::asynchronous::Client::connect(&address).await.map_err(|e| e.to_string())?;
        let req = ShutdownSandboxRequest { sandbox_id: id.into(), ..Default::default() };
        let ctx = ttrpc::context::with_timeout(Duration::from_secs(3).as_nanos() as i64);
        SandboxClient::new(client).shutdown_sandbox(ctx, &req).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(3), asked).await {
        Ok(Ok(_)) => tracing::debug!(sandbox = id, "delete: the node server released the pod"),
        Ok(Err(e)) => tracing::debug!(sandbox = id, error = %e, "delete: node server not reachable"),
        Err(_) => tracing::warn!(sandbox = id, "delete: the node server did not answer in 3 s"),
    }
}

async fn release_pod(id: &str, paths: &PodPaths, record: &Record) {
    tracing::info!(sandbox = id, "delete: releasing pod from its record");
    // The quick, node-level part first: containerd runs `delete` under a deadline and kills it
    // when that passes, and `runc delete --force` can be slow on a loaded node. Whatever the
    // deadline cuts off is still in the record for the next `delete`. A node server is never
    // signalled: it serves other pods.
    let own_server = record.node_dir.is_none();
    if own_server {
        if let Err(e) = record.server().signal_if(Signal::SIGKILL, |argv| is_ours(argv, "serve", id)) {
            tracing::warn!(sandbox = id, error = %e, "delete: kill the server");
        }
    }
    if let Err(e) = record.holder().signal_if(Signal::SIGKILL, |argv| is_ours(argv, "holder", id)) {
        tracing::warn!(sandbox = id, error = %e, "delete: kill the holder");
    }
    if let Err(e) = files::remove_all(paths) {
        tracing::warn!(sandbox = id, error = %e, "delete: pins, shm and pod files");
    }
    if let Some(socket) = record.socket.as_ref().filter(|_| own_server) {
        let _ = std::fs::remove_file(socket);
    }
    let runc = Runc {
        binary: record.runc_binary.clone(),
        root: record.runc_root.clone(),
        // runc's state remembers the cgroup manager of each container.
        cgroup_driver: Default::default(),
    };
    // CRI sees the pod NOTREADY only once this command returns, and `runc delete --force` of a
    // running container takes 100 ms at least: release the containers side by side.
    let mut releases = tokio::task::JoinSet::new();
    for (cid, bundle) in record.containers.clone() {
        let runc = runc.clone();
        releases.spawn(async move { release_container(&runc, &cid, &bundle).await });
    }
    while releases.join_next().await.is_some() {}
    if let Some(unit) = record.cgroup_unit.clone() {
        // Kills what the holder's scope still holds and unloads it; blocking D-Bus exchange.
        let stopped = tokio::task::spawn_blocking(move || crate::cgroups::scope::stop(&unit)).await;
        if let Err(e) = stopped.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
            tracing::warn!(sandbox = id, error = %e, "delete: the holder's scope");
        }
    }
    if let (Some(rel), Ok(mode)) = (&record.cgroup, crate::cgroups::Mode::detect()) {
        let _ = crate::cgroups::remove_dirs(&mode, rel).await;
    }
    let _ = std::fs::remove_file(paths.state_file());
}

async fn release_container(runc: &Runc, id: &str, bundle: &Path) {
    if let Err(e) = runc.delete(id).await {
        if !is_not_exist(&e) {
            tracing::warn!(container = id, error = %e, "delete: runc delete");
        }
    }
    let rootfs: PathBuf = bundle.join("rootfs");
    let _ = unmount_rootfs(&rootfs);
}
