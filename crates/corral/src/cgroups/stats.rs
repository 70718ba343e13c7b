//! cgroup metrics in containerd's formats (`io.containerd.cgroups.v1.Metrics`,
//! `io.containerd.cgroups.v2.Metrics`). Parsing is separate from reading so it is tested on
//! recorded files of both cgroup versions.

use std::collections::HashMap;
use std::path::Path;

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};

use super::Mode;
use crate::error::{Error, Result};

pub const V1_TYPE: &str = "io.containerd.cgroups.v1.Metrics";
pub const V2_TYPE: &str = "io.containerd.cgroups.v2.Metrics";
/// USER_HZ: the unit of cpuacct.stat.
const NS_PER_TICK: u64 = 10_000_000;

/// `key value` lines (memory.stat, cpu.stat, cpuacct.stat, memory.events).
pub fn flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?, it.next()?.parse().ok()?))
        })
        .collect()
}

/// A single-value file; "max" reads as `max`.
pub fn single(text: &str, max: u64) -> u64 {
    let t = text.trim();
    if t == "max" {
        max
    } else {
        t.parse().unwrap_or(0)
    }
}

/// Reads the files a parser needs from `dir`.
struct Files<'a>(&'a Path);

impl Files<'_> {
    fn get(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).unwrap_or_default()
    }
}

/// Metrics of cgroup `rel` as a protobuf Any of the type matching the host.
pub fn read(mode: &Mode, rel: &str) -> Result<Any> {
    let mut any = Any::new();
    match mode {
        Mode::V1(_) => {
            let dir = |c: &str| mode.dir_of(c, rel);
            let exists = dir("memory").or_else(|| dir("cpuacct")).is_some_and(|d| d.is_dir());
            if !exists {
                return Err(Error::not_found(format!("cgroup {rel}: not found")));
            }
            let read_in = |c: &str, f: &str| dir(c).map(|d| Files(&d).get(f)).unwrap_or_default();
            let m = v1_metrics(&|c, f| read_in(c, f));
            any.type_url = V1_TYPE.into();
            any.value = m.write_to_bytes().map_err(|e| Error::invalid(format!("encode metrics: {e}")))?;
        }
        Mode::V2(root) => {
            let dir = root.join(rel.trim_start_matches('/'));
            if !dir.is_dir() {
                return Err(Error::not_found(format!("cgroup {rel}: not found")));
            }
            let files = Files(&dir);
            let m = v2_metrics(&|f| files.get(f));
            any.type_url = V2_TYPE.into();
            any.value = m.write_to_bytes().map_err(|e| Error::invalid(format!("encode metrics: {e}")))?;
        }
    }
    Ok(any)
}

