//! Whether the daemon can serve what it is asked for yet: what `GET /readyz`
//! on the metrics listener answers ([`crate::metrics_http`]), for a
//! Kubernetes readiness probe. A daemon starts not ready; it is ready once
//! every listener is bound, and in Kubernetes mode once the controller has
//! read the API (the catalogue and the CA) and minted the certificates; it
//! is not ready again, for good, from the start of its shutdown
//! ([`Readiness::stop`]).

use std::sync::RwLock;

/// Ready, or not and why; each change is logged once.
#[derive(Debug)]
pub struct Readiness {
    state: RwLock<Result<(), String>>,
    /// Shutting down: not ready for good, whatever is said after.
    stopping: std::sync::atomic::AtomicBool,
}

impl Readiness {
    /// Not ready, because of `why`.
    pub fn new(why: impl Into<String>) -> Readiness {
        Readiness {
            state: RwLock::new(Err(why.into())),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Not ready from now on: the daemon shuts down.
    pub fn stop(&self) {
        self.not_ready("shutting down");
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Ready, or not and why.
    pub fn get(&self) -> Result<(), String> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether it is ready.
    pub fn is_ready(&self) -> bool {
        self.get().is_ok()
    }

    /// Makes it ready (unless it is stopping).
    pub fn ready(&self) {
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut state = self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.is_err() {
            tracing::info!("ready: serving");
            *state = Ok(());
        }
    }

    /// Makes it not ready, because of `why` (`waiting for the API server`:
    /// the log says `not ready: waiting for the API server`).
    pub fn not_ready(&self, why: impl Into<String>) {
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let why = why.into();
        let mut state = self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.as_ref().err() != Some(&why) {
            tracing::info!("not ready: {why}");
            *state = Err(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_starts_not_ready_and_says_why() {
        let r = Readiness::new("starting");
        assert_eq!(r.get(), Err("starting".to_owned()));
        r.not_ready("waiting for the API server");
        assert_eq!(r.get(), Err("waiting for the API server".to_owned()));
        assert!(!r.is_ready());
        r.ready();
        assert!(r.is_ready());
        r.stop();
        assert_eq!(r.get(), Err("shutting down".to_owned()));
        // Whatever is said after: a controller still running meanwhile.
        r.ready();
        r.not_ready("waiting for the API server");
        assert_eq!(r.get(), Err("shutting down".to_owned()));
    }
}
