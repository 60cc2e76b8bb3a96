//! One warm instance of a server-mode function: its image from the cache
//! (leased while it runs), turned into a [`fnrun_sandbox::RunSpec`] the way
//! per-call runs are ([`fnrun_runner::image_spec`]), started as a service run, and
//! ready when its own port, `127.0.0.1:9443` inside its network namespace,
//! answers gRPC. Calls reach it over one HTTP/2 connection
//! ([`Upstream`]); no port is published on the node.
//!
//! A start may take a [`Spare`]: a sandbox made ahead for the same run spec
//! (after the function's last instance stopped for idleness), so that the
//! start costs about the server's own start. A spare that no longer fits
//! (another image, other options) is ended and the start makes its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fnrun_cache::Lease;
use fnrun_runner::pool::Place;
use fnrun_sandbox::{
    ExitWatch, PreparedService, RunSpec, Service, ServiceExit, Status as RunStatus,
};
use tonic::metadata::MetadataMap;
use tonic::{Code, Response, Status};

use super::catalogue::{CredentialSource, FunctionDef};
use super::error::{ExitReport, HostError};
use super::upstream::{FUNCTION_PORT, Upstream, is_transport};
use fnrun_runner::error::RunError;
use fnrun_runner::image_spec::{self, SpecOptions};
use fnrun_runner::runner::Runner;
use fnrun_registry::Credentials;
use fnrun_registry::credentials::docker_config;

/// The argument every Function package's server takes to serve plain h2c
/// (function-sdk-go and function-sdk-python): TLS ends at the host.
pub const INSECURE_ARG: &str = "--insecure";

/// The two packages of Crossplane's function API: one wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    V1,
    V1beta1,
}

impl Api {
    /// The path of `RunFunction`.
    pub fn path(self) -> &'static str {
        match self {
            Api::V1 => "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction",
            Api::V1beta1 => "/apiextensions.fn.proto.v1beta1.FunctionRunnerService/RunFunction",
        }
    }

    pub fn other(self) -> Api {
        match self {
            Api::V1 => Api::V1beta1,
            Api::V1beta1 => Api::V1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Api::V1 => "v1",
            Api::V1beta1 => "v1beta1",
        }
    }

    fn index(self) -> usize {
        match self {
            Api::V1 => 0,
            Api::V1beta1 => 1,
        }
    }
}

/// What the function's server answered.
pub type Answer = Result<Response<Bytes>, Status>;

/// A call that did not get an answer from the server: the connection broke
/// or could not be made.
#[derive(Debug)]
pub struct Broken(pub String);

/// A running function server.
pub struct Instance {
    pub id: u64,
    pub function: String,
    service: Service,
    exit: ExitWatch,
    upstream: Mutex<Upstream>,
    reconnect: tokio::sync::Mutex<()>,
    /// Per API: the server answered UNIMPLEMENTED on it and served the
    /// other, so calls on it go to the other first.
    unimplemented: [AtomicBool; 2],
    pub started: Instant,
    /// It started in a spare made ahead.
    pub from_spare: bool,
    /// Its run spec and its image's lease, for a spare after it.
    spec: Arc<RunSpec>,
    lease: Option<Arc<Lease>>,
}

/// A sandbox made ahead for a function's next server: its init waits with
/// the root built, holding a place in the `--sandbox-pool` bounds and its
/// image's lease.
pub struct Spare {
    prepared: PreparedService,
    spec: Arc<RunSpec>,
    lease: Option<Arc<Lease>>,
    _place: Place,
    /// When it was made: which spare an expiry is for.
    pub made: Instant,
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare")
            .field("init", &self.prepared.pid())
            .finish_non_exhaustive()
    }
}

