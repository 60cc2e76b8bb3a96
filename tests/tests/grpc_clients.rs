//! The gRPC libraries of fnrun's callers reach the daemon on both kinds of
//! unix socket, whatever `:authority` they send: Python's grpcio (grpc-core
//! sends the socket's path, percent-encoded, or the abstract socket's name),
//! grpc-go (the library of Crossplane's composition controller: `localhost`
//! with its own unix support, the path or the whole target through a dialer of
//! its own), and tonic; with a root daemon and a rootless one. Also server
//! reflection v1alpha with grpcio-reflection.

use fnrun_api::v1alpha1::SERVICE_NAME;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts, Socket};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::grpc_clients::{self, GoDial, Outcome};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::unique_name;
use fnrun_tests::user::{TestUser, root_and_rootless};

/// A daemon listening on a unix path and on an abstract socket named like
/// Crossplane's default (`crossplane/fn/….sock`, with slashes); returns it and
/// the abstract name.
fn daemon(user: &Option<TestUser>) -> (Daemon, String) {
    let name = format!("crossplane/fn/{}.sock", unique_name("clients"));
    let mut opts = DaemonOpts::default()
        .arg("--listen")
        .arg(format!("unix-abstract:{name}"));
    if let Some(user) = user {
        opts = opts.user(user.clone());
    }
    (Daemon::start(opts).expect("fnrun serve starts"), name)
}

fn socket_path(daemon: &Daemon) -> std::path::PathBuf {
    match daemon.socket() {
        Socket::Path(path) => path.clone(),
        other => panic!("expected a unix path, not {other:?}"),
    }
}

/// Runs a blocking client call off the async runtime.
async fn blocking<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(call)
        .await
        .expect("the client call")
}

fn assert_echoed(outcome: &Outcome, what: &str) {
    assert!(outcome.is("OK"), "{what}: {outcome:?}");
    assert_same_yaml(&outcome.output, SAMPLE);
}

fn assert_refused_input(outcome: &Outcome, what: &str) {
    assert!(outcome.is("INVALID_ARGUMENT"), "{what}: {outcome:?}");
    assert!(
        outcome.message.starts_with("input is not a FunctionIO"),
        "{what}: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_on_a_unix_path_and_an_abstract_name() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless("python_grpcio_on_a_unix_path_and_an_abstract_name") {
        let (daemon, name) = daemon(&user);
        for target in [
            format!("unix:{}", socket_path(&daemon).display()),
            format!("unix-abstract:{name}"),
        ] {
            let what = format!("{target} ({user:?})");
            let (t, i) = (target.clone(), image.clone());
            let outcome =
                blocking(move || grpc_clients::python_run_function(&t, &i, SAMPLE.as_bytes()))
                    .await
                    .expect("the Python client runs");
            assert_echoed(&outcome, &what);
            let (t, i) = (target.clone(), image.clone());
            let outcome = blocking(move || grpc_clients::python_run_function(&t, &i, b"- a\n"))
                .await
                .expect("the Python client runs");
            assert_refused_input(&outcome, &what);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go_dialing_every_way_on_unix_sockets() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless("grpc_go_dialing_every_way_on_unix_sockets") {
        let (daemon, name) = daemon(&user);
        for dial in [
            GoDial::Unix(socket_path(&daemon)),
            GoDial::PathWithDialer(socket_path(&daemon)),
            GoDial::AbstractWithDialer(name.clone()),
        ] {
            let what = format!("{dial:?} ({user:?})");
            let (d, i) = (dial.clone(), image.clone());
            let outcome =
                blocking(move || grpc_clients::go_run_function(&d, &i, SAMPLE.as_bytes()))
                    .await
                    .expect("the Go client runs");
            assert_echoed(&outcome, &what);
            let (d, i) = (dial.clone(), image.clone());
            let outcome = blocking(move || grpc_clients::go_run_function(&d, &i, b"- a\n"))
                .await
                .expect("the Go client runs");
            assert_refused_input(&outcome, &what);
        }
    }
}

// Several threads: the client's connection must close while the test
// thread waits for the daemon to drain and stop.
#[tokio::test(flavor = "multi_thread")]
async fn tonic_on_a_unix_path_and_an_abstract_name() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless("tonic_on_a_unix_path_and_an_abstract_name") {
        let (daemon, name) = daemon(&user);
        for channel in [
            client::channel_unix(&socket_path(&daemon)).await,
            client::channel_abstract(&name).await,
        ] {
            let mut client = client::Client::new(channel.expect("connects"));
            let output = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
                .await
                .unwrap_or_else(|s| panic!("{user:?}: {s:?}"));
            assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_reflection_v1alpha_lists_the_services_and_gives_their_file() {
    let (daemon, name) = daemon(&None);
    for target in [
        format!("unix:{}", socket_path(&daemon).display()),
        format!("unix-abstract:{name}"),
    ] {
        let t = target.clone();
        let reflected = blocking(move || grpc_clients::python_reflection(&t, SERVICE_NAME))
            .await
            .unwrap_or_else(|e| panic!("{target}: {e:#}"));
        for service in [
            SERVICE_NAME,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflection",
        ] {
            assert!(
                reflected.services.iter().any(|s| s == service),
                "{target}: {reflected:?}"
            );
        }
        assert_eq!(
            reflected.file,
            (
                "apiextensions/fn/proto/v1alpha1/run_function.proto".to_owned(),
                "apiextensions.fn.proto.v1alpha1".to_owned()
            ),
            "{target}"
        );
        assert_eq!(
            reflected.methods,
            [(
                "ContainerizedFunctionRunnerService".to_owned(),
                vec!["RunFunction".to_owned()]
            )],
            "{target}"
        );
    }
}
