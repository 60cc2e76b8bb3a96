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

#[test]
fn cli_takes_podmans_memory_spellings_and_refuses_limits_no_process_starts_in() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    // podman's binary units; `1g` is a GiB.
    for memory in ["128m", "1g", "65536k"] {
        let out = cli.run(
            &["run", "--memory", memory, &image, "-"],
            Some(SAMPLE.as_bytes()),
        );
        assert_eq!(out.code, Some(0), "{memory}: {}", out.describe());
        assert_same_yaml(&out.stdout, SAMPLE);
    }
    // Below what a process starts in, or no cpu at all: usage errors (not
    // the cgroup's EBUSY), before any sandbox is made.
    for args in [
        &["--memory", "0"][..],
        &["--memory", "1"],
        &["--memory", "1Ki"],
        &["--memory", "100k"],
        &["--memory", "512b"],
        &["--cpu", "0"],
        &["--cpu", "-1"],
    ] {
        let out = cli.run(
            &[&["run"][..], args, &[&image, "-"]].concat(),
            Some(SAMPLE.as_bytes()),
        );
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.describe());
        let wanted = if args[0] == "--cpu" {
            "a cpu limit must be more than 0"
        } else {
            "below the smallest memory limit, 4Mi"
        };
        if args[1] != "-1" {
            assert!(out.stderr.contains(wanted), "{args:?}: {}", out.describe());
        }
        assert!(
            !out.stderr.contains("Device or resource busy"),
            "{}",
            out.describe()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_limits_no_process_starts_in_saying_what_was_meant() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    for (memory, cpu, wanted) in [
        // Kubernetes' meaning: 128 thousandths of a byte.
        ("128m", "", "did you mean 128Mi?"),
        ("0", "", "below the smallest memory limit, 4Mi"),
        ("1Ki", "", "below the smallest memory limit, 4Mi"),
        ("", "0", "a cpu limit must be more than 0"),
    ] {
        let mut run = Run::new(&image, SAMPLE);
        if !memory.is_empty() {
            run = run.memory(memory);
        }
        if !cpu.is_empty() {
            run = run.cpu(cpu);
        }
        let status = client::run_function(&mut client, run.build())
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(wanted), "{status:?}");
    }
}
