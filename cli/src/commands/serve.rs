//! `fnrun serve`: the daemon. One tonic server per listen address, all on one
//! shared [`Runner`], each serving the v1alpha1 runner and Porch's evaluator
//! ([`fnrun_evaluator`]).
//!
//! SIGTERM/SIGINT: health turns NOT_SERVING at once while every listener
//! keeps serving for `--shutdown-delay`; then the listeners close, in-flight
//! calls get `--shutdown-grace` to finish, and the daemon exits 0. A second
//! signal, at any point of that, stops it at once: the runs in flight are
//! killed and their sandboxes removed, and it exits 128 + the signal's
//! number (130 for SIGINT), as a process killed by it would.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use fnrun_api::v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerServiceServer;
use futures::TryStreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use fnrun_host::daemon::FunctionsDaemon;

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{CacheArgs, SandboxArgs, SocketModeArgs, parse_size};
use crate::functions_args::FunctionsArgs;
use crate::support::{Stopped, Usage};
use fnrun_evaluator::EvaluatorService;
use fnrun_host::FunctionMetrics;
use fnrun_runner::metrics::dir_bytes;
use fnrun_runner::runner::Admission;
use fnrun_runner::runner::Runner;
use fnrun_transport::authority::NormalizeAuthority;
use fnrun_transport::deadline::DeadlineLayer;
use fnrun_transport::listen::{ListenAddr, Listener};
use fnrun_transport::tls_accept::HandshakeMetrics;
use fnrun_transport::tls_accept::{ListenerKind, TlsAccept};
use fnrun_v1alpha1::FunctionRunnerService;

/// The health service names of the two APIs of `--listen`.
const RUNNER_SERVICE: &str = <ContainerizedFunctionRunnerServiceServer<FunctionRunnerService> as tonic::server::NamedService>::NAME;
const EVALUATOR_SERVICE: &str = <fnrun_api::evaluator::function_evaluator_server::FunctionEvaluatorServer<EvaluatorService> as tonic::server::NamedService>::NAME;

/// `--sandbox-pool`'s default: one kind's most (`fnrun_runner::pool::PER_KIND`).
pub const DEFAULT_SANDBOX_POOL: usize = fnrun_runner::pool::PER_KIND;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve the runner (v1alpha1) and Porch's evaluator on:
    /// unix:PATH, unix-abstract:NAME or [tcp://]HOST:PORT (HOST a name,
    /// resolved at start and every address of it listened on, or an
    /// address; :PORT: every address). Repeatable; `none` turns it off
    /// (with `--functions`: only functions are served).
    #[arg(
        long = "listen",
        default_value = "unix-abstract:crossplane/fn/default.sock"
    )]
    pub listen: Vec<String>,
    /// Runs at once [default: 4 per core].
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Calls that may wait for a run slot; beyond it calls fail at once with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    #[command(flatten)]
    pub socket_mode: SocketModeArgs,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics, and the probes
    /// /readyz (200 once fnrun can serve: in Kubernetes mode once it has read
    /// the API; 503 saying why until then) and /livez.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// On SIGTERM/SIGINT, how long health reports NOT_SERVING while new calls
    /// are still served, before the listeners close (so that Kubernetes and
    /// load balancers stop sending first); 0: close at once. A second signal
    /// (during the delay or the grace) stops at once, killing the runs in
    /// flight, and exits 128 + its number.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = fnrun_api::duration::parse)]
    pub shutdown_delay: Duration,
    /// Once the listeners are closed, how long in-flight runs may take to
    /// finish before they are killed.
    #[arg(long, default_value = "30s", value_parser = fnrun_api::duration::parse)]
    pub shutdown_grace: Duration,
    /// TLS certificate (PEM) for TCP listeners; unix sockets stay plain.
    #[arg(long, value_name = "FILE", requires = "tls_key", value_parser = crate::config::parse_path)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert", value_parser = crate::config::parse_path)]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM): TCP clients must present a certificate it signed (mTLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert", value_parser = crate::config::parse_path)]
    pub tls_client_ca: Option<PathBuf>,
    /// Only run images from this registry (HOST[:PORT]; `oci` for local
    /// layouts). Repeatable; default: any.
    #[arg(long = "allowed-registry", value_name = "HOST[:PORT]")]
    pub allowed_registries: Vec<String>,
    /// Keep the image cache under SIZE (e.g. 10Gi): after runs, least recently
    /// used images are evicted; images in use never are.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_max_size: Option<u64>,
    /// Sandboxes made ahead of calls, at most N at a time over every kind
    /// of run: a call that finds one of its kind ready skips building its
    /// sandbox (namespaces, cgroup, root). Each serves one call; a kind
    /// not called for 10s keeps none. 0: every call makes its own. A pooled
    /// sandbox holds its image in the cache: --cache-max-size evicts it
    /// once the pool has let go of it.
    #[arg(long, value_name = "N", default_value_t = crate::commands::serve::DEFAULT_SANDBOX_POOL)]
    pub sandbox_pool: usize,
    /// Memory the sandboxes made ahead may hold between them (each is
    /// measured once made: its cgroup's peak, else its init's PSS): none is
    /// made beyond it. Default: only --sandbox-pool bounds them.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub sandbox_pool_memory: Option<u64>,
    /// Pull these images into the cache at start, unless cached (for Porch's
    /// functions, say). A failed prefetch is a warning; the daemon serves
    /// meanwhile. With --sandbox-pool, each kind of run of these images
    /// keeps one sandbox made ahead once called, also while not called.
    #[arg(long, value_name = "IMAGE", num_args = 1..)]
    pub prefetch: Vec<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub functions: FunctionsArgs,
}

