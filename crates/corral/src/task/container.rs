//! A container of the pod: its bundle, init process, lifecycle and exit.
//!
//! Lifecycle: Created (runc create done) -> Running (runc start) -> Stopped (init exited) ->
//! removed by Delete. The init's exit is watched through a pidfd (corral is a subreaper, so the
//! init becomes its child once `runc create` exits).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use containerd_shim_protos::api::CreateTaskRequest;
use tokio::sync::watch;

use crate::error::{Error, IoContext, Result};
use crate::sys::pidfd::PidFd;
use crate::task::oci::{self, PodContext};
use crate::task::{rootfs, runc::Runc, stdio};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub status: u32,
    pub at: SystemTime,
}

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub pid: u32,
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
    status: Mutex<Status>,
    exit: watch::Sender<Option<ExitInfo>>,
    pidfd: PidFd,
}

/// Container ids become runc ids and file names: keep them to a safe alphabet.
pub fn validate_id(field: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field}: {id:?} is not a valid id (1-128 of [A-Za-z0-9_.-])"
        )))
    }
}

impl Container {
    /// Mounts the rootfs, rewrites config.json for the pod, runs `runc create`. Undoes its work
    /// on failure.
    pub async fn create(
        runc: &Runc,
        req: &CreateTaskRequest,
        pod: &PodContext,
    ) -> Result<Container> {
        validate_id("id", &req.id)?;
        if req.terminal {
            return Err(Error::Unimplemented(
                "terminal: tty containers are not supported yet".into(),
            ));
        }
        if !req.checkpoint.is_empty() {
            return Err(Error::Unimplemented(
                "checkpoint: restoring from a checkpoint is not supported".into(),
            ));
        }
        let bundle = PathBuf::from(&req.bundle);
        if !bundle.is_absolute() {
            return Err(Error::invalid(format!(
                "bundle: {:?} is not an absolute path",
                req.bundle
            )));
        }
        let config_path = bundle.join("config.json");
        let raw = std::fs::read(&config_path).with_path("read", &config_path)?;
        let mut spec: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::invalid(format!("{}: not JSON: {e}", config_path.display())))?;
        oci::rewrite(&mut spec, pod)?;
        let io = stdio::open(&req.stdin, &req.stdout, &req.stderr)?;

        let rootfs_dir = bundle.join("rootfs");
        if !req.rootfs.is_empty() {
            rootfs::mount_rootfs(&req.rootfs, &rootfs_dir)?;
        }
        let created = async {
            let data = serde_json::to_vec(&spec).expect("a JSON value serializes");
            std::fs::write(&config_path, data).with_path("write", &config_path)?;
            let pid_file = bundle.join("init.pid");
            runc.create(&req.id, &bundle, &pid_file, io).await?;
            let pid: u32 = std::fs::read_to_string(&pid_file)
                .with_path("read", &pid_file)?
                .trim()
                .parse()
                .map_err(|e| Error::invalid(format!("{}: not a pid: {e}", pid_file.display())))?;
            let pidfd =
                PidFd::open(pid as i32).context(|| format!("pidfd_open container init {pid}"))?;
            Ok::<_, Error>((pid, pidfd))
        }
        .await;
        let (pid, pidfd) = match created {
            Ok(v) => v,
            Err(e) => {
                let _ = runc.delete(&req.id, &bundle).await;
                let _ = rootfs::unmount_rootfs(&rootfs_dir);
                return Err(e);
            }
        };
        Ok(Container {
            id: req.id.clone(),
            bundle,
            pid,
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
            status: Mutex::new(Status::Created),
            exit: watch::channel(None).0,
            pidfd,
        })
    }

    pub fn status(&self) -> Status {
        *self.status.lock().unwrap()
    }

    pub fn exit(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// Waits for the init to exit, records it and returns it. Run once, in its own task.
    pub async fn watch_exit(self: &Arc<Self>) -> ExitInfo {
        let status = self.pidfd.wait().await;
        let info = ExitInfo {
            status,
            at: SystemTime::now(),
        };
        *self.status.lock().unwrap() = Status::Stopped;
        self.exit.send_replace(Some(info));
        info
    }

    /// Resolves when the init has exited.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit.subscribe();
        let exit = rx.wait_for(Option::is_some).await;
        match exit {
            Ok(v) => v.expect("waited for Some"),
            // The sender lives in self, so it cannot be dropped while we borrow self.
            Err(_) => unreachable!("exit sender dropped while the container lives"),
        }
    }

    pub async fn start(&self, runc: &Runc) -> Result<()> {
        match self.status() {
            Status::Created => {}
            other => {
                return Err(Error::precondition(format!(
                    "container {}: cannot start in state {other:?}",
                    self.id
                )))
            }
        }
        runc.start(&self.id, &self.bundle).await?;
        let mut status = self.status.lock().unwrap();
        // The init may already have exited and been recorded.
        if *status == Status::Created {
            *status = Status::Running;
        }
        Ok(())
    }

    pub async fn kill(&self, runc: &Runc, signal: u32, all: bool) -> Result<()> {
        if self.status() == Status::Stopped {
            return Err(Error::not_found(format!(
                "container {}: process already finished",
                self.id
            )));
        }
        if all {
            return runc.kill(&self.id, &self.bundle, signal, true).await;
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::invalid(format!("signal: {signal} is not a signal")))?;
        self.pidfd
            .signal(sig)
            .context(|| format!("signal container {} init", self.id))
    }

    /// Removes the container from runc and unmounts its rootfs. Refuses a running container.
    pub async fn delete(&self, runc: &Runc) -> Result<ExitInfo> {
        if self.status() == Status::Running {
            return Err(Error::precondition(format!(
                "container {}: still running; kill it before deleting",
                self.id
            )));
        }
        self.force_delete(runc).await?;
        Ok(self.wait().await)
    }

    /// Kills and removes whatever state the container is in; used on pod teardown.
    pub async fn force_delete(&self, runc: &Runc) -> Result<()> {
        let removed = match runc.delete(&self.id, &self.bundle).await {
            Err(e) if !crate::task::runc::is_not_exist(&e) => Err(e),
            _ => Ok(()),
        };
        let _ = self.pidfd.signal(nix::sys::signal::Signal::SIGKILL);
        let unmounted = rootfs::unmount_rootfs(&self.bundle.join("rootfs"));
        removed.and(unmounted)
    }

    pub fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    pub fn bundle(&self) -> &Path {
        &self.bundle
    }
}
