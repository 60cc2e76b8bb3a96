//! The HTTP/2 client side of the host: one connection to a function's own
//! gRPC server, opened inside the server's network namespace
//! ([`fnrun_sandbox::Service::connect`]), shared by every call to it.
//!
//! Calls go through tonic's client with the [`Passthrough`] codec, so the
//! function's answer comes back as the bytes it sent, and its status (code,
//! message, details, metadata) as it sent it. A status tonic made up for a
//! broken connection carries a `source`; one the function sent does not
//! ([`is_transport`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::codec::Passthrough;

/// The port a Function package's server listens on (function-sdk-go and
/// function-sdk-python default to `:9443`).
pub const FUNCTION_PORT: u16 = 9443;

/// Largest request and response forwarded, each way: Crossplane sends the
/// whole observed state of a composite in one request.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// What the host says it is to the function.
const ORIGIN: &str = "http://127.0.0.1:9443";

/// The health check path, used as a readiness probe: any gRPC answer to it,
/// UNIMPLEMENTED included, shows the server speaks gRPC.
const PROBE_PATH: &str = "/grpc.health.v1.Health/Check";

/// One HTTP/2 connection to a function's server.
#[derive(Clone, Debug)]
pub struct Upstream {
    sender: http2::SendRequest<Body>,
}

impl Upstream {
    /// An HTTP/2 connection over `io` (already connected); its driver task
    /// ends when the connection does.
    pub async fn handshake(io: tokio::net::TcpStream) -> Result<Upstream, hyper::Error> {
        fnrun_transport::listen::no_delay(&io);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            // Windows large enough that a request or response of a few MiB
            // does not wait for window updates.
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(1 << 20)
            .handshake(TokioIo::new(io))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection to a function server ended");
            }
        });
        Ok(Upstream { sender })
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends `message` to `path` with `metadata`, waiting at most `timeout`
    /// (sent on as `grpc-timeout`).
    pub async fn unary(
        &self,
        path: &'static str,
        message: Bytes,
        metadata: MetadataMap,
        timeout: Option<Duration>,
    ) -> Result<Response<Bytes>, Status> {
        let mut grpc =
            tonic::client::Grpc::with_origin(self.clone(), http::Uri::from_static(ORIGIN))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let mut request = Request::from_parts(metadata, Default::default(), message);
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        grpc.unary(request, PathAndQuery::from_static(path), Passthrough)
            .await
    }

    /// Whether the server answers gRPC: a health check whose answer, any
    /// answer, came from the server.
    pub async fn probe(&self, timeout: Duration) -> Result<(), Status> {
        // An empty HealthCheckRequest: service "" (the server as a whole).
        match self
            .unary(PROBE_PATH, Bytes::new(), MetadataMap::new(), Some(timeout))
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if !is_transport(&status) => Ok(()),
            Err(status) => Err(status),
        }
    }
}

/// Whether `status` is tonic's account of a broken connection or stream,
/// rather than a status the server sent.
pub fn is_transport(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

impl tower::Service<http::Request<Body>> for Upstream {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Box::pin(self.sender.send_request(request))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use fnrun_api::v1;
    use fnrun_api::v1::function_runner_service_server::{
        FunctionRunnerService, FunctionRunnerServiceServer,
    };
    use prost::Message;
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;

    /// A function server that answers with its request's tag, or with the
    /// status its tag names.
    struct Echo;

    #[tonic::async_trait]
    impl FunctionRunnerService for Echo {
        async fn run_function(
            &self,
            request: Request<v1::RunFunctionRequest>,
        ) -> Result<Response<v1::RunFunctionResponse>, Status> {
            let tag = request.get_ref().meta.clone().unwrap_or_default().tag;
            if tag == "fail" {
                let mut status = Status::with_details(
                    tonic::Code::FailedPrecondition,
                    "no can do",
                    Bytes::from_static(b"details"),
                );
                status
                    .metadata_mut()
                    .insert("x-function", "echo".parse().unwrap());
                return Err(status);
            }
            let mut response = Response::new(v1::RunFunctionResponse {
                meta: Some(v1::ResponseMeta { tag, ttl: None }),
                ..Default::default()
            });
            response
                .metadata_mut()
                .insert("x-function", "echo".parse().unwrap());
            Ok(response)
        }
    }

    async fn server() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(FunctionRunnerServiceServer::new(Echo))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        addr
    }

    fn request(tag: &str) -> Bytes {
        let mut bytes = v1::RunFunctionRequest {
            meta: Some(v1::RequestMeta {
                tag: tag.to_owned(),
                capabilities: Vec::new(),
            }),
            ..Default::default()
        }
        .encode_to_vec();
        // Field 1000, varint 7: unknown to every version of the API.
        bytes.extend_from_slice(&[0xc0, 0x3e, 0x07]);
        Bytes::from(bytes)
    }

    const V1_PATH: &str = "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction";
    const V1BETA1_PATH: &str = "/apiextensions.fn.proto.v1beta1.FunctionRunnerService/RunFunction";

    #[tokio::test]
    async fn calls_are_forwarded_as_bytes_and_statuses_come_back_whole() {
        let addr = server().await;
        let upstream = Upstream::handshake(tokio::net::TcpStream::connect(addr).await.unwrap())
            .await
            .unwrap();
        upstream.probe(Duration::from_secs(5)).await.unwrap();

        let response = upstream
            .unary(V1_PATH, request("t1"), MetadataMap::new(), None)
            .await
            .unwrap();
        assert_eq!(response.metadata().get("x-function").unwrap(), "echo");
        let decoded = v1::RunFunctionResponse::decode(response.into_inner()).unwrap();
        assert_eq!(decoded.meta.unwrap().tag, "t1");

        let status = upstream
            .unary(V1_PATH, request("fail"), MetadataMap::new(), None)
            .await
            .unwrap_err();
        assert!(!is_transport(&status));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), "no can do");
        assert_eq!(status.details(), b"details");
        assert_eq!(status.metadata().get("x-function").unwrap(), "echo");

        // A service the server does not have: its own UNIMPLEMENTED.
        let status = upstream
            .unary(V1BETA1_PATH, request("t2"), MetadataMap::new(), None)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(!is_transport(&status));
    }

    #[tokio::test]
    async fn a_broken_connection_is_a_transport_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts, reads the preface, and hangs up.
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await;
        });
        let upstream = Upstream::handshake(tokio::net::TcpStream::connect(addr).await.unwrap())
            .await
            .unwrap();
        let status = upstream
            .unary(V1_PATH, request("t"), MetadataMap::new(), None)
            .await
            .unwrap_err();
        assert!(is_transport(&status), "{status:?}");
        assert!(upstream.probe(Duration::from_secs(1)).await.is_err());
    }
}
