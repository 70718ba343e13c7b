//! The bench's output: a table with each corral handler's ratio to the pause sandbox, JSON, and
//! an SVG chart of the ratios.

use serde_json::json;

use crate::measure::percentile;

/// (p50, p95, min, max)
pub type Stats = (f64, f64, f64, f64);

/// One figure for every handler (in [`Report::handlers`] order; the last is the baseline).
/// Latencies carry a distribution; single values have p50 only.
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub stats: Vec<Stats>,
    pub distribution: bool,
}

impl Figure {
    pub fn single(name: &str, unit: &str, values: &[f64]) -> Figure {
        Figure {
            name: name.into(),
            unit: unit.into(),
            stats: values.iter().map(|v| (*v, *v, *v, *v)).collect(),
            distribution: false,
        }
    }

    /// Handler `k`'s p50 over the baseline's.
    pub fn ratio(&self, k: usize) -> f64 {
        let base = self.stats.last().map_or(0.0, |s| s.0);
        if base == 0.0 {
            return f64::NAN;
        }
        self.stats[k].0 / base
    }
}

pub struct Report {
    pub pods: usize,
    /// Column names: the corral handlers, then the baseline.
    pub handlers: Vec<String>,
    pub load_before: f64,
    pub load_after: String,
    pub figures: Vec<Figure>,
}

impl Report {
    pub fn new(pods: usize, handlers: &[&str], load_before: f64) -> Report {
        Report {
            pods,
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
            load_before,
            load_after: String::new(),
            figures: Vec::new(),
        }
    }

    pub fn push(&mut self, f: Figure) {
        self.figures.push(f);
    }

    pub fn latency(&mut self, name: &str, unit: &str, samples: &[Vec<f64>]) {
        let stat = |v: &Vec<f64>| {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            (percentile(v, 50.0), percentile(v, 95.0), min, max)
        };
        self.figures.push(Figure {
            name: name.into(),
            unit: unit.into(),
            stats: samples.iter().map(stat).collect(),
            distribution: true,
        });
    }

    fn compared(&self) -> usize {
        self.handlers.len() - 1
    }

    pub fn table(&self) -> String {
        let base = self.handlers.last().map_or("baseline", String::as_str);
        let mut out = format!(
            "corral handlers vs containerd's pause sandbox ({base}), {} pods per handler; load before {:.2}, after {}\n",
            self.pods,
            self.load_before,
            self.load_after.split_whitespace().next().unwrap_or("?")
        );
        out.push_str(&format!("{:<38}", "figure"));
        for h in &self.handlers {
            out.push_str(&format!(" {:>27}", format!("{h} p50 (p95) [min-max]")));
        }
        for h in &self.handlers[..self.compared()] {
            out.push_str(&format!(" {:>12}", format!("{h}/{base}")));
        }
        out.push('\n');
        for f in &self.figures {
            let cell = |s: &Stats| {
                if f.distribution {
                    format!("{:.1} ({:.1}) [{:.1}-{:.1}]", s.0, s.1, s.2, s.3)
                } else {
                    format!("{:.2}", s.0)
                }
            };
            out.push_str(&format!("{:<38}", format!("{} ({})", f.name, f.unit)));
            for s in &f.stats {
                out.push_str(&format!(" {:>27}", cell(s)));
            }
            for k in 0..self.compared() {
                out.push_str(&format!(" {:>12.2}", f.ratio(k)));
            }
            out.push('\n');
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let figures: Vec<_> = self
            .figures
            .iter()
            .map(|f| {
                let s = |s: &Stats| json!({"p50": s.0, "p95": s.1, "min": s.2, "max": s.3});
                let values: serde_json::Map<_, _> =
                    self.handlers.iter().zip(&f.stats).map(|(h, st)| (h.clone(), s(st))).collect();
                let ratios: serde_json::Map<_, _> =
                    (0..self.compared()).map(|k| (self.handlers[k].clone(), json!(f.ratio(k)))).collect();
                json!({"name": f.name, "unit": f.unit, "values": values, "ratio_to_baseline": ratios})
            })
            .collect();
        json!({
            "pods_per_handler": self.pods,
            "handlers": self.handlers,
            "load_before": self.load_before,
            "load_after": self.load_after.trim(),
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()},
            "figures": figures,
        })
    }

    /// Horizontal bars: each corral handler / baseline per figure (log scale), a line at 1.
    pub fn svg(&self) -> String {
        let bars = self.compared();
        let row = 14.0 + 20.0 * bars as f64;
        let (left, width) = (290.0, 420.0);
        let height = 80.0 + row * self.figures.len() as f64;
        // log2 scale from 1/32 to 2.
        let x = |r: f64| left + width * ((r.clamp(1.0 / 32.0, 2.0).log2() + 5.0) / 6.0);
        let colors = ["#2a9d8f", "#264653", "#8ab17d"];
        let mut s = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="760" height="{height}" font-family="sans-serif" font-size="13">
<text x="10" y="22" font-size="15">corral / pause sandbox (lower is better, log scale), {} pods per handler</text>
"#,
            self.pods
        );
        for (k, h) in self.handlers[..bars].iter().enumerate() {
            s.push_str(&format!(
                r#"<rect x="{}" y="32" width="12" height="12" fill="{}"/><text x="{}" y="43">{}</text>
"#,
                10.0 + 150.0 * k as f64,
                colors[k % colors.len()],
                26.0 + 150.0 * k as f64,
                xml(h)
            ));
        }
        for (i, f) in self.figures.iter().enumerate() {
            let y = 56.0 + row * i as f64;
            s.push_str(&format!(r#"<text x="10" y="{}">{}</text>"#, y + 15.0, xml(&f.name)));
            for k in 0..bars {
                let (r, yb) = (f.ratio(k), y + 20.0 * k as f64);
                let color = if r <= 1.0 { colors[k % colors.len()] } else { "#e76f51" };
                s.push_str(&format!(
                    r#"<rect x="{left}" y="{yb}" width="{:.1}" height="16" fill="{color}"/><text x="{:.1}" y="{}">{:.2}x</text>"#,
                    (x(r) - left).max(1.0),
                    x(r) + 4.0,
                    yb + 13.0,
                    r
                ));
            }
            s.push('\n');
        }
        let one = x(1.0);
        s.push_str(&format!(
            r#"<line x1="{one}" y1="50" x2="{one}" y2="{}" stroke="black" stroke-dasharray="4"/><text x="{}" y="{}">1x</text>
</svg>
"#,
            height - 10.0,
            one - 8.0,
            height - 2.0
        ));
        s
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
