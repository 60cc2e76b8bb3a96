//! Sandboxes made ahead of their calls (`serve --sandbox-pool`).
//!
//! A per-call run spends most of its time making its sandbox: namespaces,
//! id maps, the cgroup, the overlay root, `/proc`, `pivot_root`
//! (`docs/benchmarks.md`). None of it depends on the call's input, so the
//! pool makes it before the call: [`fnrun_sandbox::Sandbox::prepare`], up to
//! the point where init waits for the call. A call then only hands over its
//! input, and the function is forked, stripped of its privileges and exec'd
//! as in any run.
//!
//! - **One kind of run, one pool.** Two calls can share a pool when their
//!   [`RunSpec`]s are equal (the image's layers, argv, environment, working
//!   directory, user and groups, network and limits): the sandbox a spec
//!   prepares is then the one the other would have made. Runs with bind
//!   mounts or a mapped caller (the CLI's KRM options) are never pooled.
//! - **Each sandbox serves one call**, then ends as any run ends (every
//!   process killed, its cgroup removed). Nothing of a call reaches another.
//!   The call is answered once its function has exited
//!   ([`Sandbox::answer_prepared`]); init's exit, which tears the sandbox's
//!   namespaces and mounts down, its reap and the cgroup's removal follow in
//!   the background, off the call's path (at most `MAX_ENDING` at once;
//!   beyond that a call waits for its own). A call that makes its own
//!   sandbox (the pool empty) is answered and ended the same way.
//! - **Refilled after a take**, in the background: a call never waits for the
//!   pool. One that finds it empty makes its own sandbox, as without a pool.
//! - **Sized by the calls.** A kind's target is the most calls of it in
//!   flight at once lately plus the calls expected while a sandbox is being
//!   made (its rate times the time a sandbox takes to make), within
//!   [`PER_KIND`] and the operator's total bound. A kind not called for
//!   [`IDLE`] has no target: its sandboxes are ended. An idle daemon holds
//!   none, except for the images the operator asked to keep ready
//!   ([`Pool::keep_ready`], `--prefetch`): each kind of run of those that
//!   was called keeps one sandbox while not called, so that a call every
//!   minute (Crossplane's default poll) still finds one.
//! - **Places.** A sandbox made ahead by someone else (a function server's
//!   spare in `fnrun_host`) takes a [`Place`] in the same bounds.
//! - **Memory.** Each sandbox is measured once ready
//!   ([`PreparedRun::memory_bytes`]: its cgroup's peak, else its init's
//!   PSS where the runner may read it, else the estimate below); the pool
//!   counts what those it holds were measured to hold, and
//!   an estimate (the average of the last measures) for those in the
//!   making. With a budget (`--sandbox-pool-memory`), no sandbox is made
//!   beyond it. `fnrun_sandbox_pool_memory_bytes` reports the count.
//! - **Leases.** Each pooled sandbox holds the image's cache lease (shared
//!   with the call that asked for it), so no prune removes layers that its
//!   overlay root stands on. When the pool ends the last sandbox that holds
//!   an image's lease, it says so ([`Pool::on_lease_ended`]): the runner
//!   then prunes the cache to `--cache-max-size`, which could not evict the
//!   image while the pool held it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use fnrun_cache::Lease;
use fnrun_sandbox::{Ending, Error, Network, Outcome, PreparedRun, RunSpec, Sandbox};

use crate::metrics::Metrics;

/// The most sandboxes one kind of run keeps made ahead.
pub const PER_KIND: usize = 8;
/// A kind not called for this long has its sandboxes ended.
pub const IDLE: Duration = Duration::from_secs(10);
/// Calls are counted over windows this long, for a kind's rate and its
/// calls in flight at once.
const WINDOW: Duration = Duration::from_secs(2);
/// After a sandbox of a kind could not be made, none is made for it this
/// long (its calls make their own, which say why).
const BACKOFF: Duration = Duration::from_secs(1);
/// How often the pool looks for idle kinds while it holds sandboxes.
const SWEEP: Duration = Duration::from_secs(1);
/// What a sandbox is taken to hold in memory before one has been measured.
const FIRST_ESTIMATE: u64 = 1 << 20;
/// The most runs ended in the background at once; a call that finds this
/// many waits for its own run's end, as without a pool.
const MAX_ENDING: usize = 64;

