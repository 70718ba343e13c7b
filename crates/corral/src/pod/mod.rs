//! The pod sandbox: its spec, holder, pins, files, containers and lifecycle.
//!
//! Lifecycle: Created (CreateSandbox) -> Ready (StartSandbox) -> Stopped (StopSandbox, or the
//! holder died) -> gone (ShutdownSandbox). Only ShutdownSandbox ends the shim. StopSandbox
//! already releases the holder, the namespace pins and the shm: a stopped pod keeps only its
//! server, record, files and (empty) cgroup.

pub mod files;
pub mod persist;
pub mod spec;
pub mod sysctl;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::cgroups::oom::PodOomLedger;
use crate::cgroups::{Mode, PodCgroup};
use crate::error::{Error, Result};
use crate::holder::{pins, Holder, HolderSpec, SysctlWrite};
use crate::sys::process::ProcessId;
use crate::task::oci::PodContext;
use crate::task::runc::Runc;
use crate::task::{Container, ExitInfo};
use files::PodPaths;
use persist::{Record, ServedBy};
use spec::{NsMode, PodSpec};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    Created,
    Ready,
    /// Ended: stopped, or its holder died.
    Stopped(ExitInfo),
}

pub struct Pod {
    pub id: String,
    pub spec: PodSpec,
    pub paths: PodPaths,
    pub created_at: SystemTime,
    holder: Holder,
    pins: HashMap<String, PathBuf>,
    cgroup: Option<PodCgroup>,
    state: watch::Sender<PodState>,
    pub containers: Mutex<HashMap<String, Arc<Container>>>,
    runc: Runc,
    /// The server, recorded for `delete`.
    served_by: ServedBy,
    /// The OOM kills of the pod's cgroup its containers' watches have reported.
    pub oom_ledger: Arc<PodOomLedger>,
}

impl Pod {
    /// Builds the pod: files, shm, cgroup, holder, pins, record. Blocking (spawns and waits for
    /// the holder); on failure releases everything it made.
    pub fn create(id: &str, paths: PodPaths, spec: PodSpec, runc: Runc, served_by: ServedBy) -> Result<Pod> {
        let mut undo = Undo { armed: true, paths: &paths, made: Made::default(), holder: None, cgroup: None };
        let cgroup = match &spec.cgroup_parent_path {
            None => None,
            Some(parent) => {
                let slice = crate::cgroups::path::is_slice(&spec.cgroup_parent)
                    .then_some(spec.cgroup_parent.as_str());
                let cg = PodCgroup::create(Mode::host()?, parent, slice, id)?;
                undo.cgroup = Some(cg.clone());
                Some(cg)
            }
        };
        files::write_files(&paths, &spec.hostname, spec.dns.as_ref())?;
        undo.made.files = true;
        if spec.ipc == NsMode::Pod {
            files::mount_shm(&paths, spec.shm_size_kib)?;
            undo.made.shm = true;
        }
        let holder = undo.holder.insert(Holder::spawn(&HolderSpec {
            sandbox_id: id.to_string(),
            netns: spec.netns_path.clone(),
            join_netns_owner: spec.user_namespace,
            new_ipc: spec.ipc == NsMode::Pod,
            new_uts: spec.network == NsMode::Pod,
            new_pid: spec.pid == NsMode::Pod,
            hostname: (spec.network == NsMode::Pod).then(|| spec.hostname.clone()),
            sysctls: spec
                .sysctls
                .iter()
                .map(|(k, v)| SysctlWrite { key: k.clone(), path: sysctl::proc_path(k), value: v.clone() })
                .collect(),
        })?);
        if let Some(cg) = &cgroup {
            cg.adopt(holder.pid, id, &spec.resources)?;
        }
        let mut kinds = Vec::new();
        if spec.network == NsMode::Pod {
            kinds.extend(["net", "uts"]);
        }
        if spec.ipc == NsMode::Pod {
            kinds.push("ipc");
        }
        if spec.user_namespace {
            kinds.push("user");
        }
        let pins = pins::pin(&paths.ns_dir(), holder.pid, &kinds)?.into_iter().collect();
        undo.made.pins = true;
        let holder = undo.holder.take().expect("spawned above");
        let pod = Pod {
            id: id.to_string(),
            spec,
            paths: paths.clone(),
            created_at: SystemTime::now(),
            holder,
            pins,
            cgroup,
            state: watch::channel(PodState::Created).0,
            containers: Mutex::new(HashMap::new()),
            runc,
            served_by,
            oom_ledger: Arc::default(),
        };
        if let Err(e) = pod.save_record() {
            undo.holder = Some(pod.holder);
            return Err(e);
        }
        undo.armed = false;
        Ok(pod)
    }