/// What `/metrics` shows: the runner's, the function host's and the TLS
/// listeners', and the bytes the cache holds (read at each scrape).
fn render_metrics(
    runner: &Runner,
    functions: &Arc<FunctionMetrics>,
    tls: &Arc<HandshakeMetrics>,
) -> fnrun_transport::metrics_http::Render {
    let (metrics, functions, tls) = (runner.metrics().clone(), functions.clone(), tls.clone());
    let root = runner.cache().root().to_path_buf();
    Arc::new(move || {
        let cache_bytes = dir_bytes(&root.join("blobs")) + dir_bytes(&root.join("layers"));
        let mut out = metrics.render(cache_bytes);
        functions.render(&mut out);
        tls.render(&mut out);
        out
    })
}

/// Runs `fnrun serve`: exits 0 once stopped by a signal, 128 + the number
/// of a second signal that stopped it at once.
pub fn main(args: ServeArgs) -> ExitCode {
    match serve(args) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(stopped)) => ExitCode::from(stopped.exit_code()),
        Err(e) => crate::support::daemon_failed(&e, crate::support::exit_code_of(&e)),
    }
}

/// Serves until a signal; `Some` when a second signal stopped it at once.
fn serve(args: ServeArgs) -> anyhow::Result<Option<Stopped>> {
    crate::support::raise_open_files_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let result = rt.block_on(serve_async(args));
    // The tasks still running (after a second signal: the runs in flight)
    // are dropped, which kills their runs and removes their sandboxes.
    rt.shutdown_timeout(Duration::from_secs(10));
    result
}

