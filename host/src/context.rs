//! What every function of a host shares, and how durations are logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// A trim of malloc's free memory is scheduled ([`Context::trim_memory_soon`]).
    pub(crate) trim_pending: AtomicBool,
}

/// How long after a server stops the memory malloc keeps free is given
/// back: stops come in bursts (idle timeouts after trial starts), and one
/// trim serves a burst.
const TRIM_AFTER: Duration = Duration::from_secs(5);

impl Context {
    pub(crate) fn next_instance_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// After a server stopped: [`TRIM_AFTER`] later, gives back to the
    /// kernel the memory malloc keeps free in every arena. glibc keeps what
    /// a burst of pulls and starts freed: 12 MiB after Kubernetes mode's 20
    /// trial starts (docs/benchmarks.md), held by an idle daemon. At most one
    /// trim is pending; it runs off the runtime's threads.
    pub(crate) fn trim_memory_soon(self: &Arc<Self>) {
        if self.trim_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(TRIM_AFTER).await;
            this.trim_pending.store(false, Ordering::Release);
            let _ = tokio::task::spawn_blocking(trim_malloc).await;
        });
    }
}

/// `malloc_trim(0)`: every arena's free pages back to the kernel.
#[cfg(target_env = "gnu")]
fn trim_malloc() {
    // SAFETY: malloc_trim takes no pointer; it walks malloc's own arenas
    // under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other C libraries have no `malloc_trim`.
#[cfg(not(target_env = "gnu"))]
fn trim_malloc() {}
