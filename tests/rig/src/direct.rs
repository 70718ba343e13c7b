//! Driving a corral shim directly over ttrpc, the way containerd does, for what CRI cannot
//! reach on containerd 2.1.9 (hostNetwork pods crash it before any shim runs) and for Task API
//! calls CRI never makes. The binary protocol is exercised for real: `start` prints the
//! bootstrap JSON, `delete` prints a DeleteResponse.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::sandbox_async::SandboxClient;
use containerd_shim_protos::shim_async::TaskClient;
use containerd_shim_protos::types::mount::Mount;
use prost::Message;

/// Where direct shims' programs and container images live (one directory per shim id).
const PROGRAMS: &str = "/var/lib/corral-rig/direct";

/// containerd's namespace for direct shims (so nothing collides with CRI's k8s.io).
pub const NAMESPACE: &str = "corral-direct";

static DIRECT_CGROUPS_USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Drop for DirectShim {
    /// Ends what a failed test left, removes the bundle and the empty parent cgroup runc made
    /// for direct containers.
    fn drop(&mut self) {
        // A test that failed half-way (or ended with its pod up) leaves its shim and holder:
        // release the pod as containerd would (delete reads the pod's record), end whatever is
        // left (their argv names the id), unmount what is below the test's directory.
        let _ = self.delete_command(&self.id, &self.bundle);
        for m in crate::probe::mounts_under(&[&self.dir]).into_iter().rev() {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        for pid in crate::probe::pids_with_cmdline(&self.id) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(&self.socket);
        // The server's log (see `start_with`) outside the rig, as the Rig copies containerd's.
        if let Some(copies) = std::env::var_os("CORRAL_RIG_LOG_COPY") {
            let _ = std::fs::copy(
                self.bundle.join("log"),
                Path::new(&copies).join(format!("direct-{}.log", self.id)),
            );
            // And the runtime's own log of each container (what its init logged after `start`).
            let tasks = self.dir.join("io.containerd.runtime.v2.task").join(NAMESPACE);
            for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
                let name = format!("direct-{}-runtime.json", task.file_name().to_string_lossy());
                let _ = std::fs::copy(task.path().join("runc-log.json"), Path::new(&copies).join(name));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(self.program_dir());
        if DIRECT_CGROUPS_USED.load(std::sync::atomic::Ordering::SeqCst) {
            if let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") {
                for m in mounts.flatten() {
                    let _ = std::fs::remove_dir(m.path().join("corral-direct"));
                }
            }
        }
    }
}

/// A shim started by hand, its bundle and its clients.
pub struct DirectShim {
    pub id: String,
    pub dir: PathBuf,
    pub bundle: PathBuf,
    /// The containerd address `start` was given (part of a node server's key).
    pub address: PathBuf,
    pub socket: PathBuf,
    pub sandbox: SandboxClient,
    pub task: TaskClient,
}

impl DirectShim {
    /// A directory for programs a test writes and runs (logging programs), removed with the
    /// shim: on disk, since systemd mounts /run (where [`DirectShim::dir`] is) noexec.
    pub fn program_dir(&self) -> PathBuf {
        Path::new(PROGRAMS).join(&self.id)
    }
}

pub fn shim_binary() -> PathBuf {
    crate::shim_dir().join("containerd-shim-corral-v2")
}

/// A 5 s ttrpc context ([`crate::scaled`]).
pub fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(crate::scaled(std::time::Duration::from_secs(5)).as_nanos() as i64)
}

impl DirectShim {
    /// Runs `start` in a fresh bundle, as containerd would, and connects.
    pub async fn start(id: &str) -> Result<DirectShim> {
        // A containerd address of its own (nothing listens there): in node mode the server is
        // per address, so each test gets its own, as each Rig has its own containerd, and a test
        // that kills its server ends no other test's pods.
        let address = PathBuf::from("/run/corral-rig/direct").join(id).join("containerd.sock");
        DirectShim::start_with(id, &address, &[]).await
    }

