//! Daemon operations: admission, reflection (v1 and v1alpha), allowed
//! registries, metrics that move with the runs, and build info.

use std::time::{Duration, Instant};

use fnrun_api::v1alpha1::SERVICE_NAME;
use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::process::spawners_of;
use fnrun_tests::reflection;
use fnrun_tests::registry::{Registry, free_port, http_get};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_beyond_concurrency_and_queue_is_refused_at_once() {
    let registry = Registry::start().expect("registry starts");
    let image =
        TestImage::script(&report_script("sleep 3", "slow")).push_to(&registry, "fns/slow:v1");
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--max-concurrency")
            .arg("1")
            .arg("--max-queue")
            .arg("0"),
    )
    .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    // Warm the cache so the first call below is running, not pulling.
    let warm = Run::new(&image, SAMPLE)
        .timeout(Duration::from_secs(20))
        .build();
    client::run_function(&mut client, warm)
        .await
        .expect("warm run");

    let first = {
        let mut client = client.clone();
        let image = image.clone();
        tokio::spawn(async move {
            client::run_function(&mut client, Run::new(&image, SAMPLE).build()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let err = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect_err("the second call is refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("at capacity"), "{}", err.message());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // Decoding a document is admitted like the run it is for (#18): an input
    // that is no FunctionIO is refused for capacity, not decoded, while the
    // runner is full (it would be INVALID_ARGUMENT once decoded).
    let not_functionio = Run::new(&image, b"apiVersion: [unclosed\n").build();
    let err = client::run_function(&mut client, not_functionio.clone())
        .await
        .expect_err("the third call is refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    first
        .await
        .unwrap()
        .expect("the first call still completes");
    let err = client::run_function(&mut client, not_functionio)
        .await
        .expect_err("an input that is no FunctionIO is refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

// Several threads: the client's connection must close while the test
// thread waits for the daemon to drain and stop.
#[tokio::test(flavor = "multi_thread")]
async fn reflection_v1_and_v1alpha_list_the_services_and_give_their_files() {
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let v1 = reflection::v1(daemon.channel().await.expect("connects"), &[SERVICE_NAME]).await;
    let v1alpha =
        reflection::v1alpha(daemon.channel().await.expect("connects"), &[SERVICE_NAME]).await;
    for (version, (names, files)) in [("v1", v1), ("v1alpha", v1alpha)] {
        for service in [
            SERVICE_NAME,
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(names.iter().any(|n| n == service), "{version}: {names:?}");
        }
        let file = files
            .iter()
            .find(|f| f.package() == "apiextensions.fn.proto.v1alpha1")
            .unwrap_or_else(|| panic!("{version}: no v1alpha1 file in {files:?}"));
        assert_eq!(
            file.service[0].name(),
            "ContainerizedFunctionRunnerService",
            "{version}"
        );
        assert_eq!(file.service[0].method[0].name(), "RunFunction", "{version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_from_other_registries_are_permission_denied() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--allowed-registry")
            .arg("registry.example.org"),
    )
    .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let err = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains(&registry.addr().to_string()),
        "{}",
        err.message()
    );
}

fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_runs_pulls_and_failures() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let daemon = Daemon::start(DaemonOpts::default().arg("--metrics-listen").arg(&addr))
        .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let scrape = || http_get(&addr, "/metrics").expect("GET /metrics").1;
    let before = scrape();

    client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("first run pulls");
    client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("second run is a cache hit");
    let missing = format!("{}/fns/missing:v1", registry.addr());
    client::run_function(&mut client, Run::new(&missing, SAMPLE).build())
        .await
        .expect_err("not found");
    let after = scrape();

    for (series, delta) in [
        ("fnrun_runs_total{outcome=\"ok\"}", 2.0),
        ("fnrun_runs_total{outcome=\"image_error\"}", 1.0),
        ("fnrun_run_duration_seconds_count", 3.0),
        ("fnrun_pulls_total{result=\"ok\"}", 1.0),
        ("fnrun_pulls_total{result=\"error\"}", 1.0),
        ("fnrun_pull_duration_seconds_count", 1.0),
        ("fnrun_cache_hits_total", 1.0),
        ("fnrun_cache_misses_total", 2.0),
    ] {
        assert_eq!(
            sample(&after, series) - sample(&before, series),
            delta,
            "{series}"
        );
    }
    assert!(sample(&after, "fnrun_cache_bytes") > sample(&before, "fnrun_cache_bytes"));
    assert_eq!(sample(&after, "fnrun_runs_in_flight"), 0.0);
    assert_eq!(sample(&after, "fnrun_queue_depth"), 0.0);
}

/// The soft and hard limits on open descriptors of process `pid`.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut values = line["Max open files".len()..].split_whitespace();
    (
        values.next().unwrap().to_owned(),
        values.next().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_raises_its_open_files_limit_to_the_hard_limit() {
    let registry = Registry::start().expect("registry starts");
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = Daemon::start(DaemonOpts::default().open_files(256)).expect("fnrun serve starts");
    let pid = daemon.pid().expect("running");
    let (soft, hard) = open_files_limits(pid);
    assert_eq!(soft, hard, "a daemon started with a soft limit of 256");
    assert_ne!(soft, "256");
    let mut client = daemon.client().await.expect("connects");
    let out = client::run_function(&mut client, Run::new(&echo, SAMPLE).build())
        .await
        .expect("runs");
    assert!(!out.output.is_empty());
}

#[test]
fn version_has_build_info() {
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["--version"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.starts_with("fnrun 0."), "{}", out.stdout);
    assert!(out.stdout.contains("rustc"), "{}", out.stdout);
}

/// Waits (up to a minute) until a host process runs `sleep <seconds>`.
async fn sleeper_started(seconds: u32) {
    let arg = seconds.to_string();
    let start = Instant::now();
    while fnrun_tests::fixtures::processes_with_argv(&["sleep", &arg]).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the function never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to `limit` for no host process to run `sleep <seconds>`.
fn sleepers_gone(seconds: u32, limit: Duration) -> bool {
    let arg = seconds.to_string();
    let start = Instant::now();
    while start.elapsed() < limit {
        if fnrun_tests::fixtures::processes_with_argv(&["sleep", &arg]).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_has_its_run_killed() {
    let seconds = 4000 + std::process::id() % 500;
    let registry = Registry::start().expect("registry starts");
    let image = fnrun_tests::fixtures::sleeper(seconds).push_to(&registry, "fns/sleeper:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let call = {
        let mut client = daemon.client().await.expect("connects");
        let image = image.clone();
        tokio::spawn(async move {
            let req = Run::new(&image, SAMPLE)
                .timeout(Duration::from_secs(600))
                .build();
            client::run_function(&mut client, req).await
        })
    };
    // Wait until the function runs, then drop the call and its connection.
    sleeper_started(seconds).await;
    call.abort();
    let _ = call.await;
    assert!(
        sleepers_gone(seconds, Duration::from_secs(10)),
        "the run outlived its client"
    );
    // The daemon still serves.
    let mut client = daemon.client().await.expect("connects");
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    client::run_function(&mut client, Run::new(&echo, SAMPLE).build())
        .await
        .expect("still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_honours_the_client_deadline() {
    let seconds = 4500 + std::process::id() % 500;
    let registry = Registry::start().expect("registry starts");
    let image = fnrun_tests::fixtures::sleeper(seconds).push_to(&registry, "fns/sleeper:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--max-concurrency")
            .arg("1")
            .arg("--max-queue")
            .arg("4")
            .arg("--metrics-listen")
            .arg(&addr),
    )
    .expect("fnrun serve starts");
    let scrape = || http_get(&addr, "/metrics").expect("GET /metrics").1;
    let client = daemon.client().await.expect("connects");
    // Occupy the only slot.
    let busy = {
        let mut client = client.clone();
        let image = image.clone();
        tokio::spawn(async move {
            let req = Run::new(&image, SAMPLE)
                .timeout(Duration::from_secs(8))
                .build();
            client::run_function(&mut client, req).await
        })
    };
    sleeper_started(seconds).await;
    // A second call waits in the queue with a 1 s gRPC deadline; its client
    // keeps no timer, so the answer is the daemon's.
    let mut req = tonic::Request::new(Run::new(&image, SAMPLE).build());
    req.set_timeout(Duration::from_secs(1));
    let start = Instant::now();
    let mut untimed = daemon.client_without_timer().await.expect("connects");
    let err = untimed
        .run_function(req)
        .await
        .expect_err("deadline passes");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(err.message(), "the call's deadline of 1s passed", "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let mut dequeued = false;
    for _ in 0..20 {
        let body = scrape();
        if sample(&body, "fnrun_queue_depth") == 0.0 {
            assert_eq!(sample(&body, "fnrun_runs_in_flight"), 1.0, "{body}");
            dequeued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dequeued, "the server kept the expired call queued");
    // The first run ends at its own 8 s timeout (no gRPC deadline).
    let err = busy.await.unwrap().expect_err("the first run times out");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(
        err.message()
            .starts_with("function ran past its timeout of 8s"),
        "{err:?}"
    );
    assert!(
        sleepers_gone(seconds, Duration::from_secs(10)),
        "a run was left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inits_come_from_an_execed_spawner_which_is_replaced_when_killed() {
    let registry = Registry::start().expect("registry starts");
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let pid = daemon.pid().expect("running");
    let mut client = daemon.client().await.expect("connects");
    client::run_function(&mut client, Run::new(&echo, SAMPLE).build())
        .await
        .expect("runs");
    let spawners = spawners_of(pid);
    assert_eq!(spawners.len(), 1, "{spawners:?}");
    let first = spawners[0];
    // A fresh image of the fnrun binary, not a fork of the daemon.
    let cmdline = std::fs::read(format!("/proc/{first}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    assert_eq!(
        args,
        [
            &b"fnrun-spawner"[..],
            b"__fnrun-spawner",
            pid.to_string().as_bytes()
        ]
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{first}/exe")).unwrap(),
        std::fs::read_link(format!("/proc/{pid}/exe")).unwrap()
    );

    // Killed, it is replaced at the next run, which works.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first).expect("pids fit in i32")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let start = Instant::now();
    while spawners_of(pid).contains(&first) {
        assert!(start.elapsed() < Duration::from_secs(10), "not reaped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client::run_function(&mut client, Run::new(&echo, SAMPLE).build())
        .await
        .expect("runs after the spawner died");
    // That run may have taken a sandbox the pool made before the kill; the
    // next sandbox made, the pool's refill or that run's own, starts the
    // new spawner.
    let start = Instant::now();
    let spawners = loop {
        let spawners = spawners_of(pid);
        if !spawners.is_empty() || start.elapsed() > Duration::from_secs(10) {
            break spawners;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(spawners.len(), 1, "{spawners:?}");
    assert_ne!(spawners[0], first);
}

/// The daemon's children but its spawner: the inits of its sandboxes (a
/// pooled sandbox's init waits for its call as the daemon's child).
fn sandbox_inits_of(daemon_pid: u32) -> Vec<u32> {
    let mut inits = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{daemon_pid}/task"))
        .expect("the daemon's tasks")
        .flatten()
    {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        inits.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
                .filter(|&c| !fnrun_tests::process::is_spawner(c, daemon_pid)),
        );
    }
    inits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_pool_serves_calls_in_fresh_sandboxes_and_empties_when_idle() {
    let registry = Registry::start().expect("registry starts");
    // Fails if anything an earlier call wrote is there.
    let script = "if [ -e /tmp/seen ] || [ -e /seen ]; then \
                  echo an earlier call wrote here >&2; exit 3; fi; \
                  echo x > /tmp/seen; echo x > /seen; exec cat";
    let image = TestImage::script(script).push_to(&registry, "fns/pooled:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--sandbox-pool=8"),
    )
    .expect("fnrun serve starts");
    let pid = daemon.pid().expect("the daemon's pid");
    let scrape = || http_get(&addr, "/metrics").expect("GET /metrics").1;
    // Idle, never called: nothing made ahead.
    let idle = scrape();
    assert_eq!(sample(&idle, "fnrun_sandbox_pool_sandboxes"), 0.0);
    assert_eq!(sandbox_inits_of(pid), Vec::<u32>::new());

    let mut client = daemon.client().await.expect("connects");
    for _ in 0..6 {
        let out = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
            .await
            .expect("each call runs in a sandbox of its own");
        assert_eq!(String::from_utf8_lossy(&out.output), SAMPLE);
        // Time for the pool to make the next one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let busy = scrape();
    let pooled = sample(&busy, "fnrun_sandbox_pool_sandboxes");
    assert!(pooled >= 1.0, "{busy}");
    assert!(
        sample(&busy, "fnrun_sandbox_pool_hits_total") >= 4.0,
        "{busy}"
    );
    assert!(
        sample(&busy, "fnrun_sandbox_pool_misses_total") >= 1.0,
        "{busy}"
    );
    // Each pooled sandbox is one init, waiting; nothing else runs.
    assert_eq!(sandbox_inits_of(pid).len() as f64, pooled, "{busy}");
    // What they hold is measured, and small: under 16 MiB each.
    let bytes = sample(&busy, "fnrun_sandbox_pool_memory_bytes");
    assert!(
        bytes > 0.0 && bytes / pooled < f64::from(16 << 20),
        "{busy}"
    );

    // Not called for 10 s: the pool ends its sandboxes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = scrape();
        if sample(&body, "fnrun_sandbox_pool_sandboxes") == 0.0
            && sample(&body, "fnrun_sandbox_pool_memory_bytes") == 0.0
            && sandbox_inits_of(pid).is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool kept its sandboxes: {:?}\n{body}",
            sandbox_inits_of(pid)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A call after that makes its own and runs as before.
    let out = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs after the pool emptied");
    assert_eq!(String::from_utf8_lossy(&out.output), SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_pools_memory_budget_holds() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script("exec cat").push_to(&registry, "fns/budget:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    // A budget smaller than any sandbox: none is made ahead, and every call
    // makes its own, as without a pool.
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--sandbox-pool=8")
            .arg("--sandbox-pool-memory=64Ki"),
    )
    .expect("fnrun serve starts");
    let pid = daemon.pid().expect("the daemon's pid");
    let mut client = daemon.client().await.expect("connects");
    for _ in 0..4 {
        let out = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
            .await
            .expect("each call runs");
        assert_eq!(String::from_utf8_lossy(&out.output), SAMPLE);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let body = http_get(&addr, "/metrics").expect("GET /metrics").1;
    assert_eq!(sample(&body, "fnrun_sandbox_pool_sandboxes"), 0.0, "{body}");
    assert_eq!(
        sample(&body, "fnrun_sandbox_pool_memory_bytes"),
        0.0,
        "{body}"
    );
    assert_eq!(
        sample(&body, "fnrun_sandbox_pool_hits_total"),
        0.0,
        "{body}"
    );
    assert_eq!(
        sample(&body, "fnrun_sandbox_pool_misses_total"),
        4.0,
        "{body}"
    );
    assert_eq!(sandbox_inits_of(pid), Vec::<u32>::new());
}

/// Polls the daemon's metrics until `ready(body)`, for at most `within`.
async fn metrics_until(addr: &str, within: Duration, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let body = http_get(addr, "/metrics").expect("GET /metrics").1;
        if ready(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "not within {within:?}:\n{body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetched_images_calls_find_a_sandbox_ready_however_rare() {
    let registry = Registry::start().expect("registry starts");
    let kept = TestImage::script("exec cat").push_to(&registry, "fns/kept:v1");
    let other = TestImage::script("cat").push_to(&registry, "fns/other:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--metrics-listen")
            .arg(&addr)
            .arg("--sandbox-pool=8")
            .arg("--prefetch")
            .arg(&kept),
    )
    .expect("fnrun serve starts");
    let pid = daemon.pid().expect("the daemon's pid");
    fnrun_tests::wait_for(Duration::from_secs(30), || {
        daemon.log().contains("prefetched the image").then_some(())
    })
    .unwrap_or_else(|| panic!("no prefetch in the log:\n{}", daemon.log()));
    let mut client = daemon.client().await.expect("connects");
    let mut call = async |image: &str| {
        let out = client::run_function(&mut client, Run::new(image, SAMPLE).build())
            .await
            .expect("the call runs");
        assert_eq!(String::from_utf8_lossy(&out.output), SAMPLE);
    };
    call(&kept).await;
    call(&other).await;

    // Neither is called for 10 s: the other image's sandboxes end, the
    // prefetched image's kind keeps one, which is one waiting init.
    let body = metrics_until(&addr, Duration::from_secs(30), |body| {
        sample(body, "fnrun_sandbox_pool_sandboxes") == 1.0 && sandbox_inits_of(pid).len() == 1
    })
    .await;
    assert!(
        sample(&body, "fnrun_sandbox_pool_memory_bytes") > 0.0,
        "{body}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sandbox_inits_of(pid).len(), 1, "the kept sandbox went");

    // The next call of it takes that one; the other image's makes its own.
    let hits = sample(&body, "fnrun_sandbox_pool_hits_total");
    let misses = sample(&body, "fnrun_sandbox_pool_misses_total");
    call(&kept).await;
    call(&other).await;
    let body = http_get(&addr, "/metrics").expect("GET /metrics").1;
    assert_eq!(
        sample(&body, "fnrun_sandbox_pool_hits_total"),
        hits + 1.0,
        "{body}"
    );
    assert_eq!(
        sample(&body, "fnrun_sandbox_pool_misses_total"),
        misses + 1.0,
        "{body}"
    );
}
