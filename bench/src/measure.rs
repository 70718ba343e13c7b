//! What a pod costs, read from /proc: the processes that exist because of the pod (not its app),
//! their RSS and PSS (smaps_rollup) and CPU time.

use anyhow::Result;
use corral_rig::probe;

/// Processes of one pod's sandbox: for corral the shim server and the holder; for the pause
/// sandbox containerd-shim-runc-v2 and the pause process.
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

impl Usage {
    pub fn add(&mut self, o: &Usage) {
        self.rss_kib += o.rss_kib;
        self.pss_kib += o.pss_kib;
        self.cpu_ms += o.cpu_ms;
        self.processes += o.processes;
    }
}

fn field_kib(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0)
}

/// utime + stime of a process, in ms (clock ticks of 10 ms).
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    // After the comm: state is field 3; utime and stime are fields 14 and 15.
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(14) + ticks(15)) * 10.0
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
