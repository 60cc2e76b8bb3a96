//! gRPC over unix sockets with the generated tonic client, and request building.

use std::os::linux::net::SocketAddrExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use fnrun_api::v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient;
use fnrun_api::v1alpha1::{
    ImagePullAuth, ImagePullConfig, ImagePullPolicy, NetworkConfig, NetworkPolicy, ResourceConfig,
    ResourceLimits, RunFunctionConfig, RunFunctionRequest, RunFunctionResponse,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

/// The RunFunction client.
pub type Client = ContainerizedFunctionRunnerServiceClient<Channel>;

/// The longest the harness waits for one RPC before failing the test.
pub const RPC_GUARD: Duration = Duration::from_secs(180);

/// The URI is required by tonic but unused: the connector dials the socket.
const DUMMY_URI: &str = "http://[::]:50051";

/// A connection to the unix socket at `path`.
pub async fn connect_unix(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(path).await
}

/// A connection to the abstract unix socket `name` (without the leading
/// NUL byte, e.g. `crossplane/fn/default.sock`).
pub fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    stream.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(stream)
}

/// A channel to a daemon listening on the unix socket at `path`.
pub async fn channel_unix(path: &Path) -> Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let channel = Endpoint::try_from(DUMMY_URI)?
        .connect_with_connector(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(connect_unix(&path).await?)) }
        }))
        .await
        .context("cannot connect to the unix socket")?;
    Ok(channel)
}

/// A channel to a daemon listening on the abstract unix socket `name`.
pub async fn channel_abstract(name: &str) -> Result<Channel> {
    let name = name.to_owned();
    let channel = Endpoint::try_from(DUMMY_URI)?
        .connect_with_connector(service_fn(move |_: Uri| {
            let name = name.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(connect_abstract(&name)?)) }
        }))
        .await
        .context("cannot connect to the abstract unix socket")?;
    Ok(channel)
}

/// A channel to a daemon's TCP listener at `addr` (`HOST:PORT`): h2c, or
/// TLS when `tls` gives the CA that signed the server's certificate (and the
/// server name to verify).
pub async fn channel_tcp(addr: &str, tls: Option<(&Path, &str)>) -> Result<Channel> {
    let endpoint = match tls {
        None => Endpoint::from_shared(format!("http://{addr}"))?,
        Some((ca, server_name)) => {
            // ring as the process's provider, whatever features unify.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let ca = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            Endpoint::from_shared(format!("https://{addr}"))?.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                    .domain_name(server_name),
            )?
        }
    };
    endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))
}

/// One HTTP/2 connection, as a tonic client's transport.
pub type BareConnection = tower::util::BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<hyper::body::Incoming>,
    hyper::Error,
>;

/// A RunFunction client on `io` that keeps no timer of its own. tonic's
/// `Channel` ends a call at its `grpc-timeout` itself (CANCELLED, "Timeout
/// expired"), before the server's answer arrives; this client, like one
/// whose clock runs a little behind the server's, waits for the server to
/// say how the call ended.
pub async fn client_without_timer(
    io: tokio::net::UnixStream,
) -> Result<ContainerizedFunctionRunnerServiceClient<BareConnection>> {
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(io),
    )
    .await
    .context("HTTP/2 handshake")?;
    tokio::spawn(connection);
    let transport = service_fn(move |request| {
        let mut sender = sender.clone();
        async move { sender.send_request(request).await }
    });
    Ok(ContainerizedFunctionRunnerServiceClient::with_origin(
        BareConnection::new(transport),
        Uri::from_static("http://localhost"),
    ))
}

/// Calls RunFunction; panics if no answer comes within [`RPC_GUARD`].
pub async fn run_function(
    client: &mut Client,
    request: RunFunctionRequest,
) -> Result<RunFunctionResponse, tonic::Status> {
    tokio::time::timeout(RPC_GUARD, client.run_function(request))
        .await
        .unwrap_or_else(|_| panic!("RunFunction did not answer within {RPC_GUARD:?}"))
        .map(tonic::Response::into_inner)
}

/// The `grpc.health.v1.Health/Check` status of `service` ("" for the server).
pub async fn health(channel: Channel, service: &str) -> Result<i32, tonic::Status> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    };
    tokio::time::timeout(RPC_GUARD, health.check(request))
        .await
        .unwrap_or_else(|_| panic!("Health/Check did not answer within {RPC_GUARD:?}"))
        .map(|r| r.into_inner().status)
}

/// `SERVING` in `grpc.health.v1.HealthCheckResponse.ServingStatus`.
pub const HEALTH_SERVING: i32 =
    tonic_health::pb::health_check_response::ServingStatus::Serving as i32;

/// `NOT_SERVING` in `grpc.health.v1.HealthCheckResponse.ServingStatus`.
pub const HEALTH_NOT_SERVING: i32 =
    tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// Builds a [`RunFunctionRequest`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Run {
    request: RunFunctionRequest,
}

impl Run {
    /// A request for `image` with `input`; everything else unset (defaults).
    pub fn new(image: &str, input: impl Into<Vec<u8>>) -> Run {
        Run {
            request: RunFunctionRequest {
                image: image.to_owned(),
                input: input.into(),
                ..Default::default()
            },
        }
    }

    fn pull(&mut self) -> &mut ImagePullConfig {
        self.request
            .image_pull_config
            .get_or_insert_with(Default::default)
    }

    fn config(&mut self) -> &mut RunFunctionConfig {
        self.request
            .run_function_config
            .get_or_insert_with(Default::default)
    }

    fn limits(&mut self) -> &mut ResourceLimits {
        self.config()
            .resources
            .get_or_insert_with(ResourceConfig::default)
            .limits
            .get_or_insert_with(Default::default)
    }

    pub fn pull_policy(mut self, policy: ImagePullPolicy) -> Self {
        self.pull().pull_policy = policy.into();
        self
    }

    /// Username and password credentials for the registry.
    pub fn basic_auth(mut self, username: &str, password: &str) -> Self {
        self.pull().auth = Some(ImagePullAuth {
            username: username.to_owned(),
            password: password.to_owned(),
            ..Default::default()
        });
        self
    }

    /// Credentials as in a docker config file: base64 of `user:password`.
    pub fn auth(mut self, auth: ImagePullAuth) -> Self {
        self.pull().auth = Some(auth);
        self
    }

    pub fn network(mut self, policy: NetworkPolicy) -> Self {
        self.config().network = Some(NetworkConfig {
            policy: policy.into(),
        });
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config().timeout = Some(prost_types::Duration {
            seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(timeout.subsec_nanos()).unwrap_or(0),
        });
        self
    }

    /// A raw protobuf duration, e.g. a negative one.
    pub fn raw_timeout(mut self, seconds: i64, nanos: i32) -> Self {
        self.config().timeout = Some(prost_types::Duration { seconds, nanos });
        self
    }

    pub fn memory(mut self, quantity: &str) -> Self {
        quantity.clone_into(&mut self.limits().memory);
        self
    }

    pub fn cpu(mut self, quantity: &str) -> Self {
        quantity.clone_into(&mut self.limits().cpu);
        self
    }

    pub fn build(self) -> RunFunctionRequest {
        self.request
    }
}

impl From<Run> for RunFunctionRequest {
    fn from(run: Run) -> Self {
        run.request
    }
}