/// What makes two runs interchangeable: everything of their [`RunSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    layers: Vec<PathBuf>,
    argv: Vec<String>,
    env: Vec<String>,
    workdir: String,
    ids: (u32, u32, Vec<u32>),
    isolated: bool,
    limits: (Option<u64>, Option<u64>, Option<u64>),
}

impl Key {
    /// The kind of `spec`; `None` for a run that is never pooled.
    fn of(spec: &RunSpec) -> Option<Key> {
        if !spec.mounts.is_empty() || spec.caller.is_some() {
            return None;
        }
        Some(Key {
            layers: spec.layers.clone(),
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            ids: (spec.uid, spec.gid, spec.groups.clone()),
            isolated: spec.network == Network::Isolated,
            limits: (
                spec.limits.memory_bytes,
                spec.limits.cpu_millis,
                spec.limits.pids,
            ),
        })
    }
}

/// A sandbox made ahead, with the lease on the image it stands on.
struct Entry {
    run: PreparedRun,
    _lease: Option<Arc<Lease>>,
    /// What it holds in memory, as counted in [`State::bytes`].
    bytes: u64,
}

/// One kind's sandboxes and calls.
struct Kind {
    ready: Vec<Entry>,
    /// Sandboxes being made for it.
    making: usize,
    /// Its calls running now.
    in_flight: usize,
    /// The most of its calls in flight at once in this window and the one
    /// before, and its calls in each.
    peak: usize,
    previous_peak: usize,
    calls: usize,
    previous_calls: usize,
    window_start: Instant,
    last_call: Instant,
    /// No sandbox is made for it before this (one could not be made).
    backoff_until: Option<Instant>,
    /// One sandbox is kept while it is not called (its image is kept
    /// ready).
    kept: bool,
}

impl Kind {
    fn new(now: Instant) -> Kind {
        Kind {
            ready: Vec::new(),
            making: 0,
            in_flight: 0,
            peak: 0,
            previous_peak: 0,
            calls: 0,
            previous_calls: 0,
            window_start: now,
            last_call: now,
            backoff_until: None,
            kept: false,
        }
    }

    fn roll(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.window_start);
        if since < WINDOW {
            return;
        }
        // A window with no calls at all forgets the one before too.
        let (peak, calls) = if since < 2 * WINDOW {
            (self.peak, self.calls)
        } else {
            (0, 0)
        };
        self.previous_peak = peak;
        self.previous_calls = calls;
        self.peak = self.in_flight;
        self.calls = 0;
        self.window_start = now;
    }

    /// How many sandboxes it should have ready or in the making.
    fn target(&self, now: Instant, make_time: Duration, per_kind: usize) -> usize {
        if self.backoff_until.is_some_and(|t| now < t) {
            return 0;
        }
        if self.is_idle(now) {
            return usize::from(self.kept).min(per_kind);
        }
        let peak = self.peak.max(self.previous_peak).max(1);
        // Its calls over this window and the one before, scaled to the time
        // a sandbox takes to make: the calls to expect meanwhile.
        let span = now.saturating_duration_since(self.window_start) + WINDOW;
        let calls = (self.calls + self.previous_calls) as u128;
        let while_making = (calls * make_time.as_nanos()).div_ceil(span.as_nanos().max(1));
        let while_making = usize::try_from(while_making).unwrap_or(usize::MAX);
        peak.saturating_add(while_making).min(per_kind)
    }

    fn held(&self) -> usize {
        self.ready.len() + self.making
    }

    /// Not called for [`IDLE`], and no call of it running.
    fn is_idle(&self, now: Instant) -> bool {
        self.in_flight == 0 && now.saturating_duration_since(self.last_call) >= IDLE
    }
}

#[derive(Default)]
struct State {
    kinds: HashMap<Key, Kind>,
    /// Sandboxes ready or in the making, over every kind.
    total: usize,
    /// A sweeper task runs.
    sweeping: bool,
    /// How long a sandbox takes to make (moving average), for the targets.
    make_time: Option<Duration>,
    /// Memory of the sandboxes held: measured for those ready, estimated
    /// for those in the making.
    bytes: u64,
    /// What one sandbox holds (moving average of those measured).
    estimate: Option<u64>,
    /// The layers of the images whose kinds keep a sandbox while idle.
    kept_images: HashSet<Vec<PathBuf>>,
}

