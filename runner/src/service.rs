//! Service runs: a function's server, started in a sandbox the way a
//! per-call run is (the image from the cache, leased while it runs, turned
//! into a [`RunSpec`] by [`crate::image_spec`]), and left running until it is
//! stopped or ends. [`Runner::start_service`] is the one way in: admission
//! of the image (its registry, its pull), its lease and the sandbox's place
//! are decided here, once, for every front end that hosts servers.
//!
//! A start may take a [`Spare`]: a sandbox made ahead for the same
//! [`ServiceKind`] ([`Runner::make_spare`], after the function's last server
//! stopped), so that the start costs about the server's own start. A spare
//! that no longer fits (another image, other options, its init gone) is
//! ended off the start's path and the start makes its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fnrun_cache::{Lease, PullPolicy};
use fnrun_registry::Credentials;
use fnrun_sandbox::{ExitWatch, Limits, Network, PreparedService, RunSpec, ServiceExit};

use crate::error::RunError;
use crate::image_spec::{self, SpecOptions};
use crate::pool::Place;
use crate::runner::{Pruner, Runner};

/// What a function's server is started from.
#[derive(Debug, Clone)]
pub struct ServiceRequest {
    /// The image reference, as a call's (checked against
    /// `--allowed-registry`).
    pub image: String,
    pub pull_policy: PullPolicy,
    pub credentials: Credentials,
    /// Appended to the image's entrypoint and command.
    pub args: Vec<String>,
    /// `NAME=VALUE`, over the image's environment.
    pub env: Vec<String>,
    pub network: Network,
    pub limits: Limits,
}

/// A hold on an image's lease: the image stays in the cache while one is
/// held. Dropping the last hold lets the cache prune it to
/// `--cache-max-size`, if one is set.
#[derive(Clone)]
struct Hold {
    lease: Option<Arc<Lease>>,
    pruner: Option<Arc<Pruner>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let last = self.lease.take().and_then(Arc::into_inner).is_some();
        if last
            && let Some(pruner) = &self.pruner
            && tokio::runtime::Handle::try_current().is_ok()
        {
            pruner.request();
        }
    }
}

/// What a server's sandbox is made of: its run spec and a hold on its
/// image. A running [`Service`] gives its own ([`Service::kind`]), from
/// which the next server's [`Spare`] is made.
#[derive(Clone)]
pub struct ServiceKind {
    spec: Arc<RunSpec>,
    _hold: Hold,
    digest: String,
}

impl std::fmt::Debug for ServiceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceKind")
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl ServiceKind {
    /// The digest of its image.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

/// A running function server.
pub struct Service {
    sandbox: fnrun_sandbox::Service,
    kind: ServiceKind,
    from_spare: bool,
    /// When its sandbox was asked for, its image in hand.
    started: Instant,
    /// How long getting the image (and its spec) took.
    image_time: Duration,
    /// From `started` to its process running.
    spawn_time: Duration,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("pid", &self.sandbox.pid())
            .field("digest", &self.kind.digest)
            .field("from_spare", &self.from_spare)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// The pid of its sandbox's init.
    pub fn pid(&self) -> libc::pid_t {
        self.sandbox.pid()
    }

    /// What it is made of, for a spare after it.
    pub fn kind(&self) -> ServiceKind {
        self.kind.clone()
    }

    /// It started in a spare made ahead.
    pub fn from_spare(&self) -> bool {
        self.from_spare
    }

    /// When its sandbox was asked for, its image in hand: what its start
    /// timeout counts from.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// How long getting its image took.
    pub fn image_time(&self) -> Duration {
        self.image_time
    }

    /// From [`Service::started`] to its process running.
    pub fn spawn_time(&self) -> Duration {
        self.spawn_time
    }

    /// The last bytes it wrote.
    pub fn output_tail(&self) -> Vec<u8> {
        self.sandbox.output_tail()
    }

    /// A handle on its end.
    pub fn exit_watch(&self) -> ExitWatch {
        self.sandbox.exit_watch()
    }

    /// A TCP connection to `addr` inside its network namespace.
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        self.sandbox.connect(addr).await
    }

    /// Stops it and waits until nothing of it is left.
    pub async fn stop(self) -> ServiceExit {
        self.sandbox.stop().await
    }
}

