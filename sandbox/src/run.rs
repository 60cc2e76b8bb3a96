//! A per-call run: input on stdin, output read from stdout (up to a limit),
//! the tail of stderr kept, a timeout, and how it ended.
//!
//! It is two halves. [`Sandbox::prepare`] does everything that does not
//! depend on the call: the pipes, the plan, the cgroup, the clone, the id
//! maps, and in init the whole root (mounts, `/proc`, `pivot_root`); then
//! init forks the function, which drops every privilege and installs the
//! seccomp filter exactly as in any run, reports that it is ready and waits
//! at its exec. [`Sandbox::run_prepared`] is the call: it hands the function
//! the go, writes the input, reads the output under the timeout, and ends
//! the run. [`Sandbox::run`] is the two in a
//! row. A [`PreparedRun`] serves one call; dropping it unused kills its init
//! and removes its cgroup, as for any abandoned run. A service run is made
//! ahead the same way ([`Sandbox::prepare_service`]).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::init::Report;
use crate::process::{self, Kind, Status};
use crate::{RunSpec, Sandbox, stdio};

/// The result of a run that started.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Everything written to stdout (at most `max_output_bytes`).
    pub stdout: Vec<u8>,
    /// The last `stderr_tail_bytes` written to stderr.
    pub stderr_tail: Vec<u8>,
    /// From the call's start to the end of the run: from the clone for
    /// [`Sandbox::run`], from the hand-over for [`Sandbox::run_prepared`].
    pub elapsed: Duration,
    /// Highest memory use of the run, when its cgroup reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all the run's processes, when its cgroup reports it.
    pub cpu_time: Option<Duration>,
}

/// A sandbox made ahead of its use: init in its namespaces, cgroup and id
/// maps, building (or done building) the root, and then the function
/// waiting for the go at its exec. Serves
/// one run. Dropped unused, it kills its init (and with it the whole
/// sandbox) and removes its cgroup. `K` says what it was made for:
/// [`PreparedRun`] ([`Sandbox::prepare`], for [`Sandbox::run_prepared`]) or
/// [`crate::PreparedService`] ([`Sandbox::prepare_service`], for
/// [`Sandbox::start_prepared_service`]).
pub struct Prepared<K> {
    pub(crate) started: process::Started,
    /// Init reported that its root is built.
    ready: bool,
    kind: PhantomData<fn() -> K>,
}

/// What a [`PreparedRun`] is for: a per-call run.
#[derive(Debug)]
pub enum ForCall {}

/// A sandbox made ahead of its call by [`Sandbox::prepare`].
pub type PreparedRun = Prepared<ForCall>;

impl<K> std::fmt::Debug for Prepared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(std::any::type_name::<Self>())
            .field("init", &self.started.guard.pid())
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<K> Prepared<K> {
    pub(crate) fn new(started: process::Started) -> Prepared<K> {
        Prepared {
            started,
            ready: false,
            kind: PhantomData,
        }
    }

    /// The pid of its init, in this process's PID namespace.
    pub fn pid(&self) -> libc::pid_t {
        self.started.guard.pid()
    }

    /// Waits until init has built the root and the function waits for the
    /// go at its exec. An error when they could not (which step or stage
    /// failed, with its errno) or died: such a
    /// sandbox is of no use, drop it.
    pub async fn ready(&mut self) -> Result<(), Error> {
        if self.ready {
            return Ok(());
        }
        // Only the descriptor is borrowed across the wait: the rest of the
        // run is `Send` but not `Sync`.
        let report = &self.started.ends.report;
        let next = Report::read_next(report).await;
        let plan = &self.started.plan;
        match next {
            Ok(Some(Report::Ready)) => {
                self.ready = true;
                Ok(())
            }
            Ok(Some(Report::Failed { stage, errno })) => {
                Err(stage.error(plan, nix::errno::Errno::from_raw(errno)))
            }
            Ok(_) => Err(Error::InitDied {
                status: "before it was ready".to_owned(),
            }),
            Err(e) => Err(Error::io("wait for the sandbox to be ready")(e)),
        }
    }

    /// What it holds in memory while it waits: its cgroup's peak (init's
    /// pages and the kernel memory its namespaces, mounts and root took),
    /// else (no cgroup, as for a rootless runner without a delegated one)
    /// its init's proportional set size, else (init is not dumpable, so
    /// only a runner with CAP_SYS_PTRACE, root, reads its `smaps_rollup`)
    /// its private resident memory, which counts pages it still shares
    /// with its spawner in full; `None` when none can be read.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.started
            .guard
            .peak_memory()
            .or_else(|| pss_bytes(self.pid()))
            .or_else(|| private_rss_bytes(self.pid()))
    }

    /// [`Prepared::ready`], discarding it when it fails: it, once ready, or
    /// why it could not be made.
    pub async fn into_ready(mut self) -> Result<Prepared<K>, Error> {
        match self.ready().await {
            Ok(()) => Ok(self),
            Err(e) => {
                self.discard().await;
                Err(e)
            }
        }
    }

    /// Whether it can still be used: init has not exited (it may have been
    /// killed meanwhile, by the OOM killer or by hand).
    pub fn is_usable(&self) -> bool {
        !self.started.guard.has_exited()
    }

    /// Ends it unused: kills init, reaps it and removes its cgroup, without
    /// blocking the thread (dropping it does the same, waiting for the reap).
    pub async fn discard(self) {
        let mut started = self.started;
        started.guard.kill();
        if let Err(e) = started.guard.reap().await {
            tracing::warn!(error = %e, "cannot reap a prepared sandbox");
        }
        started.guard.remove_cgroup();
    }
}

