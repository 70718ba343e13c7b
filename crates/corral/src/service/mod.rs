//! ttrpc adapters: decode a request, find the pod or container, call one method, encode the
//! answer. Both services share one [`Shim`], which holds every pod keyed by sandbox id.

pub mod sandbox;
pub mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::events::Publisher;
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
    pub pods: Mutex<HashMap<String, Arc<Pod>>>,
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
        events: Publisher,
    ) -> Arc<Shim> {
        Arc::new(Shim {
            config,
            namespace,
            runc,
            socket,
            pods: Mutex::new(HashMap::new()),
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
    /// is written (the server loop waits for in-flight replies).
    pub async fn shutdown_pod(&self, pod: Arc<Pod>) -> Result<()> {
        pod.release().await?;
        let last = {
            let mut pods = self.pods.lock().unwrap();
            pods.remove(&pod.id);
            pods.is_empty()
        };
        if last {
            self.exit.notify_one();
        }
        Ok(())
    }

    /// The pod that owns container `id`.
    pub fn pod_of(&self, id: &str) -> Option<Arc<Pod>> {
        self.pods.lock().unwrap().values().find(|p| p.container(id).is_some()).cloned()
    }
}

/// Logs an RPC at debug level with its duration and outcome, and maps the error for ttrpc.
pub async fn traced<T>(
    rpc: &'static str,
    id: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> ttrpc::Result<T> {
    let started = Instant::now();
    tracing::debug!(rpc, id, "request");
    let out = fut.await;
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