/// v1 metrics from `file(controller, name)`.
pub fn v1_metrics(file: &dyn Fn(&str, &str) -> String) -> v1::Metrics {
    let mut m = v1::Metrics::new();

    let mut usage = v1::CPUUsage::new();
    usage.total = single(&file("cpuacct", "cpuacct.usage"), 0);
    let ticks = file("cpuacct", "cpuacct.stat");
    let ticks = flat_keyed(&ticks);
    usage.user = ticks.get("user").copied().unwrap_or(0) * NS_PER_TICK;
    usage.kernel = ticks.get("system").copied().unwrap_or(0) * NS_PER_TICK;
    usage.per_cpu =
        file("cpuacct", "cpuacct.usage_percpu").split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let throttle_text = file("cpu", "cpu.stat");
    let t = flat_keyed(&throttle_text);
    let mut throttling = v1::Throttle::new();
    throttling.periods = t.get("nr_periods").copied().unwrap_or(0);
    throttling.throttled_periods = t.get("nr_throttled").copied().unwrap_or(0);
    throttling.throttled_time = t.get("throttled_time").copied().unwrap_or(0);
    let mut cpu = v1::CPUStat::new();
    cpu.usage = MessageField::some(usage);
    cpu.throttling = MessageField::some(throttling);
    m.cpu = MessageField::some(cpu);

    let stat_text = file("memory", "memory.stat");
    let s = flat_keyed(&stat_text);
    let g = |k: &str| s.get(k).copied().unwrap_or(0);
    let mut mem = v1::MemoryStat::new();
    mem.cache = g("cache");
    mem.rss = g("rss");
    mem.rss_huge = g("rss_huge");
    mem.mapped_file = g("mapped_file");
    mem.dirty = g("dirty");
    mem.writeback = g("writeback");
    mem.pg_pg_in = g("pgpgin");
    mem.pg_pg_out = g("pgpgout");
    mem.pg_fault = g("pgfault");
    mem.pg_maj_fault = g("pgmajfault");
    mem.inactive_anon = g("inactive_anon");
    mem.active_anon = g("active_anon");
    mem.inactive_file = g("inactive_file");
    mem.active_file = g("active_file");
    mem.unevictable = g("unevictable");
    mem.hierarchical_memory_limit = g("hierarchical_memory_limit");
    mem.hierarchical_swap_limit = g("hierarchical_memsw_limit");
    mem.total_cache = g("total_cache");
    mem.total_rss = g("total_rss");
    mem.total_rss_huge = g("total_rss_huge");
    mem.total_mapped_file = g("total_mapped_file");
    mem.total_dirty = g("total_dirty");
    mem.total_writeback = g("total_writeback");
    mem.total_pg_pg_in = g("total_pgpgin");
    mem.total_pg_pg_out = g("total_pgpgout");
    mem.total_pg_fault = g("total_pgfault");
    mem.total_pg_maj_fault = g("total_pgmajfault");
    mem.total_inactive_anon = g("total_inactive_anon");
    mem.total_active_anon = g("total_active_anon");
    mem.total_inactive_file = g("total_inactive_file");
    mem.total_active_file = g("total_active_file");
    mem.total_unevictable = g("total_unevictable");
    let entry = |prefix: &str| {
        let mut e = v1::MemoryEntry::new();
        e.usage = single(&file("memory", &format!("{prefix}.usage_in_bytes")), 0);
        e.limit = single(&file("memory", &format!("{prefix}.limit_in_bytes")), u64::MAX);
        e.max = single(&file("memory", &format!("{prefix}.max_usage_in_bytes")), 0);
        e.failcnt = single(&file("memory", &format!("{prefix}.failcnt")), 0);
        e
    };
    mem.usage = MessageField::some(entry("memory"));
    mem.swap = MessageField::some(entry("memory.memsw"));
    mem.kernel = MessageField::some(entry("memory.kmem"));
    mem.kernel_tcp = MessageField::some(entry("memory.kmem.tcp"));
    m.memory = MessageField::some(mem);

    let mut pids = v1::PidsStat::new();
    pids.current = single(&file("pids", "pids.current"), 0);
    pids.limit = single(&file("pids", "pids.max"), 0);
    m.pids = MessageField::some(pids);
    m
}

