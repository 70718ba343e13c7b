//! corral's test rig: a private containerd 2.1 instance (own root, state, socket, CNI bridge,
//! NRI off) with two CRI runtime handlers, `corral` (sandboxer = shim) and `runc` (containerd's
//! default pause sandbox), driven through CRI like kubelet. Used by the e2e tests, the demo and
//! the benchmark.
//!
//! - [`Rig`]: start / stop containerd, import the locally built busybox image.
//! - [`cri`]: a CRI client over the unix socket, and kubelet-like config builders.
//! - [`probe`]: facts read from /proc and the mount table, never from corral's own answers.
//! - [`cgroup`]: the node's cgroup driver (cgroupfs on v1, systemd on v2) and cgroup facts.
//! - [`stream`]: CRI's streaming (Exec, Attach) as kubectl speaks it.

pub mod cgroup;
pub mod cri;
pub mod direct;
pub mod leaks;
pub mod probe;
pub mod stream;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use cri::Cri;

/// The image every test container runs.
pub const BUSYBOX: &str = "docker.io/corral/busybox:test";
/// Where corral keeps the files of this rig's pods (its default `pod.files_root`, namespace k8s.io).
pub const CORRAL_POD_FILES: &str = "/var/lib/corral/pods/k8s.io";
/// containerd 2.1's pinned sandbox image, needed by the `runc` handler only.
pub const PAUSE: &str = "registry.k8s.io/pause:3.10";

/// The workspace root (this crate lives in tests/rig).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// Directory holding `containerd-shim-corral-v2`: `CORRAL_SHIM_DIR`, else target/debug.
/// Whether this run's corral servers are in node mode (`CORRAL_MODE=node` in the test's
/// environment, which containerd passes on to its shims): one server for every pod.
pub fn node_mode() -> bool {
    std::env::var("CORRAL_MODE").is_ok_and(|m| m == "node")
}

/// Whether this run's corral servers use corral's builtin OCI runtime (`CORRAL_RUNC=builtin` in
/// the test's environment, which containerd passes on to its shims) instead of runc.
pub fn builtin_runtime() -> bool {
    std::env::var("CORRAL_RUNC").is_ok_and(|r| r == "builtin")
}

/// The OCI runtime program this run's corral servers call: runc, or the builtin runtime's
/// helper beside the shim.
pub fn runtime_program() -> PathBuf {
    if builtin_runtime() {
        shim_dir().join("corral-oci")
    } else {
        PathBuf::from(std::env::var("CORRAL_RUNC").unwrap_or_else(|_| "runc".into()))
    }
}

/// The OCI runtime's state root for containerd namespace k8s.io, as corral derives it.
pub fn runtime_root() -> PathBuf {
    PathBuf::from(if builtin_runtime() { "/run/corral/oci/k8s.io" } else { "/run/corral/runc/k8s.io" })
}

pub fn shim_dir() -> PathBuf {
    std::env::var_os("CORRAL_SHIM_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target/debug"))
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Also import the busybox image under the pause image's name (for the runc handler).
    pub pause_image: bool,
    /// containerd log level (`CORRAL_RIG_LOG` overrides; default info).
    pub log_level: Option<String>,
    /// Environment for shims, through containerd's shim-manager `env` (e.g. "CORRAL_SHM_SIZE=16Mi").
    pub shim_env: Vec<String>,
    /// More containerd configuration (TOML), appended to the rig's.
    pub extra_config: String,
    /// Variables of the test's environment containerd (and so its shims) must not inherit
    /// (e.g. CORRAL_MODE, for a test of both modes side by side whatever the suite's mode).
    pub env_remove: Vec<String>,
}

/// A running private containerd.
pub struct Rig {
    pub name: String,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    options: Options,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Rig {
    /// Starts a fresh instance with a unique name and waits until CRI is ready.
    pub async fn start(options: Options) -> Result<Rig> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("r{}-{n}", std::process::id() % 100_000);
        let dir = PathBuf::from("/var/lib/corral-rig").join(&name);
        let state = PathBuf::from("/run/corral-rig").join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&state);
        std::fs::create_dir_all(dir.join("cni"))?;
        std::fs::create_dir_all(&state)?;
        let mut rig = Rig {
            root: dir.join("root"),
            socket: state.join("c.sock"),
            log: dir.join("containerd.log"),
            state: state.join("state"),
            name,
            dir,
            child: None,
            options,
        };
        rig.write_config(n)?;
        rig.spawn()?;
        rig.wait_ready().await?;
        rig.import_images()?;
        Ok(rig)
    }

    fn write_config(&self, n: u32) -> Result<()> {
        let level = std::env::var("CORRAL_RIG_LOG")
            .ok()
            .or_else(|| self.options.log_level.clone())
            .unwrap_or_else(|| "info".into());
        let shim_env = format!("{:?}", self.options.shim_env);
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  level = "{level}"

{timeouts}

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{cni}"

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{runc_options}

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral]
  runtime_type = "io.containerd.corral.v2"
  sandboxer = "shim"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral-node]
  runtime_type = "io.containerd.corral-node.v2"
  sandboxer = "shim"

