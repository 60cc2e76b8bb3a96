//! Prometheus metrics: plain atomic counters and fixed-bucket histograms in
//! one struct, shared by reference (no global registry, no lock on the hot
//! path), rendered in the text exposition format at `/metrics`.
//!
//! Written by hand rather than with a metrics crate: the set is small and
//! fixed, updates are single atomic adds, the exposition is the text format
//! (0.0.4) operators already scrape, and the test below checks that every
//! metric moves when its event happens. `prometheus-client` was measured and
//! was no cheaper (docs/design.md). The other parts (the function host, TLS
//! listeners) count their own and use [`Histogram`]; `fnrun serve` renders
//! them together.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Run outcomes, as the `outcome` label of `fnrun_runs_total`.
pub const OUTCOMES: [&str; 10] = [
    "ok",
    "invalid_request",
    "image_error",
    "sandbox_error",
    "function_failed",
    "timeout",
    "out_of_memory",
    "output_too_large",
    "invalid_output",
    "rejected",
];

const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram with fixed buckets (seconds).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Every metric fnrun exports.
#[derive(Debug, Default)]
pub struct Metrics {
    runs: [AtomicU64; OUTCOMES.len()],
    pub run_duration: Histogram,
    pub queue_wait: Histogram,
    pub pulls_ok: AtomicU64,
    pub pulls_failed: AtomicU64,
    pub pull_duration: Histogram,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub in_flight: AtomicI64,
    pub queued: AtomicI64,
    /// Sandboxes made ahead of their calls, ready or in the making, and the
    /// function host's spares ([`crate::pool::Place`]).
    pub pool_sandboxes: AtomicI64,
    /// Memory the pool's sandboxes hold (measured once ready, estimated
    /// while made).
    pub pool_memory_bytes: AtomicI64,
    /// Calls that ran on a sandbox of the pool.
    pub pool_hits: AtomicU64,
    /// Calls of a kind the pool serves that found none ready.
    pub pool_misses: AtomicU64,
}

impl Metrics {
    /// Counts a finished run by outcome (one of [`OUTCOMES`]).
    pub fn run_finished(&self, outcome: &str, d: Duration) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.runs[i].fetch_add(1, Relaxed);
        }
        self.run_duration.observe(d);
    }

    /// The text exposition format; `cache_bytes` is measured by the caller.
    pub fn render(&self, cache_bytes: u64) -> String {
        let mut out = String::with_capacity(4096);
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let _ = writeln!(
            out,
            "# HELP fnrun_runs_total Function runs by outcome.\n# TYPE fnrun_runs_total counter"
        );
        for (o, n) in OUTCOMES.iter().zip(&self.runs) {
            let _ = writeln!(
                out,
                "fnrun_runs_total{{outcome=\"{o}\"}} {}",
                n.load(Relaxed)
            );
        }
        self.run_duration.render(
            &mut out,
            "fnrun_run_duration_seconds",
            "Time from admission to the end of a run.",
        );
        self.queue_wait.render(
            &mut out,
            "fnrun_queue_wait_seconds",
            "Time a call waited for a run slot.",
        );
        let _ = writeln!(
            out,
            "# HELP fnrun_pulls_total Image pulls from registries by result.\n# TYPE fnrun_pulls_total counter"
        );
        let _ = writeln!(
            out,
            "fnrun_pulls_total{{result=\"ok\"}} {}\nfnrun_pulls_total{{result=\"error\"}} {}",
            self.pulls_ok.load(Relaxed),
            self.pulls_failed.load(Relaxed)
        );
        self.pull_duration.render(
            &mut out,
            "fnrun_pull_duration_seconds",
            "Time to resolve and fetch an image from a registry.",
        );
        counter(
            &mut out,
            "fnrun_cache_hits_total",
            "Images served from the cache without a registry.",
            self.cache_hits.load(Relaxed),
        );
        counter(
            &mut out,
            "fnrun_cache_misses_total",
            "Images that had to be pulled.",
            self.cache_misses.load(Relaxed),
        );
        gauge(
            &mut out,
            "fnrun_cache_bytes",
            "Bytes of blobs and unpacked layers in the cache.",
            i64::try_from(cache_bytes).unwrap_or(i64::MAX),
        );
        gauge(
            &mut out,
            "fnrun_runs_in_flight",
            "Runs executing now.",
            self.in_flight.load(Relaxed),
        );
        gauge(
            &mut out,
            "fnrun_queue_depth",
            "Calls waiting for a run slot.",
            self.queued.load(Relaxed),
        );
        gauge(
            &mut out,
            "fnrun_sandbox_pool_sandboxes",
            "Sandboxes made ahead of their calls or of function servers' starts (--sandbox-pool), ready or in the making.",
            self.pool_sandboxes.load(Relaxed),
        );
        gauge(
            &mut out,
            "fnrun_sandbox_pool_memory_bytes",
            "Memory the sandboxes made ahead hold: each measured once ready (its cgroup's peak, else its init's PSS), estimated while made.",
            self.pool_memory_bytes.load(Relaxed),
        );
        counter(
            &mut out,
            "fnrun_sandbox_pool_hits_total",
            "Calls that ran in a sandbox made ahead of them.",
            self.pool_hits.load(Relaxed),
        );
        counter(
            &mut out,
            "fnrun_sandbox_pool_misses_total",
            "Calls that found no sandbox of their kind ready and made their own.",
            self.pool_misses.load(Relaxed),
        );
        out
    }
}

