//! `fnrun serve --functions FILE`: the function host beside the v1alpha1
//! runner, on its own listener, sharing the runner's cache and sandbox.
//!
//! SIGHUP reloads the functions file (and the certificates: minted again,
//! or read again from `--functions-certs-dir`), and so does a change of the
//! file's contents, checked every `--functions-check-interval` (a mounted
//! ConfigMap is updated in place, and a container built `FROM scratch` has
//! no `kill` to send SIGHUP with). A file or certificate that cannot be used
//! is logged and the current catalogue stays: a reload never drops a call in
//! flight nor leaves the host without a catalogue.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use super::catalogue::{self, Catalogue};
use super::certs::{CertSet, CertSource, Minter};
use super::listener;
use super::tls::{self, ClientCa, SniResolver};
use super::{Changes, FunctionMetrics, Host, Routing};
use fnrun_runner::error::{LINE_MAX, bounded};
use fnrun_runner::runner::Runner;
use fnrun_transport::listen::{ListenAddr, Listener};
use fnrun_transport::readiness::Readiness;
use fnrun_transport::tls_accept::{
    HandshakeMetrics, ListenerKind, Reason, Refusal, ServerNames, TlsAccept,
};

/// How often minted certificates are minted again.
const REMINT_EVERY: Duration = Duration::from_secs(24 * 3600);

/// The running function host.
pub struct FunctionsDaemon {
    serving: Arc<Serving>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The functions file's reloader; none when the catalogue is fed from
    /// outside ([`start_external`]).
    reloader: Option<JoinHandle<()>>,
    socket_file: Option<PathBuf>,
}

/// The host, its health and its certificates, as a catalogue source updates
/// them: the functions file's reloader, or Kubernetes mode's controller.
pub struct Serving {
    host: Arc<Host>,
    health: HealthReporter,
    namespace: String,
    resolver: Option<Arc<SniResolver>>,
    client_ca: Option<Arc<ClientCa>>,
    names: tokio::sync::Mutex<Vec<String>>,
    /// Shutting down: health stays NOT_SERVING whatever is applied.
    stopping: std::sync::atomic::AtomicBool,
    /// Whether the catalogue source has given what there is to serve
    /// (Kubernetes mode: the API read, the certificates minted); until then
    /// every TLS handshake is refused as not ready. None: a functions file,
    /// ready once started.
    readiness: Option<Arc<Readiness>>,
}

impl Serving {
    /// The host.
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// The namespace of the functions' Services.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether the daemon can serve yet, when the catalogue is fed from
    /// outside: its source says when.
    pub fn readiness(&self) -> Option<&Arc<Readiness>> {
        self.readiness.as_ref()
    }

    /// The client CA the listener verifies against, when the catalogue is
    /// fed from outside with TLS.
    pub fn client_ca(&self) -> Option<&Arc<ClientCa>> {
        self.client_ca.as_ref()
    }

    /// Makes `catalogue` the host's, with `certs` (if the listener serves
    /// TLS and they are given) the certificates of new handshakes, and
    /// health SERVING for each function (and gone for the others).
    pub async fn apply(&self, catalogue: &Catalogue, certs: Option<CertSet>) -> Changes {
        let mut current = self.names.lock().await;
        let names: Vec<String> = catalogue.names().map(str::to_owned).collect();
        if let (Some(resolver), Some(certs)) = (&self.resolver, certs) {
            resolver.replace(certs);
        }
        let changes = self.host.apply(catalogue);
        if !self.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            listener::serving(&self.health, &names).await;
        }
        for gone in current.iter().filter(|n| !names.contains(n)) {
            self.health.clone().clear_service_status(gone).await;
        }
        *current = names;
        changes
    }
}