impl Spare {
    /// Makes a spare for `spec` (the spec of an instance that ran), if the
    /// runner has a sandbox pool with room; `None` otherwise, or when it
    /// cannot be made (the next start makes its own and says why).
    pub async fn make(
        runner: &Runner,
        spec: Arc<RunSpec>,
        lease: Option<Arc<Lease>>,
    ) -> Option<Spare> {
        let Some(mut place) = runner.sandbox_place() else {
            runner.release_lease(lease);
            return None;
        };
        let made = match runner
            .sandbox()
            .prepare_service_off_worker(spec.clone())
            .await
        {
            Ok(prepared) => prepared.into_ready().await,
            Err(e) => Err(e),
        };
        match made {
            Ok(prepared) => {
                if let Some(bytes) = prepared.memory_bytes() {
                    place.measured(bytes);
                }
                Some(Spare {
                    prepared,
                    spec,
                    lease,
                    _place: place,
                    made: Instant::now(),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a function server's sandbox ahead");
                runner.release_lease(lease);
                None
            }
        }
    }

    /// The pid of its init.
    pub fn pid(&self) -> libc::pid_t {
        self.prepared.pid()
    }

    /// Ends it unused: its init and cgroup, then its place and lease.
    pub async fn end(self, runner: &Runner) {
        self.prepared.discard().await;
        runner.release_lease(self.lease);
    }

    /// [`Spare::end`] off the caller's path (or on it, outside a runtime:
    /// dropped, it kills its init and waits for it).
    pub fn end_in_background(self, runner: &Arc<Runner>) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let runner = runner.clone();
                runtime.spawn(async move { self.end(&runner).await });
            }
            Err(_) => drop(self),
        }
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("id", &self.id)
            .field("function", &self.function)
            .field("pid", &self.service.pid())
            .finish()
    }
}

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], FUNCTION_PORT))
}

impl Instance {
    /// Pulls (per the function's policy), starts and waits for the server.
    /// Returns the instance and how long the server took from start to ready.
    pub async fn start(
        runner: &Arc<Runner>,
        def: &FunctionDef,
        id: u64,
        spare: Option<Spare>,
    ) -> Result<(Instance, Duration), HostError> {
        let failed = |error: RunError| HostError::StartFailed {
            function: def.name.clone(),
            error: Arc::new(error),
        };
        let fetch = Instant::now();
        let credentials = credentials(runner, def).await?;
        let reference = runner.reference(&def.image).map_err(failed)?;
        let (image, lease) = runner
            .image(&reference, def.pull_policy, credentials, None)
            .await
            .map_err(failed)?;
        let mut args = vec![INSECURE_ARG.to_owned()];
        args.extend(def.args.iter().cloned());
        let env: Vec<String> = def.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let options = SpecOptions {
            extra_args: &args,
            extra_env: &env,
            network: def.network,
            limits: def.limits,
            ..SpecOptions::default()
        };
        let spec = image_spec::run_spec(&image, &runner.sandbox().config().id_map, &options)
            .map_err(failed)?;
        let started = Instant::now();
        let (service, from_spare) = match spare {
            Some(spare) if *spare.spec == spec && spare.prepared.is_usable() => {
                let service = runner.sandbox().start_prepared_service(spare.prepared);
                (service, true)
            }
            spare => {
                if let Some(spare) = spare {
                    // Another image or other options since, or its init
                    // died: ended off this start's path.
                    spare.end_in_background(runner);
                }
                let sandbox = runner.sandbox();
                let made = sandbox.prepare_service_off_worker(Arc::new(spec.clone()));
                let service = match made.await {
                    Ok(prepared) => sandbox.start_prepared_service(prepared),
                    Err(e) => Err(e),
                };
                (service, false)
            }
        };
        let service = service.map_err(|e| failed(e.into()))?;
        let exit = service.exit_watch();
        let spawned = started.elapsed();
        let (upstream, ready) = match wait_ready(def, &service, &exit, started).await {
            Ok(ready) => ready,
            Err(e) => {
                // Nothing of a server that did not start outlives the call
                // that learns of it: its processes and cgroup are gone first.
                service.stop().await;
                return Err(e);
            }
        };
        tracing::debug!(
            function = def.name,
            instance = id,
            digest = image.digest,
            pid = service.pid(),
            from_spare,
            image_us = crate::context::micros(started - fetch),
            spawn_us = crate::context::micros(spawned),
            listening_us = crate::context::micros(ready.listening),
            ready_us = crate::context::micros(started.elapsed()),
            polls = ready.polls,
            connecting_us = crate::context::micros(ready.connecting),
            "function server started"
        );
        Ok((
            Instance {
                id,
                function: def.name.clone(),
                service,
                exit,
                upstream: Mutex::new(upstream),
                reconnect: tokio::sync::Mutex::new(()),
                unimplemented: [AtomicBool::new(false), AtomicBool::new(false)],
                started,
                from_spare,
                spec: Arc::new(spec),
                lease,
            },
            started.elapsed(),
        ))
    }

