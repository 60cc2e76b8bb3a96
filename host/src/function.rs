//! One function of the catalogue, as one definition: its admission (at most
//! `maxConcurrency` calls at once and as many waiting) and, in server mode,
//! the life of its one warm instance:
//!
//! ```text
//! Stopped --call--> Starting --ready--> Running --idle past idleTimeout--> Stopped
//!    ^                 |                   |      (or retired, last call ended)
//!    |                 +--failed-----------+--ended unasked (crash, OOM)--> Stopped
//!    +-- next call, after a backoff once failures repeat (1s, 2s, ... 30s)
//! ```
//!
//! An instance stopped for idleness leaves a spare behind (when the
//! daemon's sandbox pool has room): a sandbox made ahead for the next
//! instance ([`Spare`]), which that instance's start takes, so
//! that a cold start costs about the server's own start. A spare not taken
//! within another `idleTimeout` (10 s at least), or whose function is
//! retired, is ended.
//!
//! Every call that finds the function starting waits for the same start
//! (single flight); the start runs in its own task, so a caller that gives up
//! does not abandon it. A supervisor task per instance watches its end, its
//! idle time, and its retirement (the catalogue replaced or removed the
//! definition, or the host is stopping): then the instance stops once its
//! last call has ended. A definition that changes is a new `Function`: new
//! calls go to it while the old one drains.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::Shared;
use tokio::sync::{Notify, Semaphore, SemaphorePermit, oneshot};
use tonic::Response;
use tonic::metadata::MetadataMap;

use super::catalogue::{FunctionDef, Mode};
use super::error::{CallError, HostError, Phase};
use super::instance::{self, Api, Instance};
use crate::context::Context;
use fnrun_runner::error::RunError;
use fnrun_runner::{ServiceKind, Spare};

/// A function's instance ran this long: its failures are forgotten.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// The longest wait before a failing function is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a call whose connection broke waits to learn how the server ended.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// How long a stopped instance may take to be cleaned up before it is logged.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How close to its deadline a call whose stream broke counts as one that
/// ran out of time (the server enforced the same deadline).
const DEADLINE_SLACK: Duration = Duration::from_millis(50);

type StartResult = Result<Arc<Instance>, Arc<HostError>>;
type StartWait = Shared<oneshot::Receiver<StartResult>>;

/// Who reports a server that did not start.
#[derive(Clone, Copy)]
enum Report {
    /// The log: the daemon's record of what its callers were told.
    Log,
    /// The caller, whose own error line it is (`function serve`, `call`).
    Caller,
}

enum State {
    Stopped,
    Starting(StartWait),
    Running(Arc<Instance>),
}

struct Inner {
    state: State,
    /// Calls admitted or waiting.
    calls: usize,
    last_call_end: Instant,
    /// Replaced, removed, or the host is stopping: stop when idle, now.
    retired: bool,
    /// Failed starts and crashes in a row.
    failures: u32,
    /// After repeated failures: no start before this, and the last failure.
    retry: Option<(Instant, Arc<HostError>)>,
    /// A sandbox made ahead for the next instance, while stopped.
    spare: Option<Spare>,
}

pub struct Function {
    pub def: Arc<FunctionDef>,
    ctx: Arc<Context>,
    slots: Semaphore,
    waiting: AtomicUsize,
    inner: Mutex<Inner>,
    /// A call ended, or the function was retired: the supervisor looks again.
    changed: Notify,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function").field("def", &self.def).finish()
    }
}

/// Holds a call in the function's count until dropped.
struct CallGuard<'a>(&'a Function);

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.calls -= 1;
        inner.last_call_end = Instant::now();
        drop(inner);
        self.0.changed.notify_one();
    }
}