/// What `fnrun serve` is asked to host (from its `--functions*` flags), as
/// plain values.
#[derive(Debug, Clone, Default)]
pub struct FunctionsConfig {
    /// The functions file (`--functions`); SIGHUP reloads it.
    pub functions_file: Option<PathBuf>,
    /// `NAME=IMAGE` functions with every default (`--function`).
    pub function: Vec<String>,
    /// Where functions are served: `HOST:PORT`, `unix:PATH` or
    /// `unix-abstract:NAME`.
    pub functions_listen: String,
    /// The namespace of the functions' Services.
    pub functions_namespace: String,
    /// The CA bundle client certificates must be signed by (mTLS).
    pub functions_client_ca: Option<PathBuf>,
    /// The CA to mint each function's server certificate from.
    pub functions_ca_cert: Option<PathBuf>,
    pub functions_ca_key: Option<PathBuf>,
    /// `DIR/NAME/tls.crt` and `tls.key` per function.
    pub functions_certs_dir: Option<PathBuf>,
    /// How often the functions file is checked for changes; zero: only on
    /// SIGHUP.
    pub functions_check_interval: Duration,
    /// Plain h2c, without TLS.
    pub functions_insecure: bool,
}

impl FunctionsConfig {
    /// Whether any function is configured: the host runs only then.
    pub fn enabled(&self) -> bool {
        self.functions_file.is_some() || !self.function.is_empty()
    }
}

/// TLS of the functions listener, as the flags ask.
struct TlsSetup {
    source: CertSource,
    client_ca: PathBuf,
}

/// Flags that do not go together, or a value that cannot be used: the
/// caller's usage error (exit 2 on the command line).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// Checks the flags' combination before anything starts.
fn tls_setup(args: &FunctionsConfig, addr: &ListenAddr) -> anyhow::Result<Option<TlsSetup>> {
    if args.functions_insecure || !matches!(addr, ListenAddr::Tcp(_)) {
        return Ok(None);
    }
    let source = match (
        &args.functions_ca_cert,
        &args.functions_ca_key,
        &args.functions_certs_dir,
    ) {
        (Some(cert), Some(key), None) => {
            // Checked now, so that a CA that cannot be used stops the start.
            Minter::load(cert, key).context("--functions-ca-cert/--functions-ca-key")?;
            CertSource::Mint {
                cert: cert.clone(),
                key: key.clone(),
            }
        }
        (None, None, Some(dir)) => CertSource::Dir(dir.clone()),
        _ => bail!(FlagError(format!(
            "the functions listener {addr} serves TLS: give --functions-ca-cert and --functions-ca-key \
             (certificates minted per function) or --functions-certs-dir DIR (DIR/NAME/tls.crt and tls.key), \
             and --functions-client-ca; or --functions-insecure for plain h2c"
        ))),
    };
    let Some(client_ca) = args.functions_client_ca.clone() else {
        bail!(FlagError(format!(
            "the functions listener {addr} requires client certificates (mTLS): give --functions-client-ca FILE \
             (Crossplane's client certificates are signed by its crossplane-root-ca); \
             or --functions-insecure for plain h2c"
        )));
    };
    Ok(Some(TlsSetup { source, client_ca }))
}

/// Checks the functions flags that must go together (the listen address,
/// the namespace, TLS), before anything starts: each error is a
/// [`FlagError`].
pub fn check_flags(args: &FunctionsConfig) -> anyhow::Result<()> {
    if !args.enabled() {
        return Ok(());
    }
    catalogue::check_dns_label(&args.functions_namespace)
        .map_err(|e| FlagError(format!("--functions-namespace {e}")))?;
    let addr: ListenAddr = args
        .functions_listen
        .parse()
        .map_err(|e| FlagError(format!("--functions-listen {e:#}")))?;
    tls_setup(args, &addr).map(drop)
}

