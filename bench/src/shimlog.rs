//! Where a container start goes on corral's side, read from its debug lines (the server logs
//! every RPC's duration, and Task.Create the runtime's share of it): containerd's runc shim logs
//! no such split, so the baseline has none.

use crate::measure::percentile;

/// Per container start: Task.Create, the OCI runtime's create within it, and Task.Start (ms).
#[derive(Default)]
pub struct StartSplit {
    pub create: Vec<f64>,
    pub runtime: Vec<f64>,
    pub start: Vec<f64>,
}

impl StartSplit {
    /// Collects the figures of containers `ids` from the shim's log text.
    pub fn from_log(text: &str, ids: &[String]) -> StartSplit {
        let mut split = StartSplit::default();
        for line in text.lines() {
            let Some(id) = ids.iter().find(|id| line.contains(id.as_str())) else {
                continue;
            };
            if line.contains(&format!("created container={id}")) {
                split.runtime.extend(field(line, "runtime_ms"));
            } else if line.contains(&format!("id=\"{id}\"")) && line.contains(" ok ") {
                if line.contains("rpc=\"Create\"") {
                    split.create.extend(field(line, "elapsed_ms"));
                } else if line.contains("rpc=\"Start\"") {
                    split.start.extend(field(line, "elapsed_ms"));
                }
            }
        }
        split
    }

    /// p50 of each, or None when the log held none (the baseline, or no debug lines).
    pub fn medians(&self) -> Option<(f64, f64, f64)> {
        let p50 = |v: &Vec<f64>| (!v.is_empty()).then(|| percentile(v, 50.0));
        Some((p50(&self.create)?, p50(&self.runtime)?, p50(&self.start)?))
    }
}

/// The number after `name=` in a tracing line.
fn field(line: &str, name: &str) -> Option<f64> {
    let rest = &line[line.find(&format!("{name}="))? + name.len() + 1..];
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_split_of_the_named_containers_only() {
        let log = "\
2026-12-01T21:46:28.599207Z DEBUG created container=c1 spec_ms=0.49 rootfs_ms=0.42 runtime_ms=37.5
2026-12-01T21:46:28.600313Z DEBUG ok rpc=\"Create\" id=\"c1\" elapsed_ms=40.0
2026-12-01T21:46:28.602427Z DEBUG ok rpc=\"Start\" id=\"c1\" elapsed_ms=0.35
2026-12-01T21:46:28.700313Z DEBUG ok rpc=\"Create\" id=\"other\" elapsed_ms=99.0
2026-12-01T21:46:28.702427Z DEBUG request rpc=\"Start\" id=\"c1\"
";
        let split = StartSplit::from_log(log, &["c1".to_string()]);
        assert_eq!((split.create, split.runtime, split.start), (vec![40.0], vec![37.5], vec![0.35]));
        assert!(StartSplit::from_log(log, &["none".to_string()]).medians().is_none());
    }
}
