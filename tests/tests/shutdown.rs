//! SIGTERM/SIGINT: health NOT_SERVING while new calls are still served for
//! the shutdown delay, then stop accepting, let in-flight runs finish, exit 0.

use std::time::Duration;

use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts, SHUTDOWN_GRACE};
use fnrun_tests::functionio::{SAMPLE, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use nix::sys::signal::Signal;

#[test]
fn idle_daemon_exits_0_on_sigterm_and_sigint() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let mut daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
        daemon.signal(signal);
        let status = daemon
            .wait_exit(SHUTDOWN_GRACE)
            .unwrap_or_else(|| panic!("still running {SHUTDOWN_GRACE:?} after {signal}"));
        assert!(status.success(), "{signal}: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_run_finishes_during_shutdown() {
    let registry = Registry::start().expect("registry starts");
    let image =
        TestImage::script(&report_script("sleep 2", "finished")).push_to(&registry, "fns/slow:v1");
    let mut daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    // Pull first, so that the call below is running the function when the
    // signal arrives.
    client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("first run");
    let call = {
        let mut client = client.clone();
        let image = image.clone();
        tokio::spawn(async move {
            client::run_function(&mut client, Run::new(&image, SAMPLE).build()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    daemon.signal(Signal::SIGTERM);
    let output = call
        .await
        .expect("task")
        .expect("the in-flight run completes");
    assert_eq!(
        last_message(&String::from_utf8_lossy(&output.output)),
        "finished"
    );
    let status = daemon
        .wait_exit(SHUTDOWN_GRACE)
        .expect("the daemon exits after the run");
    assert!(status.success(), "{status}");
    assert!(daemon.socket().probe().is_err(), "no longer accepting");
}

#[test]
fn a_signal_as_soon_as_the_socket_exists_stops_the_daemon_gracefully() {
    use std::os::unix::process::CommandExt;
    use std::time::Instant;

    // As in a non-interactive shell's background job, the daemon starts with
    // SIGINT ignored; the handler it installs must already be there when its
    // socket appears.
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fnrun.sock");
        let mut cmd = std::process::Command::new(fnrun_tests::fnrun_bin());
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--shutdown-delay=0s")
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .env("RUST_LOG", "off")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        fnrun_tests::process::die_with_parent(&mut cmd);
        // SAFETY: signal(2) with SIG_IGN in the child before exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigIgn)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("fnrun serve starts");
        let start = Instant::now();
        while !socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "round {round}: no socket"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        fnrun_tests::process::signal(&child, Signal::SIGINT);
        let status = fnrun_tests::process::wait_timeout(&mut child, SHUTDOWN_GRACE);
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let status = status.unwrap_or_else(|| panic!("round {round}: SIGINT was lost"));
        assert!(status.success(), "round {round}: {status}");
    }
}

/// On SIGTERM, health turns NOT_SERVING on every listener while new calls,
/// on new connections and on open ones, are still served for
/// `--shutdown-delay`; a client that keeps calling until it has seen
/// NOT_SERVING for a while (as a Kubernetes endpoint that is removed a
/// moment later) has no call fail. Then the listeners close and the daemon
/// exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_keep_being_served_during_the_shutdown_delay() {
    use std::time::Instant;

    use fnrun_tests::client::{HEALTH_NOT_SERVING, HEALTH_SERVING};
    use fnrun_tests::registry::free_port;

    const DELAY: Duration = Duration::from_secs(6);
    /// How long the client keeps sending after it saw NOT_SERVING.
    const KEEP_CALLING: Duration = Duration::from_secs(2);

    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let tcp = format!("127.0.0.1:{}", free_port().unwrap());
    let functions = format!("127.0.0.1:{}", free_port().unwrap());
    let mut daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--listen")
            .arg(&tcp)
            .arg("--shutdown-delay")
            .arg(format!("{}s", DELAY.as_secs()))
            .arg("--function")
            .arg(format!("fn-a={image}"))
            .arg("--functions-listen")
            .arg(&functions)
            .arg("--functions-insecure"),
    )
    .expect("fnrun serve starts");
    daemon.wait_tcp(&tcp).unwrap();
    daemon.wait_tcp(&functions).unwrap();
    let mut open = daemon.client().await.expect("connects");
    client::run_function(&mut open, Run::new(&image, SAMPLE).build())
        .await
        .expect("first run (pulls)");
    let health = async |addr: Option<&str>| {
        let channel = match addr {
            Some(addr) => client::channel_tcp(addr, None).await,
            None => daemon.channel().await,
        };
        client::health(channel.expect("connects"), "")
            .await
            .expect("health answers")
    };
    for addr in [None, Some(tcp.as_str()), Some(functions.as_str())] {
        assert_eq!(health(addr).await, HEALTH_SERVING, "{addr:?}");
    }

    daemon.signal(Signal::SIGTERM);
    let signalled = Instant::now();
    let mut not_serving_since = None;
    let mut calls = 0;
    while not_serving_since.is_none_or(|t: Instant| t.elapsed() < KEEP_CALLING) {
        assert!(
            signalled.elapsed() < DELAY,
            "health did not report NOT_SERVING within the delay"
        );
        // A new connection on each listener, and the open one.
        let mut fresh = daemon.client().await.expect("new connections are accepted");
        client::run_function(&mut fresh, Run::new(&image, SAMPLE).build())
            .await
            .expect("a call on a new connection is served during the delay");
        let mut over_tcp = client::Client::new(
            client::channel_tcp(&tcp, None)
                .await
                .expect("new TCP connections are accepted"),
        );
        client::run_function(&mut over_tcp, Run::new(&image, SAMPLE).build())
            .await
            .expect("a call over TCP is served during the delay");
        client::run_function(&mut open, Run::new(&image, SAMPLE).build())
            .await
            .expect("a call on the open connection is served during the delay");
        calls += 3;
        if not_serving_since.is_none() {
            let statuses = [
                health(None).await,
                health(Some(&tcp)).await,
                health(Some(&functions)).await,
            ];
            if statuses.iter().all(|s| *s == HEALTH_NOT_SERVING) {
                not_serving_since = Some(Instant::now());
            }
        }
    }
    assert!(calls >= 6, "only {calls} calls during the delay");
    let status = daemon
        .wait_exit(DELAY + SHUTDOWN_GRACE)
        .expect("the daemon exits after the delay");
    assert!(status.success(), "{status}");
    assert!(
        signalled.elapsed() >= DELAY,
        "exited {:?} after SIGTERM, before the delay of {DELAY:?}",
        signalled.elapsed()
    );
    assert!(daemon.socket().probe().is_err(), "no longer accepting");
    let log = daemon.log();
    assert!(log.contains("health reports NOT_SERVING"), "{log}");
    assert!(log.contains("closing the listeners"), "{log}");
}

#[test]
fn a_second_signal_stops_at_once_during_the_delay() {
    let mut daemon = Daemon::start(DaemonOpts::default().arg("--shutdown-delay=10m"))
        .expect("fnrun serve starts");
    daemon.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(daemon.try_wait().is_none(), "exited before the delay");
    // The first signal says what a second one does.
    assert!(
        daemon
            .log()
            .contains("a second SIGINT or SIGTERM stops at once"),
        "{}",
        daemon.log()
    );
    daemon.signal(Signal::SIGINT);
    let status = daemon
        .wait_exit(SHUTDOWN_GRACE)
        .expect("the second signal stops the daemon");
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(daemon.socket().probe().is_err(), "no longer accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_kills_the_runs_in_flight_at_once() {
    let registry = Registry::start().expect("registry starts");
    let image = fnrun_tests::fixtures::sleeper(4391).push_to(&registry, "fns/sleep:v1");
    let mut daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--shutdown-delay=0s")
            .arg("--shutdown-grace=10m"),
    )
    .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let call = tokio::spawn(async move {
        client::run_function(
            &mut client,
            Run::new(&image, SAMPLE)
                .timeout(Duration::from_secs(600))
                .build(),
        )
        .await
    });
    let running = fnrun_tests::wait_for(Duration::from_secs(120), || {
        let pids = fnrun_tests::fixtures::processes_with_argv(&["/bin/sleep", "4391"]);
        (!pids.is_empty()).then_some(pids)
    })
    .expect("the function runs");
    daemon.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(daemon.try_wait().is_none(), "exited with a run in flight");
    daemon.signal(Signal::SIGTERM);
    let status = daemon
        .wait_exit(Duration::from_secs(10))
        .expect("the second signal stops the daemon at once");
    assert_eq!(status.code(), Some(143), "{status}");
    let left =
        fnrun_tests::fixtures::leftover_processes(&["/bin/sleep", "4391"], Duration::from_secs(2));
    fnrun_tests::fixtures::kill_pids(&left);
    assert!(
        left.is_empty(),
        "the run was left: {left:?} (was {running:?})"
    );
    assert!(call.await.expect("task").is_err(), "the call failed");
}