/// v2 metrics from `file(name)` in the cgroup's directory.
pub fn v2_metrics(file: &dyn Fn(&str) -> String) -> v2::Metrics {
    let mut m = v2::Metrics::new();

    let cpu_text = file("cpu.stat");
    let c = flat_keyed(&cpu_text);
    let g = |k: &str| c.get(k).copied().unwrap_or(0);
    let mut cpu = v2::CPUStat::new();
    cpu.usage_usec = g("usage_usec");
    cpu.user_usec = g("user_usec");
    cpu.system_usec = g("system_usec");
    cpu.nr_periods = g("nr_periods");
    cpu.nr_throttled = g("nr_throttled");
    cpu.throttled_usec = g("throttled_usec");
    cpu.nr_bursts = g("nr_bursts");
    cpu.burst_usec = g("burst_usec");
    m.cpu = MessageField::some(cpu);

    let stat_text = file("memory.stat");
    let s = flat_keyed(&stat_text);
    let g = |k: &str| s.get(k).copied().unwrap_or(0);
    let mut mem = v2::MemoryStat::new();
    mem.anon = g("anon");
    mem.file = g("file");
    mem.kernel_stack = g("kernel_stack");
    mem.slab = g("slab");
    mem.sock = g("sock");
    mem.shmem = g("shmem");
    mem.file_mapped = g("file_mapped");
    mem.file_dirty = g("file_dirty");
    mem.file_writeback = g("file_writeback");
    mem.anon_thp = g("anon_thp");
    mem.inactive_anon = g("inactive_anon");
    mem.active_anon = g("active_anon");
    mem.inactive_file = g("inactive_file");
    mem.active_file = g("active_file");
    mem.unevictable = g("unevictable");
    mem.slab_reclaimable = g("slab_reclaimable");
    mem.slab_unreclaimable = g("slab_unreclaimable");
    mem.pgfault = g("pgfault");
    mem.pgmajfault = g("pgmajfault");
    mem.workingset_refault = g("workingset_refault");
    mem.workingset_activate = g("workingset_activate");
    mem.workingset_nodereclaim = g("workingset_nodereclaim");
    mem.pgrefill = g("pgrefill");
    mem.pgscan = g("pgscan");
    mem.pgsteal = g("pgsteal");
    mem.pgactivate = g("pgactivate");
    mem.pgdeactivate = g("pgdeactivate");
    mem.pglazyfree = g("pglazyfree");
    mem.pglazyfreed = g("pglazyfreed");
    mem.thp_fault_alloc = g("thp_fault_alloc");
    mem.thp_collapse_alloc = g("thp_collapse_alloc");
    mem.usage = single(&file("memory.current"), 0);
    mem.usage_limit = single(&file("memory.max"), u64::MAX);
    mem.max_usage = single(&file("memory.peak"), 0);
    mem.swap_usage = single(&file("memory.swap.current"), 0);
    mem.swap_limit = single(&file("memory.swap.max"), u64::MAX);
    m.memory = MessageField::some(mem);

    let events_text = file("memory.events");
    let e = flat_keyed(&events_text);
    let mut events = v2::MemoryEvents::new();
    events.low = e.get("low").copied().unwrap_or(0);
    events.high = e.get("high").copied().unwrap_or(0);
    events.max = e.get("max").copied().unwrap_or(0);
    events.oom = e.get("oom").copied().unwrap_or(0);
    events.oom_kill = e.get("oom_kill").copied().unwrap_or(0);
    m.memory_events = MessageField::some(events);

    let mut pids = v2::PidsStat::new();
    pids.current = single(&file("pids.current"), 0);
    pids.limit = single(&file("pids.max"), 0);
    m.pids = MessageField::some(pids);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files as a cgroup v2 kernel (6.x) writes them, trimmed.
    fn v2_files(name: &str) -> String {
        match name {
            "cpu.stat" => "usage_usec 51234\nuser_usec 40000\nsystem_usec 11234\nnr_periods 10\nnr_throttled 2\nthrottled_usec 900\nnr_bursts 0\nburst_usec 0\n",
            "memory.current" => "2211840\n",
            "memory.max" => "max\n",
            "memory.peak" => "4194304\n",
            "memory.swap.current" => "0\n",
            "memory.swap.max" => "max\n",
            "memory.stat" => "anon 1048576\nfile 987136\nkernel_stack 16384\nslab 120000\nshmem 0\ninactive_file 500000\nactive_file 487136\npgfault 1234\npgmajfault 3\n",
            "memory.events" => "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n",
            "pids.current" => "3\n",
            "pids.max" => "max\n",
            _ => "",
        }
        .to_string()
    }

    #[test]
    fn v2_metrics_from_recorded_files() {
        let m = v2_metrics(&v2_files);
        let cpu = m.cpu.unwrap();
        assert_eq!(
            (cpu.usage_usec, cpu.user_usec, cpu.system_usec, cpu.nr_throttled),
            (51234, 40000, 11234, 2)
        );
        let mem = m.memory.unwrap();
        assert_eq!((mem.usage, mem.usage_limit, mem.max_usage), (2211840, u64::MAX, 4194304));
        assert_eq!((mem.anon, mem.file, mem.inactive_file, mem.pgmajfault), (1048576, 987136, 500000, 3));
        let ev = m.memory_events.unwrap();
        assert_eq!((ev.max, ev.oom, ev.oom_kill), (5, 1, 1));
        let pids = m.pids.unwrap();
        assert_eq!((pids.current, pids.limit), (3, 0));
    }

    #[test]
    fn v1_metrics_from_recorded_files() {
        let files = |c: &str, f: &str| -> String {
            match (c, f) {
                ("cpuacct", "cpuacct.usage") => "123456789\n",
                ("cpuacct", "cpuacct.stat") => "user 5\nsystem 2\n",
                ("cpuacct", "cpuacct.usage_percpu") => "100 200 \n",
                ("cpu", "cpu.stat") => "nr_periods 4\nnr_throttled 1\nthrottled_time 77\n",
                ("memory", "memory.usage_in_bytes") => "3000000\n",
                ("memory", "memory.limit_in_bytes") => "9223372036854771712\n",
                ("memory", "memory.stat") => "cache 100\nrss 200\ntotal_inactive_file 50\ntotal_rss 200\n",
                ("pids", "pids.current") => "2\n",
                ("pids", "pids.max") => "max\n",
                _ => "",
            }
            .to_string()
        };
        let m = v1_metrics(&files);
        let cpu = m.cpu.unwrap();
        let usage = cpu.usage.unwrap();
        assert_eq!((usage.total, usage.user, usage.kernel), (123456789, 50_000_000, 20_000_000));
        assert_eq!(usage.per_cpu, vec![100, 200]);
        assert_eq!(cpu.throttling.unwrap().throttled_time, 77);
        let mem = m.memory.unwrap();
        assert_eq!((mem.cache, mem.rss, mem.total_inactive_file), (100, 200, 50));
        assert_eq!(mem.usage.unwrap().usage, 3_000_000);
        assert_eq!(m.pids.unwrap().current, 2);
    }
}