/// Starts the function host if any function is configured.
pub async fn start(
    args: &FunctionsConfig,
    runner: Arc<Runner>,
    function_metrics: Arc<FunctionMetrics>,
    tls_metrics: Arc<HandshakeMetrics>,
    socket_mode: u32,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<FunctionsDaemon>> {
    if !args.enabled() {
        return Ok(None);
    }
    catalogue::check_dns_label(&args.functions_namespace)
        .map_err(|e| FlagError(format!("--functions-namespace {e}")))?;
    let namespace = args.functions_namespace.clone();
    let addr: ListenAddr = args
        .functions_listen
        .parse()
        .map_err(|e| FlagError(format!("--functions-listen {e:#}")))?;
    let tls = tls_setup(args, &addr)?;
    let (catalogue, seen) =
        Catalogue::load_contents(args.functions_file.as_deref(), &args.function)?;
    let names: Vec<String> = catalogue.names().map(str::to_owned).collect();

    let (resolver, server_config) = match &tls {
        Some(setup) => {
            let certs = setup.source.cert_set(&names, &namespace)?;
            let resolver = Arc::new(SniResolver::new(certs, function_metrics.clone()));
            let config = tls::server_config(resolver.clone(), &setup.client_ca)?;
            let accept = tls_accept(&resolver, None, config, tls_metrics);
            (Some(resolver), Some(accept))
        }
        None => (None, None),
    };
    let (mut daemon, serving) = serve(
        Listening {
            addr,
            namespace,
            resolver,
            client_ca: None,
            server_config,
            socket_mode,
            readiness: None,
        },
        runner,
        function_metrics,
        shutdown,
    )
    .await?;
    serving.apply(&catalogue, None).await;
    tracing::info!(
        address = %daemon.address,
        transport = if tls.is_some() { "TLS, client certificates required" } else { "h2c" },
        namespace = serving.namespace,
        functions = names.len(),
        "serving Crossplane functions"
    );
    let reloader = Reloader {
        seen,
        check_every: args.functions_check_interval,
        file: args.functions_file.clone(),
        flags: args.function.clone(),
        serving,
        certs: tls.map(|setup| setup.source),
    };
    daemon.daemon.reloader = Some(tokio::spawn(reloader.run()?));
    Ok(Some(daemon.daemon))
}

/// The functions listener of Kubernetes mode, whose catalogue is fed from
/// outside.
#[derive(Debug, Clone)]
pub struct ExternalConfig {
    /// `HOST:PORT`, `unix:PATH` or `unix-abstract:NAME`.
    pub listen: String,
    /// The namespace of the functions' Services.
    pub namespace: String,
    /// Plain h2c, without TLS.
    pub insecure: bool,
}

/// Starts the function host with no function, its catalogue to be fed
/// through the [`Serving`] returned (Kubernetes mode). On a TCP listener
/// without `insecure`, TLS with client certificates required: until
/// `readiness` is ready (the catalogue source says so once it has applied a
/// catalogue and certificates, [`Serving::readiness`]) every handshake is
/// refused as not ready, saying why.
pub async fn start_external(
    config: &ExternalConfig,
    readiness: Arc<Readiness>,
    runner: Arc<Runner>,
    function_metrics: Arc<FunctionMetrics>,
    tls_metrics: Arc<HandshakeMetrics>,
    socket_mode: u32,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(FunctionsDaemon, Arc<Serving>)> {
    catalogue::check_dns_label(&config.namespace)
        .map_err(|e| anyhow::anyhow!("--functions-namespace {e}"))?;
    let addr: ListenAddr = config
        .listen
        .parse()
        .map_err(|e| FlagError(format!("--functions-listen {e:#}")))?;
    let tls = !config.insecure && matches!(addr, ListenAddr::Tcp(_));
    let (resolver, client_ca, server_config) = if tls {
        let resolver = Arc::new(SniResolver::new(
            CertSet::default(),
            function_metrics.clone(),
        ));
        let client_ca = Arc::new(ClientCa::default());
        let server_config = tls::server_config_following(resolver.clone(), client_ca.clone())
            .context("the functions listener's TLS")?;
        let accept = tls_accept(
            &resolver,
            Some(readiness.clone()),
            server_config,
            tls_metrics,
        );
        (Some(resolver), Some(client_ca), Some(accept))
    } else {
        (None, None, None)
    };
    let started = serve(
        Listening {
            addr,
            namespace: config.namespace.clone(),
            resolver,
            client_ca,
            server_config,
            socket_mode,
            readiness: Some(readiness),
        },
        runner,
        function_metrics,
        shutdown,
    )
    .await?;
    tracing::info!(
        address = %started.0.address,
        transport = if tls { "TLS, client certificates required" } else { "h2c" },
        namespace = config.namespace,
        "serving Crossplane functions from the Kubernetes API"
    );
    Ok((started.0.daemon, started.1))
}

/// What [`serve`] needs to listen.
struct Listening {
    addr: ListenAddr,
    namespace: String,
    resolver: Option<Arc<SniResolver>>,
    client_ca: Option<Arc<ClientCa>>,
    server_config: Option<TlsAccept>,
    socket_mode: u32,
    readiness: Option<Arc<Readiness>>,
}

/// A daemon just started, and its address.
struct Started {
    daemon: FunctionsDaemon,
    address: ListenAddr,
}

/// The TLS accept of the functions listener: names no function answers to
/// are refused before the handshake goes on, and every name while
/// `readiness` (if given) is not ready.
fn tls_accept(
    resolver: &Arc<SniResolver>,
    readiness: Option<Arc<Readiness>>,
    config: Arc<rustls::ServerConfig>,
    tls_metrics: Arc<HandshakeMetrics>,
) -> TlsAccept {
    TlsAccept::new(
        ListenerKind::Functions,
        config,
        Some(Arc::new(ReadyNames {
            resolver: resolver.clone(),
            readiness,
        })),
        tls_metrics,
    )
}

/// The functions listener's server names: none while `readiness` is not
/// ready, then those the resolver answers to.
struct ReadyNames {
    resolver: Arc<SniResolver>,
    readiness: Option<Arc<Readiness>>,
}

impl ServerNames for ReadyNames {
    fn refusal(&self, name: Option<&str>, peer: std::net::SocketAddr) -> Option<Refusal> {
        not_ready(self.readiness.as_deref(), name).or_else(|| self.resolver.refusal(name, peer))
    }

    fn accepted(&self, peer: std::net::SocketAddr) {
        self.resolver.accepted(peer);
    }
}

/// The refusal of a handshake for the server name `name` while `readiness`
/// is not ready: not that no function answers to the name, but why nothing
/// is served yet.
fn not_ready(readiness: Option<&Readiness>, name: Option<&str>) -> Option<Refusal> {
    let why = readiness?.get().err()?;
    let name = match name {
        Some(name) => format!("the server name {}", fnrun_api::Quoted::new(name)),
        None => "no server name".to_owned(),
    };
    Some(Refusal::new(
        Reason::NotReady,
        format!("not ready: {why} (the client asked for {name})"),
    ))
}

/// Binds the listener and serves a host of no function yet.
async fn serve(
    listening: Listening,
    runner: Arc<Runner>,
    function_metrics: Arc<FunctionMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(Started, Arc<Serving>)> {
    let host = Arc::new(Host::new(
        runner,
        Routing::ByName {
            namespace: listening.namespace.clone(),
        },
        function_metrics,
    ));
    let (router, health) = listener::services(host.clone())?;
    listener::serving(&health, &[]).await;
    let listener = listening.addr.bind(listening.socket_mode)?;
    let socket_file = match &listener {
        Listener::Unix(_, path) => path.clone(),
        Listener::Tcp(_) => None,
    };
    let server = listener::serve(router, listener, listening.server_config, shutdown);
    let serving = Arc::new(Serving {
        host,
        health,
        namespace: listening.namespace,
        resolver: listening.resolver,
        client_ca: listening.client_ca,
        names: tokio::sync::Mutex::new(Vec::new()),
        stopping: std::sync::atomic::AtomicBool::new(false),
        readiness: listening.readiness,
    });
    let daemon = FunctionsDaemon {
        serving: serving.clone(),
        server,
        reloader: None,
        socket_file,
    };
    Ok((
        Started {
            daemon,
            address: listening.addr,
        },
        serving,
    ))
}

impl FunctionsDaemon {
    /// The host, for its metrics.
    pub fn host(&self) -> &Arc<Host> {
        &self.serving.host
    }

    /// Makes health say NOT_SERVING for the listener, both
    /// `FunctionRunnerService`s and every function, and stops reloading
    /// (a reload would say SERVING again); calls are still served.
    pub async fn not_serving(&self) {
        use tonic_health::ServingStatus::NotServing;
        if let Some(reloader) = &self.reloader {
            reloader.abort();
        }
        // A catalogue applied from now on (Kubernetes mode's controller runs
        // until the listeners close) says SERVING no more.
        self.serving
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let services = [
            "",
            fnrun_api::v1::SERVICE_NAME,
            fnrun_api::v1beta1::SERVICE_NAME,
        ];
        let health = &self.serving.health;
        for service in services
            .into_iter()
            .map(str::to_owned)
            .chain(self.serving.host.names())
        {
            health.set_service_status(&service, NotServing).await;
        }
    }

    /// Lets calls in flight finish (within `grace`), stops every function
    /// server, and waits for the listener to close.
    pub async fn stop(self, grace: Duration) {
        if let Some(reloader) = &self.reloader {
            reloader.abort();
        }
        self.serving.host.shutdown(grace).await;
        match tokio::time::timeout(grace, self.server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("functions listener ended with an error: {e}"),
            Ok(Err(e)) => tracing::warn!("functions listener task failed: {e}"),
            Err(_) => tracing::warn!("functions listener still had calls after the grace period"),
        }
        if let Some(path) = self.socket_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Applies the functions file again on SIGHUP, and mints certificates again
/// once a day.
struct Reloader {
    /// The file's contents at the last reload (or start).
    seen: Option<Vec<u8>>,
    check_every: Duration,
    file: Option<PathBuf>,
    flags: Vec<String>,
    serving: Arc<Serving>,
    /// Where certificates come from, when the listener serves TLS.
    certs: Option<CertSource>,
}

impl Reloader {
    /// The reload loop; the SIGHUP handler is installed before it returns.
    fn run(mut self) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup()).context("install the SIGHUP handler")?;
        Ok(async move {
            let mut remint =
                tokio::time::interval_at(tokio::time::Instant::now() + REMINT_EVERY, REMINT_EVERY);
            let checking = !self.check_every.is_zero() && self.file.is_some();
            let every = if checking {
                self.check_every
            } else {
                REMINT_EVERY
            };
            let mut check = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the functions");
                        self.reload().await;
                    }
                    _ = check.tick(), if checking => {
                        if self.file_changed().await {
                            tracing::info!("the functions file changed: reloading the functions");
                            self.reload().await;
                        }
                    }
                    _ = remint.tick() => {
                        if matches!(self.certs, Some(CertSource::Mint { .. })) {
                            self.reload().await;
                        }
                    }
                }
            }
        })
    }

    async fn reload(&mut self) {
        match self.try_reload().await {
            Ok(changes) => tracing::info!(
                added = ?changes.added,
                replaced = ?changes.replaced,
                removed = ?changes.removed,
                kept = changes.kept.len(),
                "functions reloaded"
            ),
            Err(e) => tracing::error!(
                error = %bounded(&format!("{e:#}"), LINE_MAX),
                "functions not reloaded: the current ones stay"
            ),
        }
    }

    /// Whether the file's contents differ from those last loaded.
    async fn file_changed(&self) -> bool {
        let Some(path) = self.file.clone() else {
            return false;
        };
        let now = tokio::task::spawn_blocking(move || catalogue::read_file(&path).ok())
            .await
            .ok()
            .flatten();
        now != self.seen
    }

    async fn try_reload(&mut self) -> anyhow::Result<Changes> {
        let (file, flags) = (self.file.clone(), self.flags.clone());
        let (catalogue, contents) = tokio::task::spawn_blocking(move || {
            // What is compared from now on is what was read, usable or not:
            // a file that cannot be used is not tried again until it changes.
            let contents = file.as_deref().map(catalogue::read_file).transpose();
            let seen = contents.as_ref().ok().cloned().flatten();
            let catalogue = contents.and_then(|contents| {
                Catalogue::from_contents(file.as_deref().zip(contents.as_deref()), &flags)
            });
            (catalogue, seen)
        })
        .await
        .context("load the functions file")?;
        self.seen = contents;
        let catalogue = catalogue?;
        let names: Vec<String> = catalogue.names().map(str::to_owned).collect();
        let certs = match &self.certs {
            Some(source) => Some(source.cert_set(&names, &self.serving.namespace)?),
            None => None,
        };
        Ok(self.serving.apply(&catalogue, certs).await)
    }
}
