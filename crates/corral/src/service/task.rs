//! `containerd.task.v3.Task` (also served under the v2 name): every RPC containerd calls is
//! written out and answers for real or with a precise status.
//!
//! Grouped-shim rule: `Shutdown` never ends the shim while a pod lives (containerd main sends it
//! after every task deletion; a pod restarts containers). Only ShutdownSandbox ends it.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::types::task::{ProcessInfo, Status as ApiStatus};
use ttrpc::r#async::TtrpcContext;

use super::{traced, Shim};
use crate::error::{Error, Result};
use crate::events::{timestamp, Event};
use crate::pod::{Pod, PodState};
use crate::task::{Container, Status};

pub struct TaskService {
    pub shim: Arc<Shim>,
}

/// Exec processes are not supported yet; everything addresses a container's init.
fn no_exec(exec_id: &str) -> Result<()> {
    if exec_id.is_empty() {
        Ok(())
    } else {
        Err(Error::not_found(format!(
            "exec {exec_id}: not found (exec is not supported yet)"
        )))
    }
}

impl TaskService {
    fn container(&self, id: &str) -> Result<(Arc<Pod>, Arc<Container>)> {
        let pod = self
            .shim
            .pod_of(id)
            .ok_or_else(|| Error::not_found(format!("container {id}: not found")))?;
        let c = pod
            .container(id)
            .ok_or_else(|| Error::not_found(format!("container {id}: not found")))?;
        Ok((pod, c))
    }

    /// The pod a new container belongs to: the `sandbox` file containerd writes into grouped
    /// container bundles, else the only pod this shim serves.
    fn pod_for_new(&self, bundle: &Path) -> Result<Arc<Pod>> {
        if let Ok(id) = std::fs::read_to_string(bundle.join("sandbox")) {
            return self.shim.pod(id.trim());
        }
        let pods = self.shim.pods.lock().unwrap();
        match pods.len() {
            1 => Ok(pods.values().next().cloned().expect("one pod")),
            0 => Err(Error::precondition(
                "no sandbox: create the sandbox before its containers",
            )),
            _ => Err(Error::invalid(format!(
                "bundle {}: no sandbox file says which pod the container belongs to",
                bundle.display()
            ))),
        }
    }

    async fn create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
        if self.shim.pod_of(&req.id).is_some() {
            return Err(Error::AlreadyExists(format!(
                "container {}: already exists",
                req.id
            )));
        }
        let pod = self.pod_for_new(Path::new(&req.bundle))?;
        if pod.state() != PodState::Ready {
            return Err(Error::precondition(format!(
                "sandbox {}: not ready ({:?})",
                pod.id,
                pod.state()
            )));
        }
        let c = Arc::new(Container::create(&self.shim.runc, &req, &pod.context()).await?);
        if let Err(e) = pod.add_container(c.clone()) {
            let _ = c.force_delete(&self.shim.runc).await;
            return Err(e);
        }
        let events = self.shim.events.clone();
        let watched = c.clone();
        tokio::spawn(async move {
            let exit = watched.watch_exit().await;
            tracing::debug!(container = %watched.id, status = exit.status, "container exited");
            events.publish(Event::exit(&watched.id, watched.pid, exit.status, exit.at));
        });
        self.shim
            .events
            .publish(Event::create(&c.id, &req.bundle, c.pid));
        tracing::info!(sandbox = %pod.id, container = %c.id, pid = c.pid, "container created");
        Ok(CreateTaskResponse {
            pid: c.pid,
            ..Default::default()
        })
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        no_exec(&req.exec_id)?;
        let (pod, c) = self.container(&req.id)?;
        let exit = c.delete(&self.shim.runc).await?;
        pod.remove_container(&c.id)?;
        self.shim
            .events
            .publish(Event::delete(&c.id, c.pid, exit.status, exit.at));
        Ok(DeleteResponse {
            pid: c.pid,
            exit_status: exit.status,
            exited_at: timestamp(exit.at),
            ..Default::default()
        })
    }

    fn state(&self, req: &StateRequest) -> Result<StateResponse> {
        no_exec(&req.exec_id)?;
        let (_, c) = self.container(&req.id)?;
        let exit = c.exit();
        let status = match (c.status(), exit) {
            (_, Some(_)) | (Status::Stopped, _) => ApiStatus::STOPPED,
            (Status::Created, None) => ApiStatus::CREATED,
            (Status::Running, None) => ApiStatus::RUNNING,
        };
        Ok(StateResponse {
            id: c.id.clone(),
            bundle: c.bundle.display().to_string(),
            pid: c.pid,
            status: status.into(),
            stdin: c.stdin.clone(),
            stdout: c.stdout.clone(),
            stderr: c.stderr.clone(),
            terminal: c.terminal,
            exit_status: exit.map_or(0, |e| e.status),
            exited_at: exit.map_or_else(Default::default, |e| timestamp(e.at)),
            ..Default::default()
        })
    }
}

