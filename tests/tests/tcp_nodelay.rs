//! Every TCP connection the daemon accepts has `TCP_NODELAY`: on `--listen`
//! (h2c and TLS) and on the functions listener. Without it the last small
//! writes of each answer wait for the client's delayed ACK, about 40 ms a
//! call. The option is read on the daemon's own accepted sockets
//! ([`fnrun_tests::sockets`]), so the test does not depend on timing.

use fnrun_tests::certs::Certs;
use fnrun_tests::client::{self, HEALTH_SERVING};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::registry::free_port;
use fnrun_tests::sockets::tcp_connections;

/// Calls `Health/Check` over TCP at `addr` and asserts that the daemon's
/// connections on that port, at least one, have `TCP_NODELAY`.
async fn assert_no_delay(daemon: &Daemon, addr: &str, tls: Option<(&std::path::Path, &str)>) {
    let channel = client::channel_tcp(addr, tls).await.expect("connects");
    assert_eq!(
        client::health(channel.clone(), "")
            .await
            .expect("health answers"),
        HEALTH_SERVING
    );
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let accepted: Vec<_> = tcp_connections(daemon.pid().expect("running"))
        .expect("the daemon's sockets")
        .into_iter()
        .filter(|c| c.local.port() == port)
        .collect();
    assert!(!accepted.is_empty(), "{addr}: no accepted connection found");
    for c in &accepted {
        assert!(c.nodelay, "{addr}: TCP_NODELAY not set on {c:?}");
    }
    drop(channel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_listeners_set_tcp_nodelay() {
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    let functions = format!("127.0.0.1:{}", free_port().unwrap());
    let mut daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--listen")
            .arg(&listen)
            .arg("--function")
            .arg("fn-a=127.0.0.1:1/fns/a:v1")
            .arg("--functions-listen")
            .arg(&functions)
            .arg("--functions-insecure"),
    )
    .expect("fnrun serve starts");
    daemon.wait_tcp(&listen).unwrap();
    daemon.wait_tcp(&functions).unwrap();
    assert_no_delay(&daemon, &listen, None).await;
    assert_no_delay(&daemon, &functions, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_sets_tcp_nodelay() {
    let certs = Certs::new().unwrap();
    let server = certs.server("daemon", &["localhost"]).unwrap();
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    let mut daemon = Daemon::start(DaemonOpts::default().tls_listen(&listen, &server))
        .expect("fnrun serve starts");
    daemon.wait_tcp(&listen).unwrap();
    assert_no_delay(&daemon, &listen, Some((&certs.ca_cert(), "localhost"))).await;
}
