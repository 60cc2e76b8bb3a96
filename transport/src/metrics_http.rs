//! `GET /metrics` over HTTP/1.1, for Prometheus: the text each scrape
//! renders, from whichever parts the daemon is made of. The same listener
//! answers the kubelet's probes: `GET /readyz` is `200 ok` once the daemon
//! can serve ([`Readiness`]) and `503 not ready: WHY` until then; `GET
//! /livez` is `200 ok` while the daemon's runtime answers at all.

use std::sync::Arc;

use crate::readiness::Readiness;

/// Renders the whole exposition text for one scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `addr` until `shutdown` resolves: the text
/// `render` returns, called on a blocking thread (it may read the disk);
/// and `/readyz` as `readiness` says, and `/livez`.
pub async fn serve(
    addr: std::net::SocketAddr,
    render: Render,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("listen on {addr} for metrics: {e}"))?;
    tracing::info!(
        address = %addr,
        "serving metrics at /metrics, readiness at /readyz, liveness at /livez"
    );
    Ok(tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                },
            };
            let render = render.clone();
            let readiness = readiness.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let render = render.clone();
                    let readiness = readiness.clone();
                    async move {
                        let text = |status, body: String| {
                            Response::builder()
                                .status(status)
                                .header("content-type", "text/plain; charset=utf-8")
                                .body(Full::new(Bytes::from(body)))
                        };
                        match req.uri().path() {
                            "/metrics" => {
                                let text = tokio::task::spawn_blocking(move || render())
                                    .await
                                    .unwrap_or_default();
                                Response::builder()
                                    .header("content-type", "text/plain; version=0.0.4")
                                    .body(Full::new(Bytes::from(text)))
                            }
                            "/readyz" => match readiness.get() {
                                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                                Err(why) => text(
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    format!("not ready: {why}\n"),
                                ),
                            },
                            "/livez" => text(StatusCode::OK, "ok\n".into()),
                            _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    }))
}
