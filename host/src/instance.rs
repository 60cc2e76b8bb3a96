//! One warm instance of a server-mode function: started by the runner's
//! one entry for servers ([`Runner::start_service`]: the image from the
//! cache, leased while it runs, in a sandbox made as a call's is, or in a
//! [`Spare`] made ahead), and ready when its own port, `127.0.0.1:9443`
//! inside its network namespace, answers gRPC. Calls reach it over one
//! HTTP/2 connection ([`Upstream`]); no port is published on the node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fnrun_registry::Credentials;
use fnrun_registry::credentials::docker_config;
use fnrun_runner::error::RunError;
use fnrun_runner::runner::Runner;
use fnrun_runner::{Service, ServiceKind, ServiceRequest, Spare};
use fnrun_sandbox::{ExitWatch, ServiceExit, Status as RunStatus};
use tonic::metadata::MetadataMap;
use tonic::{Code, Response, Status};

use super::catalogue::{CredentialSource, FunctionDef};
use super::error::{ExitReport, HostError};
use super::upstream::{FUNCTION_PORT, Upstream, is_transport};

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
        let mut args = vec![INSECURE_ARG.to_owned()];
        args.extend(def.args.iter().cloned());
        let request = ServiceRequest {
            image: def.image.clone(),
            pull_policy: def.pull_policy,
            credentials: credentials(runner, def).await?,
            args,
            env: def.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            network: def.network,
            limits: def.limits,
        };
        let service = runner
            .start_service(&request, spare)
            .await
            .map_err(failed)?;
        let started = service.started();
        let exit = service.exit_watch();
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
            digest = service.kind().digest(),
            pid = service.pid(),
            from_spare = service.from_spare(),
            image_us = crate::context::micros(service.image_time()),
            spawn_us = crate::context::micros(service.spawn_time()),
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
                from_spare: service.from_spare(),
                service,
                exit,
                upstream: Mutex::new(upstream),
                reconnect: tokio::sync::Mutex::new(()),
                unimplemented: [AtomicBool::new(false), AtomicBool::new(false)],
                started,
            },
            started.elapsed(),
        ))
    }

    /// What a [`Spare`] for its function's next server is made of.
    pub fn kind(&self) -> ServiceKind {
        self.service.kind()
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
    let default_registry = runner.cache().default_registry().to_owned();
    let found = tokio::task::spawn_blocking(move || match &source {
        CredentialSource::DaemonDockerConfig => {
            docker_config::credentials_for_image(&default_registry, &image)
        }
        CredentialSource::DockerConfig(path) => {
            docker_config::credentials_from_docker_config(&default_registry, &image, path)
        }
        CredentialSource::PullSecret(path) => {
            docker_config::credentials_from_pull_secret(&default_registry, &image, path)
        }
        CredentialSource::PullSecrets(secrets) => {
            for secret in secrets {
                let found = docker_config::credentials_from_pull_secret_json(
                    &default_registry,
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