/// Runs `f` on the tokio runtime's blocking pool.
pub(crate) async fn off_worker<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    match tokio::task::spawn_blocking(f).await {
        Ok(made) => made,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only with the runtime, which drops the caller too.
        Err(_) => Err(Error::Setup {
            what: "make a sandbox (the runtime is shutting down)".to_owned(),
            errno: nix::errno::Errno::ECANCELED,
        }),
    }
}

/// The anonymous and shared-memory resident set of process `pid`, from
/// `status` (which, unlike `smaps_rollup`, needs no access to the process).
fn private_rss_bytes(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    };
    kib("RssAnon:")?
        .checked_add(kib("RssShmem:")?)?
        .checked_mul(1024)
}

/// The proportional set size of process `pid`, from `smaps_rollup`.
fn pss_bytes(pid: libc::pid_t) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

impl Sandbox {
    /// Makes a sandbox for a run of `spec` ahead of its call (see
    /// [`PreparedRun`]). Returns once init is released; [`PreparedRun::ready`]
    /// waits for its root.
    pub fn prepare(&self, spec: &RunSpec) -> Result<PreparedRun, Error> {
        Ok(PreparedRun::new(self.start(spec, Kind::Call)?))
    }

    /// [`Sandbox::prepare`] on the tokio runtime's blocking pool, for a
    /// caller on an async worker. The clone blocks its thread for a
    /// millisecond or more (a round trip to the spawner, the namespaces);
    /// on a worker it would hold up that worker's other tasks, the calls in
    /// flight among them.
    pub async fn prepare_off_worker(
        self: &Arc<Self>,
        spec: Arc<RunSpec>,
    ) -> Result<PreparedRun, Error> {
        let sandbox = self.clone();
        off_worker(move || sandbox.prepare(&spec)).await
    }

    /// Runs `spec` with `input` on stdin, killing it (every process of it)
    /// after `timeout`: [`Sandbox::prepare`] and [`Sandbox::run_prepared`] in
    /// a row, the timeout counted from the clone.
    ///
    /// Returns the outcome of a run that started, whatever the function did;
    /// an error only when the sandbox could not be built or the function could
    /// not be executed. Dropping the future kills the run.
    pub async fn run(
        &self,
        spec: &RunSpec,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        let prepared = self.prepare(spec)?;
        let since = prepared.started.at;
        self.run_and_end(prepared, input, timeout, since).await
    }

    /// [`Sandbox::run`] with its sandbox made on the tokio runtime's
    /// blocking pool (see [`Sandbox::prepare_off_worker`]), for a caller on
    /// an async worker: the runner's runs that its pool has no sandbox for
    /// (those with bind mounts or a caller's ids). A runner without a pool
    /// (`--sandbox-pool 0`, the CLI's) prepares and answers early
    /// ([`Sandbox::answer_prepared`]) instead, its teardown off the call's
    /// path.
    pub async fn run_off_worker(
        self: &Arc<Self>,
        spec: Arc<RunSpec>,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        let prepared = self.prepare_off_worker(spec).await?;
        let since = prepared.started.at;
        self.run_and_end(prepared, input, timeout, since).await
    }

    /// The call on a prepared sandbox: `input` on stdin, every process of
    /// the run killed after `timeout`, counted from now. As [`Sandbox::run`]
    /// otherwise: the function drops its privileges and installs the
    /// seccomp filter before its exec, and the run ends with every process
    /// killed and the cgroup removed. `prepared` must come from this
    /// sandbox. Dropping the future kills the run.
    pub async fn run_prepared(
        &self,
        prepared: PreparedRun,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        self.run_and_end(prepared, input, timeout, Instant::now())
            .await
    }

    /// The call on a prepared sandbox, answered as soon as every process of
    /// the run is dead: [`Sandbox::run_prepared`] without the wait for the
    /// teardown. The outcome comes once stdout and stderr are closed and
    /// init has reported the function's exit, which it does only after it
    /// killed and reaped whatever the function left running; the cgroup's
    /// usage is read then. Init's own exit (which tears down the sandbox's
    /// mount and other namespaces), its reap and the cgroup's removal are
    /// the returned [`Ending`]'s, for the caller to await off the call's
    /// path. A run cut short (timeout, output
    /// over its limit) or whose init died is ended before this returns, as
    /// by [`Sandbox::run_prepared`].
    pub async fn answer_prepared(
        &self,
        prepared: PreparedRun,
        input: &[u8],
        timeout: Duration,
    ) -> Result<(Outcome, Ending), Error> {
        self.call(prepared, input, timeout, Instant::now(), true)
            .await
    }