    pub fn holder_pid(&self) -> i32 {
        self.holder.pid
    }

    pub fn state(&self) -> PodState {
        *self.state.borrow()
    }

    pub fn start(&self) -> Result<()> {
        match self.state() {
            PodState::Created => {
                self.state.send_replace(PodState::Ready);
                Ok(())
            }
            PodState::Ready => Ok(()),
            PodState::Stopped(_) => Err(Error::precondition(format!("sandbox {}: already stopped", self.id))),
        }
    }

    /// Watches the holder; its death ends the pod. Run once, in its own task.
    pub async fn watch_holder(self: Arc<Self>) {
        let status = self.holder.pidfd.wait().await;
        debug!(sandbox = %self.id, status, "holder exited");
        self.mark_stopped(status);
    }

    fn mark_stopped(&self, status: u32) {
        self.state.send_if_modified(|s| match s {
            PodState::Stopped(_) => false,
            _ => {
                *s = PodState::Stopped(ExitInfo { status, at: SystemTime::now() });
                true
            }
        });
    }

    /// Resolves when the pod has ended.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.state.subscribe();
        loop {
            if let PodState::Stopped(exit) = *rx.borrow_and_update() {
                return exit;
            }
            if rx.changed().await.is_err() {
                // Sender lives in self: unreachable while self is borrowed.
                unreachable!("pod state sender dropped");
            }
        }
    }

    /// What a container of this pod needs from it.
    pub fn context(&self) -> PodContext {
        PodContext {
            sandbox_pid: self.holder.pid,
            pins: self.pins.clone(),
            hostname: self.paths.hostname(),
            hosts: self.paths.hosts(),
            resolv_conf: self.paths.resolv_conf(),
            shm: match self.spec.ipc {
                NsMode::Pod => self.paths.shm(),
                _ => PathBuf::from("/dev/shm"),
            },
        }
    }

    pub fn container(&self, id: &str) -> Option<Arc<Container>> {
        self.containers.lock().unwrap().get(id).cloned()
    }

    pub fn add_container(&self, c: Arc<Container>) -> Result<()> {
        {
            let mut map = self.containers.lock().unwrap();
            if map.contains_key(&c.id) {
                return Err(Error::AlreadyExists(format!("container {}: already exists", c.id)));
            }
            map.insert(c.id.clone(), c);
        }
        self.save_record()
    }

    pub fn remove_container(&self, id: &str) -> Result<()> {
        self.containers.lock().unwrap().remove(id);
        self.save_record()
    }

    fn save_record(&self) -> Result<()> {
        let containers =
            self.containers.lock().unwrap().values().map(|c| (c.id.clone(), c.bundle.clone())).collect();
        let (server, holder) = (ProcessId::current(), self.holder.id);
        Record {
            sandbox_id: self.id.clone(),
            server_pid: server.pid,
            server_start: server.start,
            socket: self.served_by.socket.clone(),
            node_dir: self.served_by.node_dir.clone(),
            holder_pid: holder.pid,
            holder_start: holder.start,
            files_dir: Some(self.paths.files.clone()),
            cgroup: self.cgroup.as_ref().map(|c| c.rel.clone()),
            cgroup_unit: self.cgroup.as_ref().and_then(|c| c.unit()).map(str::to_string),
            runc_binary: self.runc.binary.clone(),
            runc_root: self.runc.root.clone(),
            containers,
        }
        .save(&self.paths.state_file())
    }

    /// Stops the pod: kills every container and the holder, then marks it stopped. Idempotent.
    pub async fn stop(&self) -> Result<ExitInfo> {
        let containers: Vec<_> = self.containers.lock().unwrap().values().cloned().collect();
        for c in &containers {
            if c.init.exit().is_none() {
                if let Err(e) = c.kill(&self.runc, "", Signal::SIGKILL as u32, true).await {
                    warn!(sandbox = %self.id, container = %c.id, error = %e, "kill on pod stop");
                }
            }
        }
        for c in &containers {
            if tokio::time::timeout(Duration::from_secs(10), c.init.wait()).await.is_err() {
                warn!(sandbox = %self.id, container = %c.id, "container did not exit after SIGKILL");
            }
        }
        let _ = self.holder.pidfd.signal(Signal::SIGKILL);
        let exit = self.wait().await;
        self.release_namespaces()?;
        Ok(exit)
    }

    /// Unmounts the namespace pins and the pod's shm once the pod has ended. Nothing can run in
    /// it again (Task.Create wants a Ready pod) and kubelet may keep a stopped sandbox for days,
    /// so they go at StopSandbox; the holder is gone by then (`stop` reaped it). The record,
    /// the pod files and the cgroup stay for SandboxStatus, ShutdownSandbox and `delete`, whose
    /// unmounts find nothing left. Idempotent.
    fn release_namespaces(&self) -> Result<()> {
        let results = [pins::unpin_all(&self.paths.ns_dir()), files::remove_shm(&self.paths)];
        debug!(sandbox = %self.id, "namespace pins and shm released");
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }

    /// Releases everything: containers (runc state, rootfs mounts), pins, shm, files, record.
    /// Tries every step; returns the first failure.
    pub async fn release(&self) -> Result<()> {
        let bundle = self.paths.bundle.clone();
        let _lock = tokio::task::spawn_blocking(move || crate::sys::lock::BundleLock::acquire(&bundle))
            .await
            .map_err(|e| Error::Holder { step: "lock the bundle".into(), message: e.to_string() })?
            .map_err(|e| Error::io("lock the bundle", e))?;
        let mut first_err = None;
        // A failed unmount here is retried by remove_all below.
        if let Err(e) = self.stop().await {
            first_err.get_or_insert(e);
        }
        let containers: Vec<_> = self.containers.lock().unwrap().drain().map(|(_, c)| c).collect();
        for c in containers {
            if let Err(e) = c.force_delete(&self.runc).await {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = files::remove_all(&self.paths) {
            first_err.get_or_insert(e);
        }
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.remove().await {
                first_err.get_or_insert(e);
            }
        }
        let _ = std::fs::remove_file(self.paths.state_file());
        first_err.map_or(Ok(()), Err)
    }
}

/// What [`Pod::create`] has made so far, each step all or nothing.
#[derive(Default)]
struct Made {
    files: bool,
    shm: bool,
    pins: bool,
}

/// Undoes a half-built pod when dropped: kills the holder, removes what this creation made (and
/// nothing else: the directories may be another pod's if the request collided with one).
struct Undo<'a> {
    /// Cleared once the pod is complete.
    armed: bool,
    paths: &'a PodPaths,
    made: Made,
    holder: Option<Holder>,
    cgroup: Option<PodCgroup>,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(holder) = self.holder.take() {
            let _ = holder.pidfd.signal(Signal::SIGKILL);
            // Reap it (it is our child, or pid 1 of the pod reparented to us).
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(holder.pid), None);
        }
        if self.made.pins {
            let _ = pins::unpin_all(&self.paths.ns_dir());
        }
        if self.made.shm {
            let _ = files::remove_shm(self.paths);
        }
        if self.made.files {
            let _ = files::remove_files(self.paths);
        }
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.remove_now();
        }
    }
}