#[async_trait]
impl Task for TaskService {
    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        let id = req.id.clone();
        traced("State", &id, async { self.state(&req) }).await
    }

    async fn create(
        &self,
        _: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> ttrpc::Result<CreateTaskResponse> {
        let id = req.id.clone();
        traced("Create", &id, self.create(req)).await
    }

    async fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        traced("Start", &req.id, async {
            no_exec(&req.exec_id)?;
            let (_, c) = self.container(&req.id)?;
            c.start(&self.shim.runc).await?;
            self.shim.events.publish(Event::start(&c.id, c.pid));
            Ok(StartResponse {
                pid: c.pid,
                ..Default::default()
            })
        })
        .await
    }

    async fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        let id = req.id.clone();
        traced("Delete", &id, self.delete(req)).await
    }

    async fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        traced("Pids", &req.id, async {
            // The sandbox id has no task: an empty list lets containerd reap an orphaned sandbox
            // after a restart (a live one is kept through its sandbox record).
            if self.shim.pods.lock().unwrap().contains_key(&req.id) {
                return Ok(PidsResponse::default());
            }
            let (_, c) = self.container(&req.id)?;
            let pids = match c.exit() {
                Some(_) => Vec::new(),
                None => self.shim.runc.ps(&c.id, &c.bundle).await?,
            };
            let processes = pids
                .into_iter()
                .map(|pid| ProcessInfo {
                    pid,
                    ..Default::default()
                })
                .collect();
            Ok(PidsResponse {
                processes,
                ..Default::default()
            })
        })
        .await
    }

    async fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        traced("Pause", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented("Pause: not implemented yet".into()))
        })
        .await
    }

    async fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        traced("Resume", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented("Resume: not implemented yet".into()))
        })
        .await
    }

    async fn checkpoint(
        &self,
        _: &TtrpcContext,
        req: CheckpointTaskRequest,
    ) -> ttrpc::Result<Empty> {
        traced("Checkpoint", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented(
                "Checkpoint: not supported (no CRIU integration)".into(),
            ))
        })
        .await
    }

    async fn kill(&self, _: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        traced("Kill", &req.id, async {
            no_exec(&req.exec_id)?;
            let (_, c) = self.container(&req.id)?;
            c.kill(&self.shim.runc, req.signal, req.all).await?;
            Ok(Empty::new())
        })
        .await
    }

    async fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        traced("Exec", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented(format!(
                "Exec {}: exec is not implemented yet",
                req.exec_id
            )))
        })
        .await
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        traced("ResizePty", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented(
                "ResizePty: tty is not implemented yet".into(),
            ))
        })
        .await
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        traced("CloseIO", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented(
                "CloseIO: stdin closing is not implemented yet".into(),
            ))
        })
        .await
    }

    async fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        traced("Update", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented(
                "Update: resource updates are not implemented yet".into(),
            ))
        })
        .await
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        traced("Wait", &req.id, async {
            no_exec(&req.exec_id)?;
            let (_, c) = self.container(&req.id)?;
            let exit = c.wait().await;
            Ok(WaitResponse {
                exit_status: exit.status,
                exited_at: timestamp(exit.at),
                ..Default::default()
            })
        })
        .await
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        traced("Stats", &req.id, async {
            self.container(&req.id)?;
            Err::<StatsResponse, _>(Error::Unimplemented(
                "Stats: cgroup metrics are not implemented yet".into(),
            ))
        })
        .await
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: ConnectRequest,
    ) -> ttrpc::Result<ConnectResponse> {
        traced("Connect", &req.id, async {
            let task_pid = match self.shim.pod(&req.id) {
                Ok(pod) => pod.holder_pid() as u32,
                Err(_) => self.container(&req.id).map(|(_, c)| c.pid).unwrap_or(0),
            };
            Ok(ConnectResponse {
                shim_pid: std::process::id(),
                task_pid,
                ..Default::default()
            })
        })
        .await
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> ttrpc::Result<Empty> {
        traced("Shutdown", &req.id, async {
            // Shutdown for the sandbox id comes only when containerd reaps an orphaned sandbox
            // after a restart: tear it down. For a container id it is a no-op while pods live.
            let orphan = self.shim.pods.lock().unwrap().get(&req.id).cloned();
            match orphan {
                Some(pod) => self.shim.shutdown_pod(pod).await?,
                None if self.shim.pods.lock().unwrap().is_empty() => self.shim.exit.notify_one(),
                None => {}
            }
            Ok(Empty::new())
        })
        .await
    }
}