impl State {
    fn estimate(&self) -> u64 {
        self.estimate.unwrap_or(FIRST_ESTIMATE).max(1)
    }

    /// How many more sandboxes the bounds leave room for.
    fn room(&self, max_total: usize, max_bytes: Option<u64>) -> usize {
        let by_count = max_total.saturating_sub(self.total);
        let by_bytes = max_bytes.map_or(usize::MAX, |max| {
            usize::try_from(max.saturating_sub(self.bytes) / self.estimate()).unwrap_or(usize::MAX)
        });
        by_count.min(by_bytes)
    }

    /// Takes a sandbox's measured memory into the average.
    fn measured(&mut self, bytes: u64) {
        let average = *self.estimate.get_or_insert(bytes);
        self.estimate = Some((average.saturating_mul(7).saturating_add(bytes)) / 8);
    }

    /// Lets go of `n` sandboxes holding `bytes` between them.
    fn remove(&mut self, n: usize, bytes: u64) {
        self.total = self.total.saturating_sub(n);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

struct Inner {
    sandbox: Arc<Sandbox>,
    max_total: usize,
    /// The operator's memory budget for the pool.
    max_bytes: Option<u64>,
    per_kind: usize,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
    /// Called when the pool lets go of the last hold on an image's lease.
    on_lease_ended: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Runs answered and still ending in the background.
    ending: AtomicUsize,
}

/// The pool of every kind of run of one runner.
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("max_total", &self.inner.max_total)
            .finish_non_exhaustive()
    }
}

/// A call counted in its kind until dropped.
struct InFlight {
    inner: Arc<Inner>,
    key: Key,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        if let Some(kind) = state.kinds.get_mut(&self.key) {
            kind.in_flight = kind.in_flight.saturating_sub(1);
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_gauge(&self, state: &State) {
        self.metrics
            .pool_sandboxes
            .store(i64::try_from(state.total).unwrap_or(i64::MAX), Relaxed);
        self.metrics
            .pool_memory_bytes
            .store(i64::try_from(state.bytes).unwrap_or(i64::MAX), Relaxed);
    }

    /// Lets go of a sandbox's hold on its image's lease; if it was the last
    /// hold, the lease ends, and the pool says so.
    fn release(&self, lease: Option<Arc<Lease>>) {
        if let Some(lease) = lease.and_then(Arc::into_inner) {
            drop(lease);
            if let Some(ended) = self.on_lease_ended.get() {
                ended();
            }
        }
    }
}

impl Pool {
    /// A pool of at most `max_total` sandboxes over every kind (at least 1),
    /// holding at most `max_bytes` of memory between them if that is set,
    /// made by `sandbox`.
    pub fn new(
        sandbox: Arc<Sandbox>,
        max_total: usize,
        max_bytes: Option<u64>,
        metrics: Arc<Metrics>,
    ) -> Pool {
        let max_total = max_total.max(1);
        Pool {
            inner: Arc::new(Inner {
                sandbox,
                max_total,
                max_bytes,
                per_kind: PER_KIND.min(max_total),
                state: Mutex::new(State::default()),
                metrics,
                on_lease_ended: OnceLock::new(),
                ending: AtomicUsize::new(0),
            }),
        }
    }

    /// Has `ended` called whenever the pool ends the last sandbox that held
    /// an image's lease (and no call holds it either): the image may be
    /// evicted from then on. Set once; later calls are ignored.
    pub fn on_lease_ended(&self, ended: impl Fn() + Send + Sync + 'static) {
        let _ = self.inner.on_lease_ended.set(Box::new(ended));
    }

    /// Keeps one sandbox ready for each kind of run of the image with these
    /// layers that has been called, also while it is not called
    /// (`--prefetch`): its first call makes its own, as any, and from then
    /// on a call finds one, however rare its calls. The sandboxes count in
    /// the pool's bounds as any, and hold the image's lease, so no prune
    /// evicts it while they are kept.
    pub fn keep_ready(&self, layers: Vec<PathBuf>) {
        let mut state = self.inner.lock();
        for (key, kind) in &mut state.kinds {
            if key.layers == layers {
                kind.kept = true;
            }
        }
        state.kept_images.insert(layers);
    }

