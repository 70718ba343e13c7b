//! The pod's cgroup: the holder lives in `<cgroup_parent>/<sandbox id>` (where containerd's pause
//! container lived), or under the systemd driver in the scope `corral-<sandbox id>.scope` of the
//! pod's slice, carrying the pod's sandbox resources; metrics of the pod (`cgroup_parent`) and of
//! containers are read from cgroupfs, on cgroup v1 (also hybrid) and v2.
//!
//! Hand-written rather than through `cgroups-rs`: corral needs mkdir, one write per controller
//! and a handful of stat files, while cgroups-rs 0.5 adds 53 crates to the shim (a D-Bus stack and
//! a second `nix`), measured with `cargo tree`.

pub mod oom;
pub mod path;
pub mod scope;
pub mod stats;

use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// How the host mounts cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One v1 hierarchy per mount: (controllers, mount point).
    V1(Vec<(Vec<String>, PathBuf)>),
    /// The unified hierarchy.
    V2(PathBuf),
}

impl Mode {
    /// Reads the host's cgroup layout. Hybrid hosts (v1 controllers plus an empty unified
    /// hierarchy) count as v1: that is where the controllers are.
    pub fn detect() -> Result<Mode> {
        let stat = nix::sys::statfs::statfs(CGROUP_ROOT).with_path("statfs", Path::new(CGROUP_ROOT))?;
        if stat.filesystem_type().0 as i64 == CGROUP2_SUPER_MAGIC {
            return Ok(Mode::V2(PathBuf::from(CGROUP_ROOT)));
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .with_path("read", Path::new("/proc/self/mountinfo"))?;
        let known = std::fs::read_to_string("/proc/cgroups").with_path("read", Path::new("/proc/cgroups"))?;
        Ok(Mode::V1(parse_v1_mounts(&info, &controllers(&known))))
    }

    /// The host's layout, read once per process: it does not change under a running shim.
    pub fn host() -> Result<&'static Mode> {
        static HOST: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
        if let Some(mode) = HOST.get() {
            return Ok(mode);
        }
        let mode = Self::detect()?;
        Ok(HOST.get_or_init(|| mode))
    }

    pub fn is_v2(&self) -> bool {
        matches!(self, Mode::V2(_))
    }

    /// The directories of cgroup `rel` (an absolute cgroup path like "/kubepods/pod1/x").
    pub fn dirs(&self, rel: &str) -> Vec<PathBuf> {
        let rel = rel.trim_start_matches('/');
        match self {
            Mode::V2(root) => vec![root.join(rel)],
            Mode::V1(mounts) => mounts.iter().map(|(_, mp)| mp.join(rel)).collect(),
        }
    }

    /// The directory of cgroup `rel` for `controller` (v2: the one directory).
    pub fn dir_of(&self, controller: &str, rel: &str) -> Option<PathBuf> {
        let rel = rel.trim_start_matches('/');
        match self {
            Mode::V2(root) => Some(root.join(rel)),
            Mode::V1(mounts) => mounts
                .iter()
                .find(|(ctrls, _)| ctrls.iter().any(|c| c == controller))
                .map(|(_, mp)| mp.join(rel)),
        }
    }
}

/// Controller names the kernel knows, from /proc/cgroups.
fn controllers(proc_cgroups: &str) -> Vec<String> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// v1 hierarchies from mountinfo: fstype `cgroup`, controllers among the super options.
fn parse_v1_mounts(mountinfo: &str, known: &[String]) -> Vec<(Vec<String>, PathBuf)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        if r.next() != Some("cgroup") {
            continue;
        }
        let super_opts = r.nth(1).unwrap_or_default();
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let ctrls: Vec<String> =
            super_opts.split(',').filter(|o| known.iter().any(|k| k == o)).map(str::to_string).collect();
        // Named hierarchies without controllers (name=systemd) carry no resources.
        if ctrls.is_empty() {
            continue;
        }
        out.push((ctrls, PathBuf::from(mount_point)));
    }
    out
}

/// The holder's cgroup, created by corral (or by systemd, for it) and removed by it.
#[derive(Clone, Debug)]
pub struct PodCgroup {
    pub rel: String,
    mode: Mode,
    placement: Placement,
}

#[derive(Clone, Debug)]
enum Placement {
    /// A directory corral makes and removes.
    Directory,
    /// A transient scope of this name, in this slice, which systemd makes and removes.
    Scope { unit: String, slice: String },
}

/// What the pod asks for its sandbox cgroup (LinuxPodSandboxConfig.resources).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
}

