//! What the functions listener serves besides RunFunction: health (the
//! listener, each function by name, both FunctionRunnerServices) and server
//! reflection in v1 and v1alpha; the caller's deadline honoured end to end;
//! a unix socket as the listener, whatever `:authority` its clients send.

use std::time::{Duration, Instant};

use fnrun_tests::client::{HEALTH_SERVING, health};
use fnrun_tests::crossplane::{Call, GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::reflection;
use fnrun_tests::user::require_root;

const SERVICE_NAME: &str = "apiextensions.fn.proto.v1.FunctionRunnerService";

#[tokio::test(flavor = "multi_thread")]
async fn health_and_reflection_on_the_functions_listener() {
    if !require_root("health_and_reflection_on_the_functions_listener") {
        return;
    }
    let host = tokio::task::spawn_blocking(|| {
        let image = GoFunction::new(Variant::Label)
            .image()
            .unwrap()
            .build()
            .unwrap();
        let host = FunctionHost::start(HostOpts::insecure(vec![
            Entry::new("fn-a", &image.oci_ref()),
            Entry::new("fn-b", &image.oci_ref()),
        ]))
        .unwrap();
        (host, image)
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", host.0.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    for service in [
        "",
        "fn-a",
        "fn-b",
        SERVICE_NAME,
        "apiextensions.fn.proto.v1beta1.FunctionRunnerService",
    ] {
        assert_eq!(
            health(channel.clone(), service).await.unwrap(),
            HEALTH_SERVING,
            "{service:?}"
        );
    }
    let unknown = health(channel.clone(), "fn-c").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    // Health answers without starting any function.
    assert!(host.0.server_pids("fn-a").is_empty());
    let wanted = [
        SERVICE_NAME,
        "apiextensions.fn.proto.v1beta1.FunctionRunnerService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    for (mut names, _) in [
        reflection::v1(channel.clone(), &[]).await,
        reflection::v1alpha(channel, &[]).await,
    ] {
        names.sort();
        assert_eq!(names, wanted);
    }
    tokio::task::spawn_blocking(move || drop(host))
        .await
        .unwrap();
}

#[test]
fn the_callers_deadline_is_honoured_end_to_end() {
    if !require_root("the_callers_deadline_is_honoured_end_to_end") {
        return;
    }
    let slow = GoFunction::new(Variant::Label)
        .delay(Duration::from_secs(5))
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-slow", &slow.oci_ref()).set("timeout", "60s"),
    ]))
    .unwrap();
    // Warm: the deadline is the call's alone.
    let warm = host
        .call("fn-slow")
        .request(SAMPLE_REQUEST)
        .timeout(Duration::from_secs(20))
        .run()
        .unwrap();
    assert!(warm.is_ok(), "{warm:?}");
    let started = Instant::now();
    let outcome = host
        .call("fn-slow")
        .request(SAMPLE_REQUEST)
        .timeout(Duration::from_millis(700))
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::DeadlineExceeded, "{outcome:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // The function saw the deadline too: it gave up its call (grpc-go ends
    // the handler's context), and the instance serves the next call.
    let outcome = host
        .call("fn-slow")
        .request(SAMPLE_REQUEST)
        .timeout(Duration::from_secs(20))
        .run()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(host.server_pids("fn-slow").len(), 1);
    // Without a deadline of its own, a call gets the function's `timeout`.
    host.reload(&[
        Entry::new("fn-slow", &slow.oci_ref()).set("timeout", "60s"),
        Entry::new("fn-short", &slow.oci_ref()).set("timeout", "1s"),
    ])
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    let status = runtime.block_on(async {
        use fnrun_api::v1::function_runner_service_client::FunctionRunnerServiceClient;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", host.addr()))
            .unwrap()
            .origin("http://fn-short:9443".parse().unwrap())
            .connect()
            .await
            .unwrap();
        FunctionRunnerServiceClient::new(channel)
            .run_function(fnrun_api::v1::RunFunctionRequest::default())
            .await
            .unwrap_err()
    });
    // fnrun sends the deadline on, so whichever of fnrun and the function
    // sees it pass first answers.
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("fn-short") || status.message() == "context deadline exceeded",
        "{status:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_unix_socket_listener_routes_by_authority() {
    if !require_root("a_unix_socket_listener_routes_by_authority") {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("functions.sock");
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--function")
            .arg(format!("fn-a={}", image.oci_ref()))
            .arg("--functions-listen")
            .arg(format!("unix:{}", socket.display())),
    )
    .unwrap();
    assert!(
        fnrun_tests::wait_for(Duration::from_secs(10), || socket.exists().then_some(())).is_some(),
        "{}",
        daemon.log()
    );
    let target = format!("unix://{}", socket.display());
    let outcome = Call::insecure(&target)
        .authority("fn-a.crossplane-system")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}\n{}", daemon.log());
    // grpc-go's own authority for a unix target ("localhost"): no function.
    let outcome = Call::insecure(&target)
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
    assert!(outcome.message.contains("functions: fn-a"), "{outcome:?}");
}
