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
use crate::events::{timestamp, Event, Publisher};
use crate::pod::{Pod, PodState};
use crate::task::runc::Runc;
use crate::task::{Container, Process, Status};
use containerd_shim_protos::protobuf::well_known_types::any::Any;

pub struct TaskService {
    pub shim: Arc<Shim>,
}

/// Publishes the init's exit once it happens (after the container's leftovers are killed).
fn watch_init_exit(events: Publisher, runc: Runc, c: Arc<Container>) {
    tokio::spawn(async move {
        let exit = c.wait_init_exit(&runc).await;
        tracing::debug!(container = %c.id, status = exit.status, "init exited");
        events.publish(Event::exit(&c.id, &c.id, c.init.pid(), exit.status, exit.at));
    });
}

/// Publishes an exec's exit once it happens.
fn watch_exec_exit(events: Publisher, container_id: String, process: Arc<Process>) {
    tokio::spawn(async move {
        let exit = process.mark_exited(process.observe_exit().await);
        tracing::debug!(container = %container_id, exec = %process.id, status = exit.status, "exec exited");
        events.publish(Event::exit(&container_id, &process.id, process.pid(), exit.status, exit.at));
    });
}

/// `containerd.runc.v1.ProcessDetails`: what Pids says of a pid that is an exec, as containerd's
/// runc shim does (`ctr tasks ps` shows it).
#[derive(Clone, PartialEq, prost::Message)]
struct ProcessDetails {
    #[prost(string, tag = "1")]
    exec_id: String,
}

/// Publishes `/tasks/oom` for each OOM kill in the container's cgroup while its init lives, and
/// once more for a kill found when it has exited.
fn watch_oom(events: Publisher, pod: &Pod, c: &Arc<Container>) {
    let Some(rel) = c.cgroup.clone() else { return };
    let watch = crate::cgroups::Mode::host()
        .and_then(|mode| crate::cgroups::oom::OomWatch::new(mode, &rel, &pod.oom_ledger));
    let mut watch = match watch {
        Ok(Some(w)) => w,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(container = %c.id, error = %e, "no OOM events for this container");
            return;
        }
    };
    // Test builds: `lose-oom <container>` makes this watch lose every race for the container's
    // own count, as when systemd removes its scope first.
    if super::failpoint_set(&["lose-oom", &c.id]) {
        watch.lose_own_count();
    }
    let (id, init) = (c.id.clone(), c.init.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                kills = watch.next() => match kills {
                    Some(n) => {
                        tracing::info!(container = %id, oom_kills = n, "OOM kill");
                        events.publish(Event::oom(&id));
                    }
                    // The cgroup is gone, so are its processes: the init's exit is near.
                    None => break,
                },
                _ = init.wait() => break,
            }
        }
        let exit = init.wait().await;
        if watch.check_at_exit(exit.status) {
            tracing::info!(container = %id, "OOM kill");
            events.publish(Event::oom(&id));
        }
    });
}