    /// [`DirectShim::start`] with a given containerd address and environment (e.g.
    /// `CORRAL_MODE=node`): node-mode shims started with one address share one server.
    pub async fn start_with(id: &str, address: &Path, env: &[(&str, &str)]) -> Result<DirectShim> {
        let dir = PathBuf::from("/run/corral-rig/direct").join(id);
        let _ = std::fs::remove_dir_all(&dir);
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(bundle.join("rootfs"))?;
        // Where containerd has its log FIFO, a file: corral logs there (else its lines would be
        // dropped with no FIFO), and a test that fails keeps them (see Drop).
        std::fs::write(bundle.join("log"), "")?;
        let out = Command::new(shim_binary())
            .args(["-namespace", NAMESPACE, "-address"])
            .arg(address)
            .args(["-publish-binary", "/bin/true", "-id", id, "start"])
            .envs(env.iter().copied())
            .current_dir(&bundle)
            .output()?;
        if !out.status.success() {
            bail!("start: {}", String::from_utf8_lossy(&out.stderr));
        }
        let reply: serde_json::Value = serde_json::from_slice(&out.stdout).context("start prints JSON")?;
        let served_at = reply["address"].as_str().context("address")?.to_string();
        let socket = PathBuf::from(served_at.trim_start_matches("unix://"));
        let client = ttrpc::asynchronous::Client::connect(&served_at).await?;
        Ok(DirectShim {
            id: id.into(),
            dir,
            bundle,
            address: address.to_path_buf(),
            socket,
            sandbox: SandboxClient::new(client.clone()),
            task: TaskClient::new(client),
        })
    }

    /// A started shim running a pod named `name` in a fresh test netns; returns the shim, the
    /// netns (deleted on drop) and the sandbox pid.
    pub async fn with_pod(id: &str, name: &str) -> Result<(DirectShim, TestNetns, u32)> {
        let shim = DirectShim::start(id).await?;
        let netns = TestNetns::new(&format!("crl-{}-{}", &name[..name.len().min(4)], std::process::id()))?;
        let config = crate::cri::pod_config(name, &shim.dir);
        let holder = shim.run_pod(&config, &netns.path.display().to_string()).await?;
        Ok((shim, netns, holder))
    }

    /// CreateSandbox and StartSandbox for `config` with CRI's `netns` ("" for the node's);
    /// returns the sandbox pid.
    pub async fn run_pod(&self, config: &k8s_cri::v1::PodSandboxConfig, netns: &str) -> Result<u32> {
        use containerd_shim_protos::sandbox_api::{CreateSandboxRequest, StartSandboxRequest};
        let create = CreateSandboxRequest {
            sandbox_id: self.id.clone(),
            bundle_path: self.bundle.display().to_string(),
            options: pod_options(config),
            netns_path: netns.into(),
            ..Default::default()
        };
        self.sandbox.create_sandbox(ctx(), &create).await?;
        let start = StartSandboxRequest { sandbox_id: self.id.clone(), ..Default::default() };
        Ok(self.sandbox.start_sandbox(ctx(), &start).await?.pid)
    }

    /// A container made by [`container_bundle`], created and started the way containerd's task
    /// manager does it; returns its bundle and init pid.
    pub async fn run_container(&self, cid: &str, sandbox_pid: u32, args: &[&str]) -> Result<(PathBuf, u32)> {
        use containerd_shim_protos::api::StartRequest;
        let (bundle, rootfs) = container_bundle(&self.dir, cid, sandbox_pid, args)?;
        let pid = self.create_task(cid, &bundle, rootfs).await?;
        self.task.start(ctx(), &StartRequest { id: cid.into(), ..Default::default() }).await?;
        Ok((bundle, pid))
    }

    /// Task.Create of container `cid` in this shim's pod from `bundle` (see [`container_bundle`]),
    /// as containerd's task manager sends it; the container's pid.
    pub async fn create_task(&self, cid: &str, bundle: &Path, rootfs: Vec<Mount>) -> Result<u32> {
        use containerd_shim_protos::api::CreateTaskRequest;
        std::fs::write(bundle.join("sandbox"), &self.id)?;
        let create = CreateTaskRequest {
            id: cid.into(),
            bundle: bundle.display().to_string(),
            rootfs,
            ..Default::default()
        };
        Ok(self.task.create(ctx(), &create).await?.pid)
    }

    /// ShutdownSandbox of this shim's pod: what ends a test's pod (and, per pod, its server).
    pub async fn shutdown_sandbox(&self) -> Result<()> {
        use containerd_shim_protos::sandbox_api::ShutdownSandboxRequest;
        let request = ShutdownSandboxRequest { sandbox_id: self.id.clone(), ..Default::default() };
        self.sandbox.shutdown_sandbox(ctx(), &request).await?;
        Ok(())
    }

    /// Runs the `delete` subcommand for `id` with `bundle`, as containerd does; returns the
    /// exit status of the command and the bytes it printed.
    pub fn delete_command(&self, id: &str, bundle: &Path) -> Result<(bool, Vec<u8>)> {
        let out = Command::new(shim_binary())
            .args(["-namespace", NAMESPACE, "-address"])
            .arg(&self.address)
            .args(["-publish-binary", "/bin/true", "-id", id, "-bundle"])
            .arg(bundle)
            .arg("delete")
            .current_dir(bundle.parent().unwrap_or(Path::new("/")))
            .output()?;
        Ok((out.status.success(), out.stdout))
    }
}

