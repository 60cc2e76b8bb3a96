//! The core: turns a request into a cached image and a sandbox run. The CLI's
//! `run`, the v1alpha1 service and Porch's evaluator all call [`Runner::run`];
//! nothing here knows about tonic.
//!
//! A request says what the function reads and writes ([`Format`]): a
//! Crossplane FunctionIO, or a KRM function's ResourceList, whose input and
//! output are checked as kpt checks them and whose output is kept, with its
//! results, even when the function fails. It also says whom the function
//! runs as ([`RunAs`]), what it adds to the image's environment and which host
//! paths it mounts.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use fnrun_api::resourcelist::{self, ResourceList};
use fnrun_api::{functionio, text};
use fnrun_cache::{Cache, GetOptions, Got, Image, Lease, PullPolicy, PullProgress};
use fnrun_registry::{Credentials, ErrorKind, ImageRef};
use fnrun_sandbox::{BindMount, Limits, Network, Sandbox, Status};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::{
    IMAGE_REF_MAX, LINE_MAX, OutputError, RequestError, Returned, RunError, bounded,
};
pub use crate::image_spec::RunAs;
use crate::image_spec::{self, SpecOptions};
use crate::metrics::Metrics;
use crate::pool::Pool;

/// Default function timeout (SPEC.md).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(25);

/// What a function reads on stdin and writes on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A Crossplane FunctionIO (v1alpha1).
    #[default]
    FunctionIo,
    /// A KRM function's ResourceList (kpt, kustomize, Porch).
    ResourceList,
}

/// One function call, already decoded from gRPC or the command line.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub image: String,
    pub input: Vec<u8>,
    pub pull_policy: PullPolicy,
    pub credentials: Credentials,
    pub network: Network,
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    /// Processes and threads; `None`: the sandbox's default limit.
    pub pids: Option<u64>,
    pub timeout: Duration,
    /// What the input and output are.
    pub format: Format,
    /// Whom the function runs as.
    pub run_as: RunAs,
    /// `KEY=VALUE` pairs added to the image's environment, replacing its own
    /// value of a key.
    pub env: Vec<String>,
    /// Host paths mounted into the run.
    pub mounts: Vec<BindMount>,
    /// Told of each layer when the image is pulled (`fnrun run`'s bars on a
    /// terminal); `None`: nobody.
    pub progress: Option<PullDisplay>,
}

/// A [`PullProgress`] in a [`RunRequest`].
#[derive(Clone)]
pub struct PullDisplay(pub Arc<dyn PullProgress>);

impl std::fmt::Debug for PullDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PullDisplay")
    }
}

impl RunRequest {
    /// A request with SPEC.md's defaults.
    pub fn new(image: impl Into<String>, input: Vec<u8>) -> Self {
        RunRequest {
            image: image.into(),
            input,
            pull_policy: PullPolicy::IfNotPresent,
            credentials: Credentials::Anonymous,
            network: Network::Isolated,
            memory_bytes: None,
            cpu_millis: None,
            pids: None,
            timeout: DEFAULT_TIMEOUT,
            format: Format::FunctionIo,
            run_as: RunAs::Image,
            env: Vec::new(),
            mounts: Vec::new(),
            progress: None,
        }
    }

    /// A KRM function call with kpt's defaults: a ResourceList in and out,
    /// run as `nobody`, no network (SPEC.md's other defaults).
    pub fn krm(image: impl Into<String>, input: Vec<u8>) -> Self {
        RunRequest {
            format: Format::ResourceList,
            run_as: RunAs::Nobody,
            ..RunRequest::new(image, input)
        }
    }
}

/// What a successful run returns, with facts for the log line.
#[derive(Debug)]
pub struct RunOutput {
    pub output: Vec<u8>,
    /// The output read as a ResourceList, for [`Format::ResourceList`]: its
    /// results say whether the function reported an error.
    pub resource_list: Option<ResourceList>,
    /// The tail of what the function wrote to stderr.
    pub stderr: Vec<u8>,
    pub digest: String,
    pub peak_memory_bytes: Option<u64>,
    pub cpu_time: Option<Duration>,
}

