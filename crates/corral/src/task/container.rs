//! A container of the pod: its bundle, its init process and its exec processes.
//!
//! The init is made by `runc create` and started by `runc start`; execs by `runc exec --detach`.
//! Exits are watched per process (see [`super::process`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use containerd_shim_protos::api::{CreateTaskRequest, ExecProcessRequest};
use serde_json::Value;

use super::process::{ExitInfo, Process, Status};
use crate::error::{Error, IoContext, Result};
use crate::task::console::{Console, ConsoleSocket};
use crate::task::oci::{self, PodContext};
use crate::task::runc::{CreateIo, Runc};
use crate::task::{idmap, rootfs, stdio, Stdio};

/// The type URL containerd gives an exec's OCI process spec.
const PROCESS_SPEC_TYPE: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub init: Arc<Process>,
    /// The container's cgroup (a cgroupfs path) from its spec, for stats.
    pub cgroup: Option<String>,
    /// Frozen by Task.Pause.
    paused: std::sync::atomic::AtomicBool,
    /// The containerd namespace, told to logging programs.
    namespace: String,
    /// Its processes share a pid namespace, so its init's exit does not end them (see
    /// [`Container::wait_init_exit`]).
    kill_all_on_exit: bool,
    /// The spec has poststart hooks, which only the runtime's own `start` runs.
    start_hooks: bool,
    execs: Mutex<HashMap<String, Exec>>,
}

struct Exec {
    process: Arc<Process>,
    spec: Value,
}

/// The request's `terminal` must agree with the spec's, which is what runc acts on.
fn check_terminal(field: &str, terminal: bool, process: Option<&Value>) -> Result<()> {
    let in_spec = process.is_some_and(oci::wants_terminal);
    if terminal != in_spec {
        return Err(Error::invalid(format!(
            "terminal: the request says {terminal} but {field}.terminal says {in_spec}"
        )));
    }
    Ok(())
}

/// Runs `run` (runc create or exec) with the process's stdio, then keeps what the process's
/// stdio needs while it lives: FIFO readers, the stdin copy, its terminal, its logging program.
async fn run_with_stdio<F>(process: &Process, namespace: &str, run: F) -> Result<()>
where
    F: AsyncFnOnce(CreateIo) -> Result<()>,
{
    if !process.stdio.terminal {
        let (io, kept) = stdio::open(&process.stdio, &process.id, namespace).await?;
        process.keep_io(kept);
        return run(io).await;
    }
    let socket = ConsoleSocket::bind()?;
    let (console_io, mut kept) = stdio::open_for_console(&process.stdio, &process.id, namespace).await?;
    run(CreateIo::console(socket.path())).await?;
    let master = socket.receive().await?;
    kept.console = Some(Console::start(master, console_io.stdin, console_io.output)?);
    process.keep_io(kept);
    Ok(())
}

impl Container {
    /// Mounts the rootfs, rewrites config.json for the pod, runs `runc create`. Undoes its work
    /// on failure.
    pub async fn create(
        runc: &Runc,
        namespace: &str,
        req: &CreateTaskRequest,
        pod: &PodContext,
    ) -> Result<Container> {
        crate::ids::validate("id", &req.id)?;
        let began = std::time::Instant::now();
        if !req.checkpoint.is_empty() {
            return Err(Error::Unimplemented(
                "checkpoint: restoring from a checkpoint is not supported".into(),
            ));
        }
        let bundle = PathBuf::from(&req.bundle);
        check_bundle(&bundle, &req.id, namespace)?;
        let config_path = bundle.join("config.json");
        let raw = std::fs::read(&config_path).with_path("read", &config_path)?;
        let mut spec: Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::invalid(format!("{}: not JSON: {e}", config_path.display())))?;
        check_terminal("config.json process", req.terminal, spec.get("process"))?;
        oci::rewrite(&mut spec, pod)?;
        let userns = idmap::PodUserns::from_spec(&spec)?;
        // Attached until runc has bound them into the container (released below either way).
        let mut bind_copies = idmap::BindCopies::prepare(&mut spec, userns.as_ref())?;
        let kill_all_on_exit = oci::shares_pid_namespace(&spec);
        let start_hooks = oci::has_poststart_hooks(&spec);
        let (cgroup, systemd_cgroup) = match spec.pointer("/linux/cgroupsPath").and_then(Value::as_str) {
            Some(p) if !p.is_empty() => (
                Some(crate::cgroups::path::resolve_container(p)?),
                crate::cgroups::path::container_uses_systemd(p, runc.cgroup_driver)?,
            ),
            _ => (None, false),
        };
        let stdio = Stdio::checked(&req.stdin, &req.stdout, &req.stderr, req.terminal)?;
        let init = Arc::new(Process::new(&req.id, stdio));

