//! The core: turns a request into a cached image and a sandbox run. The CLI's
//! `run` and the gRPC service both call [`Runner::run`]; nothing here knows
//! about tonic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fnrun_api::functionio;
use fnrun_cache::{Cache, Credentials, PullPolicy};
use fnrun_sandbox::{IdMap, Limits, Network, RunSpec, Sandbox, Status};
use tokio::sync::Semaphore;

use crate::error::RunError;
use crate::user;

/// Default function timeout (SPEC.md).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(25);

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
    pub timeout: Duration,
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
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// What a successful run returns, with facts for the log line.
#[derive(Debug)]
pub struct RunOutput {
    pub output: Vec<u8>,
    pub digest: String,
}

/// The core runner: an image cache and a sandbox, shared by every call.
pub struct Runner {
    cache: Arc<Cache>,
    sandbox: Sandbox,
    slots: Semaphore,
}

impl Runner {
    pub fn new(cache: Cache, sandbox: Sandbox, max_concurrency: usize) -> Self {
        Runner {
            cache: Arc::new(cache),
            sandbox,
            slots: Semaphore::new(max_concurrency.max(1)),
        }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Runs one function call and logs one line about it.
    pub async fn run(&self, req: RunRequest) -> Result<RunOutput, RunError> {
        let start = Instant::now();
        let image = req.image.clone();
        let result = self.run_inner(req).await;
        let elapsed = start.elapsed();
        match &result {
            Ok(out) => tracing::info!(
                image,
                digest = out.digest,
                outcome = "ok",
                duration_ms = elapsed.as_millis() as u64,
                "function run"
            ),
            Err(e) => tracing::info!(
                image,
                outcome = e.outcome(),
                duration_ms = elapsed.as_millis() as u64,
                error = %e,
                "function run"
            ),
        }
        result
    }

    async fn run_inner(&self, req: RunRequest) -> Result<RunOutput, RunError> {
        // Everything about the request is checked before any work starts.
        functionio::validate(&req.input).map_err(RunError::InvalidInput)?;
        if req.timeout.is_zero() {
            return Err(RunError::InvalidRequest("timeout must be positive".into()));
        }
        let reference = self.cache.parse_reference(&req.image)?;

        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| RunError::InvalidRequest("runner is shutting down".into()))?;

        let image = self
            .cache
            .get(&reference, req.pull_policy, &req.credentials)
            .await?;

        let exec_user = user::resolve(&image.config.user, &image.layers)
            .map_err(|e| RunError::InvalidRequest(e.to_string()))?;
        let (uid, gid, groups) = match self.sandbox.config().id_map {
            IdMap::Range { .. } => (exec_user.uid, exec_user.gid, exec_user.groups),
            IdMap::Own { .. } => {
                if exec_user.uid != 0 || exec_user.gid != 0 {
                    tracing::debug!(
                        image = image.reference,
                        user = image.config.user,
                        "rootless runner maps one id: running the function as 0:0"
                    );
                }
                (0, 0, Vec::new())
            }
        };
        let mut argv = image.config.entrypoint.clone();
        argv.extend(image.config.cmd.iter().cloned());
        let mut env = image.config.env.clone();
        if !env.iter().any(|e| e.starts_with("PATH=")) {
            env.push(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            );
        }
        if !env.iter().any(|e| e.starts_with("HOME=")) {
            env.push(format!("HOME={}", exec_user.home));
        }
        let workdir = if image.config.working_dir.is_empty() {
            "/".to_owned()
        } else {
            image.config.working_dir.clone()
        };
        let spec = RunSpec {
            layers: image.layers.clone(),
            argv,
            env,
            workdir,
            uid,
            gid,
            groups,
            network: req.network,
            timeout: req.timeout,
            limits: Limits {
                memory_bytes: req.memory_bytes,
                cpu_millis: req.cpu_millis,
                pids: None,
            },
        };
        let outcome = self.sandbox.run(&spec, &req.input).await?;
        let stderr = String::from_utf8_lossy(&outcome.stderr_tail).into_owned();
        match outcome.status {
            Status::Exited(0) => {}
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
        functionio::validate(&outcome.stdout)
            .map_err(|error| RunError::InvalidOutput { error, stderr })?;
        Ok(RunOutput {
            output: outcome.stdout,
            digest: image.digest,
        })
    }
}
