//! Every gRPC API fnrun serves, called by the four client libraries of its
//! callers on every kind of listener it has:
//! - the daemon's `--listen` addresses (a unix path, an abstract socket named
//!   like Crossplane's default, a TCP port): the v1alpha1 runner, Porch's
//!   evaluator and server reflection;
//! - the functions listener, over h2c and over mTLS: Crossplane's v1 API;
//!
//! by grpc-go (Crossplane's and Porch's library, built from its module),
//! Python's grpcio from PyPI (grpc-core: it sends a unix socket's path or
//! name as `:authority`), grpc-java from Maven Central (Netty: it dials a
//! unix path by its own `unix:` scheme and an abstract socket on Netty's
//! epoll transport) and tonic; with a root daemon and a rootless one.

use std::net::TcpListener;

use fnrun_api::evaluator::EvaluateFunctionRequest;
use fnrun_api::evaluator::function_evaluator_client::FunctionEvaluatorClient;
use fnrun_api::v1::RunFunctionRequest as V1Request;
use fnrun_api::v1::function_runner_service_client::FunctionRunnerServiceClient;
use fnrun_tests::client::{self, Run};
use fnrun_tests::crossplane::{GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::daemon::{Daemon, DaemonOpts, Socket};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, NAMESPACE};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::grpc_clients::{self, GoDial};
use fnrun_tests::image::TestImage;
use fnrun_tests::krm::{RESOURCE_LIST, go_evaluate};
use fnrun_tests::registry::Registry;
use fnrun_tests::unique_name;
use fnrun_tests::user::{TestUser, require_root, root_and_rootless};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Runs a blocking client call off the async runtime.
async fn blocking<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(call)
        .await
        .expect("the client call")
}

/// One of the daemon's listeners, as each client names it.
#[derive(Debug, Clone)]
enum Listener {
    Path(std::path::PathBuf),
    Abstract(String),
    Tcp(String),
}

impl Listener {
    /// The gRPC target grpcio, grpc-go and grpc-java dial.
    fn target(&self) -> String {
        match self {
            Listener::Path(path) => format!("unix:{}", path.display()),
            Listener::Abstract(name) => format!("unix-abstract:{name}"),
            Listener::Tcp(addr) => addr.clone(),
        }
    }

    /// How grpc-go's runfunction client dials it.
    fn go_dial(&self) -> GoDial {
        match self {
            Listener::Path(path) => GoDial::Unix(path.clone()),
            Listener::Abstract(name) => GoDial::AbstractWithDialer(name.clone()),
            Listener::Tcp(addr) => GoDial::Tcp(addr.clone()),
        }
    }

    async fn tonic(&self) -> Channel {
        match self {
            Listener::Path(path) => client::channel_unix(path).await,
            Listener::Abstract(name) => client::channel_abstract(name).await,
            Listener::Tcp(addr) => Endpoint::from_shared(format!("http://{addr}"))
                .expect("a URI")
                .connect()
                .await
                .map_err(Into::into),
        }
        .unwrap_or_else(|e| panic!("tonic connects to {self:?}: {e:#}"))
    }
}

/// A free loopback TCP port's address.
fn free_tcp_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds a loopback port");
    listener.local_addr().expect("its address").to_string()
}