/// CreateSandbox options as containerd 2.1 sends them.
pub fn pod_options(config: &k8s_cri::v1::PodSandboxConfig) -> MessageField<Any> {
    let mut any = Any::new();
    any.type_url = "runtime.v1.PodSandboxConfig".into();
    any.value = config.encode_to_vec();
    MessageField::some(any)
}

/// A container bundle for the direct shim: a busybox rootfs (bind mounted by the shim) and a
/// `runc spec` config running `args`, with namespace paths as CRI writes them for `sandbox_pid`.
pub fn container_bundle(
    dir: &Path,
    cid: &str,
    sandbox_pid: u32,
    args: &[&str],
) -> Result<(PathBuf, Vec<Mount>)> {
    // The layout containerd's task manager uses, which corral checks.
    let bundle = dir.join("io.containerd.runtime.v2.task").join(NAMESPACE).join(cid);
    // The image's files beside the shim's programs (see `DirectShim::program_dir`), on disk: /run
    // is noexec under systemd, and a runtime that keeps the source's flags when it makes the root
    // read-only (corral-oci does; runc 1.1 drops noexec) could not exec from it.
    let image = Path::new(PROGRAMS)
        .join(dir.file_name().context("the shim's directory has a name")?)
        .join(format!("{cid}-image"));
    std::fs::create_dir_all(bundle.join("rootfs"))?;
    std::fs::create_dir_all(image.join("bin"))?;
    for d in ["proc", "sys", "dev", "etc", "tmp"] {
        std::fs::create_dir_all(image.join(d))?;
    }
    std::fs::copy("/bin/busybox", image.join("bin/busybox"))?;
    std::fs::set_permissions(image.join("bin/busybox"), std::fs::Permissions::from_mode(0o755))?;
    for applet in ["sh", "sleep", "cat", "hostname", "readlink", "echo", "ls"] {
        let _ = std::os::unix::fs::symlink("busybox", image.join("bin").join(applet));
    }
    let status = Command::new("runc").arg("spec").current_dir(&bundle).status()?;
    if !status.success() {
        bail!("runc spec failed");
    }
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["args"] = serde_json::json!(args);
    // `runc spec` names a hostname; CRI sets none for Linux containers (they join the pod's UTS
    // namespace, or the node's with hostNetwork), and corral refuses one there.
    spec.as_object_mut().context("config.json")?.remove("hostname");
    spec["process"]["terminal"] = serde_json::json!(false);
    spec["root"]["readonly"] = serde_json::json!(true);
    spec["linux"]["namespaces"] = serde_json::json!([
        {"type": "pid"},
        {"type": "ipc", "path": format!("/proc/{sandbox_pid}/ns/ipc")},
        {"type": "uts", "path": format!("/proc/{sandbox_pid}/ns/uts")},
        {"type": "mount"},
        {"type": "network", "path": format!("/proc/{sandbox_pid}/ns/net")},
    ]);
    spec["linux"]["cgroupsPath"] = serde_json::json!(cgroups_path(cid));
    DIRECT_CGROUPS_USED.store(true, std::sync::atomic::Ordering::SeqCst);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    let mut mount = Mount::new();
    mount.type_ = "bind".into();
    mount.source = image.display().to_string();
    mount.options = vec!["rbind".into(), "ro".into()];
    Ok((bundle, vec![mount]))
}

/// The `linux.cgroupsPath` of direct container `cid`: a plain path on a cgroupfs node, a
/// scope in system.slice (`slice:prefix:name`, as CRI writes them) on a systemd node.
pub fn cgroups_path(cid: &str) -> String {
    if crate::cgroup::is_systemd() {
        format!("system.slice:corral-direct:{cid}")
    } else {
        format!("/corral-direct/{cid}")
    }
}

/// The cgroup direct container `cid` lives in (see [`cgroups_path`]).
pub fn container_cgroup(cid: &str) -> String {
    if crate::cgroup::is_systemd() {
        format!("/system.slice/corral-direct-{cid}.scope")
    } else {
        format!("/corral-direct/{cid}")
    }
}

/// A network namespace made for a test with `ip netns add`, deleted on drop.
pub struct TestNetns {
    pub name: String,
    pub path: PathBuf,
}

impl TestNetns {
    pub fn new(name: &str) -> Result<TestNetns> {
        let status = Command::new("ip").args(["netns", "add", name]).status()?;
        if !status.success() {
            bail!("ip netns add {name} failed");
        }
        Ok(TestNetns { name: name.into(), path: PathBuf::from("/run/netns").join(name) })
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "delete", &self.name]).status();
    }
}
