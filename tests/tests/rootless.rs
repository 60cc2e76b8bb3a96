//! Rootless mode: the daemon and the CLI as an unprivileged user (the
//! `fnrun-test` system user), with the user's own id mapped to root in the
//! function's user namespace.
//!
//! These tests need root to create and switch to that user; they are skipped
//! (with a message) when not run as root or when the kernel forbids
//! unprivileged user namespaces.

use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts, Listen};
use fnrun_tests::fixtures::FAIL_SCRIPT;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{TestUser, rootless_user};
use tonic::Code;

/// The test user, or None (after saying why) if the test must be skipped.
fn test_user(test: &str) -> Option<TestUser> {
    rootless_user(test)
}

fn rootless_daemon(user: TestUser, listen: Listen) -> Daemon {
    let daemon = Daemon::start(DaemonOpts::default().user(user.clone()).listen(listen))
        .expect("rootless fnrun serve starts");
    let pid = daemon.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|id| id == user.uid.to_string()),
        "the daemon runs as {}: {uid_line}",
        user.uid
    );
    daemon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootless_daemon_runs_a_function() {
    let Some(user) = test_user("rootless_daemon_runs_a_function") else {
        return;
    };
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = rootless_daemon(user, Listen::UnixPath);
    let mut client = daemon.client().await.expect("connects");
    let output = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs");
    assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootless_daemon_on_an_abstract_socket_reports_function_failure() {
    let Some(user) = test_user("rootless_daemon_on_an_abstract_socket_reports_function_failure")
    else {
        return;
    };
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script(FAIL_SCRIPT).push_to(&registry, "fns/fail:v1");
    let daemon = rootless_daemon(user, Listen::crossplane_style());
    let mut client = daemon.client().await.expect("connects");
    let status = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect_err("the function fails");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("boom"), "{status:?}");
    let status = client::run_function(
        &mut client,
        Run::new(&registry.reference("fns/missing:v1"), SAMPLE).build(),
    )
    .await
    .expect_err("missing image");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootless_maps_the_runners_own_id_to_root() {
    let Some(user) = test_user("rootless_maps_the_runners_own_id_to_root") else {
        return;
    };
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script(&report_script(
        "map=$(cat /proc/self/uid_map | xargs)",
        "uid=$(id -u) map=$map",
    ))
    .push_to(&registry, "fns/idmap:v1");
    let daemon = rootless_daemon(user.clone(), Listen::UnixPath);
    let mut client = daemon.client().await.expect("connects");
    let output = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs");
    let message = last_message(&String::from_utf8_lossy(&output.output));
    assert_eq!(message, format!("uid=0 map=0 {} 1", user.uid));
}

#[test]
fn rootless_cli_runs_a_function() {
    let Some(user) = test_user("rootless_cli_runs_a_function") else {
        return;
    };
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::as_user(user).expect("cli");
    let input = cli.write_file("input.yaml", SAMPLE).expect("input");
    let out = cli.run(&["run", &image, &input], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}