/// A daemon on a unix path, an abstract socket and a TCP port.
fn daemon(user: &Option<TestUser>) -> (Daemon, Vec<Listener>) {
    let name = format!("crossplane/fn/{}.sock", unique_name("matrix"));
    let tcp = free_tcp_addr();
    let mut opts = DaemonOpts::default()
        .arg("--listen")
        .arg(format!("unix-abstract:{name}"))
        .arg("--listen")
        .arg(&tcp);
    if let Some(user) = user {
        opts = opts.user(user.clone());
    }
    let daemon = Daemon::start(opts).expect("fnrun serve starts");
    let path = match daemon.socket() {
        Socket::Path(path) => path.clone(),
        other => panic!("expected a unix path, not {other:?}"),
    };
    let listeners = vec![
        Listener::Path(path),
        Listener::Abstract(name),
        Listener::Tcp(tcp),
    ];
    (daemon, listeners)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go_grpcio_grpc_java_and_tonic_call_the_runner_and_the_evaluator_on_every_listener() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless(
        "grpc_go_grpcio_grpc_java_and_tonic_call_the_runner_and_the_evaluator_on_every_listener",
    ) {
        let (_daemon, listeners) = daemon(&user);
        for listener in &listeners {
            let what = format!("{listener:?} ({user:?})");

            // grpc-go.
            let (dial, i) = (listener.go_dial(), image.clone());
            let outcome =
                blocking(move || grpc_clients::go_run_function(&dial, &i, SAMPLE.as_bytes()))
                    .await
                    .unwrap_or_else(|e| panic!("grpc-go RunFunction, {what}: {e:#}"));
            assert!(outcome.is("OK"), "grpc-go RunFunction, {what}: {outcome:?}");
            assert_same_yaml(&outcome.output, SAMPLE);
            let (target, abstract_socket) =
                (listener.target(), matches!(listener, Listener::Abstract(_)));
            let i = image.clone();
            let evaluated = blocking(move || {
                go_evaluate(
                    &target,
                    abstract_socket,
                    &[&i],
                    "",
                    RESOURCE_LIST.as_bytes(),
                )
            })
            .await
            .unwrap_or_else(|e| panic!("grpc-go EvaluateFunction, {what}: {e:#}"));
            assert_eq!(
                evaluated[0].code, "OK",
                "grpc-go EvaluateFunction, {what}: {evaluated:?}"
            );
            assert_same_yaml(&evaluated[0].resource_list, RESOURCE_LIST);

            // grpcio.
            let (target, i) = (listener.target(), image.clone());
            let outcome =
                blocking(move || grpc_clients::python_run_function(&target, &i, SAMPLE.as_bytes()))
                    .await
                    .unwrap_or_else(|e| panic!("grpcio RunFunction, {what}: {e:#}"));
            assert!(outcome.is("OK"), "grpcio RunFunction, {what}: {outcome:?}");
            assert_same_yaml(&outcome.output, SAMPLE);
            let (target, i) = (listener.target(), image.clone());
            let evaluated = blocking(move || {
                grpc_clients::python_evaluate(&target, &i, RESOURCE_LIST.as_bytes())
            })
            .await
            .unwrap_or_else(|e| panic!("grpcio EvaluateFunction, {what}: {e:#}"));
            assert_eq!(
                evaluated.code, "OK",
                "grpcio EvaluateFunction, {what}: {evaluated:?}"
            );
            assert_same_yaml(&evaluated.resource_list, RESOURCE_LIST);
            let target = listener.target();
            let reflected = blocking(move || {
                grpc_clients::python_reflection(&target, "evaluator.FunctionEvaluator")
            })
            .await
            .unwrap_or_else(|e| panic!("grpcio reflection, {what}: {e:#}"));
            assert!(
                reflected
                    .services
                    .iter()
                    .any(|s| s == "evaluator.FunctionEvaluator"),
                "grpcio reflection, {what}: {reflected:?}"
            );

            // grpc-java.
            let (target, i) = (listener.target(), image.clone());
            let outcome =
                blocking(move || grpc_clients::java_run_function(&target, &i, SAMPLE.as_bytes()))
                    .await
                    .unwrap_or_else(|e| panic!("grpc-java RunFunction, {what}: {e:#}"));
            assert!(
                outcome.is("OK"),
                "grpc-java RunFunction, {what}: {outcome:?}"
            );
            assert_same_yaml(&outcome.output, SAMPLE);
            let (target, i) = (listener.target(), image.clone());
            let evaluated = blocking(move || {
                grpc_clients::java_evaluate(&target, &i, RESOURCE_LIST.as_bytes())
            })
            .await
            .unwrap_or_else(|e| panic!("grpc-java EvaluateFunction, {what}: {e:#}"));
            assert_eq!(
                evaluated.code, "OK",
                "grpc-java EvaluateFunction, {what}: {evaluated:?}"
            );
            assert_same_yaml(&evaluated.resource_list, RESOURCE_LIST);
            let target = listener.target();
            let reflected = blocking(move || {
                grpc_clients::java_reflection(
                    &target,
                    "apiextensions.fn.proto.v1alpha1.ContainerizedFunctionRunnerService",
                )
            })
            .await
            .unwrap_or_else(|e| panic!("grpc-java reflection, {what}: {e:#}"));
            assert!(
                reflected
                    .services
                    .iter()
                    .any(|s| s == "evaluator.FunctionEvaluator"),
                "grpc-java reflection, {what}: {reflected:?}"
            );
            assert_eq!(
                reflected.file.1, "apiextensions.fn.proto.v1alpha1",
                "grpc-java reflection, {what}: {reflected:?}"
            );
            assert!(
                reflected.methods.iter().any(|(service, methods)| service
                    == "ContainerizedFunctionRunnerService"
                    && methods.iter().any(|m| m == "RunFunction")),
                "grpc-java reflection, {what}: {reflected:?}"
            );

            // tonic.
            let mut runner = client::Client::new(listener.tonic().await);
            let output = client::run_function(&mut runner, Run::new(&image, SAMPLE).build())
                .await
                .unwrap_or_else(|s| panic!("tonic RunFunction, {what}: {s:?}"));
            assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
            let evaluated = FunctionEvaluatorClient::new(listener.tonic().await)
                .evaluate_function(EvaluateFunctionRequest {
                    resource_list: RESOURCE_LIST.as_bytes().to_vec(),
                    image: image.clone(),
                    tag: String::new(),
                })
                .await
                .unwrap_or_else(|s| panic!("tonic EvaluateFunction, {what}: {s:?}"))
                .into_inner();
            assert_same_yaml(
                &String::from_utf8_lossy(&evaluated.resource_list),
                RESOURCE_LIST,
            );
        }
    }
}