    /// Runs `spec` as [`Sandbox::run`] does, on a sandbox of the pool when
    /// one of its kind is ready, else on one made now; then has the pool
    /// refilled. `lease` is the image's, which pooled sandboxes keep.
    pub async fn run(
        &self,
        spec: &RunSpec,
        lease: Option<Arc<Lease>>,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        let sandbox = &self.inner.sandbox;
        let Some(key) = Key::of(spec) else {
            return sandbox
                .run_off_worker(Arc::new(spec.clone()), input, timeout)
                .await;
        };
        let (taken, _in_flight) = self.take(&key);
        // The refill starts once this call has its sandbox, so that a call
        // that makes its own does not queue behind the pool's at the
        // spawner. The call's own lease lives until its run is over.
        let (run, _its_lease) = match taken {
            Some(Entry { run, _lease, .. }) => {
                self.inner.metrics.pool_hits.fetch_add(1, Relaxed);
                (run, _lease)
            }
            None => {
                self.inner.metrics.pool_misses.fetch_add(1, Relaxed);
                let spec = Arc::new(spec.clone());
                (sandbox.prepare_off_worker(spec).await?, None)
            }
        };
        self.refill(&key, spec, lease.clone());
        let (outcome, ending) = sandbox.answer_prepared(run, input, timeout).await?;
        // The sandbox's overlay root stands on the image's layers until its
        // mount namespace is gone: the leases go with its ending.
        self.end(ending, [_its_lease, lease]).await;
        Ok(outcome)
    }

    /// Ends a run answered early: in the background, off its call's path,
    /// while fewer than [`MAX_ENDING`] are; else now. The leases its root
    /// stands on are let go of once it has ended (and the pool says so if
    /// that was their last hold, as for its own sandboxes).
    async fn end(&self, ending: Ending, leases: [Option<Arc<Lease>>; 2]) {
        let inner = self.inner.clone();
        let end = async move {
            ending.finish().await;
            for lease in leases {
                inner.release(lease);
            }
        };
        let ending_now = &self.inner.ending;
        if ending_now.fetch_add(1, Relaxed) >= MAX_ENDING {
            ending_now.fetch_sub(1, Relaxed);
            return end.await;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            end.await;
            inner.ending.fetch_sub(1, Relaxed);
        });
    }

    /// Counts a call of `key` and takes a ready sandbox of it, if there is
    /// one that can still be used.
    fn take(&self, key: &Key) -> (Option<Entry>, InFlight) {
        let now = Instant::now();
        let mut unusable = Vec::new();
        let taken = {
            let mut state = self.inner.lock();
            if !state.sweeping {
                state.sweeping = true;
                tokio::spawn(sweep(Arc::downgrade(&self.inner)));
            }
            let kept = state.kept_images.contains(&key.layers);
            let kind = state.kinds.entry(key.clone()).or_insert_with(|| Kind {
                kept,
                ..Kind::new(now)
            });
            kind.roll(now);
            kind.in_flight += 1;
            kind.peak = kind.peak.max(kind.in_flight);
            kind.calls += 1;
            kind.last_call = now;
            let mut taken = None;
            while let Some(entry) = kind.ready.pop() {
                if entry.run.is_usable() {
                    taken = Some(entry);
                    break;
                }
                unusable.push(entry);
            }
            let gone = unusable.len() + usize::from(taken.is_some());
            let bytes = unusable.iter().chain(&taken).map(|e| e.bytes).sum();
            state.remove(gone, bytes);
            self.inner.set_gauge(&state);
            taken
        };
        for entry in unusable {
            tracing::debug!(
                init = entry.run.pid(),
                "a pooled sandbox died before its call"
            );
            discard(self.inner.clone(), entry);
        }
        let in_flight = InFlight {
            inner: self.inner.clone(),
            key: key.clone(),
        };
        (taken, in_flight)
    }