        let spec_done = began.elapsed();
        let rootfs_dir = bundle.join("rootfs");
        if !req.rootfs.is_empty() {
            rootfs::mount_rootfs(&req.rootfs, &rootfs_dir, userns.as_ref())?;
        }
        let rootfs_done = began.elapsed();
        // The init is our child: keep the orphan reaper off until its pidfd claims it.
        let _busy = crate::sys::reaper::Busy::new();
        let created = async {
            let data = serde_json::to_vec(&spec).expect("a JSON value serializes");
            std::fs::write(&config_path, data).with_path("write", &config_path)?;
            let pid_file = bundle.join("init.pid");
            run_with_stdio(&init, namespace, async |io| {
                runc.create(&req.id, &bundle, &pid_file, io, systemd_cgroup).await
            })
            .await?;
            init.attach(read_pid(&pid_file)?)
        }
        .await;
        if let Err(e) = bind_copies.release() {
            tracing::warn!(container = %req.id, error = %e, "release idmapped bind copies");
        }
        if let Err(e) = created {
            init.release_io();
            let _ = runc.delete(&req.id).await;
            let _ = rootfs::unmount_rootfs(&rootfs_dir);
            return Err(e);
        }
        // Where a container's creation goes (the runtime's share is what an in-process
        // runtime would replace): spec rewrite, rootfs mount, then the runtime's create.
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            container = %req.id,
            spec_ms = ms(spec_done),
            rootfs_ms = ms(rootfs_done - spec_done),
            runtime_ms = ms(began.elapsed() - rootfs_done),
            "created"
        );
        Ok(Container {
            id: req.id.clone(),
            bundle,
            init,
            cgroup,
            paused: Default::default(),
            namespace: namespace.to_string(),
            kill_all_on_exit,
            start_hooks,
            execs: Mutex::new(HashMap::new()),
        })
    }

    pub async fn start(&self, runc: &Runc) -> Result<()> {
        match self.init.status() {
            Status::Created => {}
            other => {
                return Err(Error::precondition(format!(
                    "container {}: cannot start in state {other:?}",
                    self.id
                )))
            }
        }
        runc.start(&self.id, self.start_hooks, || self.init.exit().is_none()).await?;
        self.init.set_running();
        Ok(())
    }

    /// Waits for the init's exit and records it. In a shared pid namespace the container's other
    /// processes are killed first, as containerd's runc shim does: no pid namespace teardown will
    /// end them, and the container is only over when they are gone.
    pub async fn wait_init_exit(&self, runc: &Runc) -> ExitInfo {
        let status = self.init.observe_exit().await;
        if self.kill_all_on_exit {
            if let Err(e) = runc.kill(&self.id, nix::sys::signal::Signal::SIGKILL as u32, true).await {
                tracing::debug!(container = %self.id, error = %e, "kill the processes left after the init");
            }
        }
        self.init.mark_exited(status)
    }

    /// The init or one exec.
    pub fn process(&self, exec_id: &str) -> Result<Arc<Process>> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs
            .lock()
            .unwrap()
            .get(exec_id)
            .map(|e| e.process.clone())
            .ok_or_else(|| Error::not_found(format!("container {}: exec {exec_id} not found", self.id)))
    }

    pub async fn kill(&self, runc: &Runc, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let process = self.process(exec_id)?;
        if all && exec_id.is_empty() {
            if process.exit().is_some() {
                return Err(Error::not_found(format!("{}: process already finished", self.id)));
            }
            return runc.kill(&self.id, signal, true).await;
        }
        process.signal(signal)
    }

    /// Freezes or thaws the container; refuses a container that is not running.
    pub async fn set_paused(&self, runc: &Runc, paused: bool) -> Result<()> {
        if self.init.status() != Status::Running || self.init.exit().is_some() {
            return Err(Error::precondition(format!("container {}: not running", self.id)));
        }
        if paused {
            runc.pause(&self.id).await?;
        } else {
            runc.resume(&self.id).await?;
        }
        self.paused.store(paused, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Applies new resources (an OCI LinuxResources JSON document) to the running container.
    pub async fn update(
        &self,
        runc: &Runc,
        resources: &containerd_shim_protos::protobuf::well_known_types::any::Any,
    ) -> Result<()> {
        if !resources.type_url.ends_with("runtime-spec/1/LinuxResources") {
            return Err(Error::invalid(format!(
                "resources.type_url: {:?} is not an OCI LinuxResources",
                resources.type_url
            )));
        }
        serde_json::from_slice::<Value>(&resources.value)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| Error::invalid("resources.value: not a JSON object"))?;
        if self.init.exit().is_some() {
            return Err(Error::precondition(format!("container {}: not running", self.id)));
        }
        runc.update(&self.id, &resources.value).await
    }

    /// Registers an exec (Task.Exec); it runs on Start.
    pub fn add_exec(&self, req: &ExecProcessRequest) -> Result<Arc<Process>> {
        crate::ids::validate("exec_id", &req.exec_id)?;
        if self.init.status() != Status::Running || self.init.exit().is_some() {
            return Err(Error::precondition(format!("container {}: not running; cannot exec", self.id)));
        }
        let any = req.spec.as_ref().ok_or_else(|| Error::invalid("spec: missing the exec's process spec"))?;
        if !any.type_url.ends_with("runtime-spec/1/Process") {
            return Err(Error::invalid(format!(
                "spec.type_url: {:?} is not {PROCESS_SPEC_TYPE:?}",
                any.type_url
            )));
        }
        let spec: Value = serde_json::from_slice(&any.value)
            .map_err(|e| Error::invalid(format!("spec.value: not an OCI process (JSON): {e}")))?;
        if spec.get("args").and_then(Value::as_array).is_none_or(Vec::is_empty) {
            return Err(Error::invalid("spec.value: process.args is empty"));
        }
        check_terminal("spec.value", req.terminal, Some(&spec))?;
        let stdio = Stdio::checked(&req.stdin, &req.stdout, &req.stderr, req.terminal)?;
        let process = Arc::new(Process::new(&req.exec_id, stdio));
        let mut execs = self.execs.lock().unwrap();
        if execs.contains_key(&req.exec_id) {
            return Err(Error::AlreadyExists(format!(
                "container {}: exec {} already exists",
                self.id, req.exec_id
            )));
        }
        execs.insert(req.exec_id.clone(), Exec { process: process.clone(), spec });
        Ok(process)
    }

    /// Runs a registered exec with `runc exec --detach`.
    pub async fn start_exec(&self, runc: &Runc, exec_id: &str) -> Result<Arc<Process>> {
        let (process, spec) = {
            let execs = self.execs.lock().unwrap();
            let exec = execs.get(exec_id).ok_or_else(|| {
                Error::not_found(format!("container {}: exec {exec_id} not found", self.id))
            })?;
            (exec.process.clone(), exec.spec.clone())
        };
        if process.status() != Status::Created {
            return Err(Error::precondition(format!("exec {exec_id}: already started")));
        }
        // A fast exec may be a zombie before its pidfd claims it: keep the orphan reaper off.
        let _busy = crate::sys::reaper::Busy::new();
        let spec_file = self.bundle.join(format!("exec-{exec_id}.json"));
        let pid_file = self.bundle.join(format!("exec-{exec_id}.pid"));
        std::fs::write(&spec_file, serde_json::to_vec(&spec).expect("JSON serializes"))
            .with_path("write", &spec_file)?;
        let ran = run_with_stdio(&process, &self.namespace, async |io| {
            runc.exec(&self.id, &self.bundle, &spec_file, &pid_file, io).await
        })
        .await;
        let _ = std::fs::remove_file(&spec_file);
        match ran.and_then(|()| read_pid(&pid_file)).and_then(|pid| process.attach(pid)) {
            Ok(()) => {
                let _ = std::fs::remove_file(&pid_file);
                process.set_running();
                Ok(process)
            }
            Err(e) => {
                // A failed start is an exited exec: waiters must not hang.
                process.release_io();
                process.mark_exited(255);
                Err(e)
            }
        }
    }

    /// The host pids of the execs that run, with their ids.
    pub fn exec_pids(&self) -> Vec<(u32, String)> {
        let execs = self.execs.lock().unwrap();
        execs
            .iter()
            .filter(|(_, e)| e.process.status() == Status::Running)
            .map(|(id, e)| (e.process.pid(), id.clone()))
            .collect()
    }

    /// Forgets an exited exec.
    pub fn delete_exec(&self, exec_id: &str) -> Result<ExitInfo> {
        let process = self.process(exec_id)?;
        let exit = match (process.status(), process.exit()) {
            (_, Some(exit)) => exit,
            (Status::Created, None) => process.mark_exited(0),
            _ => {
                return Err(Error::precondition(format!(
                    "exec {exec_id}: still running; kill it before deleting"
                )))
            }
        };
        process.release_io();
        self.execs.lock().unwrap().remove(exec_id);
        Ok(exit)
    }

    /// Removes the container from runc and unmounts its rootfs. Refuses a running container.
    pub async fn delete(&self, runc: &Runc) -> Result<ExitInfo> {
        if self.init.status() == Status::Running && self.init.exit().is_none() {
            return Err(Error::precondition(format!(
                "container {}: still running; kill it before deleting",
                self.id
            )));
        }
        self.force_delete(runc).await?;
        let exit = self.init.wait().await;
        self.init.release_io();
        Ok(exit)
    }

    /// Kills and removes whatever state the container is in; used on pod teardown.
    pub async fn force_delete(&self, runc: &Runc) -> Result<()> {
        let removed = match runc.delete(&self.id).await {
            Err(e) if !crate::task::runc::is_not_exist(&e) => Err(e),
            _ => Ok(()),
        };
        let _ = self.init.signal(nix::sys::signal::Signal::SIGKILL as u32);
        let unmounted = rootfs::unmount_rootfs(&self.bundle.join("rootfs"));
        removed.and(unmounted)
    }
}