    /// Its run spec and its image's lease: what a [`Spare`] for its
    /// function's next server is made of.
    pub fn spare_parts(&self) -> (Arc<RunSpec>, Option<Arc<Lease>>) {
        (self.spec.clone(), self.lease.clone())
    }

    /// A handle on the server's end.
    pub fn exit_watch(&self) -> ExitWatch {
        self.exit.clone()
    }

    /// The pid of the server's sandbox init.
    pub fn pid(&self) -> libc::pid_t {
        self.service.pid()
    }

    /// The last bytes the server wrote.
    pub fn output_tail(&self) -> String {
        String::from_utf8_lossy(&self.service.output_tail()).into_owned()
    }

    /// Sends `message` as a call on `api`; on the server's own
    /// UNIMPLEMENTED, again on the other API (same bytes, other path), as
    /// Crossplane falls back from v1 to v1beta1. Remembers an API the server
    /// does not serve, so later calls on it go to the other at once.
    pub async fn call(
        &self,
        api: Api,
        message: Bytes,
        metadata: MetadataMap,
        timeout: Duration,
    ) -> Result<Answer, Broken> {
        let upstream = self.upstream().await?;
        let first = if self.unimplemented[api.index()].load(Ordering::Relaxed) {
            api.other()
        } else {
            api
        };
        let started = Instant::now();
        let answer = upstream
            .unary(
                first.path(),
                message.clone(),
                metadata.clone(),
                Some(timeout),
            )
            .await;
        let answer = match answer {
            Err(status) if status.code() == Code::Unimplemented && !is_transport(&status) => {
                let other = first.other();
                let left = timeout.saturating_sub(started.elapsed());
                let answer = upstream
                    .unary(other.path(), message, metadata, Some(left))
                    .await;
                if answer.is_ok() {
                    self.unimplemented[first.index()].store(true, Ordering::Relaxed);
                }
                answer
            }
            answer => answer,
        };
        match answer {
            Err(status) if is_transport(&status) => Err(Broken(status.message().to_owned())),
            answer => Ok(answer),
        }
    }

    /// The connection, opened again if it has ended while the server runs.
    async fn upstream(&self) -> Result<Upstream, Broken> {
        let current = || {
            let upstream = self
                .upstream
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (!upstream.is_closed()).then(|| upstream.clone())
        };
        if let Some(upstream) = current() {
            return Ok(upstream);
        }
        let _one = self.reconnect.lock().await;
        if let Some(upstream) = current() {
            return Ok(upstream);
        }
        let stream = self
            .service
            .connect(local())
            .await
            .map_err(|e| Broken(format!("cannot connect to 127.0.0.1:{FUNCTION_PORT}: {e}")))?;
        let upstream = Upstream::handshake(stream)
            .await
            .map_err(|e| Broken(format!("HTTP/2 handshake failed: {e}")))?;
        *self
            .upstream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = upstream.clone();
        Ok(upstream)
    }
}

/// The error for a server that ended: out of memory is its own.
pub fn exit_error(def: &FunctionDef, exit: &ServiceExit) -> HostError {
    match exit.status {
        Ok(RunStatus::OutOfMemory) => HostError::OutOfMemory {
            function: def.name.clone(),
            limit: def.limits.memory_bytes.unwrap_or_default(),
            output: String::from_utf8_lossy(&exit.output_tail).into_owned(),
        },
        _ => HostError::Exited {
            function: def.name.clone(),
            exit: ExitReport::from(exit),
        },
    }
}

/// How often a starting server's port is tried at first.
const FIRST_POLLS_EVERY: Duration = Duration::from_micros(250);

