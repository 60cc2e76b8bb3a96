//! `--pull-timeout`: a pull from a registry too slow to finish within it
//! fails, naming the image and the deadline, on the CLI (exit 1) and over
//! gRPC (UNAVAILABLE), and leaves the cache able to pull the image from a
//! registry that answers. The slow registry is the real one behind a
//! loopback proxy that trickles its answers.

use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::{Registry, TrickleProxy};
use tonic::Code;

/// 4 KiB every 100 ms: busybox's layer takes half a minute.
fn slow(registry: &Registry) -> TrickleProxy {
    TrickleProxy::start(registry.addr(), 4 << 10, Duration::from_millis(100))
        .expect("the proxy starts")
}

#[test]
fn a_pull_past_its_deadline_fails_naming_the_image_and_the_deadline() {
    let registry = Registry::start().expect("registry starts");
    TestImage::echo().push_to(&registry, "fns/echo:v1");
    let proxy = slow(&registry);
    let image = format!("{}/fns/echo:v1", proxy.addr());
    let cli = Cli::new().expect("cli");

    let out = cli.run(&["pull", "--pull-timeout", "2s", &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let stderr = out.stderr.trim();
    assert_eq!(stderr.lines().count(), 1, "{}", out.describe());
    for says in [
        image.as_str(),
        "did not finish within the pull timeout of 2s",
        "--pull-timeout",
    ] {
        assert!(stderr.contains(says), "{says}: {}", out.describe());
    }
    // At the deadline, not when the download would have ended.
    assert!(
        out.elapsed >= Duration::from_secs(2) && out.elapsed < Duration::from_secs(20),
        "{}",
        out.describe()
    );

    // The same cache pulls it from the registry itself.
    let direct = registry.reference("fns/echo:v1");
    let out = cli.run(&["pull", "--pull-timeout", "2m", &direct], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());

    // The help says it, with its default.
    let out = cli.run(&["pull", "--help"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let line = out
        .stdout
        .lines()
        .skip_while(|l| !l.contains("--pull-timeout"))
        .take_while(|l| !l.trim_start().starts_with('-') || l.contains("--pull-timeout"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains("[default: 5m]"), "{}", out.stdout);

    // A duration that is none is a usage error.
    let out = cli.run(&["pull", "--pull-timeout", "soon", &direct], None);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(out.stderr.contains("--pull-timeout"), "{}", out.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_pull_passes_its_deadline_is_unavailable() {
    let registry = Registry::start().expect("registry starts");
    TestImage::echo().push_to(&registry, "fns/echo:v1");
    let proxy = slow(&registry);
    let image = format!("{}/fns/echo:v1", proxy.addr());
    let daemon = Daemon::start(DaemonOpts::default().arg("--pull-timeout").arg("2s"))
        .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");

    let status = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect_err("the pull is too slow");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&image)
            && status
                .message()
                .contains("did not finish within the pull timeout of 2s"),
        "{status:?}"
    );

    // From the registry itself the same daemon pulls and runs it.
    let direct = registry.reference("fns/echo:v1");
    let output = client::run_function(&mut client, Run::new(&direct, SAMPLE).build())
        .await
        .expect("runs");
    assert_same_yaml(&String::from_utf8(output.output).unwrap(), SAMPLE);
}