    /// Starts making sandboxes of `key` up to its target, in the background.
    fn refill(&self, key: &Key, spec: &RunSpec, lease: Option<Arc<Lease>>) {
        let now = Instant::now();
        let (wanted, estimate) = {
            let mut state = self.inner.lock();
            let make_time = state.make_time.unwrap_or(Duration::from_millis(5));
            let room = state.room(self.inner.max_total, self.inner.max_bytes);
            let estimate = state.estimate();
            let per_kind = self.inner.per_kind;
            let Some(kind) = state.kinds.get_mut(key) else {
                return;
            };
            let wanted = kind
                .target(now, make_time, per_kind)
                .saturating_sub(kind.held())
                .min(room);
            kind.making += wanted;
            state.total += wanted;
            let reserved = estimate.saturating_mul(u64::try_from(wanted).unwrap_or(u64::MAX));
            state.bytes = state.bytes.saturating_add(reserved);
            self.inner.set_gauge(&state);
            (wanted, estimate)
        };
        if wanted == 0 {
            return;
        }
        let spec = Arc::new(spec.clone());
        for _ in 0..wanted {
            let (inner, key, spec, lease) =
                (self.inner.clone(), key.clone(), spec.clone(), lease.clone());
            tokio::spawn(async move { make(&inner, &key, &spec, lease, estimate).await });
        }
    }
}