    async fn run_and_end(
        &self,
        prepared: PreparedRun,
        input: &[u8],
        timeout: Duration,
        since: Instant,
    ) -> Result<Outcome, Error> {
        let (outcome, ending) = self.call(prepared, input, timeout, since, false).await?;
        ending.finish().await;
        Ok(outcome)
    }

    /// The call. With `early`, it returns once the function's exit is
    /// reported (see [`Sandbox::answer_prepared`]); without, once init is
    /// reaped and the cgroup removed (the [`Ending`] is then empty).
    async fn call(
        &self,
        prepared: PreparedRun,
        input: &[u8],
        timeout: Duration,
        since: Instant,
        early: bool,
    ) -> Result<(Outcome, Ending), Error> {
        let process::Started {
            mut guard,
            ends,
            plan,
            go,
            ..
        } = prepared.started;
        let stderr = ends.stderr.expect("a per-call run has its own stderr pipe");
        // The input first, then the go: the function finds its input when it
        // first reads.
        let (stdio, written) = stdio::Stdio::prefilled(ends.stdin, ends.stdout, stderr, input)
            .map_err(Error::io("set up the run's stdio"))?;
        go.send();
        let input = &input[written..];
        let mut io = stdio::Pumped::default();
        // Reports read off the pipe before init died, in an early answer.
        let mut read = Vec::new();
        let exited = guard.exited();
        let report = &ends.report;
        let cfg = &self.config;
        let finished = tokio::time::timeout(timeout, async {
            stdio
                .pump(input, cfg.max_output_bytes, cfg.stderr_tail_bytes, &mut io)
                .await;
            if io.output_too_large {
                return None;
            }
            if early {
                // Init reports the function's exit once every other process
                // of the run is dead, and exits right after.
                match Report::until_exit(report).await {
                    Ok(results) => return Some(results),
                    Err(results) => read.extend(results),
                }
            }
            let _ = exited.await;
            None
        })
        .await;
        let cut = match &finished {
            Err(_) => Some(Status::TimedOut),
            Ok(_) if io.output_too_large => Some(Status::OutputTooLarge),
            Ok(_) => None,
        };
        let (status, usage, ending) = if let Ok(Some(results)) = finished {
            // Answered early: every process of the run is dead, and its
            // results are in.
            let usage = guard.usage();
            let ending = Ending {
                guard: Some(guard),
                _report: Some(ends.report),
            };
            match process::ended(&plan, None, &results, None, &usage) {
                Ok(status) => (status, usage, ending),
                Err(e) => {
                    ending.finish().await;
                    return Err(e);
                }
            }
        } else {
            if cut.is_some() {
                guard.kill();
            }
            let init_status = guard.reap().await?;
            let usage = guard.remove_cgroup();
            read.extend(Report::read_all(ends.report));
            let status = process::ended(&plan, cut, &read, Some(init_status), &usage)?;
            (status, usage, Ending::default())
        };
        let outcome = Outcome {
            status,
            stdout: io.stdout,
            stderr_tail: io.stderr_tail,
            elapsed: since.elapsed(),
            peak_memory_bytes: usage.peak_memory_bytes,
            cpu_time: usage.cpu_time,
        };
        Ok((outcome, ending))
    }
}

/// The end of a run answered early ([`Sandbox::answer_prepared`]): init's
/// exit, which tears the sandbox down, its reap and the removal of its
/// cgroup. [`Ending::finish`] waits for it without blocking the thread;
/// dropped, it kills init and reaps it, blocking, as an abandoned run is.
#[derive(Default)]
#[must_use = "a run's ending holds its init and cgroup until finished or dropped"]
pub struct Ending {
    guard: Option<process::InitGuard>,
    /// Init's report pipe, held open until init is reaped: init still
    /// writes to it after a function's failure report.
    _report: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ending")
            .field("init", &self.guard.as_ref().map(process::InitGuard::pid))
            .finish()
    }
}

impl Ending {
    /// Whether there is anything left to end.
    pub fn is_pending(&self) -> bool {
        self.guard.is_some()
    }

    /// Waits for init's exit, reaps it and removes the run's cgroup.
    pub async fn finish(mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        let pid = guard.pid();
        let at = Instant::now();
        if let Err(e) = guard.reap().await {
            tracing::warn!(init = pid, error = %e, "cannot reap a run's init");
        }
        guard.discard_cgroup();
        tracing::trace!(init = pid, took = ?at.elapsed(), "run ended");
    }
}
