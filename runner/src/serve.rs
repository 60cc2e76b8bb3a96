//! `fnrun serve`: the daemon. One tonic server per listen address, all on one
//! shared [`Runner`]; SIGTERM/SIGINT drain and exit 0.

use std::sync::Arc;

use anyhow::Context;
use fnrun_api::v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerServiceServer;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

use crate::config::ServeArgs;
use crate::listen::{ListenAddr, Listener};
use crate::service::FunctionRunnerService;

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    rt.block_on(serve_async(args))
}

async fn serve_async(args: ServeArgs) -> anyhow::Result<()> {
    let addrs: Vec<ListenAddr> = args
        .listen
        .iter()
        .map(|a| a.parse())
        .collect::<anyhow::Result<_>>()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max_concurrency = args.max_concurrency.unwrap_or(4 * cores);
    let runner = crate::config::build_runner(&args.cache, &args.sandbox, max_concurrency)?;
    tracing::info!(
        cache = %runner.cache().root().display(),
        max_concurrency,
        "fnrun {} starting",
        env!("CARGO_PKG_VERSION")
    );
    let runner = Arc::new(runner);
    let service = ContainerizedFunctionRunnerServiceServer::new(FunctionRunnerService::new(runner))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(128 << 20);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ContainerizedFunctionRunnerServiceServer<FunctionRunnerService>>()
        .await;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut servers = Vec::new();
    let mut socket_files = Vec::new();
    for addr in &addrs {
        let listener = addr.bind(args.socket_mode)?;
        tracing::info!(address = %addr, "listening");
        let router = Server::builder()
            .add_service(health.clone())
            .add_service(service.clone());
        let mut rx = shutdown_rx.clone();
        let shutdown = async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        servers.push(match listener {
            Listener::Unix(l, path) => {
                socket_files.extend(path);
                tokio::spawn(
                    router.serve_with_incoming_shutdown(UnixListenerStream::new(l), shutdown),
                )
            }
            Listener::Tcp(l) => tokio::spawn(
                router.serve_with_incoming_shutdown(TcpListenerStream::new(l), shutdown),
            ),
        });
    }

    let signal = wait_for_signal().await?;
    tracing::info!(signal, "shutting down: draining in-flight runs");
    health_reporter
        .set_not_serving::<ContainerizedFunctionRunnerServiceServer<FunctionRunnerService>>()
        .await;
    let _ = shutdown_tx.send(true);
    for server in servers {
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("server ended with an error: {e}"),
            Err(e) => tracing::warn!("server task failed: {e}"),
        }
    }
    for path in socket_files {
        let _ = std::fs::remove_file(&path);
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