/// Sleeps `d`: below tokio's millisecond tick on a blocking thread (the
/// pool keeps idle threads, so this costs a wake-up, not a thread).
async fn pause(d: Duration) {
    let precise = d < Duration::from_millis(1)
        && tokio::task::spawn_blocking(move || std::thread::sleep(d))
            .await
            .is_ok();
    if !precise {
        tokio::time::sleep(d).await;
    }
}

/// How a server became ready.
struct Ready {
    /// From the start to the first accepted connection.
    listening: Duration,
    /// Connections tried.
    polls: u32,
    /// Time spent trying them.
    connecting: Duration,
}

/// Polls the server's port until it answers gRPC, it ends, or its start
/// timeout passes.
async fn wait_ready(
    def: &FunctionDef,
    service: &Service,
    exit: &ExitWatch,
    started: Instant,
) -> Result<(Upstream, Ready), HostError> {
    let deadline = started + def.start_timeout;
    let mut last_error = "nothing listened".to_owned();
    let mut polls = 0;
    let mut connecting = Duration::ZERO;
    // tokio's timer ticks in milliseconds, which would quantise the start
    // of every instance; the first polls sleep on a blocking thread instead.
    let mut delay = FIRST_POLLS_EVERY;
    loop {
        if let Some(exit) = exit.try_exit() {
            return Err(exit_error(def, &exit));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        polls += 1;
        let t = Instant::now();
        let connected = service.connect(local()).await;
        connecting += t.elapsed();
        match connected {
            Ok(stream) => {
                let accepted = started.elapsed();
                match Upstream::handshake(stream).await {
                    Ok(upstream) => match upstream.probe(left.min(Duration::from_secs(2))).await {
                        Ok(()) => {
                            return Ok((
                                upstream,
                                Ready {
                                    listening: accepted,
                                    polls,
                                    connecting,
                                },
                            ));
                        }
                        Err(status) => {
                            last_error = format!("it does not answer gRPC: {}", status.message());
                        }
                    },
                    Err(e) => last_error = format!("HTTP/2 handshake failed: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                "connection refused".clone_into(&mut last_error);
            }
            Err(e) => last_error = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(HostError::NeverListened {
                function: def.name.clone(),
                port: FUNCTION_PORT,
                waited: def.start_timeout,
                last_error,
                output: String::from_utf8_lossy(&service.output_tail()).into_owned(),
            });
        }
        tokio::select! {
            () = pause(delay.min(deadline.saturating_duration_since(Instant::now()))) => {}
            exit = exit.clone().exited() => return Err(exit_error(def, &exit)),
        }
        // A server that takes long to listen is polled less often: every
        // 250 us for its first 50 ms or so, then every 10 ms.
        if polls == 200 {
            delay = Duration::from_millis(10);
        }
    }
}

/// The registry credentials of the function's image, from its source. Read
/// off the runtime's threads: a credential helper may run.
pub async fn credentials(runner: &Runner, def: &FunctionDef) -> Result<Credentials, HostError> {
    let source = def.credentials.clone();
    let image = def.image.clone();
    let cache = runner.cache_handle();
    let found = tokio::task::spawn_blocking(move || match &source {
        CredentialSource::DaemonDockerConfig => {
            docker_config::credentials_for_image(cache.default_registry(), &image)
        }
        CredentialSource::DockerConfig(path) => {
            docker_config::credentials_from_docker_config(cache.default_registry(), &image, path)
        }
        CredentialSource::PullSecret(path) => {
            docker_config::credentials_from_pull_secret(cache.default_registry(), &image, path)
        }
        CredentialSource::PullSecrets(secrets) => {
            for secret in secrets {
                let found = docker_config::credentials_from_pull_secret_json(
                    cache.default_registry(),
                    &image,
                    &secret.origin,
                    &secret.dockerconfigjson,
                )?;
                if found != Credentials::Anonymous {
                    return Ok(found);
                }
            }
            Ok(Credentials::Anonymous)
        }
    })
    .await
    .map_err(|_| HostError::ShuttingDown)?;
    found.map_err(|error| HostError::Credentials {
        function: def.name.clone(),
        error: Arc::new(error),
    })
}
