//! Resource limits from the request: memory and cpu quantities.

use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_function_runs_within_limits() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    for (memory, cpu) in [("64Mi", "500m"), ("1G", "2"), ("134217728", "0.5")] {
        let output = client::run_function(
            &mut client,
            Run::new(&image, SAMPLE).memory(memory).cpu(cpu).build(),
        )
        .await
        .unwrap_or_else(|s| panic!("memory {memory} cpu {cpu}: {s:?}"));
        assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_the_memory_limit_is_resource_exhausted() {
    let registry = Registry::start().expect("registry starts");
    // The shell keeps 200 MB of command output in memory.
    let image = TestImage::script(
        "#!/bin/sh\ncat >/dev/null\nx=$(head -c 200000000 /dev/zero | tr '\\0' a)\necho ${#x} >&2\nexit 0\n",
    )
    .push_to(&registry, "fns/hungry:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let status = client::run_function(
        &mut client,
        Run::new(&image, SAMPLE)
            .memory("32Mi")
            .timeout(Duration::from_secs(60))
            .build(),
    )
    .await
    .expect_err("killed");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // In the units the limit was given in, not 33554432 bytes.
    assert!(
        status
            .message()
            .starts_with("function exceeded its memory limit of 32Mi and was killed"),
        "{status:?}"
    );
}

#[test]
fn cli_memory_and_cpu_flags() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "--memory", "64Mi", "--cpu", "500m", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
    let out = cli.run(
        &["run", "--memory", "lots", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "bad quantity: {}", out.describe());
}
