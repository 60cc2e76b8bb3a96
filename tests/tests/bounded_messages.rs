//! Every message that quotes what a caller sent or a function wrote (gRPC
//! status, CLI stderr, log line) is a few KiB, however large that was: a 12 MB
//! FunctionIO whose `config` is a string (the parser's error quotes the
//! value), a function whose output quotes a megabyte, a memory limit and an
//! image reference of megabytes; through tonic, the real Python grpcio client
//! (which refuses a status over its metadata limit) and the CLI, as root and
//! rootless.

use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::grpc_clients;
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::{Registry, free_port};
use fnrun_tests::user::{TestUser, root_and_rootless};
use tonic::Code;

/// What "a few KiB" is held to, for a status message or a CLI error line.
const FEW_KIB: usize = 4 << 10;
/// The longest log line allowed (a message plus the line's other fields).
const LOG_LINE_MAX: usize = 8 << 10;

/// A FunctionIO of 12 MB whose `config` is a string, not a mapping.
fn huge_invalid_input() -> Vec<u8> {
    format!("config: {}\n", "a".repeat(12 << 20)).into_bytes()
}

/// The message says what is wrong, quotes the value's head, and says how much
/// it left out.
fn assert_bounded_invalid_input(message: &str) {
    assert!(message.len() <= FEW_KIB, "{} bytes", message.len());
    assert!(
        message.starts_with("input is not a FunctionIO: invalid type: string \"aaa"),
        "{message}"
    );
    assert!(message.contains("bytes elided]"), "{message}");
    assert!(message.contains("expected a map"), "{message}");
}

fn daemon(user: &Option<TestUser>, opts: DaemonOpts) -> Daemon {
    let opts = match user {
        Some(user) => opts.user(user.clone()),
        None => opts,
    };
    Daemon::start(opts).expect("fnrun serve starts")
}

/// Every line of the daemon's log is at most [`LOG_LINE_MAX`]; the run's line
/// says what happened, bounded.
fn assert_log_bounded(daemon: &Daemon) {
    let log = daemon.log();
    for line in log.lines() {
        assert!(
            line.len() <= LOG_LINE_MAX,
            "a log line of {} bytes: {}…",
            line.len(),
            &line[..200]
        );
    }
    let run = log
        .lines()
        .find(|l| l.contains("function run") && l.contains("invalid_request"))
        .unwrap_or_else(|| panic!("no log line for the run:\n{log}"));
    assert!(run.contains("bytes elided]"), "{run}");
}

// Several threads: the client's connection must close while the test
// thread waits for the daemon to drain and stop.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_invalid_input_gets_a_bounded_status_through_tonic_and_log() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in
        root_and_rootless("a_huge_invalid_input_gets_a_bounded_status_through_tonic_and_log")
    {
        let daemon = daemon(&user, DaemonOpts::default());
        let mut client = daemon.client().await.expect("connects");
        let status =
            client::run_function(&mut client, Run::new(&image, huge_invalid_input()).build())
                .await
                .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{user:?}: {status:?}");
        assert_bounded_invalid_input(status.message());
        assert_log_bounded(&daemon);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_invalid_input_gets_a_bounded_status_through_python_grpcio() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in
        root_and_rootless("a_huge_invalid_input_gets_a_bounded_status_through_python_grpcio")
    {
        // grpc-core refuses a status over 16 KiB of metadata: it would report
        // RESOURCE_EXHAUSTED, never the real error. On TCP, and on the unix
        // socket (with the path as :authority).
        let tcp = format!("127.0.0.1:{}", free_port().expect("a free port"));
        let daemon = daemon(&user, DaemonOpts::default().arg("--listen").arg(&tcp));
        for target in [tcp.clone(), daemon.socket().listen_arg()] {
            let image = image.clone();
            let outcome = tokio::task::spawn_blocking(move || {
                grpc_clients::python_run_function(&target, &image, &huge_invalid_input())
            })
            .await
            .unwrap()
            .expect("the Python client runs");
            assert!(outcome.is("INVALID_ARGUMENT"), "{user:?}: {outcome:?}");
            assert_bounded_invalid_input(&outcome.message);
        }
        assert_log_bounded(&daemon);
    }
}