async fn serve_async(args: ServeArgs) -> anyhow::Result<Option<Stopped>> {
    // Before anything listens: a SIGTERM or SIGINT that comes as soon as the
    // socket exists must stop the daemon gracefully, not be lost (an inherited
    // SIG_IGN, as in a non-interactive shell's background job) or kill it.
    let mut signals = Signals::install()?;
    let addrs = check_config(&args)?;
    let runner = start_runner(&args)?;
    check_sandbox(&runner).await?;
    let shutdown = Shutdown::new();
    // Each part counts its own; a scrape renders them all.
    let function_metrics = Arc::new(FunctionMetrics::default());
    let tls_metrics = Arc::new(HandshakeMetrics::default());
    // `/readyz` of the metrics listener: ready once every listener is bound
    // and, in Kubernetes mode, once the controller has read the API and
    // minted the certificates.
    let readiness = Arc::new(fnrun_transport::readiness::Readiness::new("starting"));
    let metrics_task = match args.metrics_listen {
        Some(addr) => Some(
            fnrun_transport::metrics_http::serve(
                addr,
                render_metrics(&runner, &function_metrics, &tls_metrics),
                readiness.clone(),
                shutdown.stopped(),
            )
            .await?,
        ),
        None => None,
    };
    if !args.prefetch.is_empty() {
        tokio::spawn(fnrun_evaluator::prefetch(
            runner.clone(),
            args.prefetch.clone(),
        ));
    }
    let listeners = start_listeners(&args, &addrs, &runner, tls_metrics.clone(), &shutdown).await?;
    let (functions, controller) = start_functions(
        &args,
        runner,
        &readiness,
        function_metrics,
        tls_metrics,
        &shutdown,
    )
    .await?;
    let mut daemon = Daemon {
        listeners,
        functions,
        controller,
        metrics_task,
        readiness,
        shutdown,
    };
    let (signal, controller_failed) = daemon.wait_for_stop(&mut signals).await;
    daemon
        .shut_down(&args, &mut signals, signal, controller_failed)
        .await
}

/// Checks the flags that are only checked at start, and gives the runner's
/// listen addresses (none with `--listen none`).
fn check_config(args: &ServeArgs) -> anyhow::Result<Vec<ListenAddr>> {
    let addrs = listen_addrs(&args.listen, args.functions.enabled())?;
    if !args.functions.functions_kubernetes {
        fnrun_host::daemon::check_flags(&args.functions.config())?;
    }
    if addrs.is_empty() {
        tracing::info!("the runner's listener is off (--listen none): only functions are served");
    }
    Ok(addrs)
}

/// The runner every listener shares.
fn start_runner(args: &ServeArgs) -> anyhow::Result<Arc<Runner>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let admission = Admission {
        max_concurrency: args.max_concurrency.unwrap_or(4 * cores),
        max_queue: args.max_queue,
    };
    let runner = crate::config::build_runner(&args.cache, &args.sandbox, admission)?
        .with_allowed_registries(args.allowed_registries.clone())
        .with_cache_max_size(args.cache_max_size)
        .with_sandbox_pool(args.sandbox_pool, args.sandbox_pool_memory);
    tracing::info!(
        cache = %runner.cache().root().display(),
        max_concurrency = admission.max_concurrency,
        max_queue = admission.max_queue,
        sandbox_pool = args.sandbox_pool,
        sandbox_pool_memory = args.sandbox_pool_memory,
        "fnrun {} starting",
        crate::support::VERSION
    );
    tracing::info!(limits = %runner.limit_support(), "limits this host can enforce");
    if args.sandbox.network_namespace == crate::config::NetworkNamespaceArg::PerKind
        && !runner.shares_network_namespaces()
    {
        tracing::info!(
            "--network-namespace per-kind needs CAP_SYS_ADMIN (a root runner): each call gets its own network namespace"
        );
    }
    Ok(Arc::new(runner))
}

/// Refuses to start where no function could run: one sandbox made and
/// ended before anything listens (see [`Runner::check_sandbox`]).
async fn check_sandbox(runner: &Runner) -> anyhow::Result<()> {
    match runner.check_sandbox().await {
        Ok(()) => Ok(()),
        Err(e) => anyhow::bail!(
            "cannot make a sandbox here, so no function could run: {e}. In a \
             container it needs user namespaces, mounts and a /proc of its own: a pod with \
             hostUsers: false, procMount: Unmasked and a seccomp profile that allows them \
             (deploy/seccomp/fnrun.json), or a privileged one (docs/deployment.md)"
        ),
    }
}

/// Tells every part of the daemon when to stop: its listeners, the metrics
/// listener, the function host and the controller.
struct Shutdown {
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    fn new() -> Shutdown {
        let (tx, rx) = watch::channel(false);
        Shutdown { tx, rx }
    }

