//! The RunFunction gRPC API of `fnrun serve`, as Crossplane's composition
//! controller calls it: transports, health, and the status code table.

use std::time::{Duration, Instant};

use fnrun_api::v1alpha1::{ImagePullPolicy, SERVICE_NAME};
use fnrun_tests::client::{self, HEALTH_SERVING, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts, Listen};
use fnrun_tests::fixtures::{self, FAIL_SCRIPT, HELLO_SCRIPT, NOT_FUNCTIONIO};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use tonic::Code;

fn registry() -> Registry {
    Registry::start().expect("registry starts")
}

fn daemon(listen: Listen) -> Daemon {
    Daemon::start(DaemonOpts::default().listen(listen)).expect("fnrun serve starts")
}

async fn run(daemon: &Daemon, request: Run) -> Result<String, tonic::Status> {
    let mut client = daemon.client().await.expect("connects");
    client::run_function(&mut client, request.build())
        .await
        .map(|r| String::from_utf8(r.output).expect("output is UTF-8"))
}

async fn expect_code(daemon: &Daemon, request: Run, code: Code) -> tonic::Status {
    match run(daemon, request).await {
        Ok(output) => panic!("expected {code:?}, got output:\n{output}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{status:?}");
            assert!(
                !status.message().is_empty(),
                "the message says what happened"
            );
            status
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_function_over_a_unix_path() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::UnixPath);
    let output = run(&daemon, Run::new(&image, SAMPLE)).await.expect("runs");
    assert_same_yaml(&output, SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_function_over_an_abstract_socket() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::crossplane_style());
    let output = run(&daemon, Run::new(&image, SAMPLE)).await.expect("runs");
    assert_same_yaml(&output, SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_address_is_crossplanes() {
    // Only this test listens on the real default address.
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::Default);
    let output = run(&daemon, Run::new(&image, SAMPLE)).await.expect("runs");
    assert_same_yaml(&output, SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_service_reports_serving() {
    let daemon = daemon(Listen::UnixPath);
    let channel = daemon.channel().await.expect("connects");
    assert_eq!(
        client::health(channel.clone(), "").await.expect("health"),
        HEALTH_SERVING
    );
    assert_eq!(
        client::health(channel, SERVICE_NAME)
            .await
            .expect("service health"),
        HEALTH_SERVING
    );
    // Its log is a file: plain text, no terminal colours.
    let log = daemon.log();
    assert!(log.contains(" INFO ") && log.contains("listening"), "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_all_succeed() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::UnixPath);
    let client = daemon.client().await.expect("connects");
    let calls = (0..16).map(|i| {
        let mut client = client.clone();
        let input = format!("desired:\n  composite:\n    resource:\n      call: {i}\n");
        let image = image.clone();
        async move {
            let output = client::run_function(&mut client, Run::new(&image, input.clone()).build())
                .await
                .unwrap_or_else(|s| panic!("call {i}: {s:?}"));
            assert_same_yaml(&String::from_utf8_lossy(&output.output), &input);
        }
    });
    futures_join_all(calls).await;
}

/// Joins futures without pulling in the futures crate.
async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    for handle in handles {
        handle.await.expect("call task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_image_or_tag_is_not_found() {
    let registry = registry();
    TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::UnixPath);
    for image in [
        registry.reference("fns/missing:v1"),
        registry.reference("fns/echo:no-such-tag"),
    ] {
        let status = expect_code(&daemon, Run::new(&image, SAMPLE), Code::NotFound).await;
        assert!(
            status.message().contains("not found"),
            "{image}: {status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_argument() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::UnixPath);
    for input in NOT_FUNCTIONIO {
        expect_code(&daemon, Run::new(&image, *input), Code::InvalidArgument).await;
    }
    for request in [
        Run::new(&image, SAMPLE).memory("lots"),
        Run::new(&image, SAMPLE).memory("-1Gi"),
        Run::new(&image, SAMPLE).cpu("fast"),
        Run::new("", SAMPLE),
        Run::new("Not A/Valid::Reference", SAMPLE),
        Run::new(&image, SAMPLE).raw_timeout(-5, 0),
    ] {
        expect_code(&daemon, request, Code::InvalidArgument).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policy_never_without_a_cached_image_is_failed_precondition() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(Listen::UnixPath);
    expect_code(
        &daemon,
        Run::new(&image, SAMPLE).pull_policy(ImagePullPolicy::Never),
        Code::FailedPrecondition,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_is_deadline_exceeded_and_kills_the_function() {
    let registry = registry();
    let image = fixtures::sleeper(31).push_to(&registry, "fns/sleep:v1");
    let daemon = daemon(Listen::UnixPath);
    // Warm the cache so the timed call measures the run, not the pull.
    expect_code(
        &daemon,
        Run::new(&image, SAMPLE).timeout(Duration::from_millis(100)),
        Code::DeadlineExceeded,
    )
    .await;
    let start = Instant::now();
    expect_code(
        &daemon,
        Run::new(&image, SAMPLE).timeout(Duration::from_secs(1)),
        Code::DeadlineExceeded,
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    let left = fixtures::leftover_processes(&["sleep", "31"], Duration::from_secs(5));
    fixtures::kill_pids(&left);
    assert!(
        left.is_empty(),
        "the timed-out function is still running: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_zero_exit_is_aborted_with_exit_code_and_stderr() {
    let registry = registry();
    let image = TestImage::script(FAIL_SCRIPT).push_to(&registry, "fns/fail:v1");
    let daemon = daemon(Listen::UnixPath);
    let status = expect_code(&daemon, Run::new(&image, SAMPLE), Code::Aborted).await;
    assert!(status.message().contains('3'), "exit code: {status:?}");
    assert!(status.message().contains("boom"), "stderr tail: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_that_is_not_functionio_is_aborted() {
    let registry = registry();
    let image = TestImage::script(HELLO_SCRIPT).push_to(&registry, "fns/hello:v1");
    let daemon = daemon(Listen::UnixPath);
    expect_code(&daemon, Run::new(&image, SAMPLE), Code::Aborted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_survives_errors_and_keeps_serving() {
    let registry = registry();
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let fail = TestImage::script(FAIL_SCRIPT).push_to(&registry, "fns/fail:v1");
    let daemon = daemon(Listen::UnixPath);
    expect_code(&daemon, Run::new(&fail, SAMPLE), Code::Aborted).await;
    expect_code(&daemon, Run::new(&echo, "- x\n"), Code::InvalidArgument).await;
    let output = run(&daemon, Run::new(&echo, SAMPLE))
        .await
        .expect("still runs");
    assert_same_yaml(&output, SAMPLE);
}
