//! What every function of a host shares, and how durations are logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fnrun_runner::runner::Runner;

use crate::metrics::FunctionMetrics;

/// `d` in whole milliseconds, for logs.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole microseconds, for logs.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What every function of a host shares.
pub struct Context {
    pub runner: Arc<Runner>,
    pub metrics: Arc<FunctionMetrics>,
    pub(crate) next_id: AtomicU64,
}

impl Context {
    pub(crate) fn next_instance_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}