[plugins.'io.containerd.shim.v1.manager']
  env = {shim_env}

{extra}
"#,
            shim_env = shim_env,
            // What a systemd node's containerd has: runc's systemd cgroup manager, which CRI's
            // slice:prefix:name cgroup paths need. corral takes the driver from the path's shape.
            runc_options = if cgroup::is_systemd() {
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true"
            } else {
                ""
            },
            extra = self.options.extra_config,
            // containerd kills a shim's `delete` after 5 s (its default cleanup timeout); under
            // software emulation (CORRAL_RIG_TIME_SCALE, scripts/test-vm.sh) merely loading the
            // debug binary from the 9p share can take most of that, so the deadline stretches
            // with the rig's other waits. Unscaled, it is containerd's default.
            timeouts = match scaled(Duration::from_secs(5)).as_secs() {
                5 => String::new(),
                secs => format!("[timeouts]\n  \"io.containerd.timeout.shim.cleanup\" = \"{secs}s\""),
            },
            root = self.root.display(),
            state = self.state.display(),
            sock = self.socket.display(),
            pause = PAUSE,
            cni = self.dir.join("cni").display(),
        );
        std::fs::write(self.dir.join("config.toml"), config)?;
        // A bridge on a private subnet that exists only on this machine.
        let subnet = 20 + (std::process::id() + n * 7) % 200;
        let cni = format!(
            r#"{{"cniVersion":"1.0.0","name":"corral-{name}","plugins":[{{"type":"bridge","bridge":"crl{name_short}","isGateway":true,"ipMasq":false,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.233.{subnet}.0/24"}}]],"dataDir":"{ipam}"}}}}]}}"#,
            name = self.name,
            name_short = &self.name[..self.name.len().min(12)].replace('-', ""),
            ipam = self.dir.join("ipam").display(),
        );
        std::fs::write(self.dir.join("cni/10-corral.conflist"), cni)?;
        Ok(())
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::File::create(&self.log)?;
        // The `corral-node` handler's binary: a link to the shim, as `make install` makes it.
        let bin = self.dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let _ = std::fs::remove_file(bin.join("containerd-shim-corral-node-v2"));
        std::os::unix::fs::symlink(
            shim_dir().join("containerd-shim-corral-v2"),
            bin.join("containerd-shim-corral-node-v2"),
        )?;
        let path = format!(
            "{}:{}:{}",
            bin.display(),
            shim_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("containerd");
        for name in &self.options.env_remove {
            cmd.env_remove(name);
        }
        let child = cmd
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .env("PATH", path)
            // Node servers' logs stay with the rig (and go with it), not in the node's /var/log.
            .env("CORRAL_NODE_LOG_DIR", self.dir.join("node-logs"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn containerd (is it installed? scripts/install-deps.sh)")?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + scaled(Duration::from_secs(30));
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("containerd exited early ({status}); log: {}", self.log_tail(30));
            }
            if self.socket.exists() {
                if let Ok(mut cri) = Cri::connect(&self.socket).await {
                    if cri.ready().await.unwrap_or(false) {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd not ready after {:?}; log: {}",
                    scaled(Duration::from_secs(30)),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn import_images(&self) -> Result<()> {
        let tar = workspace().join("target/corral-rig/busybox-oci.tar");
        // Tests run in parallel threads: one of them builds the image, the others wait.
        static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        if !tar.exists() {
            let status = Command::new("bash")
                .arg(workspace().join("scripts/build-image.sh"))
                .arg(&tar)
                .arg(BUSYBOX)
                .status()?;
            if !status.success() {
                bail!("building the busybox image failed");
            }
        }
        self.ctr(&["images", "import", &tar.display().to_string()])?;
        if self.options.pause_image {
            self.ctr(&["images", "tag", BUSYBOX, PAUSE])?;
        }
        Ok(())
    }

    /// A kubelet-like pod config named `name`, logging under this rig's log directory. On a
    /// systemd node it has the pod's slice as its cgroup parent, since kubelet always sends one
    /// there (and runc's systemd manager needs one); on a cgroupfs node none unless a test sets
    /// [`Rig::cgroup_parent`].
    pub fn pod_config(&self, name: &str) -> k8s_cri::v1::PodSandboxConfig {
        let mut cfg = cri::pod_config(name, &cri::log_dir(&self.dir, name));
        if cgroup::is_systemd() {
            cfg.linux.as_mut().expect("linux").cgroup_parent = self.cgroup_parent(name);
        }
        cfg
    }

    /// Runs `ctr` against this instance in namespace k8s.io; returns stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!("ctr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A cgroup parent for pod `pod`, made as kubelet makes one before the pod's sandbox:
    /// cgroupfs `/corral-e2e/<rig>/<pod>` (created by corral, as a path kubelet would have
    /// made), systemd the slice `kubepods-besteffort-pod<uid>.slice`, started here, with a uid
    /// made of the rig's and the pod's names. Removed by [`Rig::remove_cgroup_parent`] or with
    /// the rig.
    pub fn cgroup_parent(&self, pod: &str) -> String {
        match cgroup::driver() {
            cgroup::Driver::Cgroupfs => format!("/corral-e2e/{}/{pod}", self.name),
            cgroup::Driver::Systemd => {
                let slice = format!("{}{}.slice", self.slice_prefix(), pod.replace(['-', '.'], "_"));
                cgroup::start_slice(&slice).unwrap_or_else(|e| panic!("pod cgroup parent: {e:#}"));
                slice
            }
        }
    }

    /// `kubepods-besteffort-pod<rig name>_`: every pod slice of this rig starts with it (systemd
    /// reads '-' as a level, so the rig's '-' becomes '_', as kubelet does with a pod uid's).
    fn slice_prefix(&self) -> String {
        format!("kubepods-besteffort-pod{}_", self.name.replace('-', "_"))
    }

    /// Removes pod `pod`'s cgroup parent once the pod is gone, as kubelet does; an error if
    /// anything is still in it (a leaked pod or container cgroup), after a few seconds for
    /// teardowns to settle.
    pub async fn remove_cgroup_parent(&self, pod: &str) -> Result<()> {
        let parent = self.cgroup_parent_dir(pod);
        eventually(Duration::from_secs(10), || {
            let left = cgroup::children(&parent);
            (!left.is_empty()).then(|| format!("cgroup parent {} not empty: {left:?}", parent.display()))
        })
        .await?;
        match cgroup::driver() {
            cgroup::Driver::Cgroupfs => {
                for m in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
                    let dir = m.path().join(format!("corral-e2e/{}/{pod}", self.name));
                    match std::fs::remove_dir(&dir) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            bail!("remove {}: {e}", dir.display())
                        }
                        _ => {}
                    }
                }
            }
            cgroup::Driver::Systemd => {
                let slice = self.cgroup_parent(pod);
                cgroup::stop_units(std::slice::from_ref(&slice));
                if !cgroup::units(&slice).is_empty() {
                    bail!("slice {slice} still loaded after stop");
                }
            }
        }
        Ok(())
    }

    fn cgroup_parent_dir(&self, pod: &str) -> PathBuf {
        let rel = match cgroup::driver() {
            cgroup::Driver::Cgroupfs => format!("/corral-e2e/{}/{pod}", self.name),
            cgroup::Driver::Systemd => {
                cgroup::slice_path(&format!("{}{}.slice", self.slice_prefix(), pod.replace(['-', '.'], "_")))
            }
        };
        cgroup::dir("memory", &rel)
    }

    /// The cgroups of this rig's pod parents (the memory hierarchy's, on v1): what kubelet made.
    pub fn pod_parent_cgroups(&self) -> Vec<PathBuf> {
        match cgroup::driver() {
            cgroup::Driver::Cgroupfs => {
                cgroup::children(&cgroup::dir("memory", &format!("/corral-e2e/{}", self.name)))
            }
            cgroup::Driver::Systemd => {
                let prefix = self.slice_prefix();
                cgroup::children(&cgroup::dir("memory", "/kubepods.slice/kubepods-besteffort.slice"))
                    .into_iter()
                    .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
                    .collect()
            }
        }
    }

    /// Loaded systemd units of pods: this rig's pod slices, every container scope
    /// (`cri-containerd-*.scope`) and every holder scope (`corral-*.scope`) on the node, whatever their state (a failed or abandoned
    /// scope is a leak too). None on a cgroupfs node.
    pub fn units(&self) -> Vec<String> {
        let mut units = cgroup::units(&format!("{}*", self.slice_prefix()));
        units.extend(cgroup::units("cri-containerd-*.scope"));
        units.extend(cgroup::units("corral-*.scope"));
        units
    }

    pub async fn cri(&self) -> Result<Cri> {
        Cri::connect(&self.socket).await
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The containerd process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills containerd with `signal`, waits `downtime`, and starts it again on the same
    /// directories.
    pub async fn restart(&mut self, signal: nix::sys::signal::Signal, downtime: Duration) -> Result<()> {
        self.stop_daemon(signal);
        tokio::time::sleep(downtime).await;
        self.spawn()?;
        self.wait_ready().await
    }

    fn stop_daemon(&mut self, signal: nix::sys::signal::Signal) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
            let deadline = Instant::now() + scaled(Duration::from_secs(10));
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Rig {
    /// Stops containerd and removes whatever the tests left behind, so the next run starts clean.
    /// (Tests assert the absence of leaks *before* this runs.)
    fn drop(&mut self) {
        // What a failed test may have left: its pods' holders and containers.
        let ids = |plugin: &str| -> Vec<String> {
            std::fs::read_dir(self.state.join(plugin).join("k8s.io"))
                .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default()
        };
        let sandboxes = ids("io.containerd.sandbox.controller.v1.shim");
        let containers = ids("io.containerd.runtime.v2.task");
        self.stop_daemon(nix::sys::signal::Signal::SIGTERM);
        let kill = |pid: i32| {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        };
        let marker = self.socket.display().to_string();
        probe::pids_with_cmdline(&marker).into_iter().for_each(kill);
        for sb in &sandboxes {
            probe::pids_with_cmdline(sb).into_iter().for_each(kill);
            // corral's files for the pod (see corral's pod.files_root), if its delete never ran.
            let _ = std::fs::remove_dir_all(Path::new(CORRAL_POD_FILES).join(sb));
        }
        for cid in &containers {
            for root in ["/run/corral/runc/k8s.io", "/run/containerd/runc/k8s.io"] {
                let _ = Command::new("runc").args(["--root", root, "delete", "--force", cid]).output();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for m in
            probe::mounts_under(&[&self.dir, self.state.parent().unwrap_or(&self.state)]).into_iter().rev()
        {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        // Pod slices (and whatever is left in them) of a systemd node; kubelet's parent slices
        // (kubepods.slice, kubepods-besteffort.slice) stay, as on a node.
        if cgroup::is_systemd() {
            cgroup::stop_units(&cgroup::units(&format!("{}*", self.slice_prefix())));
        }
        // Pod cgroups tests created under /corral-e2e/<rig name> (see [`Rig::cgroup_parent`]).
        if let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") {
            for m in mounts.flatten() {
                remove_cgroup_tree(&m.path().join("corral-e2e").join(&self.name));
                let _ = std::fs::remove_dir(m.path().join("corral-e2e"));
            }
        }
        // A log directory outside the rig (scripts/test-vm.sh: the guest's disk is thrown away).
        if let Some(dir) = std::env::var_os("CORRAL_RIG_LOG_COPY") {
            let _ = std::fs::copy(&self.log, Path::new(&dir).join(format!("{}.log", self.name)));
            for log in std::fs::read_dir(self.dir.join("node-logs")).into_iter().flatten().flatten() {
                let name = format!("{}-{}", self.name, log.file_name().to_string_lossy());
                let _ = std::fs::copy(log.path(), Path::new(&dir).join(name));
            }
        }
        if std::env::var_os("CORRAL_RIG_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
            let _ = std::fs::remove_dir_all(self.state.parent().unwrap_or(&self.state));
        }
    }
}

/// Removes a cgroup directory tree, children first (cgroupfs allows only rmdir).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// `d` stretched by `CORRAL_RIG_TIME_SCALE` (a whole number, default 1): the waits of the rig
/// and the tests are sized for this machine, and a slower one (software emulation runs the
/// same work several times slower; scripts/test-vm.sh sets it) needs longer ones. Nothing
/// asserts a duration; this only keeps a slow node from failing a wait for a fact that comes.
pub fn scaled(d: Duration) -> Duration {
    static SCALE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    d * *SCALE.get_or_init(|| {
        std::env::var("CORRAL_RIG_TIME_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|s| *s > 0)
            .unwrap_or(1)
    })
}

/// Polls `check` until it returns `None` or `timeout` ([`scaled`]) passes; returns the last
/// complaint. For facts that settle shortly after an RPC returns (a process finishing its exit).
pub async fn eventually<F: FnMut() -> Option<String>>(timeout: Duration, mut check: F) -> Result<()> {
    let timeout = scaled(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            None => return Ok(()),
            Some(why) if Instant::now() > deadline => bail!("after {timeout:?}: {why}"),
            Some(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}
