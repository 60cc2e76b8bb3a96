//! The v1 and v1beta1 `FunctionRunnerService` of the functions listener: a
//! thin shell that takes each call's bytes, its route (the connection's TLS
//! server name, the call's `:authority`), its metadata and its deadline to
//! the [`Host`], and answers with what the function answered, or with the
//! host's own failure through the one table (`crate::service::code`).
//!
//! Generated tonic servers decode every request into a message; this one
//! serves `RunFunction` with the passthrough codec instead, so the bytes are
//! forwarded as they came.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::Host;
use super::codec::Passthrough;
use super::error::CallError;
use super::instance::Api;
use super::routing::Route;
use super::upstream::MAX_MESSAGE_BYTES;
use fnrun_transport::deadline::CallDeadline;

/// What a connection of the functions listener tells each of its calls.
#[derive(Debug, Clone, Default)]
pub struct ConnInfo {
    /// The TLS server name the client asked for.
    pub sni: Option<String>,
}

/// Marks the package a [`FunctionApi`] serves.
pub trait Package: Send + Sync + 'static {
    const API: Api;
    const NAME: &'static str;
}

#[derive(Debug, Clone, Copy)]
pub struct V1;
#[derive(Debug, Clone, Copy)]
pub struct V1beta1;

impl Package for V1 {
    const API: Api = Api::V1;
    const NAME: &'static str = fnrun_api::v1::SERVICE_NAME;
}

impl Package for V1beta1 {
    const API: Api = Api::V1beta1;
    const NAME: &'static str = fnrun_api::v1beta1::SERVICE_NAME;
}

/// `FunctionRunnerService` of package `P`, forwarding to the host.
pub struct FunctionApi<P> {
    host: Arc<Host>,
    _package: PhantomData<P>,
}

impl<P> FunctionApi<P> {
    pub fn new(host: Arc<Host>) -> Self {
        FunctionApi {
            host,
            _package: PhantomData,
        }
    }
}

impl<P> Clone for FunctionApi<P> {
    fn clone(&self) -> Self {
        FunctionApi::new(self.host.clone())
    }
}

impl<P: Package> NamedService for FunctionApi<P> {
    const NAME: &'static str = P::NAME;
}

impl<P: Package> tower::Service<http::Request<Body>> for FunctionApi<P> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(P::NAME))
            .and_then(|p| p.strip_prefix('/'));
        if method != Some("RunFunction") {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let route = Route {
            sni: request
                .extensions()
                .get::<ConnInfo>()
                .and_then(|c| c.sni.clone()),
            authority: request
                .uri()
                .authority()
                .map(|a| a.as_str().to_owned())
                .or_else(|| {
                    request
                        .headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .map(str::to_owned)
                }),
        };
        let run = RunFunction {
            host: self.host.clone(),
            route,
            api: P::API,
        };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Passthrough)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.unary(run, request).await)
        })
    }
}

/// One `RunFunction` call.
struct RunFunction {
    host: Arc<Host>,
    route: Route,
    api: Api,
}

impl UnaryService<Bytes> for RunFunction {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let host = self.host.clone();
        let route = std::mem::take(&mut self.route);
        let api = self.api;
        Box::pin(async move {
            let deadline = CallDeadline::of(&request);
            let (metadata, _, message) = request.into_parts();
            let forwarded = forwardable(metadata);
            match host.call(&route, api, message, forwarded, deadline).await {
                Ok(response) => {
                    let (metadata, message, _) = response.into_parts();
                    Ok(Response::from_parts(
                        forwardable(metadata),
                        message,
                        Default::default(),
                    ))
                }
                Err(CallError::Function(mut status)) => {
                    let metadata = forwardable(std::mem::take(status.metadata_mut()));
                    *status.metadata_mut() = metadata;
                    Err(status)
                }
                Err(CallError::Failed(e)) => Err(e.into()),
            }
        })
    }
}

/// Headers of HTTP/2 and gRPC itself, which each hop sets for itself; the
/// rest of the metadata passes through.
const HOP_HEADERS: &[&str] = &[
    "te",
    "content-type",
    "content-length",
    "user-agent",
    "host",
    "date",
    "server",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
];

/// `metadata` without the headers each hop sets for itself.
fn forwardable(metadata: MetadataMap) -> MetadataMap {
    let mut headers = metadata.into_headers();
    for name in HOP_HEADERS {
        headers.remove(*name);
    }
    MetadataMap::from_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_headers_are_not_forwarded() {
        let mut m = MetadataMap::new();
        for (k, v) in [
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("grpc-timeout", "1S"),
            ("grpc-encoding", "gzip"),
            ("user-agent", "grpc-go/1.60"),
            ("x-request-id", "abc"),
        ] {
            m.insert(k, v.parse().unwrap());
        }
        m.insert_bin(
            "trace-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x01\x02"),
        );
        let kept = forwardable(m);
        let mut names: Vec<_> = kept
            .keys()
            .map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => k.as_str().to_owned(),
                tonic::metadata::KeyRef::Binary(k) => k.as_str().to_owned(),
            })
            .collect();
        names.sort();
        assert_eq!(names, ["trace-bin", "x-request-id"]);
    }
}
