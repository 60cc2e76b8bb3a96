//! The functions listener: one address (TCP, `unix:` or `unix-abstract:`)
//! serving `apiextensions.fn.proto.v1` and `v1beta1`
//! `FunctionRunnerService`, `grpc.health.v1.Health` and server reflection
//! (`v1` and `v1alpha`).
//!
//! Each accepted connection becomes an [`FnConn`] that tells its calls what
//! the host routes by ([`ConnInfo`]: the TLS server name). TLS handshakes
//! are [`fnrun_transport::tls_accept`]'s. Unix
//! connections go through the `:authority` rewriter, as on `--listen`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::TryStreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::Server;
use tonic::transport::server::{Connected, Router};
use tonic_health::server::HealthReporter;

use super::Host;
use super::api::{ConnInfo, FunctionApi, V1, V1beta1};
use fnrun_transport::authority::NormalizeAuthority;
use fnrun_transport::deadline::DeadlineLayer;
use fnrun_transport::listen::Listener;
use fnrun_transport::tls_accept::TlsAccept;

/// The functions listener's router: its services behind [`DeadlineLayer`].
pub type FunctionsRouter =
    Router<tower::layer::util::Stack<DeadlineLayer, tower::layer::util::Identity>>;

/// The gRPC services of the functions listener, and the health reporter
/// that says which functions exist.
pub fn services(host: Arc<Host>) -> anyhow::Result<(FunctionsRouter, HealthReporter)> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    let (reflection_v1, reflection_v1alpha) = fnrun_transport::reflection::services(&[
        fnrun_api::v1::FILE_DESCRIPTOR_SET,
        fnrun_api::v1beta1::FILE_DESCRIPTOR_SET,
    ])?;
    let router = Server::builder()
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .layer(DeadlineLayer)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(FunctionApi::<V1>::new(host.clone()))
        .add_service(FunctionApi::<V1beta1>::new(host));
    Ok((router, health_reporter))
}

/// Says every function of `names` is serving, and so are the two
/// `FunctionRunnerService`s (and, as always, the listener: `""`).
pub async fn serving(health: &HealthReporter, names: &[String]) {
    use tonic_health::ServingStatus::Serving;
    for service in [
        fnrun_api::v1::SERVICE_NAME,
        fnrun_api::v1beta1::SERVICE_NAME,
    ] {
        health.set_service_status(service, Serving).await;
    }
    for name in names {
        health.set_service_status(name, Serving).await;
    }
}

/// Serves `router` on `listener` (TLS with `tls` on TCP) until `shutdown`.
pub fn serve(
    router: FunctionsRouter,
    listener: Listener,
    tls: Option<TlsAccept>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    match (listener, tls) {
        (Listener::Unix(l, _), _) => {
            let incoming = UnixListenerStream::new(l).map_ok(|s| {
                FnConn::new(
                    Io::Unix(Box::new(NormalizeAuthority::new(s))),
                    ConnInfo::default(),
                )
            });
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
        }
        (Listener::Tcp(l), None) => {
            let incoming = fnrun_transport::listen::tcp_incoming(l)
                .map_ok(|s| FnConn::new(Io::Tcp(s), ConnInfo::default()));
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
        }
        (Listener::Tcp(l), Some(tls)) => {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            tokio::spawn(tls.run(l, tx, |tls| {
                let info = ConnInfo {
                    sni: tls.get_ref().1.server_name().map(str::to_ascii_lowercase),
                };
                FnConn::new(Io::Tls(Box::new(tls)), info)
            }));
            tokio::spawn(router.serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown))
        }
    }
}

/// One connection of the functions listener.
pub struct FnConn {
    io: Io,
    info: ConnInfo,
}

enum Io {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Unix(Box<NormalizeAuthority<UnixStream>>),
}

impl FnConn {
    fn new(io: Io, info: ConnInfo) -> FnConn {
        FnConn { io, info }
    }
}

impl Connected for FnConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for FnConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for FnConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Io::Unix(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
            Io::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Io::Unix(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
