//! `serve --listen none`: the function host alone, without the runner's
//! (v1alpha1) listener, which otherwise takes Crossplane's default abstract
//! socket.

use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, HEALTH_SERVING};
use fnrun_tests::daemon::{DEFAULT_SOCKET, Daemon, DaemonOpts, Listen};
use fnrun_tests::registry::free_port;
use fnrun_tests::sockets::unix_socket_addresses;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_none_serves_only_the_functions() {
    let functions = format!("127.0.0.1:{}", free_port().unwrap());
    let daemon = Daemon::start(
        DaemonOpts::default()
            .listen(Listen::Off {
                ready: functions.clone(),
            })
            .arg("--function")
            .arg("fn-a=127.0.0.1:1/fns/a:v1")
            .arg("--functions-listen")
            .arg(&functions)
            .arg("--functions-insecure"),
    )
    .expect("fnrun serve --listen none starts");
    let channel = client::channel_tcp(&functions, None)
        .await
        .expect("connects");
    assert_eq!(
        client::health(channel, "fn-a")
            .await
            .expect("health answers"),
        HEALTH_SERVING
    );
    let sockets = unix_socket_addresses(daemon.pid().unwrap()).unwrap();
    assert!(
        !sockets.iter().any(|s| s.ends_with(DEFAULT_SOCKET)),
        "the runner's default socket is held: {sockets:?}"
    );
    assert!(
        daemon.log().contains("--listen none"),
        "the log says the runner's listener is off:\n{}",
        daemon.log()
    );
}

#[test]
fn listen_none_is_refused_with_other_addresses_or_nothing_to_serve() {
    let cli = Cli::new().unwrap();
    for (args, says) in [
        (
            &["serve", "--listen", "none", "--listen", "127.0.0.1:1"][..],
            "--listen none turns the runner's listener off: give it alone",
        ),
        (
            &["serve", "--listen", "none"][..],
            "--listen none leaves nothing to serve: give --functions FILE or --function NAME=IMAGE",
        ),
    ] {
        let out = cli.run(args, None);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.describe());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.describe());
    }
}