/// A place in the pool's bounds for a sandbox the pool does not keep itself
/// (a function server's spare, which `fnrun_host` makes): counted in the
/// total of `--sandbox-pool`, in the memory budget and in the pool's gauges
/// until dropped.
pub struct Place {
    inner: Arc<Inner>,
    /// Counted in [`State::bytes`]: the estimate, then what was measured.
    bytes: u64,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Place {
    /// Counts what its sandbox was measured to hold instead of the
    /// estimate it was given.
    pub fn measured(&mut self, bytes: u64) {
        let mut state = self.inner.lock();
        state.measured(bytes);
        state.bytes = state.bytes.saturating_sub(self.bytes).saturating_add(bytes);
        self.bytes = bytes;
        self.inner.set_gauge(&state);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        state.remove(1, self.bytes);
        self.inner.set_gauge(&state);
    }
}

impl Pool {
    /// A place for one sandbox made ahead outside the pool's kinds, if the
    /// bounds have room for it.
    pub fn place(&self) -> Option<Place> {
        let mut state = self.inner.lock();
        if state.room(self.inner.max_total, self.inner.max_bytes) == 0 {
            return None;
        }
        let bytes = state.estimate();
        state.total += 1;
        state.bytes = state.bytes.saturating_add(bytes);
        self.inner.set_gauge(&state);
        Some(Place {
            inner: self.inner.clone(),
            bytes,
        })
    }
}

/// Makes one sandbox of `key` (counted in its `making` already, with
/// `reserved` bytes) and puts it in the pool once its root is built, with
/// its memory measured, unless the kind no longer wants it.
async fn make(
    inner: &Arc<Inner>,
    key: &Key,
    spec: &Arc<RunSpec>,
    lease: Option<Arc<Lease>>,
    reserved: u64,
) {
    let started = Instant::now();
    let made = match inner.sandbox.prepare_off_worker(spec.clone()).await {
        Ok(run) => run.into_ready().await,
        Err(e) => Err(e),
    };
    let now = Instant::now();
    // Read from its cgroup before the pool's lock, which calls take.
    let bytes = made.as_ref().ok().and_then(PreparedRun::memory_bytes);
    let unwanted = {
        let mut state = inner.lock();
        let took = now - started;
        let average = *state.make_time.get_or_insert(took);
        let make_time = (average * 7 + took) / 8;
        state.make_time = Some(make_time);
        let per_kind = inner.per_kind;
        if let Some(bytes) = bytes {
            state.measured(bytes);
        }
        // The kind may have been swept and made anew meanwhile, without
        // this sandbox in its count.
        match (made, state.kinds.get_mut(key)) {
            (Ok(run), Some(kind)) => {
                kind.making = kind.making.saturating_sub(1);
                if kind.held() < kind.target(now, make_time, per_kind) {
                    let bytes = bytes.unwrap_or(reserved);
                    kind.ready.push(Entry {
                        run,
                        _lease: lease,
                        bytes,
                    });
                    state.bytes = state.bytes.saturating_sub(reserved).saturating_add(bytes);
                    inner.set_gauge(&state);
                    return;
                }
                Some(run)
            }
            // Swept meanwhile: not wanted.
            (Ok(run), None) => Some(run),
            (Err(e), kind) => {
                if let Some(kind) = kind {
                    kind.making = kind.making.saturating_sub(1);
                    kind.backoff_until = Some(now + BACKOFF);
                }
                tracing::warn!(error = %e, "cannot make a sandbox ahead of its call");
                None
            }
        }
    };
    // Not in the pool after all.
    {
        let mut state = inner.lock();
        state.remove(1, reserved);
        inner.set_gauge(&state);
    }
    if let Some(run) = unwanted {
        run.discard().await;
    }
    inner.release(lease);
}

/// Ends a sandbox of the pool, off the caller's path.
fn discard(inner: Arc<Inner>, entry: Entry) {
    tokio::spawn(async move {
        entry.run.discard().await;
        inner.release(entry._lease);
    });
}

/// Ends the sandboxes of kinds not called lately, and forgets the kinds
/// (but for one sandbox of each kind kept ready, see [`Pool::keep_ready`]),
/// every [`SWEEP`], until nothing is left to end (or the pool is dropped).
async fn sweep(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut ended = Vec::new();
        let done = {
            let mut state = inner.lock();
            state.kinds.retain(|_, kind| {
                if !kind.is_idle(now) {
                    return true;
                }
                if kind.kept {
                    let extra = kind.ready.len().saturating_sub(1);
                    ended.extend(kind.ready.drain(..extra));
                    return true;
                }
                // Sandboxes still in the making find their kind gone.
                ended.append(&mut kind.ready);
                false
            });
            let bytes = ended.iter().map(|e| e.bytes).sum();
            state.remove(ended.len(), bytes);
            inner.set_gauge(&state);
            // Only kept kinds, idle, are left: nothing more to sweep until
            // a call (which starts the sweeper again).
            let done = state.kinds.values().all(|k| k.kept && k.is_idle(now));
            if done {
                state.sweeping = false;
            }
            done
        };
        for entry in ended {
            discard(inner.clone(), entry);
        }
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAKE: Duration = Duration::from_millis(5);

    #[test]
    fn a_kind_not_called_lately_wants_nothing() {
        let t0 = Instant::now();
        let mut kind = Kind::new(t0);
        kind.calls = 50;
        kind.peak = 4;
        assert!(kind.target(t0, MAKE, PER_KIND) > 0);
        assert_eq!(kind.target(t0 + IDLE, MAKE, PER_KIND), 0);
        kind.backoff_until = Some(t0 + BACKOFF);
        assert_eq!(kind.target(t0, MAKE, PER_KIND), 0);
        assert!(kind.target(t0 + BACKOFF, MAKE, PER_KIND) > 0);
    }

    #[test]
    fn a_kept_kind_wants_one_while_not_called() {
        let t0 = Instant::now();
        let mut kind = Kind {
            kept: true,
            ..Kind::new(t0)
        };
        kind.calls = 50;
        kind.peak = 4;
        assert!(kind.target(t0, MAKE, PER_KIND) > 1);
        assert_eq!(kind.target(t0 + IDLE, MAKE, PER_KIND), 1);
        assert_eq!(kind.target(t0 + IDLE * 100, MAKE, PER_KIND), 1);
        // Not while it cannot be made.
        kind.backoff_until = Some(t0 + IDLE + BACKOFF);
        assert_eq!(kind.target(t0 + IDLE, MAKE, PER_KIND), 0);
        // And a kind not kept wants none.
        kind.backoff_until = None;
        kind.kept = false;
        assert_eq!(kind.target(t0 + IDLE, MAKE, PER_KIND), 0);
    }

    #[test]
    fn the_target_follows_concurrency_and_rate_within_the_cap() {
        let t0 = Instant::now();
        let mut kind = Kind::new(t0);
        // One call at a time, and one more for a call that comes while a
        // sandbox is made (however rare the calls, that rounds up to one).
        kind.calls = 1;
        kind.peak = 1;
        assert_eq!(kind.target(t0, MAKE, PER_KIND), 2);
        // 800 calls over 2 s (400/s), 5 ms to make one: 2 more expected
        // while one is made; 3 at once.
        kind.calls = 800;
        kind.peak = 3;
        assert_eq!(kind.target(t0, MAKE, PER_KIND), 5);
        kind.peak = 30;
        assert_eq!(kind.target(t0, MAKE, PER_KIND), PER_KIND);
        assert_eq!(kind.target(t0, MAKE, 2), 2);
    }

    #[test]
    fn places_count_in_the_bound_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = fnrun_sandbox::SandboxConfig::new(
            dir.path().join("scratch"),
            fnrun_sandbox::IdMap::detect(0, 0),
        );
        // Nothing is run: no cgroup is touched, no spawner started.
        config.cgroup.enabled = false;
        config.spawner = false;
        let sandbox = Arc::new(Sandbox::new(config).unwrap());
        let metrics = Arc::new(Metrics::default());
        let pool = Pool::new(sandbox.clone(), 2, None, metrics.clone());
        let a = pool.place().expect("room for one");
        let b = pool.place().expect("room for two");
        assert!(pool.place().is_none(), "the bound holds");
        assert_eq!(metrics.pool_sandboxes.load(Relaxed), 2);
        let estimate = i64::try_from(FIRST_ESTIMATE).unwrap();
        assert_eq!(metrics.pool_memory_bytes.load(Relaxed), 2 * estimate);
        drop(a);
        assert_eq!(metrics.pool_sandboxes.load(Relaxed), 1);
        let c = pool.place().expect("room again");
        drop((b, c));
        assert_eq!(metrics.pool_sandboxes.load(Relaxed), 0);
        assert_eq!(metrics.pool_memory_bytes.load(Relaxed), 0);
        assert_eq!(pool.inner.lock().total, 0);

        // A memory budget bounds them too, by what they were measured to
        // hold once they were.
        let metrics = Arc::new(Metrics::default());
        let pool = Pool::new(sandbox, 8, Some(3 << 20), metrics.clone());
        let mut a = pool.place().expect("1 MiB estimated");
        let b = pool.place().expect("2 MiB estimated");
        a.measured(512 << 10);
        assert_eq!(
            metrics.pool_memory_bytes.load(Relaxed),
            (512 << 10) + estimate
        );
        // The first measure is the estimate from then on: 1.5 MiB counted,
        // room for three more of 0.5 MiB in the 3 MiB.
        assert_eq!(pool.inner.lock().estimate(), 512 << 10);
        let more: Vec<Place> = std::iter::from_fn(|| pool.place()).take(8).collect();
        assert_eq!(more.len(), 3, "the budget holds");
        assert_eq!(metrics.pool_memory_bytes.load(Relaxed), 3 << 20);
        drop((a, b, more));
        assert_eq!(metrics.pool_memory_bytes.load(Relaxed), 0);
        assert_eq!(pool.inner.lock().total, 0);
    }

