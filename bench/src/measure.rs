//! What a pod costs, read from /proc: the processes that exist because of the pod (not its app),
//! their RSS and PSS (smaps_rollup) and CPU time.

use anyhow::Result;
use corral_rig::probe;

/// Processes of one pod's sandbox: for corral the shim server and the holder (in node mode the
/// holder only: the shared server is counted once for all pods); for the pause sandbox
/// containerd-shim-runc-v2 and the pause process.
pub struct PodProcesses {
    pub pids: Vec<u32>,
}

impl PodProcesses {
    pub fn find(_handler: &str, sandbox: &str) -> PodProcesses {
        // By command line (shims, holder carry the sandbox id) or by cgroup (the pause container
        // lives in a cgroup named after the sandbox id).
        let mut pids: Vec<u32> = probe::pids_with_cmdline(sandbox).into_iter().map(|p| p as u32).collect();
        for p in probe::pids_in_cgroup_of(sandbox) {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        PodProcesses { pids }
    }

    pub fn measure(&self) -> Result<Usage> {
        let mut u = Usage::default();
        for pid in &self.pids {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
            u.rss_kib += field_kib(&rollup, "Rss:");
            u.pss_kib += field_kib(&rollup, "Pss:");
            u.cpu_ms += cpu_ms(*pid);
            u.processes += 1;
        }
        Ok(u)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub rss_kib: f64,
    pub pss_kib: f64,
    pub cpu_ms: f64,
    pub processes: usize,
}

fn field_kib(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0)
}

/// CPU time of a process (all its threads, live or gone), in ms, from its CPU-time clock: exact
/// to the nanosecond, where /proc/<pid>/stat counts whole 10 ms ticks (a corral shim's CPU per
/// pod is below one tick, so ticks read 0).
fn cpu_ms(pid: u32) -> f64 {
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid as i32));
    match clock.and_then(nix::time::clock_gettime) {
        Ok(t) => t.tv_sec() as f64 * 1000.0 + t.tv_nsec() as f64 / 1e6,
        Err(_) => 0.0,
    }
}

/// RSS of one process, KiB.
pub fn rss_kib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    field_kib(&status, "VmRSS:")
}

/// The p-th percentile (0-100) of `values`, nearest rank.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// CPU time the whole machine spent busy (every state but idle and iowait), in ms, from the
/// first line of /proc/stat (USER_HZ ticks: 10 ms each, fine for phases of seconds).
pub fn machine_busy_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already counted in user)
    let busy: f64 =
        ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    busy * tick_ms()
}

/// CPU time of a process and of the children it has reaped (for containerd: the CNI plugins and
/// each shim's `start` and `delete` runs; not the shims that keep running), in ms.
pub fn with_reaped_children_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces: utime is the
    // 14th field of the line, the 12th after the ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: f64 = rest.split_whitespace().skip(11).take(4).filter_map(|f| f.parse::<f64>().ok()).sum();
    ticks * tick_ms()
}

fn tick_ms() -> f64 {
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1000.0 / if hz > 0 { hz as f64 } else { 100.0 }
}