impl TaskService {
    fn container(&self, id: &str) -> Result<(Arc<Pod>, Arc<Container>)> {
        let pod =
            self.shim.pod_of(id).ok_or_else(|| Error::not_found(format!("container {id}: not found")))?;
        let c = pod.container(id).ok_or_else(|| Error::not_found(format!("container {id}: not found")))?;
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
            0 => Err(Error::precondition("no sandbox: create the sandbox before its containers")),
            _ => Err(Error::invalid(format!(
                "bundle {}: no sandbox file says which pod the container belongs to",
                bundle.display()
            ))),
        }
    }

    async fn create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
        if self.shim.pod_of(&req.id).is_some() {
            return Err(Error::AlreadyExists(format!("container {}: already exists", req.id)));
        }
        let pod = self.pod_for_new(Path::new(&req.bundle))?;
        if pod.state() != PodState::Ready {
            return Err(Error::precondition(format!("sandbox {}: not ready ({:?})", pod.id, pod.state())));
        }
        let c =
            Arc::new(Container::create(&self.shim.runc, &self.shim.namespace, &req, &pod.context()).await?);
        if let Err(e) = pod.add_container(c.clone()) {
            let _ = c.force_delete(&self.shim.runc).await;
            return Err(e);
        }
        watch_init_exit(self.shim.events.clone(), self.shim.runc.clone(), c.clone());
        watch_oom(self.shim.events.clone(), &pod, &c);
        let pid = c.init.pid();
        self.shim.events.publish(Event::create(&c.id, &req.bundle, pid));
        tracing::info!(sandbox = %pod.id, container = %c.id, pid, "container created");
        Ok(CreateTaskResponse { pid, ..Default::default() })
    }

    async fn start(&self, req: &StartRequest) -> Result<StartResponse> {
        let (_, c) = self.container(&req.id)?;
        let pid = if req.exec_id.is_empty() {
            c.start(&self.shim.runc).await?;
            self.shim.events.publish(Event::start(&c.id, c.init.pid()));
            c.init.pid()
        } else {
            let process = c.start_exec(&self.shim.runc, &req.exec_id).await?;
            watch_exec_exit(self.shim.events.clone(), c.id.clone(), process.clone());
            self.shim.events.publish(Event::exec_started(&c.id, &req.exec_id, process.pid()));
            process.pid()
        };
        Ok(StartResponse { pid, ..Default::default() })
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        let (pod, c) = self.container(&req.id)?;
        if !req.exec_id.is_empty() {
            let pid = c.process(&req.exec_id)?.pid();
            let exit = c.delete_exec(&req.exec_id)?;
            return Ok(DeleteResponse {
                pid,
                exit_status: exit.status,
                exited_at: timestamp(exit.at),
                ..Default::default()
            });
        }
        let exit = c.delete(&self.shim.runc).await?;
        pod.remove_container(&c.id)?;
        let pid = c.init.pid();
        self.shim.events.publish(Event::delete(&c.id, pid, exit.status, exit.at));
        Ok(DeleteResponse {
            pid,
            exit_status: exit.status,
            exited_at: timestamp(exit.at),
            ..Default::default()
        })
    }

    fn state(&self, req: &StateRequest) -> Result<StateResponse> {
        let (_, c) = self.container(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let exit = p.exit();
        let status = match (p.status(), exit) {
            (_, Some(_)) | (Status::Stopped, _) => ApiStatus::STOPPED,
            (Status::Created, None) => ApiStatus::CREATED,
            (Status::Running, None) if req.exec_id.is_empty() && c.is_paused() => ApiStatus::PAUSED,
            (Status::Running, None) => ApiStatus::RUNNING,
        };
        Ok(StateResponse {
            id: p.id.clone(),
            exec_id: req.exec_id.clone(),
            bundle: c.bundle.display().to_string(),
            pid: p.pid(),
            status: status.into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.map_or(0, |e| e.status),
            exited_at: exit.map_or_else(Default::default, |e| timestamp(e.at)),
            ..Default::default()
        })
    }

    async fn pids(&self, req: &PidsRequest) -> Result<PidsResponse> {
        // The sandbox id has no task: an empty list lets containerd reap an orphaned sandbox
        // after a restart (a live one is kept through its sandbox record).
        if self.shim.pods.lock().unwrap().contains_key(&req.id) {
            return Ok(PidsResponse::default());
        }
        let (_, c) = self.container(&req.id)?;
        let pids = match c.init.exit() {
            Some(_) => Vec::new(),
            None => self.shim.runc.ps(&c.id).await?,
        };
        let execs = c.exec_pids();
        let processes = pids
            .into_iter()
            .map(|pid| {
                let info = execs.iter().find(|(p, _)| *p == pid).map(|(_, exec_id)| Any {
                    type_url: "containerd.runc.v1.ProcessDetails".into(),
                    value: prost::Message::encode_to_vec(&ProcessDetails { exec_id: exec_id.clone() }),
                    ..Default::default()
                });
                ProcessInfo { pid, info: info.into(), ..Default::default() }
            })
            .collect();
        Ok(PidsResponse { processes, ..Default::default() })
    }

    async fn shutdown(&self, req: &ShutdownRequest) -> Result<()> {
        // Shutdown for the sandbox id comes only when containerd reaps an orphaned sandbox after a
        // restart: tear it down. For a container id it is a no-op while pods live.
        let orphan = self.shim.pods.lock().unwrap().get(&req.id).cloned();
        match orphan {
            Some(pod) => self.shim.shutdown_pod(pod).await?,
            // A server with no pod left has no reason to live (a node server also waits for
            // registrations of pods to come).
            None => self.shim.exit_if_idle().await,
        }
        Ok(())
    }
}

