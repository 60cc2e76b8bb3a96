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
    /// Added to a registry's refusal: where the credentials came from, or
    /// where they were looked for (`fnrun run`'s, from
    /// `fnrun_registry::credentials::find_credentials`).
    pub auth_note: Option<String>,
    /// Refuse a Crossplane Function package ([`image_spec::function_package`])
    /// before it runs: a gRPC server would only wait for calls until the
    /// timeout. `fnrun run` asks for it; the daemon's services do not (it
    /// costs a look into each layer on every call).
    pub refuse_function_package: bool,
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
            auth_note: None,
            refuse_function_package: false,
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
    /// `--cache-max-size`: the cache is pruned to it after runs.
    pruner: Option<Arc<Pruner>>,
    /// Runs without the pool being ended in the background.
    ending: Arc<std::sync::atomic::AtomicUsize>,
}

/// Most runs without the pool ended in the background at once; beyond, a
/// call waits for its own (as the pool's `MAX_ENDING`).
const MAX_ENDING: usize = 64;

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
            pruner: None,
            ending: Arc::default(),
        }
    }

    /// Makes sandboxes ahead of calls, at most `max_sandboxes` at a time
    /// over every kind of run, holding at most `max_bytes` of memory between
    /// them if that is set (see [`crate::pool`]); 0: none, every call makes
    /// its own (the default).
    pub fn with_sandbox_pool(mut self, max_sandboxes: usize, max_bytes: Option<u64>) -> Self {
        self.pool = (max_sandboxes > 0).then(|| {
            Pool::new(
                self.sandbox.clone(),
                max_sandboxes,
                max_bytes,
                self.metrics.clone(),
            )
        });
        self.prune_when_the_pool_lets_go();
        self
    }

    /// Prunes the cache to `max_bytes` after runs, and when the sandbox pool
    /// ends the last sandbox standing on an image (least recently used images
    /// first; images in use are leased and never evicted).
    pub fn with_cache_max_size(mut self, max_bytes: Option<u64>) -> Self {
        self.pruner = max_bytes.map(|max| {
            Arc::new(Pruner {
                cache: self.cache.clone(),
                max,
                state: std::sync::Mutex::new(PruneState::default()),
            })
        });
        self.prune_when_the_pool_lets_go();
        self
    }

    /// A pooled sandbox holds its image's lease, so the prune after a run
    /// cannot evict an image whose sandboxes are pooled: prune again when
    /// the pool lets go of them.
    fn prune_when_the_pool_lets_go(&self) {
        if let (Some(pool), Some(pruner)) = (&self.pool, &self.pruner) {
            let pruner = pruner.clone();
            pool.on_lease_ended(move || pruner.request());
        }
    }

    /// A place in the `--sandbox-pool` bound for a sandbox made ahead
    /// outside the pool (a function server's spare); `None` without a pool
    /// or when it is full.
    pub(crate) fn sandbox_place(&self) -> Option<crate::pool::Place> {
        self.pool.as_ref().and_then(Pool::place)
    }

    /// The cache's pruner to `--cache-max-size`, if one is set: what a hold
    /// on an image's lease asks when it lets go of the last.
    pub(crate) fn pruner(&self) -> Option<Arc<Pruner>> {
        self.pruner.clone()
    }

    /// Has the cache pruned to `--cache-max-size`, if one is set.
    fn maybe_prune(&self) {
        if let Some(pruner) = &self.pruner {
            pruner.request();
        }
    }

    /// Refuses images from registries not in `registries` (empty: allow all).
    pub fn with_allowed_registries(mut self, registries: Vec<String>) -> Self {
        self.allowed_registries = registries;
        self
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    pub(crate) fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// Makes one sandbox as every run's is made (its user namespace and id
    /// maps, the other namespaces, its cgroup and limits, its root over an
    /// empty layer, its own `/proc`) and ends it before it would exec
    /// anything: whether this host, or this container, lets fnrun run any
    /// function at all. A daemon asks at start, so that one which could run
    /// nothing refuses to start (and a pod is never Ready) instead of
    /// failing every call.
    pub async fn check_sandbox(&self) -> Result<(), fnrun_sandbox::Error> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let layer = self
            .cache
            .root()
            .join(format!("sandbox-check-{}", std::process::id()));
        let made = match std::fs::DirBuilder::new().mode(0o755).create(&layer) {
            // Left by an earlier start with the same pid that ended before
            // removing it (in a container fnrun is pid 1 at every start):
            // nothing is ever written to it.
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && std::fs::symlink_metadata(&layer).is_ok_and(|m| m.is_dir()) =>
            {
                Ok(())
            }
            made => made,
        }
        .and_then(|()| {
            // Searchable by the runs' ids whatever the umask.
            std::fs::set_permissions(&layer, std::fs::Permissions::from_mode(0o755))
        });
        if let Err(e) = made {
            return Err(fnrun_sandbox::Error::Io {
                op: "create the sandbox check's empty layer",
                path: Some(layer),
                source: e,
            });
        }
        let spec = fnrun_sandbox::RunSpec {
            layers: vec![layer.clone()],
            argv: vec!["/fnrun-sandbox-check".to_owned()],
            env: Vec::new(),
            workdir: "/".to_owned(),
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            network: Network::Isolated,
            limits: Limits::default(),
            mounts: Vec::new(),
            caller: None,
        };
        let checked = match self.sandbox.prepare_off_worker(Arc::new(spec)).await {
            Ok(prepared) => prepared.into_ready().await.map(|ready| ready.discard()),
            Err(e) => Err(e),
        };
        let checked = match checked {
            Ok(discarded) => {
                discarded.await;
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = std::fs::remove_dir(&layer) {
            tracing::warn!(dir = %layer.display(), error = %e, "cannot remove the sandbox check's empty layer");
        }
        checked
    }

    /// Which limits this host's sandboxes can enforce.
    pub fn limit_support(&self) -> &fnrun_sandbox::LimitSupport {
        self.sandbox.limit_support()
    }

    /// A run without the pool (`--sandbox-pool 0`): its sandbox made now,
    /// the call answered once every process of the run is dead; its
    /// teardown (init's exit, which ends its mount and other namespaces,
    /// the reap, the cgroup's removal, its network namespace given back)
    /// in the background, off the call's path, while fewer than
    /// [`MAX_ENDING`] are, else before the answer. The image's lease is let
    /// go of once the overlay root is gone.
    async fn run_unpooled(
        &self,
        spec: fnrun_sandbox::RunSpec,
        lease: Option<Arc<fnrun_cache::Lease>>,
        input: &[u8],
        timeout: Duration,
    ) -> Result<fnrun_sandbox::Outcome, fnrun_sandbox::Error> {
        let prepared = self.sandbox.prepare_off_worker(Arc::new(spec)).await?;
        let (outcome, ending) = self
            .sandbox
            .answer_prepared(prepared, input, timeout)
            .await?;
        let end = async move {
            ending.finish().await;
            drop(lease);
        };
        if self.ending.fetch_add(1, Ordering::SeqCst) >= MAX_ENDING {
            self.ending.fetch_sub(1, Ordering::SeqCst);
            end.await;
        } else {
            let ending = self.ending.clone();
            tokio::spawn(async move {
                end.await;
                ending.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Ok(outcome)
    }

    /// Whether isolated calls of one kind share network namespaces
    /// (`--network-namespace per-kind`, and not a rootless runner).
    pub fn shares_network_namespaces(&self) -> bool {
        self.sandbox.shares_network_namespaces()
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
    /// would: its registry must be allowed. With a sandbox pool, each kind
    /// of run of it keeps a sandbox ready once called ([`Pool::keep_ready`]).
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
        if let Some(pool) = &self.pool {
            pool.keep_ready(got.image.layers.clone());
        }
        Ok(Prefetched {
            digest: got.image.digest,
            pulled: got.image.pulled,
        })
    }

    /// Gets `image` into the cache per `policy` (its registry must be
    /// allowed), as a call would before its run; returns its digest.
    pub async fn fetch(
        &self,
        image: &str,
        policy: PullPolicy,
        credentials: Credentials,
    ) -> Result<String, RunError> {
        let reference = self.reference(image)?;
        let (image, _lease) = self.image(&reference, policy, credentials, None).await?;
        Ok(image.digest)
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
    pub(crate) fn reference(&self, image: &str) -> Result<ImageRef, RunError> {
        let reference = self.cache.parse_reference(image)?;
        self.check_registry(&reference)?;
        Ok(reference)
    }

    /// The image from the cache (pulled if the policy says so), leased against
    /// pruning until the lease is dropped; counted in the pull and cache metrics.
    pub(crate) async fn image(
        &self,
        reference: &ImageRef,
        policy: PullPolicy,
        credentials: Credentials,
        progress: Option<PullDisplay>,
    ) -> Result<(Image, Option<Arc<Lease>>), RunError> {
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

    async fn run_inner(&self, mut req: RunRequest) -> Result<RunOutput, RunError> {
        // What is cheap to check is checked before admission; decoding the
        // input is not (its memory is linear in the input, within the YAML
        // bounds), so it runs inside it, where `--max-concurrency` bounds how
        // many decode at once. Either way, before any image or sandbox work.
        if req.timeout.is_zero() {
            return Err(RequestError::ZeroTimeout.into());
        }
        let reference = self.reference(&req.image)?;

        let _slot = self.admit().await?;
        let format = req.format;
        let (input, checked) = decode(std::mem::take(&mut req.input), move |doc| match format {
            Format::FunctionIo => functionio::validate(doc)
                .map(drop)
                .map_err(RunError::InvalidInput),
            Format::ResourceList => resourcelist::validate_input(doc)
                .map(drop)
                .map_err(RunError::InvalidResourceList),
        })
        .await;
        checked?;
        req.input = input;
        let _running = Gauge::enter(&self.metrics.in_flight);

        let (image, lease) = self
            .image(
                &reference,
                req.pull_policy,
                req.credentials.clone(),
                req.progress.clone(),
            )
            .await
            .map_err(|e| match e {
                RunError::Image(e) => RunError::Image(e.noted(req.auth_note.as_deref())),
                other => other,
            })?;
        if req.refuse_function_package
            && let Some(name) = image_spec::function_package(&image.layers)
        {
            return Err(RequestError::FunctionPackage { name }.into());
        }
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
            Some(pool) => pool.run(&spec, lease, &req.input, req.timeout).await?,
            None => {
                self.run_unpooled(spec, lease, &req.input, req.timeout)
                    .await?
            }
        };
        let stderr = String::from_utf8_lossy(&outcome.stderr_tail).into_owned();
        match outcome.status {
            Status::Exited(0) => {}
            // A KRM function that fails still says why in its output's results.
            Status::Exited(code) if req.format == Format::ResourceList => {
                let (output, list) = decode(outcome.stdout, resourcelist::validate_output).await;
                let returned = list.ok().map(|list| Box::new(Returned { output, list }));
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
        let (output, checked) = decode(outcome.stdout, move |doc| match format {
            Format::FunctionIo => functionio::validate(doc)
                .map(|_| None)
                .map_err(OutputError::FunctionIo),
            Format::ResourceList => resourcelist::validate_output(doc)
                .map(Some)
                .map_err(OutputError::ResourceList),
        })
        .await;
        let resource_list = checked.map_err(|error| RunError::InvalidOutput { error, stderr })?;
        Ok(RunOutput {
            output,
            resource_list,
            stderr: outcome.stderr_tail,
            digest: image.digest,
            peak_memory_bytes: outcome.peak_memory_bytes,
            cpu_time: outcome.cpu_time,
        })
    }
}

/// The largest document decoded on the task that asked for it; a larger one
/// is decoded on the blocking pool. Decoding 1 MiB of YAML holds its thread
/// for tens of milliseconds (about 150 ms in a debug build): on a runtime
/// worker, the other connections that worker serves (health checks on other
/// listeners among them) would wait that long. Below this size, decoding
/// holds a worker a few milliseconds at most, and most documents (a
/// FunctionIO of a few resources) are far smaller: for them a hand-over to
/// another thread would cost more than the decoding.
const DECODE_INLINE_MAX: usize = 64 << 10;

/// `decode(&doc)`, off the runtime's workers when `doc` is larger than
/// [`DECODE_INLINE_MAX`]; gives `doc` back with the result. The runner calls
/// it with the call's admission slot held, so `--max-concurrency` bounds how
/// many documents are decoded at once, inputs and outputs alike.
async fn decode<T, F>(doc: Vec<u8>, decode: F) -> (Vec<u8>, T)
where
    F: FnOnce(&[u8]) -> T + Send + 'static,
    T: Send + 'static,
{
    if doc.len() <= DECODE_INLINE_MAX {
        let decoded = decode(&doc);
        return (doc, decoded);
    }
    match tokio::task::spawn_blocking(move || {
        let decoded = decode(&doc);
        (doc, decoded)
    })
    .await
    {
        Ok(done) => done,
        // The decoders do not panic (they are fuzzed); if one did, the panic
        // is this call's, as it would be on this task. A blocking task is
        // cancelled only with its runtime, which drops this call too.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Prunes are at most this often; one asked for sooner runs when the time is
/// up.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// Prunes the cache to `--cache-max-size` in the background, at most every
/// [`PRUNE_EVERY`], and never drops a request: one made within that time of
/// the last prune is run once the time is up (one for all such requests).
pub(crate) struct Pruner {
    cache: Arc<Cache>,
    max: u64,
    state: std::sync::Mutex<PruneState>,
}

#[derive(Default)]
struct PruneState {
    last: Option<Instant>,
    /// A prune is waiting for [`PRUNE_EVERY`] to pass.
    scheduled: bool,
}

impl PruneState {
    /// A prune is asked for at `now`: how long to wait before it runs, or
    /// `None` if one already waits (it will see what this one would).
    fn plan(&mut self, now: Instant) -> Option<Duration> {
        if self.scheduled {
            return None;
        }
        match self.last.map(|t| now.saturating_duration_since(t)) {
            Some(since) if since < PRUNE_EVERY => {
                self.scheduled = true;
                Some(PRUNE_EVERY - since)
            }
            _ => {
                self.last = Some(now);
                Some(Duration::ZERO)
            }
        }
    }

    /// The waiting prune runs at `now`.
    fn run_scheduled(&mut self, now: Instant) {
        self.scheduled = false;
        self.last = Some(now);
    }
}

impl Pruner {
    pub(crate) fn request(self: &Arc<Self>) {
        let wait = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .plan(Instant::now());
        let Some(wait) = wait else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
                this.state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .run_scheduled(Instant::now());
            }
            match this.cache.prune(this.max).await {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large document is decoded off the thread of the task that asked
    /// (a runtime worker, whose other connections would wait), a small one
    /// on it (a hand-over would cost more than the decoding); the document
    /// comes back either way.
    #[tokio::test(flavor = "current_thread")]
    async fn large_documents_are_decoded_off_the_runtime() {
        let caller = std::thread::current().id();
        for (len, off) in [(DECODE_INLINE_MAX, false), (DECODE_INLINE_MAX + 1, true)] {
            let (doc, thread) = decode(vec![b'a'; len], |_| std::thread::current().id()).await;
            assert_eq!(doc.len(), len);
            assert_eq!(thread != caller, off, "{len} bytes");
        }
    }

    /// A prune asked for within [`PRUNE_EVERY`] of the last one is not
    /// dropped (the pool's prune after it lets go of an image comes a few
    /// seconds after the prune of the run that filled it): it waits for the
    /// rest of the time, and requests meanwhile share it.
    #[test]
    fn a_prune_asked_for_too_soon_waits_and_is_not_lost() {
        let t0 = Instant::now();
        let mut state = PruneState::default();
        assert_eq!(state.plan(t0), Some(Duration::ZERO));
        let soon = t0 + Duration::from_secs(3);
        assert_eq!(state.plan(soon), Some(PRUNE_EVERY - Duration::from_secs(3)));
        assert_eq!(state.plan(soon + Duration::from_secs(1)), None);
        state.run_scheduled(t0 + PRUNE_EVERY);
        assert_eq!(
            state.plan(t0 + PRUNE_EVERY + Duration::from_secs(1)),
            Some(PRUNE_EVERY - Duration::from_secs(1))
        );
        let mut state = PruneState::default();
        state.plan(t0);
        assert_eq!(state.plan(t0 + PRUNE_EVERY), Some(Duration::ZERO));
    }
}
