//! `delete`: containerd runs it after every sandbox shutdown, shim crash, and (after a containerd
//! restart) container task deletion, with `-id` a sandbox id or a container id. It must work with
//! no server, partial state, concurrently and twice. It releases what it finds and prints a
//! DeleteResponse.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::Message;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::args::Args;
use crate::error::{IoContext, Result};
use crate::events::timestamp;
use crate::pod::files::{self, PodPaths};
use crate::pod::persist::Record;
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
    let paths = PodPaths::new(&bundle);
    // Serialises concurrent deletes and the server's own release (see sys::lock).
    let _lock = crate::sys::lock::BundleLock::acquire(&bundle).with_path("lock", &bundle)?;
    match Record::load(&paths.state_file()) {
        Some(record) => runtime.block_on(release_pod(&args.id, &paths, &record)),
        None => {
            // containerd does not give `delete` the shim-manager environment: the file and the
            // defaults decide (a pod's record names its own runtime).
            let runc = Runc::for_namespace(crate::config::get(), &args.namespace);
            runtime.block_on(release_container(&runc, &args.id, &bundle));
            // A sandbox bundle without a record was released by ShutdownSandbox, or never got
            // that far; its mounts (if any) are below rootfs.
            let _ = files::remove_all(&paths);
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

/// Whether `pid` is a corral process of `role` ("serve" or "holder") for sandbox `id`: never kill
/// a recycled pid.
fn is_ours(pid: i32, role: &str, id: &str) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.contains(&role.as_bytes()) && args.contains(&id.as_bytes())
}

async fn release_pod(id: &str, paths: &PodPaths, record: &Record) {
    tracing::info!(sandbox = id, "delete: releasing pod from its record");
    if is_ours(record.server_pid, "serve", id) {
        let _ = kill(Pid::from_raw(record.server_pid), Signal::SIGKILL);
    }
    let runc = Runc {
        binary: record.runc_binary.clone(),
        root: record.runc_root.clone(),
        // runc's state remembers the cgroup manager of each container.
        cgroup_driver: Default::default(),
    };
    for (cid, bundle) in &record.containers {
        release_container(&runc, cid, bundle).await;
    }
    if is_ours(record.holder_pid, "holder", id) {
        let _ = kill(Pid::from_raw(record.holder_pid), Signal::SIGKILL);
    }
    let _ = files::remove_all(paths);
    if let (Some(rel), Ok(mode)) = (&record.cgroup, crate::cgroups::Mode::detect()) {
        let _ = crate::cgroups::remove_dirs(&mode, rel).await;
    }
    if let Some(socket) = &record.socket {
        let _ = std::fs::remove_file(socket);
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