#[test]
fn a_huge_invalid_input_gets_a_bounded_error_line_on_the_cli() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless("a_huge_invalid_input_gets_a_bounded_error_line_on_the_cli") {
        let cli = match &user {
            Some(user) => Cli::as_user(user.clone()).expect("cli"),
            None => Cli::new().expect("cli"),
        };
        let out = cli.run(&["run", &image, "-"], Some(&huge_invalid_input()));
        assert_eq!(out.code, Some(2), "{user:?}: exit code {:?}", out.code);
        assert!(out.stdout.is_empty(), "{user:?}");
        assert_eq!(out.stderr.lines().count(), 1, "one line");
        let line = out.stderr.trim_end();
        let message = line.strip_prefix("fnrun: ").expect("the error line");
        assert_bounded_invalid_input(message);
    }
}

// Several threads: the client's connection must close while the test
// thread waits for the daemon to drain and stop.
#[tokio::test(flavor = "multi_thread")]
async fn output_that_quotes_a_megabyte_gets_a_bounded_status_and_error_line() {
    // The output's `config` is a 1 MB string: the output error quotes it.
    let script = r#"#!/bin/sh
cat >/dev/null
printf 'config: '
head -c 1048576 /dev/zero | tr '\0' b
echo
echo 'the function says why' >&2
"#;
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script(script).push_to(&registry, "fns/big-output:v1");
    let daemon = daemon(&None, DaemonOpts::default());
    let mut client = daemon.client().await.expect("connects");
    let status = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let message = status.message();
    assert!(message.len() <= FEW_KIB, "{} bytes", message.len());
    assert!(
        message.starts_with("function output is not a FunctionIO: invalid type: string \"bbb"),
        "{message}"
    );
    assert!(message.contains("bytes elided]"), "{message}");
    assert!(
        message.ends_with("stderr: the function says why"),
        "{message}"
    );
    for line in daemon.log().lines() {
        assert!(
            line.len() <= LOG_LINE_MAX,
            "a log line of {} bytes",
            line.len()
        );
    }

    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.len() <= FEW_KIB + 64,
        "{} bytes",
        out.stderr.len()
    );
    assert!(out.stderr.contains("bytes elided]"), "{}", out.stderr);
}

// Several threads: the client's connection must close while the test thread
// waits for the daemon to drain and stop.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_quantity_or_image_reference_gets_a_bounded_status_and_log() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = daemon(&None, DaemonOpts::default());
    let mut client = daemon.client().await.expect("connects");
    let huge_image = format!("example.org/{}:v1", "a".repeat(4 << 20));
    for (request, says) in [
        (
            Run::new(&image, SAMPLE).memory(&format!("{}Gb", "1".repeat(12 << 20))),
            "is not a valid quantity",
        ),
        (
            Run::new(&image, SAMPLE).cpu(&"x".repeat(12 << 20)),
            "is not a valid quantity",
        ),
        (Run::new(&huge_image, SAMPLE), "example.org/aaa"),
    ] {
        let status = client::run_function(&mut client, request.build())
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let message = status.message();
        assert!(message.len() <= FEW_KIB, "{} bytes", message.len());
        assert!(message.contains(says), "{message}");
    }
    for line in daemon.log().lines() {
        assert!(
            line.len() <= LOG_LINE_MAX,
            "a log line of {} bytes: {}…",
            line.len(),
            &line[..200]
        );
    }
}

#[test]
fn a_huge_argument_gets_a_bounded_error_on_the_cli() {
    // One argument may be 128 KiB long (MAX_ARG_STRLEN).
    let cli = Cli::new().expect("cli");
    let memory = format!("{}Gb", "1".repeat(100_000));
    let image = format!("example.org/{}:v1", "a".repeat(100_000));
    for args in [
        vec!["run", "--memory", memory.as_str(), "example.org/fn:v1", "-"],
        vec!["run", image.as_str(), "-"],
    ] {
        let out = cli.run(&args, Some(SAMPLE.as_bytes()));
        assert_eq!(out.code, Some(2), "exit code {:?}", out.code);
        assert!(
            out.stderr.len() <= FEW_KIB + 64,
            "{} bytes",
            out.stderr.len()
        );
    }
}