    #[test]
    fn room_is_the_tighter_of_count_and_budget() {
        let mut state = State::default();
        assert_eq!(state.room(8, None), 8);
        assert_eq!(state.room(8, Some(3 << 20)), 3);
        state.total = 2;
        state.bytes = 2 << 20;
        assert_eq!(state.room(8, Some(3 << 20)), 1);
        state.estimate = Some(256 << 10);
        assert_eq!(state.room(8, Some(3 << 20)), 4);
        assert_eq!(state.room(3, Some(3 << 20)), 1);
        state.bytes = 4 << 20;
        assert_eq!(state.room(8, Some(3 << 20)), 0);
        state.remove(2, 8 << 20);
        assert_eq!((state.total, state.bytes), (0, 0));
    }

    #[test]
    fn windows_roll_and_forget_a_quiet_past() {
        let t0 = Instant::now();
        let mut kind = Kind::new(t0);
        kind.calls = 10;
        kind.peak = 6;
        kind.in_flight = 1;
        kind.roll(t0 + WINDOW);
        assert_eq!((kind.previous_calls, kind.previous_peak), (10, 6));
        assert_eq!((kind.calls, kind.peak), (0, 1));
        // Two windows later with no call between: the past is gone.
        kind.in_flight = 0;
        kind.roll(t0 + 4 * WINDOW);
        assert_eq!((kind.previous_calls, kind.previous_peak), (0, 0));
    }
}