impl PodCgroup {
    /// Prepares the holder's cgroup under `parent` (a cgroupfs path, see
    /// [`path::resolve_parent_as`]). Under the cgroupfs driver (`slice` None) this creates
    /// `<parent>/<sandbox id>` in every hierarchy, and parents kubelet has not made yet (left for
    /// kubelet, which owns them). Under the systemd driver (`slice` the pod's slice) it only names
    /// the scope: systemd makes it in [`PodCgroup::adopt`].
    pub fn create(mode: &Mode, parent: &str, slice: Option<&str>, sandbox_id: &str) -> Result<PodCgroup> {
        let parent = parent.trim_end_matches('/');
        if let Some(slice) = slice {
            let unit = scope::unit_name(sandbox_id);
            let rel = format!("{parent}/{unit}");
            return Ok(PodCgroup {
                rel,
                mode: mode.clone(),
                placement: Placement::Scope { unit, slice: slice.into() },
            });
        }
        let rel = format!("{parent}/{sandbox_id}");
        for dir in mode.dirs(&rel) {
            std::fs::create_dir_all(&dir).with_path("create cgroup", &dir)?;
        }
        if let Mode::V2(root) = mode {
            enable_controllers(root, &rel);
        }
        if let Some(cpuset) = mode.dir_of("cpuset", &rel).filter(|_| !mode.is_v2()) {
            inherit_cpuset(&cpuset)?;
        }
        Ok(PodCgroup { rel, mode: mode.clone(), placement: Placement::Directory })
    }

    /// The systemd unit holding the cgroup, if systemd made it.
    pub fn unit(&self) -> Option<&str> {
        match &self.placement {
            Placement::Directory => None,
            Placement::Scope { unit, .. } => Some(unit),
        }
    }

    /// Moves the holder `pid` in and applies the sandbox's resources. Blocking: under systemd
    /// it waits for the scope's start job.
    pub fn adopt(&self, pid: i32, sandbox_id: &str, res: &Resources) -> Result<()> {
        match &self.placement {
            Placement::Directory => {
                self.add(pid)?;
                self.apply(res)
            }
            Placement::Scope { unit, slice } => {
                let pid = u32::try_from(pid).map_err(|_| Error::invalid(format!("holder pid {pid}")))?;
                scope::start(unit, &scope::properties(self.mode.is_v2(), slice, sandbox_id, pid, res))?;
                tracing::debug!(unit, slice, "holder scope started");
                Ok(())
            }
        }
    }

    fn add(&self, pid: i32) -> Result<()> {
        for dir in self.mode.dirs(&self.rel) {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string()).with_path("join", &procs)?;
        }
        Ok(())
    }

    /// Applies the sandbox's resources; containerd gives the pause container 2 CPU shares when
    /// the pod says nothing, and so does corral.
    fn apply(&self, res: &Resources) -> Result<()> {
        let shares = res.cpu_shares.unwrap_or(2);
        match &self.mode {
            Mode::V1(_) => {
                self.write("cpu", "cpu.shares", &shares.to_string())?;
                if let Some(period) = res.cpu_period {
                    self.write("cpu", "cpu.cfs_period_us", &period.to_string())?;
                }
                if let Some(quota) = res.cpu_quota {
                    self.write("cpu", "cpu.cfs_quota_us", &quota.to_string())?;
                }
                if let Some(limit) = res.memory_limit.filter(|l| *l > 0) {
                    self.write("memory", "memory.limit_in_bytes", &limit.to_string())?;
                }
            }
            Mode::V2(_) => {
                self.write("cpu", "cpu.weight", &shares_to_weight(shares).to_string())?;
                if let Some(quota) = res.cpu_quota.filter(|q| *q > 0) {
                    self.write("cpu", "cpu.max", &format!("{quota} {}", res.cpu_period.unwrap_or(100_000)))?;
                }
                if let Some(limit) = res.memory_limit.filter(|l| *l > 0) {
                    self.write("memory", "memory.max", &limit.to_string())?;
                }
            }
        }
        Ok(())
    }

    fn write(&self, controller: &str, file: &str, value: &str) -> Result<()> {
        let Some(dir) = self.mode.dir_of(controller, &self.rel) else {
            return Ok(());
        };
        let path = dir.join(file);
        std::fs::write(&path, value).with_path(&format!("write {value:?} to"), &path)
    }

    /// Removes the cgroup (its processes must be gone; a scope's are killed). Missing
    /// directories and units are fine.
    pub async fn remove(&self) -> Result<()> {
        if let Some(unit) = self.unit().map(str::to_string) {
            // Blocking D-Bus exchange: off the runtime's one thread.
            tokio::task::spawn_blocking(move || scope::stop(&unit))
                .await
                .map_err(|e| Error::Internal(format!("stop the holder's scope: {e}")))??;
        }
        remove_dirs(&self.mode, &self.rel).await
    }

    /// Removes the cgroup once, without waiting: for a failed creation, whose holder has been
    /// reaped already.
    pub fn remove_now(&self) -> Result<()> {
        if let Some(unit) = self.unit() {
            scope::stop(unit)?;
        }
        self.mode.dirs(&self.rel).iter().try_for_each(|dir| remove_dir(dir).with_path("remove cgroup", dir))
    }
}