    /// Ends once [`Shutdown::start`] is called.
    fn stopped(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    fn start(&self) {
        let _ = self.tx.send(true);
    }
}

/// A listener's server task.
type ServerTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// The listeners of `--listen`, serving the runner (v1alpha1) and Porch's
/// evaluator.
struct Listeners {
    servers: Vec<ServerTask>,
    /// The unix sockets' files, removed at the end.
    socket_files: Vec<std::path::PathBuf>,
    health: tonic_health::server::HealthReporter,
}

/// Binds every address of `--listen` and serves on it the runner, Porch's
/// evaluator, health and reflection.
async fn start_listeners(
    args: &ServeArgs,
    addrs: &[ListenAddr],
    runner: &Arc<Runner>,
    tls_metrics: Arc<HandshakeMetrics>,
    shutdown: &Shutdown,
) -> anyhow::Result<Listeners> {
    let (reflection_v1, reflection_v1alpha) = fnrun_transport::reflection::services(&[
        fnrun_api::v1alpha1::FILE_DESCRIPTOR_SET,
        fnrun_api::evaluator::FILE_DESCRIPTOR_SET,
    ])?;
    let evaluator = EvaluatorService::server(runner.clone());
    let service =
        ContainerizedFunctionRunnerServiceServer::new(FunctionRunnerService::new(runner.clone()))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(128 << 20);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    for service in [RUNNER_SERVICE, EVALUATOR_SERVICE] {
        health_reporter
            .set_service_status(service, tonic_health::ServingStatus::Serving)
            .await;
    }

    let tls = tls_accept(args, tls_metrics)?;
    let mut listeners = Listeners {
        servers: Vec::new(),
        socket_files: Vec::new(),
        health: health_reporter,
    };
    for addr in addrs {
        let listener = addr.bind(args.socket_mode.socket_mode)?;
        tracing::info!(address = %addr, "listening");
        let router = Server::builder()
            .layer(DeadlineLayer)
            .add_service(health.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .add_service(service.clone())
            .add_service(evaluator.clone());
        let shutdown = shutdown.stopped();
        listeners.servers.push(match listener {
            Listener::Unix(l, path) => {
                listeners.socket_files.extend(path);
                // Clients of unix sockets send the socket's path or name as
                // `:authority`, which h2 refuses; see `authority`.
                let incoming = UnixListenerStream::new(l).map_ok(NormalizeAuthority::new);
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
            }
            Listener::Tcp(l) => match &tls {
                Some(tls) => {
                    let (tx, rx) = tokio::sync::mpsc::channel(64);
                    tokio::spawn(tls.clone().run(l, tx, |tls| tls));
                    tokio::spawn(router.serve_with_incoming_shutdown(
                        tokio_stream::wrappers::ReceiverStream::new(rx),
                        shutdown,
                    ))
                }
                None => tokio::spawn(router.serve_with_incoming_shutdown(
                    fnrun_transport::listen::tcp_incoming(l),
                    shutdown,
                )),
            },
        });
    }
    Ok(listeners)
}

/// Crossplane v1 functions, when any is configured: their own listener.
/// In Kubernetes mode, the controller feeds the host its catalogue; else
/// the daemon is ready now, every listener being bound.
async fn start_functions(
    args: &ServeArgs,
    runner: Arc<Runner>,
    readiness: &Arc<fnrun_transport::readiness::Readiness>,
    function_metrics: Arc<FunctionMetrics>,
    tls_metrics: Arc<HandshakeMetrics>,
    shutdown: &Shutdown,
) -> anyhow::Result<(Option<FunctionsDaemon>, Option<ControllerTask>)> {
    let limits = fnrun_controller::LimitPolicy {
        support: runner.limit_support().clone(),
        best_effort: args.sandbox.best_effort_limits,
    };
    let started = match args.functions.kubernetes(limits)? {
        Some((listener, config)) => {
            let (daemon, controller) = start_kubernetes_mode(
                args,
                listener,
                config,
                readiness,
                runner,
                function_metrics,
                tls_metrics,
                shutdown,
            )
            .await?;
            (Some(daemon), Some(controller))
        }
        None => {
            let daemon = fnrun_host::daemon::start(
                &args.functions.config(),
                runner,
                function_metrics,
                tls_metrics,
                args.socket_mode.socket_mode,
                shutdown.stopped(),
            )
            .await?;
            readiness.ready();
            (daemon, None)
        }
    };
    Ok(started)
}

/// Kubernetes mode (`--functions-kubernetes`): the function host on its own
/// listener, fed its catalogue by the controller, which follows Crossplane's
/// Functions in the API server.
#[allow(clippy::too_many_arguments)]
async fn start_kubernetes_mode(
    args: &ServeArgs,
    listener: fnrun_host::daemon::ExternalConfig,
    config: fnrun_controller::Config,
    readiness: &Arc<fnrun_transport::readiness::Readiness>,
    runner: Arc<Runner>,
    function_metrics: Arc<FunctionMetrics>,
    tls_metrics: Arc<HandshakeMetrics>,
    shutdown: &Shutdown,
) -> anyhow::Result<(FunctionsDaemon, ControllerTask)> {
    let client = kube::Client::try_default().await.context(
        "--functions-kubernetes: no Kubernetes API server to read Functions from \
         (in a pod: its service account; else KUBECONFIG or ~/.kube/config)",
    )?;
    let (daemon, serving) = fnrun_host::daemon::start_external(
        &listener,
        readiness.clone(),
        runner,
        function_metrics,
        tls_metrics,
        args.socket_mode.socket_mode,
        shutdown.stopped(),
    )
    .await?;
    let controller = tokio::spawn(fnrun_controller::run(
        client,
        serving,
        config,
        shutdown.stopped(),
    ));
    Ok((daemon, controller))
}

/// The Kubernetes controller's task.
type ControllerTask = tokio::task::JoinHandle<anyhow::Result<()>>;

/// The daemon once started: what its shutdown stops.
struct Daemon {
    listeners: Listeners,
    functions: Option<FunctionsDaemon>,
    controller: Option<ControllerTask>,
    metrics_task: Option<tokio::task::JoinHandle<()>>,
    readiness: Arc<fnrun_transport::readiness::Readiness>,
    shutdown: Shutdown,
}

impl Daemon {
    /// Waits for SIGTERM or SIGINT, or for the controller to end by itself:
    /// then it cannot follow Crossplane any more, and the daemon stops as on
    /// a signal, and exits with the controller's error (given here).
    async fn wait_for_stop(
        &mut self,
        signals: &mut Signals,
    ) -> (&'static str, Option<anyhow::Error>) {
        let controller = &mut self.controller;
        tokio::select! {
            signal = signals.next() => (signal.name, None),
            ended = async { controller.as_mut().expect("only polled with a controller").await },
                if controller.is_some() =>
            {
                *controller = None;
                let error = match ended {
                    Ok(Ok(())) => anyhow::anyhow!("the Kubernetes controller ended"),
                    Ok(Err(e)) => e,
                    Err(e) => anyhow::anyhow!("the Kubernetes controller failed: {e}"),
                };
                tracing::error!(error = format!("{error:#}"), "Kubernetes mode: the controller stopped; shutting down");
                ("controller failed", Some(error))
            }
        }
    }

    /// Stops the daemon: health NOT_SERVING for `--shutdown-delay` while
    /// calls are still served, then the listeners close and in-flight calls
    /// get `--shutdown-grace`. A second signal at any point of that stops it
    /// at once (`Some`).
    async fn shut_down(
        mut self,
        args: &ServeArgs,
        signals: &mut Signals,
        signal: &'static str,
        controller_failed: Option<anyhow::Error>,
    ) -> anyhow::Result<Option<Stopped>> {
        self.not_serving(args, signal).await;
        // A second signal, during the delay or the drain, stops at once.
        if !args.shutdown_delay.is_zero() {
            let second = tokio::select! {
                () = tokio::time::sleep(args.shutdown_delay) => None,
                second = signals.next() => Some(second),
            };
            if let Some(second) = second {
                return Ok(Some(self.stop_at_once(second)));
            }
        }
        self.shutdown.start();
        tracing::info!(grace = ?args.shutdown_grace, "closing the listeners: draining in-flight calls");
        let drained = tokio::select! {
            drained = self.drain(args.shutdown_grace) => Ok(drained),
            second = signals.next() => Err(second),
        };
        let drained = match drained {
            Ok(drained) => drained,
            Err(second) => return Ok(Some(self.stop_at_once(second))),
        };
        self.finish(drained, args.shutdown_grace).await;
        if let Some(error) = controller_failed {
            return Err(error);
        }
        tracing::info!("stopped");
        Ok(None)
    }

    /// Health says NOT_SERVING first, while every listener still serves: a
    /// Kubernetes endpoint or a load balancer takes a moment to stop sending
    /// here, and a call it sends meanwhile must not be refused.
    async fn not_serving(&self, args: &ServeArgs, signal: &'static str) {
        tracing::info!(
            signal,
            delay = ?args.shutdown_delay,
            "shutting down: health reports NOT_SERVING; new calls are served for the shutdown delay \
             (a second SIGINT or SIGTERM stops at once, killing the runs in flight)"
        );
        self.readiness.stop();
        for service in ["", RUNNER_SERVICE, EVALUATOR_SERVICE] {
            self.listeners
                .health
                .set_service_status(service, tonic_health::ServingStatus::NotServing)
                .await;
        }
        if let Some(functions) = &self.functions {
            functions.not_serving().await;
        }
    }

    /// Waits up to `grace` for the listeners' in-flight calls to finish, and
    /// for the function host's; `Err` if the grace ran out.
    async fn drain(
        &mut self,
        grace: Duration,
    ) -> Result<Vec<ServerResult>, tokio::time::error::Elapsed> {
        // In-flight runs get the grace period; then their tasks are
        // aborted, which drops their sandboxes and so kills them.
        let functions = self.functions.take();
        let functions_stopped = async {
            if let Some(functions) = functions {
                functions.stop(grace).await;
            }
        };
        let drain = futures::future::join_all(self.listeners.servers.iter_mut());
        tokio::join!(tokio::time::timeout(grace, drain), functions_stopped).0
    }

    /// After a second signal: kills the runs in flight (their server tasks
    /// are aborted) and removes the sockets.
    fn stop_at_once(self, second: Stopped) -> Stopped {
        self.shutdown.start();
        tracing::warn!(
            signal = second.name,
            "second signal: stopping at once; the runs in flight are killed"
        );
        for server in &self.listeners.servers {
            server.abort();
        }
        if let Some(task) = self.metrics_task {
            task.abort();
        }
        if let Some(controller) = self.controller {
            controller.abort();
        }
        for path in self.listeners.socket_files {
            let _ = std::fs::remove_file(&path);
        }
        second
    }

    /// After the drain: reports how the servers ended (killing the runs still
    /// in flight if the grace ran out), removes the sockets and waits for the
    /// metrics listener and the controller to end.
    async fn finish(
        self,
        drained: Result<Vec<ServerResult>, tokio::time::error::Elapsed>,
        grace: Duration,
    ) {
        match drained {
            Ok(results) => {
                for result in results {
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("server ended with an error: {e}"),
                        Err(e) => tracing::warn!("server task failed: {e}"),
                    }
                }
            }
            Err(_) => {
                tracing::warn!(
                    grace = ?grace,
                    "grace period over: killing the runs still in flight"
                );
                for server in &self.listeners.servers {
                    server.abort();
                }
            }
        }
        if let Some(task) = self.metrics_task {
            let _ = task.await;
        }
        for path in self.listeners.socket_files {
            let _ = std::fs::remove_file(&path);
        }
        // The controller ends at the shutdown, releasing the Lease if it held it.
        if let Some(controller) = self.controller {
            match tokio::time::timeout(Duration::from_secs(10), controller).await {
                Ok(Ok(Err(e))) => tracing::warn!(
                    error = format!("{e:#}"),
                    "the Kubernetes controller ended with an error"
                ),
                Ok(_) => {}
                Err(_) => tracing::warn!("the Kubernetes controller did not stop in time"),
            }
        }
    }
}

/// How a server task ended.
type ServerResult = Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>;

/// The addresses of `--listen`; `none`, alone, turns the runner's listener
/// off, which leaves only the functions listener (`--functions`) to serve.
/// A host name is resolved now, and each of its addresses listened on.
/// Every error is a usage error.
fn listen_addrs(listen: &[String], functions: bool) -> anyhow::Result<Vec<ListenAddr>> {
    if !listen.iter().any(|a| a == "none") {
        let mut addrs = Vec::new();
        for given in listen {
            let resolved = ListenAddr::resolve(given)
                .map_err(|e| Usage(format!("--listen {}", crate::support::error_line(&e))))?;
            for addr in resolved {
                if !addrs.contains(&addr) {
                    addrs.push(addr);
                }
            }
        }
        return Ok(addrs);
    }
    if listen.len() > 1 {
        bail!(Usage(
            "--listen none turns the runner's listener off: give it alone, without other --listen addresses".to_owned()
        ));
    }
    if !functions {
        bail!(Usage(
            "--listen none leaves nothing to serve: give --functions FILE or --function NAME=IMAGE too".to_owned()
        ));
    }
    Ok(Vec::new())
}

/// TLS for TCP listeners, from `--tls-cert`, `--tls-key` and
/// `--tls-client-ca`; handshakes are [`fnrun_transport::tls_accept`]'s, which logs and
/// counts those it refuses.
fn tls_accept(
    args: &ServeArgs,
    metrics: Arc<HandshakeMetrics>,
) -> anyhow::Result<Option<TlsAccept>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let read =
        |p: &std::path::PathBuf| std::fs::read(p).with_context(|| format!("read {}", p.display()));
    let certs = |p: &std::path::PathBuf| -> anyhow::Result<Vec<CertificateDer<'static>>> {
        let chain: Vec<_> = CertificateDer::pem_slice_iter(&read(p)?)
            .collect::<Result<_, _>>()
            .with_context(|| format!("{}: not PEM", p.display()))?;
        if chain.is_empty() {
            bail!("{} has no PEM certificate", p.display());
        }
        Ok(chain)
    };
    let chain = certs(cert)?;
    let private_key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .with_context(|| format!("{} has no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match &args.tls_client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca)? {
                roots
                    .add(c)
                    .with_context(|| format!("--tls-client-ca {}", ca.display()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .with_context(|| format!("--tls-client-ca {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, private_key)
        .with_context(|| {
            format!(
                "--tls-cert {} with --tls-key {}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(TlsAccept::new(
        ListenerKind::Runner,
        Arc::new(config),
        None,
        metrics,
    )))
}

/// The handlers of the signals that stop the daemon.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("install SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("install SIGINT handler")?,
        })
    }

    /// The next of them that arrives (or arrived since `install`, or since
    /// the last call).
    async fn next(&mut self) -> Stopped {
        let (name, number) = tokio::select! {
            _ = self.term.recv() => ("SIGTERM", libc::SIGTERM),
            _ = self.int.recv() => ("SIGINT", libc::SIGINT),
        };
        Stopped { name, number }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_none_turns_the_runner_listener_off_and_only_alone_with_functions() {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(listen_addrs(&strings(&["none"]), true).unwrap(), []);
        assert_eq!(
            listen_addrs(&strings(&["unix:/run/a.sock", "127.0.0.1:9443"]), false).unwrap(),
            [
                ListenAddr::Unix("/run/a.sock".into()),
                ListenAddr::Tcp("127.0.0.1:9443".parse().unwrap())
            ]
        );
        assert!(
            listen_addrs(&strings(&["localhost:9443"]), false)
                .unwrap()
                .contains(&ListenAddr::Tcp("127.0.0.1:9443".parse().unwrap()))
        );
        let err = listen_addrs(&strings(&["127.0.0.1:80000"]), false).unwrap_err();
        assert!(err.is::<Usage>(), "{err}");
        let err = listen_addrs(&strings(&["none", "127.0.0.1:1"]), true).unwrap_err();
        assert!(err.is::<Usage>(), "{err}");
        assert!(err.to_string().contains("give it alone"), "{err}");
        let err = listen_addrs(&strings(&["none"]), false).unwrap_err();
        assert!(err.to_string().contains("--functions"), "{err}");
    }
}