/// containerd's task manager makes every bundle `<state>/io.containerd.runtime.v2.task/<ns>/<id>`.
/// corral mounts the rootfs and rewrites config.json there, so anything else is refused: an
/// absolute, symlink-free path of that shape for this namespace and id.
pub fn check_bundle(bundle: &Path, id: &str, namespace: &str) -> Result<()> {
    let refuse = |why: &str| Err(Error::invalid(format!("bundle: {:?} {why}", bundle.display().to_string())));
    if !bundle.is_absolute() {
        return refuse("is not an absolute path");
    }
    if bundle.canonicalize().ok().as_deref() != Some(bundle) {
        return refuse("is not an existing directory without symlinks or '..'");
    }
    let mut parts = bundle.iter().rev();
    let (leaf, ns, plugin) = (parts.next(), parts.next(), parts.next());
    if leaf != Some(id.as_ref())
        || ns != Some(namespace.as_ref())
        || plugin != Some("io.containerd.runtime.v2.task".as_ref())
    {
        return refuse(&format!("is not <containerd state>/io.containerd.runtime.v2.task/{namespace}/{id}"));
    }
    Ok(())
}

fn read_pid(pid_file: &Path) -> Result<u32> {
    std::fs::read_to_string(pid_file)
        .with_path("read", pid_file)?
        .trim()
        .parse()
        .map_err(|e| Error::invalid(format!("{}: not a pid: {e}", pid_file.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_must_be_containerd_task_bundles() {
        let dir = std::env::temp_dir().join(format!("corral-bundle-{}", std::process::id()));
        let good = dir.join("io.containerd.runtime.v2.task/k8s.io/c1");
        std::fs::create_dir_all(&good).unwrap();
        assert!(check_bundle(&good, "c1", "k8s.io").is_ok());
        let err = |p: &Path, id: &str| check_bundle(p, id, "k8s.io").unwrap_err().to_string();
        assert!(err(&good, "c2").contains("io.containerd.runtime.v2.task/k8s.io/c2"));
        assert!(err(Path::new("rel/c1"), "c1").contains("not an absolute path"));
        assert!(err(&dir.join("io.containerd.runtime.v2.task/k8s.io/../k8s.io/c1"), "c1")
            .contains("symlinks or '..'"));
        let link = dir.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(err(&link, "c1").contains("symlinks"));
        let other = dir.join("elsewhere/k8s.io/c1");
        std::fs::create_dir_all(&other).unwrap();
        assert!(err(&other, "c1").contains("is not <containerd state>"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
