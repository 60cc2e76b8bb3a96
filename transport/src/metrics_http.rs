//! `GET /metrics` over HTTP/1.1, for Prometheus: the text each scrape
//! renders, from whichever parts the daemon is made of.

use std::sync::Arc;

/// Renders the whole exposition text for one scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `addr` until `shutdown` resolves: the text
/// `render` returns, called on a blocking thread (it may read the disk).
pub async fn serve(
    addr: std::net::SocketAddr,
    render: Render,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("listen on {addr} for metrics: {e}"))?;
    tracing::info!(address = %addr, "serving metrics at /metrics");
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
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let render = render.clone();
                    async move {
                        if req.uri().path() == "/metrics" {
                            let text = tokio::task::spawn_blocking(move || render())
                                .await
                                .unwrap_or_default();
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(text)))
                        } else {
                            Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::from_static(b"not found\n")))
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