/// What `--prefetch` got.
#[derive(Debug)]
pub struct Prefetched {
    pub digest: String,
    /// Whether it was pulled now (else it was cached).
    pub pulled: bool,
}

/// How many runs execute at once and how many calls may wait for a slot.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    pub max_concurrency: usize,
    /// Calls waiting beyond this are refused at once.
    pub max_queue: usize,
}

impl Admission {
    /// One run at a time and a queue for one call: the CLI.
    pub const ONE: Admission = Admission {
        max_concurrency: 1,
        max_queue: 1,
    };
}

/// The core runner: an image cache and a sandbox, shared by every call.
pub struct Runner {
    /// Sandboxes made ahead of calls (`--sandbox-pool`); `None`: every call
    /// makes its own. Before `sandbox`, so that its sandboxes end first.
    pool: Option<Pool>,
    cache: Arc<Cache>,
    sandbox: Arc<Sandbox>,
    admission: Admission,
    slots: Semaphore,
    allowed_registries: Vec<String>,
    metrics: Arc<Metrics>,
    /// `--cache-max-size`: the cache is pruned to it after runs (at most every 10s).
    cache_max_size: Option<u64>,
    last_prune: std::sync::Mutex<Option<Instant>>,
}

/// Holds one unit of a gauge (a queued call, a run in flight) until dropped.
struct Gauge<'a>(&'a AtomicI64);

