//! Image pull policies and the cache: IF_NOT_PRESENT (the default) runs a
//! cached image without the registry, ALWAYS resolves the tag again, NEVER
//! runs only cached images.

use fnrun_api::v1alpha1::ImagePullPolicy;
use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use tonic::Code;

async fn run(daemon: &Daemon, request: Run) -> Result<String, tonic::Status> {
    let mut client = daemon.client().await.expect("connects");
    client::run_function(&mut client, request.build())
        .await
        .map(|r| String::from_utf8(r.output).expect("output is UTF-8"))
}

fn daemon() -> Daemon {
    Daemon::start(DaemonOpts::default()).expect("fnrun serve starts")
}

fn says(word: &str) -> TestImage {
    TestImage::script(&report_script("", word))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_not_present_runs_the_cached_image_without_the_registry() {
    let mut registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon();
    run(&daemon, Run::new(&image, SAMPLE))
        .await
        .expect("first run pulls");
    registry.stop();
    for request in [
        Run::new(&image, SAMPLE),
        Run::new(&image, SAMPLE).pull_policy(ImagePullPolicy::IfNotPresent),
        Run::new(&image, SAMPLE).pull_policy(ImagePullPolicy::Never),
    ] {
        let output = run(&daemon, request).await.expect("runs from the cache");
        assert_same_yaml(&output, SAMPLE);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_needs_the_registry() {
    let mut registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon();
    let request = || Run::new(&image, SAMPLE).pull_policy(ImagePullPolicy::Always);
    run(&daemon, request()).await.expect("runs");
    registry.stop();
    let status = run(&daemon, request()).await.expect_err("registry is down");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_sees_a_new_push_and_if_not_present_keeps_the_cached_one() {
    let registry = Registry::start().expect("registry starts");
    let image = says("one").push_to(&registry, "fns/word:v1");
    let daemon = daemon();
    let word = |policy| {
        let request = Run::new(&image, SAMPLE).pull_policy(policy);
        let daemon = &daemon;
        async move { last_message(&run(daemon, request).await.expect("runs")) }
    };
    assert_eq!(word(ImagePullPolicy::IfNotPresent).await, "one");
    says("two").push_to(&registry, "fns/word:v1");
    assert_eq!(word(ImagePullPolicy::IfNotPresent).await, "one", "cached");
    assert_eq!(word(ImagePullPolicy::Always).await, "two", "resolved again");
    assert_eq!(
        word(ImagePullPolicy::IfNotPresent).await,
        "two",
        "the tag now means two"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_references_run_and_are_cached() {
    let mut registry = Registry::start().expect("registry starts");
    TestImage::echo().push_to(&registry, "fns/echo:v1");
    let digest = registry.digest("fns/echo:v1").expect("digest");
    let by_digest = registry.reference(&format!("fns/echo@{digest}"));
    let daemon = daemon();
    assert_same_yaml(
        &run(&daemon, Run::new(&by_digest, SAMPLE))
            .await
            .expect("runs"),
        SAMPLE,
    );
    registry.stop();
    assert_same_yaml(
        &run(&daemon, Run::new(&by_digest, SAMPLE))
            .await
            .expect("runs from the cache"),
        SAMPLE,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_without_a_cached_image_is_failed_precondition() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon();
    let status = run(
        &daemon,
        Run::new(&image, SAMPLE).pull_policy(ImagePullPolicy::Never),
    )
    .await
    .expect_err("not cached");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
}

#[test]
fn cli_pull_then_run_never_without_the_registry() {
    let mut registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "--image-pull-policy", "Never", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(1), "not cached yet: {}", out.describe());
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    registry.stop();
    let out = cli.run(
        &["run", "--image-pull-policy", "Never", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
    let out = cli.run(
        &["run", "--image-pull-policy", "IfNotPresent", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let out = cli.run(
        &["run", "--image-pull-policy", "Always", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(1), "registry is down: {}", out.describe());
}
