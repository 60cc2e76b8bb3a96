//! `fnrun serve`: the daemon. One tonic server per listen address, all on one
//! shared [`Runner`], each serving the v1alpha1 runner and Porch's evaluator
//! ([`crate::evaluator`]); SIGTERM/SIGINT drain and exit 0.

use std::sync::Arc;

use anyhow::Context;
use fnrun_api::v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerServiceServer;
use futures::TryStreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::authority::NormalizeAuthority;
use crate::config::ServeArgs;
use crate::deadline::DeadlineLayer;
use crate::evaluator::EvaluatorService;
use crate::listen::{ListenAddr, Listener};
use crate::runner::Admission;
use crate::service::FunctionRunnerService;

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    rt.block_on(serve_async(args))
}

async fn serve_async(args: ServeArgs) -> anyhow::Result<()> {
    // Before anything listens: a SIGTERM or SIGINT that comes as soon as the
    // socket exists must stop the daemon gracefully, not be lost (an inherited
    // SIG_IGN, as in a non-interactive shell's background job) or kill it.
    let signals = Signals::install()?;
    let addrs: Vec<ListenAddr> = args
        .listen
        .iter()
        .map(|a| a.parse())
        .collect::<anyhow::Result<_>>()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let admission = Admission {
        max_concurrency: args.max_concurrency.unwrap_or(4 * cores),
        max_queue: args.max_queue,
    };
    let runner = crate::config::build_runner(&args.cache, &args.sandbox, admission)?
        .with_allowed_registries(args.allowed_registries.clone())
        .with_cache_max_size(args.cache_max_size);
    tracing::info!(
        cache = %runner.cache().root().display(),
        max_concurrency = admission.max_concurrency,
        max_queue = admission.max_queue,
        "fnrun {} starting",
        crate::VERSION
    );
    tracing::info!(limits = %runner.sandbox().limit_support(), "limits this host can enforce");
    let runner = Arc::new(runner);

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let metrics_task = match args.metrics_listen {
        Some(addr) => Some(
            crate::metrics::serve(
                addr,
                runner.metrics().clone(),
                runner.cache().root().to_path_buf(),
                stopped(shutdown_rx.clone()),
            )
            .await?,
        ),
        None => None,
    };
    let (reflection_v1, reflection_v1alpha) = crate::reflection::services(&[
        fnrun_api::v1alpha1::FILE_DESCRIPTOR_SET,
        fnrun_api::evaluator::FILE_DESCRIPTOR_SET,
    ])?;
    let evaluator = EvaluatorService::server(runner.clone());
    if !args.prefetch.is_empty() {
        tokio::spawn(crate::evaluator::prefetch(
            runner.clone(),
            args.prefetch.clone(),
        ));
    }
    let service =
        ContainerizedFunctionRunnerServiceServer::new(FunctionRunnerService::new(runner.clone()))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(128 << 20);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ContainerizedFunctionRunnerServiceServer<FunctionRunnerService>>()
        .await;
    health_reporter
        .set_serving::<fnrun_api::evaluator::function_evaluator_server::FunctionEvaluatorServer<EvaluatorService>>()
        .await;

    let tls = tls_config(&args)?;
    let mut servers = Vec::new();
    let mut socket_files = Vec::new();
    for addr in &addrs {
        let listener = addr.bind(args.socket_mode)?;
        tracing::info!(address = %addr, "listening");
        let mut builder = Server::builder();
        if let (Listener::Tcp(_), Some(tls)) = (&listener, &tls) {
            builder = builder.tls_config(tls.clone()).context("configure TLS")?;
        }
        let router = builder
            .layer(DeadlineLayer)
            .add_service(health.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .add_service(service.clone())
            .add_service(evaluator.clone());
        let shutdown = stopped(shutdown_rx.clone());
        servers.push(match listener {
            Listener::Unix(l, path) => {
                socket_files.extend(path);
                // Clients of unix sockets send the socket's path or name as
                // `:authority`, which h2 refuses; see `authority`.
                let incoming = UnixListenerStream::new(l).map_ok(NormalizeAuthority::new);
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
            }
            Listener::Tcp(l) => tokio::spawn(
                router.serve_with_incoming_shutdown(TcpListenerStream::new(l), shutdown),
            ),
        });
    }

    // Crossplane v1 functions, when any is configured: their own listener.
    let functions = crate::host::daemon::start(
        &args.functions,
        runner.clone(),
        args.socket_mode,
        stopped(shutdown_rx.clone()),
    )
    .await?;

    let signal = signals.first().await;
    tracing::info!(signal, "shutting down: draining in-flight runs");
    health_reporter
        .set_not_serving::<ContainerizedFunctionRunnerServiceServer<FunctionRunnerService>>()
        .await;
    health_reporter
        .set_not_serving::<fnrun_api::evaluator::function_evaluator_server::FunctionEvaluatorServer<EvaluatorService>>()
        .await;
    let _ = shutdown_tx.send(true);
    // In-flight runs get the grace period; then their tasks are aborted, which
    // drops their sandboxes and so kills them.
    let functions_stopped = async {
        if let Some(functions) = functions {
            functions.stop(args.shutdown_grace).await;
        }
    };
    let drain = futures::future::join_all(servers.iter_mut());
    let (drained, ()) = tokio::join!(
        tokio::time::timeout(args.shutdown_grace, drain),
        functions_stopped
    );
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
                grace = ?args.shutdown_grace,
                "grace period over: killing the runs still in flight"
            );
            for server in &servers {
                server.abort();
            }
        }
    }
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    for path in socket_files {
        let _ = std::fs::remove_file(&path);
    }
    tracing::info!("stopped");
    Ok(())
}

/// TLS for TCP listeners, from `--tls-cert`, `--tls-key` and `--tls-client-ca`.
fn tls_config(args: &ServeArgs) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let read =
        |p: &std::path::PathBuf| std::fs::read(p).with_context(|| format!("read {}", p.display()));
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &args.tls_client_ca {
        config = config.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Some(config))
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

    /// The name of the first of them that arrives (or arrived since `install`).
    async fn first(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