impl<'a> Gauge<'a> {
    /// Adds one; returns the guard and the value before.
    fn enter(gauge: &'a AtomicI64) -> (Self, i64) {
        let before = gauge.fetch_add(1, Ordering::SeqCst);
        (Gauge(gauge), before)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Runner {
    pub fn new(cache: Cache, sandbox: Sandbox, admission: Admission) -> Self {
        Runner {
            pool: None,
            cache: Arc::new(cache),
            sandbox: Arc::new(sandbox),
            slots: Semaphore::new(admission.max_concurrency.max(1)),
            admission,
            allowed_registries: Vec::new(),
            metrics: Arc::new(Metrics::default()),
            cache_max_size: None,
            last_prune: std::sync::Mutex::new(None),
        }
    }

    /// Makes sandboxes ahead of calls, at most `max_sandboxes` at a time
    /// over every kind of run (see [`crate::pool`]); 0: none, every call
    /// makes its own (the default).
    pub fn with_sandbox_pool(mut self, max_sandboxes: usize) -> Self {
        self.pool = (max_sandboxes > 0)
            .then(|| Pool::new(self.sandbox.clone(), max_sandboxes, self.metrics.clone()));
        self
    }

    /// Prunes the cache to `max_bytes` after runs (least recently used images first;
    /// images in use are leased and never evicted).
    pub fn with_cache_max_size(mut self, max_bytes: Option<u64>) -> Self {
        self.cache_max_size = max_bytes;
        self
    }

    /// Starts a background prune to `--cache-max-size`, unless one ran in the last 10s.
    fn maybe_prune(&self) {
        let Some(max) = self.cache_max_size else {
            return;
        };
        {
            let mut last = self
                .last_prune
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(10)) {
                return;
            }
            *last = Some(Instant::now());
        }
        let cache = self.cache.clone();
        tokio::spawn(async move {
            match cache.prune(max).await {
                Ok(r) if !r.removed_refs.is_empty() || r.freed_bytes > 0 => tracing::info!(
                    removed = ?r.removed_refs,
                    freed_bytes = r.freed_bytes,
                    total_bytes = r.total_bytes,
                    kept_in_use = ?r.kept_in_use,
                    "pruned the image cache"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = %bounded(&e, LINE_MAX),
                    "cannot prune the image cache"
                ),
            }
        });
    }

    /// Refuses images from registries not in `registries` (empty: allow all).
    pub fn with_allowed_registries(mut self, registries: Vec<String>) -> Self {
        self.allowed_registries = registries;
        self
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The cache, shared: for work off the runtime's threads.
    pub fn cache_handle(&self) -> Arc<Cache> {
        self.cache.clone()
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs one function call and logs one line about it.
    pub async fn run(&self, req: RunRequest) -> Result<RunOutput, RunError> {
        let start = Instant::now();
        // The reference is the caller's: it may be anything, of any length.
        let image = text::bounded(&req.image, IMAGE_REF_MAX).into_owned();
        let result = self.run_inner(req).await;
        self.maybe_prune();
        let elapsed = start.elapsed();
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok(out) => {
                self.metrics.run_finished("ok", elapsed);
                tracing::info!(
                    image,
                    digest = out.digest,
                    outcome = "ok",
                    duration_ms = ms,
                    peak_memory_bytes = out.peak_memory_bytes,
                    cpu_time_ms = out
                        .cpu_time
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    "function run"
                );
            }
            Err(e) => {
                self.metrics.run_finished(e.outcome(), elapsed);
                tracing::info!(
                    image,
                    outcome = e.outcome(),
                    duration_ms = ms,
                    error = %bounded(e, LINE_MAX),
                    "function run"
                );
            }
        }
        result
    }

    /// Gets `image` into the cache unless it is there (`--prefetch`), as a run
    /// would: its registry must be allowed.
    pub async fn prefetch(
        &self,
        image: &str,
        credentials: Credentials,
    ) -> Result<Prefetched, RunError> {
        let reference = self.cache.parse_reference(image)?;
        self.check_registry(&reference)?;
        let got = self
            .cache
            .get(
                &reference,
                GetOptions::new(PullPolicy::IfNotPresent).credentials(credentials),
            )
            .await?;
        if got.image.pulled {
            self.metrics.pulls_ok.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Prefetched {
            digest: got.image.digest,
            pulled: got.image.pulled,
        })
    }

    /// A run slot, waiting in a bounded queue for one.
    async fn admit(&self) -> Result<SemaphorePermit<'_>, RunError> {
        if let Ok(permit) = self.slots.try_acquire() {
            return Ok(permit);
        }
        let start = Instant::now();
        // The queue-depth gauge is the queue's own counter.
        let (_queued, before) = Gauge::enter(&self.metrics.queued);
        if usize::try_from(before).unwrap_or(0) >= self.admission.max_queue {
            return Err(RunError::Overloaded {
                max_concurrency: self.admission.max_concurrency,
                max_queue: self.admission.max_queue,
            });
        }
        let permit = self
            .slots
            .acquire()
            .await
            .expect("the run slots' semaphore is never closed");
        self.metrics.queue_wait.observe(start.elapsed());
        Ok(permit)
    }

    /// Refuses `reference` if its registry is not allowed here.
    pub fn check_registry(&self, reference: &ImageRef) -> Result<(), RunError> {
        if self.allowed_registries.is_empty() {
            return Ok(());
        }
        let registry = match reference {
            ImageRef::Registry { registry, .. } => registry.as_str(),
            ImageRef::OciLayout { .. } => "oci",
        };
        if self.allowed_registries.iter().any(|r| r == registry) {
            Ok(())
        } else {
            Err(RunError::RegistryNotAllowed {
                registry: registry.to_owned(),
            })
        }
    }

    /// Parses an image reference and checks it against `--allowed-registry`.
    pub fn reference(&self, image: &str) -> Result<ImageRef, RunError> {
        let reference = self.cache.parse_reference(image)?;
        self.check_registry(&reference)?;
        Ok(reference)
    }

    /// The image from the cache (pulled if the policy says so), leased against
    /// pruning until the lease is dropped; counted in the pull and cache metrics.
    pub async fn image(
        &self,
        reference: &ImageRef,
        policy: PullPolicy,
        credentials: Credentials,
        progress: Option<PullDisplay>,
    ) -> Result<(Image, Option<Lease>), RunError> {
        let pull_start = Instant::now();
        let mut options = GetOptions::new(policy).credentials(credentials).leased();
        if let Some(PullDisplay(progress)) = progress {
            options = options.progress(progress);
        }
        match self.cache.get(reference, options).await {
            Ok(Got { image, lease }) => {
                if image.pulled {
                    self.metrics.cache_misses.fetch_add(1, Ordering::Relaxed);
                    self.metrics.pulls_ok.fetch_add(1, Ordering::Relaxed);
                    self.metrics.pull_duration.observe(pull_start.elapsed());
                } else {
                    self.metrics.cache_hits.fetch_add(1, Ordering::Relaxed);
                }
                Ok((image, lease))
            }
            Err(e) => {
                if !matches!(e.kind(), ErrorKind::NotCached | ErrorKind::InvalidReference) {
                    self.metrics.cache_misses.fetch_add(1, Ordering::Relaxed);
                    self.metrics.pulls_failed.fetch_add(1, Ordering::Relaxed);
                }
                Err(e.into())
            }
        }
    }

    async fn run_inner(&self, req: RunRequest) -> Result<RunOutput, RunError> {
        // What is cheap to check is checked before admission; decoding the
        // input is not (its memory is linear in the input, within the YAML
        // bounds), so it runs inside it, where `--max-concurrency` bounds how
        // many decode at once. Either way, before any image or sandbox work.
        if req.timeout.is_zero() {
            return Err(RequestError::ZeroTimeout.into());
        }
        let reference = self.reference(&req.image)?;

        let _slot = self.admit().await?;
        match req.format {
            Format::FunctionIo => {
                functionio::validate(&req.input).map_err(RunError::InvalidInput)?;
            }
            Format::ResourceList => {
                resourcelist::validate_input(&req.input).map_err(RunError::InvalidResourceList)?;
            }
        }
        let _running = Gauge::enter(&self.metrics.in_flight);

        let (image, lease) = self
            .image(
                &reference,
                req.pull_policy,
                req.credentials.clone(),
                req.progress.clone(),
            )
            .await?;
        let options = SpecOptions {
            extra_args: &[],
            extra_env: &req.env,
            network: req.network,
            limits: Limits {
                memory_bytes: req.memory_bytes,
                cpu_millis: req.cpu_millis,
                pids: req.pids,
            },
            run_as: req.run_as,
            mounts: &req.mounts,
        };
        let spec = image_spec::run_spec(&image, &self.sandbox.config().id_map, &options)?;
        let outcome = match &self.pool {
            Some(pool) => {
                pool.run(&spec, lease.map(Arc::new), &req.input, req.timeout)
                    .await?
            }
            None => {
                let outcome = self.sandbox.run(&spec, &req.input, req.timeout).await;
                drop(lease);
                outcome?
            }
        };
        let stderr = String::from_utf8_lossy(&outcome.stderr_tail).into_owned();
        match outcome.status {
            Status::Exited(0) => {}
            // A KRM function that fails still says why in its output's results.
            Status::Exited(code) if req.format == Format::ResourceList => {
                let returned = resourcelist::validate_output(&outcome.stdout)
                    .ok()
                    .map(|list| {
                        Box::new(Returned {
                            output: outcome.stdout,
                            list,
                        })
                    });
                return Err(RunError::KrmFunctionFailed {
                    code,
                    returned,
                    stderr,
                });
            }
            Status::Exited(code) => return Err(RunError::FunctionFailed { code, stderr }),
            Status::Signaled(signal) => return Err(RunError::FunctionKilled { signal, stderr }),
            Status::TimedOut => {
                return Err(RunError::TimedOut {
                    timeout: req.timeout,
                    stderr,
                });
            }
            Status::OutOfMemory => {
                return Err(RunError::OutOfMemory {
                    limit: req.memory_bytes.unwrap_or_default(),
                    stderr,
                });
            }
            Status::OutputTooLarge => {
                return Err(RunError::OutputTooLarge {
                    limit: self.sandbox.config().max_output_bytes,
                });
            }
        }
        let resource_list = match req.format {
            Format::FunctionIo => {
                functionio::validate(&outcome.stdout).map_err(|error| RunError::InvalidOutput {
                    error: OutputError::FunctionIo(error),
                    stderr,
                })?;
                None
            }
            Format::ResourceList => Some(resourcelist::validate_output(&outcome.stdout).map_err(
                |error| RunError::InvalidOutput {
                    error: OutputError::ResourceList(error),
                    stderr,
                },
            )?),
        };
        Ok(RunOutput {
            output: outcome.stdout,
            resource_list,
            stderr: outcome.stderr_tail,
            digest: image.digest,
            peak_memory_bytes: outcome.peak_memory_bytes,
            cpu_time: outcome.cpu_time,
        })
    }
}