/// Removes cgroup `rel` in every hierarchy, retrying briefly while the kernel finishes
/// tearing down exited processes. Waits on the runtime's timer: the shim's runtime has one
/// thread, which a blocking sleep would take from every other RPC.
pub async fn remove_dirs(mode: &Mode, rel: &str) -> Result<()> {
    for dir in mode.dirs(rel) {
        let mut last = remove_dir(&dir);
        for _ in 0..50 {
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            last = remove_dir(&dir);
        }
        last.with_path("remove cgroup", &dir)?;
    }
    Ok(())
}

/// rmdir, with a missing directory counting as removed.
fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// cgroup v2 gives a new cgroup only the controllers its parent enables in
/// `cgroup.subtree_control`, and nothing enables them below a cgroup kubelet made: enable
/// every available controller on each ancestor of `rel`, from the root down, as runc does for
/// the containers' cgroups. Each controller is asked for separately and refusals are left to show where a limit is written
/// (a cgroup holding processes cannot enable any: the "no internal processes" rule).
fn enable_controllers(root: &Path, rel: &str) {
    let mut dir = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    for part in parts.iter().take(parts.len().saturating_sub(1)).copied().chain(std::iter::once("")) {
        let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        for c in available.split_whitespace().filter(|c| !enabled.split_whitespace().any(|e| e == *c)) {
            if let Err(e) = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")) {
                tracing::debug!(cgroup = %dir.display(), controller = c, error = %e, "enable controller");
            }
        }
        if part.is_empty() {
            break;
        }
        dir.push(part);
    }
}

/// A new v1 cpuset cgroup has empty cpus/mems and refuses tasks: copy them down from the
/// nearest ancestor that has both. Both, because shims starting pods at once share new
/// ancestors: another one may have written an ancestor's cpus and not yet its mems, and copying
/// that empty mems down left a pod cgroup that refused its holder (ENOSPC, seen in load_many).
/// Every shim writes the same values top-down, so racing writers agree.
fn inherit_cpuset(dir: &Path) -> Result<()> {
    let mut chain = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        let set = |file: &str| std::fs::read_to_string(d.join(file)).is_ok_and(|v| !v.trim().is_empty());
        if set("cpuset.cpus") && set("cpuset.mems") {
            break;
        }
        chain.push(d.to_path_buf());
        cur = d.parent();
    }
    for d in chain.iter().rev() {
        let parent = d.parent().ok_or_else(|| Error::invalid("cpuset cgroup without a parent"))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let value = std::fs::read_to_string(parent.join(file)).with_path("read", &parent.join(file))?;
            std::fs::write(d.join(file), value.trim()).with_path("write", &d.join(file))?;
        }
    }
    Ok(())
}

/// cgroup v1 cpu.shares -> v2 cpu.weight, the conversion runc and the kernel docs use.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuset_is_inherited_from_the_nearest_ancestor_with_cpus_and_mems() {
        let root = std::env::temp_dir().join(format!("corral-cpuset-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("a/b"));
        std::fs::create_dir_all(&b).unwrap();
        let write = |d: &Path, cpus: &str, mems: &str| {
            std::fs::write(d.join("cpuset.cpus"), cpus).unwrap();
            std::fs::write(d.join("cpuset.mems"), mems).unwrap();
        };
        write(&root, "0-1\n", "0\n");
        // Another shim has written a's cpus and not yet its mems.
        write(&a, "0-1", "");
        write(&b, "", "");
        inherit_cpuset(&b).unwrap();
        let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap();
        assert_eq!((read(&b, "cpuset.cpus"), read(&b, "cpuset.mems")), ("0-1".into(), "0".into()));
        assert_eq!(read(&a, "cpuset.mems"), "0");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn finds_v1_hierarchies_in_a_hybrid_mountinfo() {
        let info = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 25 0:31 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd
39 25 0:34 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct
40 25 0:35 / /sys/fs/cgroup/memory rw shared:16 - cgroup cgroup rw,memory
41 25 0:36 / /proc/x rw - proc proc rw
";
        let known = controllers("#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\ncpuacct\t1\t1\t1\nmemory\t2\t1\t1\n");
        let got = parse_v1_mounts(info, &known);
        assert_eq!(
            got,
            vec![
                (vec!["cpu".to_string(), "cpuacct".to_string()], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")),
                (vec!["memory".to_string()], PathBuf::from("/sys/fs/cgroup/memory")),
            ]
        );
        let mode = Mode::V1(got);
        assert_eq!(mode.dir_of("cpuacct", "/a/b"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a/b")));
        assert_eq!(mode.dir_of("pids", "/a"), None);
        assert_eq!(Mode::V2("/sys/fs/cgroup".into()).dirs("/a"), vec![PathBuf::from("/sys/fs/cgroup/a")]);
    }

    #[test]
    fn converts_shares_to_weight_like_runc() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }
}
