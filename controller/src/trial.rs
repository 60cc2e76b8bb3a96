//! Trial starts: when the host starts serving a function (added, or its
//! definition changed), its image is pulled and its server started once
//! before its revision's `RuntimeHealthy` turns True. A failed trial is
//! tried again after a backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fnrun_host::catalogue::FunctionDef;

use crate::status::Health;

/// Trial starts run at most this many at a time: each pulls an image and
/// starts a sandbox, and twenty at once (every Function at fnrun's start)
/// left the allocator holding their peak for good (docs/benchmarks.md).
pub(crate) const TRIALS_AT_ONCE: usize = 2;
/// A failed trial start is tried again after this, doubling up to the most.
const TRIAL_RETRY_FIRST: Duration = Duration::from_secs(10);
const TRIAL_RETRY_MOST: Duration = Duration::from_secs(300);

/// A function's runtime health, for the definition it was found with.
struct Trial {
    def: Arc<FunctionDef>,
    health: Health,
    failures: u32,
    retry_at: Option<Instant>,
}

/// The trials of the functions served, by Function name, and the permits
/// to run one ([`TRIALS_AT_ONCE`]).
pub(crate) struct Trials(Mutex<HashMap<String, Trial>>, Arc<tokio::sync::Semaphore>);

impl Default for Trials {
    fn default() -> Self {
        Trials(
            Mutex::default(),
            Arc::new(tokio::sync::Semaphore::new(TRIALS_AT_ONCE)),
        )
    }
}

impl Trials {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Trial>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a permit to run a trial; it is held until dropped.
    pub(crate) async fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.1.clone().acquire_owned().await.ok()
    }

    /// What the last trial of `name` found.
    pub(crate) fn health(&self, name: &str) -> Option<Health> {
        self.lock().get(name).map(|t| t.health.clone())
    }

    pub(crate) fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Records a trial of `def`, the function `name` as the host now serves
    /// it, begun after `failures` failed ones.
    pub(crate) fn begin(&self, name: &str, def: Arc<FunctionDef>, failures: u32) {
        self.lock().insert(
            name.to_owned(),
            Trial {
                def,
                health: Health::Starting,
                failures,
                retry_at: None,
            },
        );
    }

    /// Records the end of the trial of `def`; false if `name` is served
    /// otherwise since (that trial's result is the one that counts).
    pub(crate) fn end(
        &self,
        name: &str,
        def: &Arc<FunctionDef>,
        result: &Result<(), String>,
    ) -> bool {
        let mut trials = self.lock();
        let Some(trial) = trials.get_mut(name).filter(|t| Arc::ptr_eq(&t.def, def)) else {
            return false;
        };
        match result {
            Ok(()) => trial.health = Health::Healthy,
            Err(why) => {
                trial.health = Health::Unhealthy(why.clone());
                trial.failures = trial.failures.saturating_add(1);
                trial.retry_at = Some(
                    Instant::now() + backoff(TRIAL_RETRY_FIRST, TRIAL_RETRY_MOST, trial.failures),
                );
            }
        }
        true
    }

    /// The failures so far of a failed trial of `name` whose backoff is
    /// over: it is to be tried again.
    pub(crate) fn due(&self, name: &str) -> Option<u32> {
        self.lock()
            .get(name)
            .and_then(|t| match (&t.health, t.retry_at) {
                (Health::Unhealthy(_), Some(at)) if Instant::now() >= at => Some(t.failures),
                _ => None,
            })
    }
}

/// `first`, doubled for each failure after the first, at most `most`.
pub(crate) fn backoff(first: Duration, most: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_most() {
        let (first, most) = (Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(backoff(first, most, 0), first);
        assert_eq!(backoff(first, most, 1), first);
        assert_eq!(backoff(first, most, 2), Duration::from_secs(2));
        assert_eq!(backoff(first, most, 5), Duration::from_secs(16));
        assert_eq!(backoff(first, most, 40), most);
        assert_eq!(backoff(first, most, u32::MAX), most);
    }
}
