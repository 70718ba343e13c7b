//! ttrpc adapters: decode a request, find the pod or container, call one method, encode the
//! answer. Both services share one [`Shim`], which holds every pod keyed by sandbox id.

pub mod sandbox;
pub mod task;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::events::Publisher;
use crate::node::NodeServer;
use crate::pod::persist::ServedBy;
use crate::pod::Pod;
use crate::task::runc::Runc;

/// State shared by the services of one shim process.
pub struct Shim {
    /// corral's settings: the file, the handler's options, the environment (see `config`).
    pub config: &'static crate::config::Config,
    pub namespace: String,
    pub runc: Runc,
    /// This server's socket (recorded so `delete` can remove it after a crash).
    pub socket: Option<std::path::PathBuf>,
    /// Node mode: the node server this process is (shared by every pod).
    pub node: Option<NodeServer>,
    pub pods: Mutex<HashMap<String, Arc<Pod>>>,
    /// CreateSandbox calls in flight (a node server must not exit under them).
    pub creating: AtomicUsize,
    pub events: Publisher,
    /// Notified when the server should exit (after ShutdownSandbox replied).
    pub exit: Arc<Notify>,
}

impl Shim {
    pub fn new(
        config: &'static crate::config::Config,
        namespace: String,
        runc: Runc,
        socket: Option<std::path::PathBuf>,
        node: Option<NodeServer>,
        events: Publisher,
    ) -> Arc<Shim> {
        Arc::new(Shim {
            config,
            namespace,
            runc,
            socket,
            node,
            pods: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            events,
            exit: Arc::new(Notify::new()),
        })
    }

    pub fn pod(&self, id: &str) -> Result<Arc<Pod>> {
        self.pods
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("sandbox {id}: not found")))
    }

    /// Releases `pod` and forgets it; the last pod gone makes the server exit once this reply
    /// is written (the server loop waits for in-flight replies). A node server goes on while
    /// other pods, or registrations of pods to come, remain.
    pub async fn shutdown_pod(&self, pod: Arc<Pod>) -> Result<()> {
        // On failure the pod stays: containerd retries ShutdownSandbox, or `delete` finishes.
        pod.release().await?;
        self.pods.lock().unwrap().remove(&pod.id);
        self.forget(&pod.id).await;
        Ok(())
    }

    /// A sandbox id this server will not serve (again): drops its node registration, and ends
    /// the server if nothing else is left.
    pub async fn forget(&self, id: &str) {
        if let Some(node) = &self.node {
            node.deregister(id);
        }
        self.exit_if_idle().await;
    }

    /// What a pod's record says about this server.
    pub fn served_by(&self) -> ServedBy {
        match &self.node {
            None => ServedBy { socket: self.socket.clone(), node_dir: None },
            Some(node) => ServedBy { socket: None, node_dir: Some(node.dir.clone()) },
        }
    }

    /// Exits when no pod is left. A node server decides under the node lock, so that no `start`
    /// registers a pod in between; it removes its socket before letting go of the lock, so the
    /// next `start` spawns a new server instead of connecting to this leaving one.
    pub async fn exit_if_idle(&self) {
        let idle = || self.pods.lock().unwrap().is_empty() && self.creating.load(Ordering::SeqCst) == 0;
        if !idle() {
            return;
        }
        let Some(node) = self.node.clone() else {
            self.exit.notify_one();
            return;
        };
        let lock = match tokio::task::spawn_blocking(move || node.lock().map(|l| (l, node))).await {
            Ok(Ok(lock)) => lock,
            Ok(Err(e)) => return tracing::warn!(error = %e, "idle check: node lock"),
            Err(e) => return tracing::warn!(error = %e, "idle check: node lock"),
        };
        let (lock, node) = lock;
        let live: HashSet<String> = self.pods.lock().unwrap().keys().cloned().collect();
        let pending = node.pending(&live);
        if !idle() || !pending.is_empty() {
            tracing::debug!(pods = live.len(), ?pending, "node server stays");
            return;
        }
        let _ = std::fs::remove_file(&node.socket);
        node.remove(&lock);
        tracing::info!(node = %node.key(), "no pod left; the node server exits");
        self.exit.notify_one();
    }

    /// Node mode: checks for idleness every `period` (a registration whose CreateSandbox never
    /// came expires, see crate::node).
    pub async fn exit_when_idle_every(self: Arc<Self>, period: std::time::Duration) {
        loop {
            tokio::time::sleep(period).await;
            self.exit_if_idle().await;
        }
    }

    /// The pod that owns container `id`.
    pub fn pod_of(&self, id: &str) -> Option<Arc<Pod>> {
        self.pods.lock().unwrap().values().find(|p| p.container(id).is_some()).cloned()
    }
}

/// Logs an RPC at debug level with its duration and outcome, and maps the error for ttrpc.
/// A panic while serving it fails this RPC alone, naming the pod or container: in node mode the
/// process serves every pod, and one pod's bug must not end the others.
pub async fn traced<T>(
    rpc: &'static str,
    id: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> ttrpc::Result<T> {
    use futures_util::FutureExt;
    let started = Instant::now();
    tracing::debug!(rpc, id, "request");
    let guarded = async {
        failpoint(rpc, id);
        fut.await
    };
    let out = match std::panic::AssertUnwindSafe(guarded).catch_unwind().await {
        Ok(out) => out,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            tracing::error!(rpc, id, panic = %what, "panicked; this request fails, the server goes on");
            Err(Error::Internal(format!("{rpc} {id}: corral panicked: {what}")))
        }
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    match &out {
        Ok(_) => tracing::debug!(rpc, id, elapsed_ms, "ok"),
        // NotFound is routine (Kill after an exit, probes of deleted ids): not worth a warning.
        Err(e @ Error::NotFound(_)) => {
            tracing::debug!(rpc, id, elapsed_ms, error = %e, "not found")
        }
        Err(e) => tracing::warn!(rpc, id, elapsed_ms, error = %e, "failed"),
    }
    out.map_err(Into::into)
}

/// Test builds only: `CORRAL_FAILPOINT=<file>` where the file holds lines `panic <rpc> <id>`
/// panics while serving those requests, so the end-to-end tests can check that a panic costs
/// one request, not the server. (A file, so a test can name ids it learns as it runs.)
fn failpoint(rpc: &str, id: &str) {
    if failpoint_set(&["panic", rpc, id]) {
        panic!("failpoint {rpc} {id}");
    }
}

/// Test builds only: whether the failpoint file holds the line `words` (always false in a
/// release build).
#[cfg(debug_assertions)]
pub(crate) fn failpoint_set(words: &[&str]) -> bool {
    let Some(file) = std::env::var_os("CORRAL_FAILPOINT") else { return false };
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines().any(|l| l.split_whitespace().eq(words.iter().copied()))
}

#[cfg(not(debug_assertions))]
pub(crate) fn failpoint_set(_: &[&str]) -> bool {
    false
}
