//! The bench's output: a table with corral/baseline ratios, JSON, and an SVG chart of the ratios.

use serde_json::json;

use crate::measure::percentile;

/// One figure for both handlers. Latencies carry a distribution; single values have p50 only.
pub struct Figure {
    pub name: String,
    pub unit: String,
    /// [corral, baseline]: (p50, p95, min, max)
    pub stats: [(f64, f64, f64, f64); 2],
    pub distribution: bool,
}

impl Figure {
    pub fn single(name: &str, unit: &str, corral: f64, baseline: f64) -> Figure {
        Figure {
            name: name.into(),
            unit: unit.into(),
            stats: [(corral, corral, corral, corral), (baseline, baseline, baseline, baseline)],
            distribution: false,
        }
    }

    pub fn ratio(&self) -> f64 {
        if self.stats[1].0 == 0.0 {
            return f64::NAN;
        }
        self.stats[0].0 / self.stats[1].0
    }
}

pub struct Report {
    pub pods: usize,
    pub load_before: f64,
    pub load_after: String,
    pub figures: Vec<Figure>,
}

impl Report {
    pub fn new(pods: usize, load_before: f64) -> Report {
        Report { pods, load_before, load_after: String::new(), figures: Vec::new() }
    }

    pub fn push(&mut self, f: Figure) {
        self.figures.push(f);
    }

    pub fn latency(&mut self, name: &str, unit: &str, samples: &[Vec<f64>; 2]) {
        let stat = |v: &Vec<f64>| {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            (percentile(v, 50.0), percentile(v, 95.0), min, max)
        };
        self.figures.push(Figure {
            name: name.into(),
            unit: unit.into(),
            stats: [stat(&samples[0]), stat(&samples[1])],
            distribution: true,
        });
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "corral vs containerd pause sandbox ({} pods per handler; load before {:.2}, after {})\n",
            self.pods,
            self.load_before,
            self.load_after.split_whitespace().next().unwrap_or("?")
        );
        out.push_str(&format!(
            "{:<34} {:>26} {:>26} {:>8}\n",
            "figure", "corral p50 (p95) [min-max]", "pause p50 (p95) [min-max]", "ratio"
        ));
        for f in &self.figures {
            let cell = |s: (f64, f64, f64, f64)| {
                if f.distribution {
                    format!("{:.1} ({:.1}) [{:.1}-{:.1}]", s.0, s.1, s.2, s.3)
                } else {
                    format!("{:.2}", s.0)
                }
            };
            out.push_str(&format!(
                "{:<34} {:>26} {:>26} {:>8.2}\n",
                format!("{} ({})", f.name, f.unit),
                cell(f.stats[0]),
                cell(f.stats[1]),
                f.ratio()
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let figures: Vec<_> = self
            .figures
            .iter()
            .map(|f| {
                let s = |s: (f64, f64, f64, f64)| json!({"p50": s.0, "p95": s.1, "min": s.2, "max": s.3});
                json!({"name": f.name, "unit": f.unit, "corral": s(f.stats[0]), "pause": s(f.stats[1]), "ratio": f.ratio()})
            })
            .collect();
        json!({
            "pods_per_handler": self.pods,
            "load_before": self.load_before,
            "load_after": self.load_after.trim(),
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()},
            "figures": figures,
        })
    }

    /// Horizontal bars: corral / baseline per figure (log scale), a line at 1.
    pub fn svg(&self) -> String {
        let row = 34.0;
        let (left, width) = (290.0, 420.0);
        let height = 60.0 + row * self.figures.len() as f64;
        // log2 scale from 1/32 to 2.
        let x = |r: f64| left + width * ((r.clamp(1.0 / 32.0, 2.0).log2() + 5.0) / 6.0);
        let mut s = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="760" height="{height}" font-family="sans-serif" font-size="13">
<text x="10" y="22" font-size="15">corral / pause sandbox (lower is better, log scale), {} pods per handler</text>
"#,
            self.pods
        );
        for (i, f) in self.figures.iter().enumerate() {
            let y = 40.0 + row * i as f64;
            let r = f.ratio();
            let color = if r <= 1.0 { "#2a9d8f" } else { "#e76f51" };
            s.push_str(&format!(
                r#"<text x="10" y="{}">{}</text><rect x="{left}" y="{y}" width="{:.1}" height="20" fill="{color}"/><text x="{:.1}" y="{}">{:.2}x</text>
"#,
                y + 15.0,
                xml(&f.name),
                (x(r) - left).max(1.0),
                x(r) + 4.0,
                y + 15.0,
                r
            ));
        }
        let one = x(1.0);
        s.push_str(&format!(
            r#"<line x1="{one}" y1="32" x2="{one}" y2="{}" stroke="black" stroke-dasharray="4"/><text x="{}" y="{}">1x</text>
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
