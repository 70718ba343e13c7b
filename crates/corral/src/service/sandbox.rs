//! `containerd.runtime.sandbox.v1.Sandbox`: every RPC written out, none left to a generated
//! default.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::sandbox_api::*;
use containerd_shim_protos::sandbox_async::Sandbox;
use containerd_shim_protos::types::platform::Platform;
use ttrpc::r#async::TtrpcContext;

use super::{traced, Shim};
use crate::cgroups;
use crate::error::{Error, Result};
use crate::events::timestamp;
use crate::pod::files::PodPaths;
use crate::pod::{spec, Pod, PodState};

pub struct SandboxService {
    pub shim: Arc<Shim>,
}

/// Counts a CreateSandbox in flight for as long as it lives.
struct Creating<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Creating<'a> {
    fn new(counter: &'a std::sync::atomic::AtomicUsize) -> Self {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Creating(counter)
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl SandboxService {
    /// A request cannot make corral write pod files or mount anywhere but the sandbox's bundle:
    /// in pod mode containerd started this server in it; in node mode `start` (run by containerd
    /// in it) registered it for this id.
    fn check_bundle(&self, id: &str, bundle: &std::path::Path) -> Result<()> {
        let resolved = bundle.is_absolute().then(|| bundle.canonicalize().ok()).flatten();
        let (expected, whose) = match &self.shim.node {
            None => (
                std::env::current_dir().ok().and_then(|d| d.canonicalize().ok()),
                "this shim's bundle (the directory containerd started it in)",
            ),
            Some(node) => (node.registered_bundle(id), "the bundle `start` registered for this sandbox id"),
        };
        if resolved.is_none() || resolved != expected {
            return Err(Error::invalid(format!("bundle_path: {:?} is not {whose}", bundle)));
        }
        Ok(())
    }

    async fn create(&self, req: CreateSandboxRequest) -> Result<()> {
        let _creating = Creating::new(&self.shim.creating);
        crate::ids::validate("sandbox_id", &req.sandbox_id)?;
        if self.shim.pods.lock().unwrap().contains_key(&req.sandbox_id) {
            return Err(Error::AlreadyExists(format!("sandbox {}: already exists", req.sandbox_id)));
        }
        let bundle = std::path::PathBuf::from(&req.bundle_path);
        self.check_bundle(&req.sandbox_id, &bundle)?;
        let options = req.options.as_ref();
        let spec = spec::decode(
            options.map(|a| a.type_url.as_str()),
            options.map(|a| a.value.as_slice()).unwrap_or_default(),
            &req.netns_path,
            self.shim.config,
        )?;
        // One pod per bundle: its pins, shm and record live there.
        if let Some(other) = self.shim.pods.lock().unwrap().values().find(|p| p.paths.bundle == bundle) {
            return Err(Error::AlreadyExists(format!(
                "sandbox {}: bundle_path {:?} already holds sandbox {}",
                req.sandbox_id, req.bundle_path, other.id
            )));
        }
        let id = req.sandbox_id.clone();
        let paths = PodPaths::new(bundle, &self.shim.config.pod.files_root, &self.shim.namespace, &id);
        let runc = self.shim.runc.clone();
        let served_by = self.shim.served_by();
        // The holder is our child until its pidfd claims it (see sys::reaper).
        let _busy = crate::sys::reaper::Busy::new();
        let pod = tokio::task::spawn_blocking(move || Pod::create(&id, paths, spec, runc, served_by))
            .await
            .map_err(|e| Error::Holder { step: "create pod".into(), message: e.to_string() })??;
        let pod = Arc::new(pod);
        tracing::info!(sandbox = %pod.id, holder = pod.holder_pid(), pod = %pod.spec.name, "sandbox created");
        tokio::spawn(pod.clone().watch_holder());
        self.shim.pods.lock().unwrap().insert(req.sandbox_id, pod);
        Ok(())
    }

    fn status(&self, req: &SandboxStatusRequest) -> Result<SandboxStatusResponse> {
        let pod = self.shim.pod(&req.sandbox_id)?;
        let mut resp = SandboxStatusResponse {
            sandbox_id: pod.id.clone(),
            pid: pod.holder_pid() as u32,
            created_at: timestamp(pod.created_at),
            ..Default::default()
        };
        match pod.state() {
            PodState::Ready => resp.state = "SANDBOX_READY".into(),
            PodState::Created => resp.state = "SANDBOX_NOTREADY".into(),
            PodState::Stopped(exit) => {
                resp.state = "SANDBOX_NOTREADY".into();
                resp.exited_at = timestamp(exit.at);
            }
        }
        if req.verbose {
            let info = serde_json::json!({
                "pid": pod.holder_pid(),
                "sandboxer": "corral",
                "bundle": pod.paths.bundle,
                "spec": pod.spec,
            });
            resp.info.insert("info".into(), info.to_string());
        }
        Ok(resp)
    }
}

#[async_trait]
impl Sandbox for SandboxService {
    async fn create_sandbox(
        &self,
        _: &TtrpcContext,
        req: CreateSandboxRequest,
    ) -> ttrpc::Result<CreateSandboxResponse> {
        let id = req.sandbox_id.clone();
        traced("CreateSandbox", &id, self.create(req)).await?;
        Ok(CreateSandboxResponse::default())
    }

    async fn start_sandbox(
        &self,
        _: &TtrpcContext,
        req: StartSandboxRequest,
    ) -> ttrpc::Result<StartSandboxResponse> {
        traced("StartSandbox", &req.sandbox_id, async {
            let pod = self.shim.pod(&req.sandbox_id)?;
            pod.start()?;
            Ok(StartSandboxResponse {
                pid: pod.holder_pid() as u32,
                created_at: timestamp(pod.created_at),
                ..Default::default()
            })
        })
        .await
    }

    async fn platform(&self, _: &TtrpcContext, req: PlatformRequest) -> ttrpc::Result<PlatformResponse> {
        traced("Platform", &req.sandbox_id, async {
            self.shim.pod(&req.sandbox_id)?;
            let platform =
                Platform { os: "linux".into(), architecture: go_arch().into(), ..Default::default() };
            Ok(PlatformResponse { platform: MessageField::some(platform), ..Default::default() })
        })
        .await
    }

    async fn stop_sandbox(
        &self,
        _: &TtrpcContext,
        req: StopSandboxRequest,
    ) -> ttrpc::Result<StopSandboxResponse> {
        traced("StopSandbox", &req.sandbox_id, async {
            let pod = self.shim.pod(&req.sandbox_id)?;
            pod.stop().await?;
            Ok(StopSandboxResponse::default())
        })
        .await
    }

    async fn wait_sandbox(
        &self,
        _: &TtrpcContext,
        req: WaitSandboxRequest,
    ) -> ttrpc::Result<WaitSandboxResponse> {
        traced("WaitSandbox", &req.sandbox_id, async {
            let pod = self.shim.pod(&req.sandbox_id)?;
            let exit = pod.wait().await;
            Ok(WaitSandboxResponse {
                exit_status: exit.status,
                exited_at: timestamp(exit.at),
                ..Default::default()
            })
        })
        .await
    }

    async fn sandbox_status(
        &self,
        _: &TtrpcContext,
        req: SandboxStatusRequest,
    ) -> ttrpc::Result<SandboxStatusResponse> {
        let id = req.sandbox_id.clone();
        traced("SandboxStatus", &id, async { self.status(&req) }).await
    }

    async fn ping_sandbox(&self, _: &TtrpcContext, req: PingRequest) -> ttrpc::Result<PingResponse> {
        traced("PingSandbox", &req.sandbox_id, async {
            self.shim.pod(&req.sandbox_id)?;
            Ok(PingResponse::default())
        })
        .await
    }

    async fn shutdown_sandbox(
        &self,
        _: &TtrpcContext,
        req: ShutdownSandboxRequest,
    ) -> ttrpc::Result<ShutdownSandboxResponse> {
        traced("ShutdownSandbox", &req.sandbox_id, async {
            match self.shim.pod(&req.sandbox_id) {
                Ok(pod) => self.shim.shutdown_pod(pod).await?,
                // CreateSandbox failed (containerd cleans up with ShutdownSandbox) or a retry:
                // nothing to release, and a shim without pods has no reason to live.
                Err(_) if self.shim.node.is_some() || self.shim.pods.lock().unwrap().is_empty() => {
                    self.shim.forget(&req.sandbox_id).await
                }
                Err(e) => return Err(e),
            }
            tracing::info!(sandbox = %req.sandbox_id, "sandbox shut down");
            Ok(ShutdownSandboxResponse::default())
        })
        .await
    }

    async fn sandbox_metrics(
        &self,
        _: &TtrpcContext,
        req: SandboxMetricsRequest,
    ) -> ttrpc::Result<SandboxMetricsResponse> {
        traced("SandboxMetrics", &req.sandbox_id, async {
            let pod = self.shim.pod(&req.sandbox_id)?;
            let Some(rel) = pod.spec.cgroup_parent_path.as_ref() else {
                return Err(Error::precondition(format!(
                    "sandbox {}: no cgroup_parent, so no pod cgroup to measure",
                    pod.id
                )));
            };
            let data = cgroups::stats::read(cgroups::Mode::host()?, rel)?;
            let mut resp = SandboxMetricsResponse::default();
            let metric = resp.metrics.mut_or_insert_default();
            metric.id = pod.id.clone();
            metric.timestamp = timestamp(std::time::SystemTime::now());
            metric.data = MessageField::some(data);
            Ok(resp)
        })
        .await
    }
}

/// The architecture name in Go's spelling, as containerd compares it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}