impl Function {
    pub fn new(def: Arc<FunctionDef>, ctx: Arc<Context>) -> Arc<Function> {
        Arc::new(Function {
            slots: Semaphore::new(def.max_concurrency),
            def,
            ctx,
            waiting: AtomicUsize::new(0),
            inner: Mutex::new(Inner {
                state: State::Stopped,
                calls: 0,
                last_call_end: Instant::now(),
                retired: false,
                failures: 0,
                retry: None,
                spare: None,
            }),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the instance once no call is in flight, and any later one too.
    pub fn retire(&self) {
        let spare = {
            let mut inner = self.lock();
            inner.retired = true;
            inner.spare.take()
        };
        self.changed.notify_one();
        self.end_spare(spare);
    }

    /// Ends a spare off the caller's path.
    fn end_spare(&self, spare: Option<Spare>) {
        if let Some(spare) = spare {
            spare.end_in_background();
        }
    }

    /// Makes a spare for the next instance from what the stopped one ran,
    /// and keeps it while the function stays stopped, for at most its
    /// `idleTimeout` again, and at least as long as the sandbox pool keeps
    /// the sandboxes of a kind of run not called ([`fnrun_runner::pool::IDLE`]).
    async fn make_spare(self: Arc<Self>, kind: ServiceKind) {
        let Some(idle) = self.def.idle_timeout else {
            return;
        };
        let keep = idle.max(fnrun_runner::pool::IDLE);
        let Some(spare) = self.ctx.runner.make_spare(kind).await else {
            return;
        };
        let (made, made_by) = (spare.made, spare.pid());
        let unwanted = {
            let mut inner = self.lock();
            if matches!(inner.state, State::Stopped) && !inner.retired && inner.spare.is_none() {
                inner.spare = Some(spare);
                None
            } else {
                Some(spare)
            }
        };
        if unwanted.is_some() {
            self.end_spare(unwanted);
            return;
        }
        tracing::info!(
            function = self.def.name,
            init = made_by,
            "function server's sandbox made ahead"
        );
        tokio::time::sleep(keep).await;
        let expired = {
            let mut inner = self.lock();
            if inner.spare.as_ref().is_some_and(|s| s.made == made) {
                inner.spare.take()
            } else {
                None
            }
        };
        if expired.is_some() {
            tracing::info!(
                function = self.def.name,
                init = made_by,
                "function server's sandbox ended unused"
            );
        }
        self.end_spare(expired);
    }

    /// Whether an instance is running or starting.
    pub fn is_up(&self) -> bool {
        !matches!(self.lock().state, State::Stopped)
    }

    /// Gets ready now rather than at the first call: starts the server
    /// (server mode) or fetches the image (FunctionIO mode).
    pub async fn prepare(self: &Arc<Self>) -> Result<(), HostError> {
        match self.def.mode {
            Mode::Server => {
                // A pull may take long; the server's start has its own timeout.
                let budget = Duration::from_secs(3600);
                // The caller reports a failure itself (it ends `function
                // serve`): not logged here as well.
                self.ready_instance(Instant::now() + budget, budget, Report::Caller)
                    .await
                    .map(drop)
            }
            Mode::FunctionIo => {
                let failed = |error: RunError| HostError::StartFailed {
                    function: self.def.name.clone(),
                    error: Arc::new(error),
                };
                let credentials = instance::credentials(&self.ctx.runner, &self.def).await?;
                self.ctx
                    .runner
                    .fetch(&self.def.image, self.def.pull_policy, credentials)
                    .await
                    .map_err(failed)
                    .map(drop)
            }
        }
    }

    fn enter(&self) -> CallGuard<'_> {
        self.lock().calls += 1;
        CallGuard(self)
    }

    /// A call slot, waiting (in a queue as long as `maxConcurrency`) until the
    /// deadline for one.
    async fn admit(
        &self,
        deadline: Instant,
        budget: Duration,
    ) -> Result<SemaphorePermit<'_>, HostError> {
        if let Ok(permit) = self.slots.try_acquire() {
            return Ok(permit);
        }
        let max = self.def.max_concurrency;
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= max {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(HostError::Busy {
                function: self.def.name.clone(),
                max_concurrency: max,
                max_queue: max,
            });
        }
        let acquired = tokio::time::timeout_at(deadline.into(), self.slots.acquire()).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match acquired {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(HostError::ShuttingDown),
            Err(_) => Err(HostError::Deadline {
                function: self.def.name.clone(),
                deadline: budget,
                during: Phase::Queued,
            }),
        }
    }

    /// Answers one call of `api` carrying `message`, before `deadline`
    /// (`budget` from its arrival).
    pub async fn call(
        self: &Arc<Self>,
        api: Api,
        message: Bytes,
        metadata: MetadataMap,
        deadline: Instant,
        budget: Duration,
    ) -> Result<Response<Bytes>, CallError> {
        let _call = self.enter();
        let _slot = self.admit(deadline, budget).await?;
        match self.def.mode {
            Mode::Server => self.forward(api, message, metadata, deadline, budget).await,
            Mode::FunctionIo => {
                super::functionio::call(&self.ctx, &self.def, message, deadline).await
            }
        }
    }

    async fn forward(
        self: &Arc<Self>,
        api: Api,
        message: Bytes,
        metadata: MetadataMap,
        deadline: Instant,
        budget: Duration,
    ) -> Result<Response<Bytes>, CallError> {
        let instance = self.ready_instance(deadline, budget, Report::Log).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        let call = instance.call(api, message, metadata, left);
        match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(Ok(response))) => Ok(response),
            Ok(Ok(Err(status))) => Err(CallError::Function(status)),
            // A server on grpc-go resets the stream when the grpc-timeout it
            // was sent passes, which it measures from its own receipt of a
            // value rounded by the encoder: a break at the deadline is the
            // deadline.
            Ok(Err(_)) if deadline.saturating_duration_since(Instant::now()) <= DEADLINE_SLACK => {
                Err(HostError::Deadline {
                    function: self.def.name.clone(),
                    deadline: budget,
                    during: Phase::Calling,
                }
                .into())
            }
            Ok(Err(broken)) => Err(self.diagnose(&instance, broken.0).await.into()),
            Err(_) => Err(HostError::Deadline {
                function: self.def.name.clone(),
                deadline: budget,
                during: Phase::Calling,
            }
            .into()),
        }
    }

    /// Why a call's connection to the instance broke: the server ended (out
    /// of memory is its own), or the connection alone.
    async fn diagnose(&self, instance: &Instance, error: String) -> HostError {
        match tokio::time::timeout(EXIT_GRACE, instance.exit_watch().exited()).await {
            Ok(exit) if !exit.stopped => instance::exit_error(&self.def, &exit),
            _ => HostError::Forward {
                function: self.def.name.clone(),
                error,
                output: instance.output_tail(),
            },
        }
    }

    /// The running instance, started if there is none (one start for every
    /// caller that finds none), unless the function is backing off.
    async fn ready_instance(
        self: &Arc<Self>,
        deadline: Instant,
        budget: Duration,
        report: Report,
    ) -> Result<Arc<Instance>, HostError> {
        let wait = {
            let mut inner = self.lock();
            match &inner.state {
                State::Running(instance) => return Ok(instance.clone()),
                State::Starting(wait) => wait.clone(),
                State::Stopped => {
                    if let Some((at, last)) = &inner.retry {
                        let now = Instant::now();
                        if now < *at {
                            return Err(HostError::BackingOff {
                                function: self.def.name.clone(),
                                failures: inner.failures,
                                retry_in: *at - now,
                                last: last.clone(),
                            });
                        }
                    }
                    let spare = inner.spare.take();
                    let wait = self.spawn_start(report, spare);
                    inner.state = State::Starting(wait.clone());
                    wait
                }
            }
        };
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(Ok(instance))) => Ok(instance),
            Ok(Ok(Err(error))) => Err(HostError::Start(error)),
            Ok(Err(_)) => Err(HostError::ShuttingDown),
            Err(_) => Err(HostError::Deadline {
                function: self.def.name.clone(),
                deadline: budget,
                during: Phase::Starting,
            }),
        }
    }

    /// Starts an instance in a task of its own; its result is shared by
    /// every caller waiting for it.
    fn spawn_start(self: &Arc<Self>, report: Report, spare: Option<Spare>) -> StartWait {
        let (tx, rx) = oneshot::channel();
        let this = self.clone();
        let id = self.ctx.next_instance_id();
        tokio::spawn(async move {
            let result = Instance::start(&this.ctx.runner, &this.def, id, spare).await;
            let _ = tx.send(this.started(result, report));
        });
        rx.shared()
    }

    /// Records the end of a start.
    fn started(
        self: &Arc<Self>,
        result: Result<(Instance, Duration), HostError>,
        report: Report,
    ) -> StartResult {
        let metrics = &self.ctx.metrics;
        match result {
            Ok((instance, took)) => {
                let instance = Arc::new(instance);
                metrics.cold_starts.fetch_add(1, Ordering::Relaxed);
                if instance.from_spare {
                    metrics.spare_starts.fetch_add(1, Ordering::Relaxed);
                }
                metrics.instances.fetch_add(1, Ordering::Relaxed);
                metrics.start_duration.observe(took);
                tracing::info!(
                    function = self.def.name,
                    instance = instance.id,
                    pid = instance.pid(),
                    from_spare = instance.from_spare,
                    ready_ms = crate::context::millis(took),
                    "function server ready"
                );
                self.lock().state = State::Running(instance.clone());
                tokio::spawn(self.clone().supervise(instance.clone()));
                Ok(instance)
            }
            Err(error) => {
                let error = Arc::new(error);
                let mut inner = self.lock();
                inner.state = State::Stopped;
                // A server that failed counts towards the backoff; an image
                // that cannot be had is tried again on the next call.
                if matches!(
                    *error,
                    HostError::Exited { .. }
                        | HostError::OutOfMemory { .. }
                        | HostError::NeverListened { .. }
                ) {
                    metrics.crashes.fetch_add(1, Ordering::Relaxed);
                    self.failed(&mut inner, error.clone());
                }
                drop(inner);
                if let Report::Log = report {
                    tracing::warn!(
                        function = self.def.name,
                        error = %fnrun_runner::error::bounded(&error, fnrun_runner::error::LINE_MAX),
                        "function server did not start"
                    );
                }
                Err(error)
            }
        }
    }

    /// Counts a failure and sets when the next start may be.
    fn failed(&self, inner: &mut Inner, error: Arc<HostError>) {
        inner.failures += 1;
        inner.retry = backoff(inner.failures).map(|d| (Instant::now() + d, error));
    }

    /// Watches one instance until it ends or is stopped.
    async fn supervise(self: Arc<Self>, instance: Arc<Instance>) {
        let exited = instance.exit_watch().exited();
        tokio::pin!(exited);
        loop {
            let stop_at = {
                let inner = self.lock();
                if !matches!(&inner.state, State::Running(i) if Arc::ptr_eq(i, &instance)) {
                    return;
                }
                if inner.calls > 0 {
                    None
                } else if inner.retired {
                    Some(Instant::now())
                } else {
                    self.def.idle_timeout.map(|idle| inner.last_call_end + idle)
                }
            };
            let changed = self.changed.notified();
            let idle = async {
                match stop_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                exit = &mut exited => {
                    self.crashed(&instance, &exit);
                    return;
                }
                () = idle => {
                    if self.take_if_idle(&instance) {
                        let (id, pid) = (instance.id, instance.pid());
                        let retired = self.lock().retired;
                        let next = (!retired).then(|| instance.kind());
                        // The last holder of the instance drops its service,
                        // which stops the run.
                        drop(instance);
                        let exit = tokio::time::timeout(STOP_GRACE, exited).await;
                        self.ctx.metrics.instances.fetch_sub(1, Ordering::Relaxed);
                        match exit {
                            Ok(exit) => tracing::info!(
                                function = self.def.name,
                                instance = id,
                                pid,
                                ran_ms = crate::context::millis(exit.elapsed),
                                "function server stopped"
                            ),
                            Err(_) => tracing::warn!(
                                function = self.def.name,
                                instance = id,
                                pid,
                                "function server stopped, but not yet cleaned up after {STOP_GRACE:?}"
                            ),
                        }
                        self.ctx.trim_memory_soon();
                        if let Some(kind) = next {
                            self.clone().make_spare(kind).await;
                        }
                        return;
                    }
                }
                () = changed => {}
            }
        }
    }

    /// Takes the instance out of the running state if it is still idle.
    fn take_if_idle(&self, instance: &Arc<Instance>) -> bool {
        let mut inner = self.lock();
        let running = matches!(&inner.state, State::Running(i) if Arc::ptr_eq(i, instance));
        let idle_enough = inner.retired
            || self
                .def
                .idle_timeout
                .is_some_and(|idle| inner.last_call_end.elapsed() >= idle);
        if running && inner.calls == 0 && idle_enough {
            inner.state = State::Stopped;
            true
        } else {
            false
        }
    }

    /// Records an instance that ended unasked.
    fn crashed(&self, instance: &Arc<Instance>, exit: &fnrun_sandbox::ServiceExit) {
        let metrics = &self.ctx.metrics;
        metrics.instances.fetch_sub(1, Ordering::Relaxed);
        metrics.crashes.fetch_add(1, Ordering::Relaxed);
        let error = Arc::new(instance::exit_error(&self.def, exit));
        let mut inner = self.lock();
        if matches!(&inner.state, State::Running(i) if Arc::ptr_eq(i, instance)) {
            inner.state = State::Stopped;
        }
        if instance.started.elapsed() >= STABLE_AFTER {
            inner.failures = 0;
        }
        self.failed(&mut inner, error.clone());
        let failures = inner.failures;
        drop(inner);
        tracing::warn!(
            function = self.def.name,
            instance = instance.id,
            failures,
            error = %fnrun_runner::error::bounded(&error, fnrun_runner::error::LINE_MAX),
            "function server ended; it is started again on the next call"
        );
    }
}

/// The wait before start number `failures + 1`: none after one failure (a
/// crash is restarted on the next call), then 1s, 2s, 4s ... up to 30s.
pub fn backoff(failures: u32) -> Option<Duration> {
    match failures {
        0 | 1 => None,
        n => Some(
            Duration::from_secs(1)
                .saturating_mul(1 << (n - 2).min(16))
                .min(MAX_BACKOFF),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        assert_eq!(backoff(0), None);
        assert_eq!(backoff(1), None);
        assert_eq!(backoff(2), Some(Duration::from_secs(1)));
        assert_eq!(backoff(3), Some(Duration::from_secs(2)));
        assert_eq!(backoff(6), Some(Duration::from_secs(16)));
        assert_eq!(backoff(7), Some(MAX_BACKOFF));
        assert_eq!(backoff(u32::MAX), Some(MAX_BACKOFF));
    }
}
