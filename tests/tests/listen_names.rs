//! `fnrun serve --listen` takes what its help says: `HOST:PORT` with HOST a
//! name (resolved at start, every address of it listened on), `:PORT`
//! (every address) and a `tcp://` prefix, as well as an IP address.

use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::registry::free_port;

/// Whether this host has IPv6 loopback.
fn ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

#[test]
fn host_names_any_host_and_tcp_urls_are_listened_on() {
    let (named, any, url) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let mut daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--listen")
            .arg(format!("localhost:{named}"))
            .arg("--listen")
            .arg(format!(":{any}"))
            .arg("--listen")
            .arg(format!("tcp://127.0.0.1:{url}")),
    )
    .expect("fnrun serve starts");
    daemon
        .wait_tcp(&format!("127.0.0.1:{named}"))
        .expect("localhost: 127.0.0.1");
    if ipv6_loopback()
        && std::net::ToSocketAddrs::to_socket_addrs(&("localhost", named))
            .is_ok_and(|mut a| a.any(|a| a.is_ipv6()))
    {
        daemon
            .wait_tcp(&format!("[::1]:{named}"))
            .expect("localhost: ::1 too");
    }
    daemon
        .wait_tcp(&format!("127.0.0.1:{any}"))
        .expect(":PORT: every address");
    daemon
        .wait_tcp(&format!("127.0.0.1:{url}"))
        .expect("tcp://HOST:PORT");
    let log = daemon.log();
    assert!(log.contains(&format!("127.0.0.1:{named}")), "{log}");
}