/// The label the Go function sets on every desired composed resource.
fn touched(response: &serde_json::Value) -> Option<&str> {
    response["desired"]["resources"]["instance"]["resource"]["metadata"]["labels"]
        ["fnrun.dev/touched"]
        .as_str()
}

/// A v1 request whose desired state holds one composed resource,
/// `instance`.
fn v1_request() -> V1Request {
    let resource = serde_json::json!({
        "apiVersion": "example.org/v1",
        "kind": "Instance",
        "metadata": {"name": "instance"},
    });
    V1Request {
        meta: Some(fnrun_api::v1::RequestMeta {
            tag: "tonic".into(),
            capabilities: Vec::new(),
        }),
        desired: Some(fnrun_api::v1::State {
            composite: None,
            resources: [(
                "instance".to_owned(),
                fnrun_api::v1::Resource {
                    resource: Some(to_struct(&resource)),
                    ..Default::default()
                },
            )]
            .into(),
        }),
        ..Default::default()
    }
}

fn to_struct(value: &serde_json::Value) -> prost_types::Struct {
    match to_value(value).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => prost_types::Struct::default(),
    }
}

fn to_value(value: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A protobuf `Struct` read back as JSON.
struct Struct(prost_types::Struct);

impl From<Struct> for serde_json::Value {
    fn from(s: Struct) -> Self {
        fn value(v: prost_types::Value) -> serde_json::Value {
            use prost_types::value::Kind;
            match v.kind {
                Some(Kind::BoolValue(b)) => b.into(),
                Some(Kind::NumberValue(n)) => n.into(),
                Some(Kind::StringValue(s)) => s.into(),
                Some(Kind::ListValue(l)) => l.values.into_iter().map(value).collect(),
                Some(Kind::StructValue(s)) => Struct(s).into(),
                Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
            }
        }
        s.0.fields.into_iter().map(|(k, v)| (k, value(v))).collect()
    }
}

/// `bench/run.sh`'s grpc-go load client (the `runfunction` client's load
/// mode): calls on one connection, several at a time, each answered and
/// timed; calls that fail are counted as failed, with the first error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_gos_load_client_counts_answers_and_failures() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let (_daemon, listeners) = daemon(&None);
    let dial = listeners[0].go_dial();
    let (d, i) = (dial.clone(), image.clone());
    let load = blocking(move || grpc_clients::go_run_load(&d, &i, SAMPLE.as_bytes(), (40, 4, 2)))
        .await
        .unwrap_or_else(|e| panic!("grpc-go load: {e:#}"));
    assert_eq!(
        (load.calls, load.concurrency, load.errors),
        (40, 4, 0),
        "{load:?}"
    );
    assert!(load.p50_ms > 0.0 && load.p99_ms >= load.p50_ms, "{load:?}");
    assert!(load.runs_per_s > 0.0, "{load:?}");

    let missing = registry.reference("fns/missing:v1");
    let load =
        blocking(move || grpc_clients::go_run_load(&dial, &missing, SAMPLE.as_bytes(), (6, 2, 0)))
            .await
            .unwrap_or_else(|e| panic!("grpc-go load: {e:#}"));
    assert_eq!((load.calls, load.errors), (6, 6), "{load:?}");
    assert!(load.first_error.contains("NotFound"), "{load:?}");
    assert_eq!(load.runs_per_s, 0.0, "{load:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go_grpcio_grpc_java_and_tonic_call_a_hosted_function_over_h2c_and_mtls() {
    if !require_root("grpc_go_grpcio_grpc_java_and_tonic_call_a_hosted_function_over_h2c_and_mtls")
    {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .and_then(|i| i.build())
        .expect("the function image builds");
    // The rootless daemon reads the layout too.
    image
        .share()
        .expect("the image is readable by the test user");
    let request: serde_json::Value =
        serde_norway::from_str(SAMPLE_REQUEST).expect("the sample request is YAML");
    let authority = format!("fn-a.{NAMESPACE}:9443");
    let server_name = format!("fn-a.{NAMESPACE}");
    for user in root_and_rootless(
        "grpc_go_grpcio_grpc_java_and_tonic_call_a_hosted_function_over_h2c_and_mtls",
    ) {
        for tls in [HostTls::Insecure, HostTls::Mint] {
            let what = format!("{tls:?} ({user:?})");
            let host = FunctionHost::start(
                HostOpts::insecure(vec![Entry::new("fn-a", &image.oci_ref())])
                    .tls(tls)
                    .user(user.clone()),
            )
            .expect("the host starts");

            // grpc-go, as Crossplane calls.
            let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
            assert!(outcome.is_ok(), "grpc-go, {what}: {outcome:?}");
            assert_eq!(outcome.version, "v1", "grpc-go, {what}: {outcome:?}");

            // grpcio.
            let files = host.client_cert();
            let (addr, a, n, r) = (
                host.addr().to_owned(),
                authority.clone(),
                server_name.clone(),
                request.clone(),
            );
            let secure = tls != HostTls::Insecure;
            let called = blocking(move || {
                let tls = secure.then_some((&files, n.as_str()));
                grpc_clients::python_crossplane_call(&addr, &a, tls, &r)
            })
            .await
            .unwrap_or_else(|e| panic!("grpcio, {what}: {e:#}"));
            assert_eq!(called.code, "OK", "grpcio, {what}: {called:?}");
            let response = called.response.as_ref().expect("a response");
            assert_eq!(
                touched(response),
                Some("true"),
                "grpcio, {what}: {response}"
            );

            // grpc-java.
            let files = host.client_cert();
            let (addr, a, n, r) = (
                host.addr().to_owned(),
                authority.clone(),
                server_name.clone(),
                request.clone(),
            );
            let called = blocking(move || {
                let tls = secure.then_some((&files, n.as_str()));
                grpc_clients::java_crossplane_call(&addr, &a, tls, &r)
            })
            .await
            .unwrap_or_else(|e| panic!("grpc-java, {what}: {e:#}"));
            assert_eq!(called.code, "OK", "grpc-java, {what}: {called:?}");
            let response = called.response.as_ref().expect("a response");
            assert_eq!(
                touched(response),
                Some("true"),
                "grpc-java, {what}: {response}"
            );

            // tonic.
            let mut endpoint = Endpoint::from_shared(format!("http://{}", host.addr()))
                .expect("a URI")
                .origin(format!("http://{authority}").parse().expect("a URI"));
            if secure {
                let files = host.client_cert();
                let read = |p: &std::path::Path| std::fs::read(p).expect("a PEM file");
                let _ = rustls::crypto::ring::default_provider().install_default();
                endpoint = Endpoint::from_shared(format!("https://{}", host.addr()))
                    .expect("a URI")
                    .origin(format!("https://{authority}").parse().expect("a URI"))
                    .tls_config(
                        ClientTlsConfig::new()
                            .ca_certificate(Certificate::from_pem(read(&files.ca)))
                            .identity(Identity::from_pem(read(&files.cert), read(&files.key)))
                            .domain_name(&server_name),
                    )
                    .expect("a TLS config");
            }
            let channel = endpoint.connect().await.expect("tonic connects");
            let request = v1_request();
            let response = FunctionRunnerServiceClient::new(channel)
                .run_function(request)
                .await
                .unwrap_or_else(|s| panic!("tonic, {what}: {s:?}"))
                .into_inner();
            let labels = response
                .desired
                .and_then(|d| d.resources.get("instance").cloned())
                .and_then(|r| r.resource)
                .map(|r| serde_json::Value::from(Struct(r)))
                .unwrap_or_default();
            assert_eq!(
                labels["metadata"]["labels"]["fnrun.dev/touched"], "true",
                "tonic, {what}: {labels}"
            );
        }
    }
}
