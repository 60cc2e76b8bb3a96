//! Metrics of the function host, rendered with the daemon's others
//! ([`fnrun_runner::metrics::Metrics`]): calls by function and gRPC code, instances
//! running, cold starts (and those from a spare), crashes, and start and call
//! durations.
//!
//! The call counter is the one labelled by function: a small map behind a
//! mutex, bounded by the catalogue (at most [`super::catalogue::MAX_FUNCTIONS`]
//! functions and 17 codes); a function's series go when it leaves the
//! catalogue. Calls that name no function of the catalogue count under
//! `function=""`. Kubernetes mode's reconciles are counted by Function too
//! (`fnrun_controller_reconciles_total`, only once there is one): bounded by
//! the Functions installed, a Function's series goes when it is deleted.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use tonic::Code;

use fnrun_runner::metrics::Histogram;

#[derive(Debug, Default)]
pub struct FunctionMetrics {
    calls: Mutex<BTreeMap<(String, i32), u64>>,
    /// Instances that became ready.
    pub cold_starts: AtomicU64,
    /// Of those, the ones that started in a spare made ahead.
    pub spare_starts: AtomicU64,
    /// Instances that ended without being stopped, or failed to start.
    pub crashes: AtomicU64,
    /// Instances running now.
    pub instances: AtomicI64,
    /// From the start of an instance (image cached) to its first gRPC answer.
    pub start_duration: Histogram,
    /// From a call's arrival to its answer.
    pub call_duration: Histogram,
    /// Certificates minted for server names no function answers to
    /// ([`crate::tls::SniResolver`]).
    pub unknown_name_mints: AtomicU64,
    /// Kubernetes mode's reconciles, by Function (none in file mode).
    reconciles: Mutex<BTreeMap<String, u64>>,
}

impl FunctionMetrics {
    /// Counts a call to `function` that ended with `code`.
    pub fn call(&self, function: &str, code: Code, elapsed: std::time::Duration) {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *calls.entry((function.to_owned(), code as i32)).or_default() += 1;
        drop(calls);
        self.call_duration.observe(elapsed);
    }

    /// Forgets the series of functions not in `names` (and keeps `""`).
    pub fn retain(&self, names: &[&str]) {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(f, _), _| f.is_empty() || names.contains(&f.as_str()));
    }

    /// Counts a reconcile of the Function `function` (Kubernetes mode).
    pub fn reconciled(&self, function: &str) {
        *self
            .reconciles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(function.to_owned())
            .or_default() += 1;
    }

    /// Forgets the reconciles of the Function `function`, deleted.
    pub fn forget_reconciles(&self, function: &str) {
        self.reconciles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(function);
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP fnrun_function_calls_total Calls to Crossplane functions by function and gRPC code.\n# TYPE fnrun_function_calls_total counter"
        );
        let calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for ((function, code), n) in calls {
            let _ = writeln!(
                out,
                "fnrun_function_calls_total{{function=\"{function}\",code=\"{}\"}} {n}",
                code_name(Code::from_i32(code))
            );
        }
        let _ = writeln!(
            out,
            "# HELP fnrun_function_instances Crossplane function servers running.\n# TYPE fnrun_function_instances gauge\nfnrun_function_instances {}",
            self.instances.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fnrun_function_cold_starts_total Crossplane function servers started and ready.\n# TYPE fnrun_function_cold_starts_total counter\nfnrun_function_cold_starts_total {}",
            self.cold_starts.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fnrun_function_spare_starts_total Crossplane function servers that started in a sandbox made ahead.\n# TYPE fnrun_function_spare_starts_total counter\nfnrun_function_spare_starts_total {}",
            self.spare_starts.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fnrun_function_crashes_total Crossplane function servers that ended unasked or failed to start.\n# TYPE fnrun_function_crashes_total counter\nfnrun_function_crashes_total {}",
            self.crashes.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP fnrun_tls_unknown_name_certificates_minted_total Server certificates minted for names no Crossplane function answers to.\n# TYPE fnrun_tls_unknown_name_certificates_minted_total counter\nfnrun_tls_unknown_name_certificates_minted_total {}",
            self.unknown_name_mints.load(Relaxed)
        );
        let reconciles = self
            .reconciles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if !reconciles.is_empty() {
            let _ = writeln!(
                out,
                "# HELP fnrun_controller_reconciles_total Reconciles of each Crossplane Function (Kubernetes mode).\n# TYPE fnrun_controller_reconciles_total counter"
            );
            for (function, n) in reconciles {
                let _ = writeln!(
                    out,
                    "fnrun_controller_reconciles_total{{function=\"{function}\"}} {n}"
                );
            }
        }
        self.start_duration.render(
            out,
            "fnrun_function_start_duration_seconds",
            "Time from starting a function server (image cached) to its first gRPC answer.",
        );
        self.call_duration.render(
            out,
            "fnrun_function_call_duration_seconds",
            "Time from a call's arrival at the function host to its answer.",
        );
    }
}

/// The gRPC name of a code, as in `grpc-go`'s `codes.Code.String()` upper-cased.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_metric_moves_with_its_event() {
        let m = FunctionMetrics::default();
        let before = {
            let mut s = String::new();
            m.render(&mut s);
            s
        };
        m.call("fn-a", Code::Ok, Duration::from_millis(1));
        m.call("fn-a", Code::Ok, Duration::from_millis(1));
        m.call("", Code::NotFound, Duration::from_millis(1));
        m.cold_starts.fetch_add(1, Relaxed);
        m.spare_starts.fetch_add(1, Relaxed);
        m.crashes.fetch_add(1, Relaxed);
        m.instances.fetch_add(1, Relaxed);
        m.unknown_name_mints.fetch_add(1, Relaxed);
        m.start_duration.observe(Duration::from_millis(20));
        let mut out = String::new();
        m.render(&mut out);
        assert_ne!(before, out);
        for line in [
            "fnrun_function_calls_total{function=\"fn-a\",code=\"OK\"} 2",
            "fnrun_function_calls_total{function=\"\",code=\"NOT_FOUND\"} 1",
            "fnrun_function_instances 1",
            "fnrun_function_cold_starts_total 1",
            "fnrun_function_spare_starts_total 1",
            "fnrun_function_crashes_total 1",
            "fnrun_tls_unknown_name_certificates_minted_total 1",
            "fnrun_function_start_duration_seconds_count 1",
            "fnrun_function_call_duration_seconds_count 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
        }
        m.retain(&["fn-b"]);
        let mut out = String::new();
        m.render(&mut out);
        assert!(!out.contains("function=\"fn-a\""), "{out}");
        assert!(out.contains("function=\"\""), "{out}");
    }
}
