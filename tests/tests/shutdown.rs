//! SIGTERM/SIGINT: stop accepting, let in-flight runs finish, exit 0.

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

#[tokio::test]
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
