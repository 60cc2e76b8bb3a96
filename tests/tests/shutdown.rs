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