/// A sandbox made ahead for a function's next server: its init waits with
/// the root built, holding a place in the `--sandbox-pool` bounds and a
/// hold on its image.
pub struct Spare {
    prepared: PreparedService,
    kind: ServiceKind,
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
    /// The pid of its init.
    pub fn pid(&self) -> libc::pid_t {
        self.prepared.pid()
    }

    /// Ends it unused: its init and cgroup, then its place and its hold.
    pub async fn end(self) {
        let Spare {
            prepared,
            kind,
            _place,
            ..
        } = self;
        prepared.discard().await;
        drop(kind);
    }

    /// [`Spare::end`] off the caller's path (or on it, outside a runtime:
    /// dropped, it kills its init and waits for it).
    pub fn end_in_background(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.end());
            }
            Err(_) => drop(self),
        }
    }
}

impl Runner {
    /// Starts a function's server: its image from the cache (pulled per
    /// `request.pull_policy`, checked against `--allowed-registry`, leased
    /// while the server runs), its run spec made as a call's is, in `spare`
    /// if that was made for the same kind and still waits.
    pub async fn start_service(
        &self,
        request: &ServiceRequest,
        spare: Option<Spare>,
    ) -> Result<Service, RunError> {
        let fetch = Instant::now();
        let kind = self.service_kind(request).await?;
        let started = Instant::now();
        let sandbox = self.sandbox();
        let (made, from_spare) = match spare {
            Some(spare) if *spare.kind.spec == *kind.spec && spare.prepared.is_usable() => {
                (sandbox.start_prepared_service(spare.prepared), true)
            }
            spare => {
                if let Some(spare) = spare {
                    spare.end_in_background();
                }
                let made = match sandbox.prepare_service_off_worker(kind.spec.clone()).await {
                    Ok(prepared) => sandbox.start_prepared_service(prepared),
                    Err(e) => Err(e),
                };
                (made, false)
            }
        };
        let service = made?;
        Ok(Service {
            sandbox: service,
            kind,
            from_spare,
            started,
            image_time: started - fetch,
            spawn_time: started.elapsed(),
        })
    }

    /// Makes a spare of `kind` (a server's that ran), if the runner has a
    /// sandbox pool with room; `None` otherwise, or when it cannot be made
    /// (the next start makes its own, and this says why in the log).
    pub async fn make_spare(&self, kind: ServiceKind) -> Option<Spare> {
        let mut place = self.sandbox_place()?;
        let sandbox = self.sandbox();
        let made = match sandbox.prepare_service_off_worker(kind.spec.clone()).await {
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
                    kind,
                    _place: place,
                    made: Instant::now(),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a function server's sandbox ahead");
                None
            }
        }
    }

    /// The image and run spec of a server.
    async fn service_kind(&self, request: &ServiceRequest) -> Result<ServiceKind, RunError> {
        let reference = self.reference(&request.image)?;
        let (image, lease) = self
            .image(
                &reference,
                request.pull_policy,
                request.credentials.clone(),
                None,
            )
            .await?;
        let hold = Hold {
            lease,
            pruner: self.pruner(),
        };
        let options = SpecOptions {
            extra_args: &request.args,
            extra_env: &request.env,
            network: request.network,
            limits: request.limits,
            ..SpecOptions::default()
        };
        let spec = image_spec::run_spec(&image, &self.sandbox().config().id_map, &options)?;
        Ok(ServiceKind {
            spec: Arc::new(spec),
            _hold: hold,
            digest: image.digest,
        })
    }
}