/// Sums the bytes of files under `dir` (blobs and unpacked layers).
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, line_prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .unwrap_or_else(|| panic!("{line_prefix} missing:\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Every metric moves when its event happens, and all names are prefixed.
    #[test]
    fn every_metric_moves_with_its_event() {
        let m = Metrics::default();
        let before = m.render(0);
        m.run_finished("ok", Duration::from_millis(3));
        m.run_finished("timeout", Duration::from_secs(2));
        m.queue_wait.observe(Duration::from_millis(1));
        m.pulls_ok.fetch_add(1, Relaxed);
        m.pulls_failed.fetch_add(1, Relaxed);
        m.pull_duration.observe(Duration::from_millis(40));
        m.cache_hits.fetch_add(1, Relaxed);
        m.cache_misses.fetch_add(1, Relaxed);
        m.in_flight.fetch_add(1, Relaxed);
        m.queued.fetch_add(2, Relaxed);
        m.pool_sandboxes.fetch_add(3, Relaxed);
        m.pool_memory_bytes.fetch_add(3 << 20, Relaxed);
        m.pool_hits.fetch_add(1, Relaxed);
        m.pool_misses.fetch_add(1, Relaxed);
        let after = m.render(1234);
        for series in [
            "fnrun_runs_total{outcome=\"ok\"}",
            "fnrun_runs_total{outcome=\"timeout\"}",
            "fnrun_run_duration_seconds_count",
            "fnrun_queue_wait_seconds_count",
            "fnrun_pulls_total{result=\"ok\"}",
            "fnrun_pulls_total{result=\"error\"}",
            "fnrun_pull_duration_seconds_count",
            "fnrun_cache_hits_total",
            "fnrun_cache_misses_total",
            "fnrun_cache_bytes",
            "fnrun_runs_in_flight",
            "fnrun_queue_depth",
            "fnrun_sandbox_pool_sandboxes",
            "fnrun_sandbox_pool_memory_bytes",
            "fnrun_sandbox_pool_hits_total",
            "fnrun_sandbox_pool_misses_total",
        ] {
            let prefix = format!("{series} ");
            assert!(
                value(&after, &prefix) > value(&before, &prefix),
                "{series} did not move"
            );
        }
        assert_eq!(
            value(&after, "fnrun_run_duration_seconds_bucket{le=\"0.005\"} "),
            1.0
        );
        assert_eq!(
            value(&after, "fnrun_run_duration_seconds_bucket{le=\"+Inf\"} "),
            2.0
        );
        for l in after.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.starts_with("fnrun_"), "{l}");
        }
    }
}