#[async_trait]
impl Task for TaskService {
    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        traced("State", &req.id, async { self.state(&req) }).await
    }

    async fn create(&self, _: &TtrpcContext, req: CreateTaskRequest) -> ttrpc::Result<CreateTaskResponse> {
        let id = req.id.clone();
        traced("Create", &id, self.create(req)).await
    }

    async fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        traced("Start", &req.id, self.start(&req)).await
    }

    async fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        let id = req.id.clone();
        traced("Delete", &id, self.delete(req)).await
    }

    async fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        traced("Pids", &req.id, self.pids(&req)).await
    }

    async fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        traced("Pause", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            c.set_paused(&self.shim.runc, true).await?;
            self.shim.events.publish(Event::paused(&c.id));
            Ok(Empty::new())
        })
        .await
    }

    async fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        traced("Resume", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            c.set_paused(&self.shim.runc, false).await?;
            self.shim.events.publish(Event::resumed(&c.id));
            Ok(Empty::new())
        })
        .await
    }

    async fn checkpoint(&self, _: &TtrpcContext, req: CheckpointTaskRequest) -> ttrpc::Result<Empty> {
        traced("Checkpoint", &req.id, async {
            self.container(&req.id)?;
            Err::<Empty, _>(Error::Unimplemented("Checkpoint: not supported (no CRIU integration)".into()))
        })
        .await
    }

    async fn kill(&self, _: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        traced("Kill", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            c.kill(&self.shim.runc, &req.exec_id, req.signal, req.all).await?;
            Ok(Empty::new())
        })
        .await
    }

    async fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        traced("Exec", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            c.add_exec(&req)?;
            self.shim.events.publish(Event::exec_added(&c.id, &req.exec_id));
            Ok(Empty::new())
        })
        .await
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        traced("ResizePty", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            c.process(&req.exec_id)?.resize(req.width, req.height)?;
            Ok(Empty::new())
        })
        .await
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        traced("CloseIO", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            let process = c.process(&req.exec_id)?;
            if req.stdin {
                process.close_stdin();
            }
            Ok(Empty::new())
        })
        .await
    }

    async fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        traced("Update", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            let resources = req.resources.as_ref().ok_or_else(|| Error::invalid("resources: missing"))?;
            c.update(&self.shim.runc, resources).await?;
            Ok(Empty::new())
        })
        .await
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        traced("Wait", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            let exit = c.process(&req.exec_id)?.wait().await;
            Ok(WaitResponse { exit_status: exit.status, exited_at: timestamp(exit.at), ..Default::default() })
        })
        .await
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        traced("Stats", &req.id, async {
            let (_, c) = self.container(&req.id)?;
            let rel = c.cgroup.as_deref().ok_or_else(|| {
                Error::precondition(format!("container {}: its spec names no cgroup", c.id))
            })?;
            let stats = crate::cgroups::stats::read(crate::cgroups::Mode::host()?, rel)?;
            Ok(StatsResponse {
                stats: containerd_shim_protos::protobuf::MessageField::some(stats),
                ..Default::default()
            })
        })
        .await
    }

    async fn connect(&self, _: &TtrpcContext, req: ConnectRequest) -> ttrpc::Result<ConnectResponse> {
        traced("Connect", &req.id, async {
            let task_pid = match self.shim.pod(&req.id) {
                Ok(pod) => pod.holder_pid() as u32,
                Err(_) => self.container(&req.id).map(|(_, c)| c.init.pid()).unwrap_or(0),
            };
            Ok(ConnectResponse { shim_pid: std::process::id(), task_pid, ..Default::default() })
        })
        .await
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> ttrpc::Result<Empty> {
        traced("Shutdown", &req.id, async {
            self.shutdown(&req).await?;
            Ok(Empty::new())
        })
        .await
    }
}
