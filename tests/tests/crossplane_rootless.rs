//! The function host run by an unprivileged user (rootless), as root's:
//! mTLS with minted certificates, routing, a server's network namespace
//! reached without setns, scale to zero, a crash and its restart, and a
//! clean stop.

use std::time::Duration;

use fnrun_tests::crossplane::{GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, alive};
use fnrun_tests::user::rootless_user;

const SPARE_MADE: &str = "function server's sandbox made ahead";

#[test]
fn a_rootless_daemon_hosts_functions() {
    let Some(user) = rootless_user("a_rootless_daemon_hosts_functions") else {
        return;
    };
    let label = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    label.share().unwrap();
    let crashing = GoFunction::new(Variant::ExitOnSecondCall)
        .image()
        .unwrap()
        .build()
        .unwrap();
    crashing.share().unwrap();
    let mut host = FunctionHost::start(
        HostOpts::insecure(vec![
            Entry::new("fn-a", &label.oci_ref()).set("idleTimeout", "1s"),
            Entry::new("fn-crash", &crashing.oci_ref()),
        ])
        .tls(HostTls::Mint)
        .user(Some(user.clone())),
    )
    .unwrap();
    let daemon_pid = host.daemon().pid().unwrap();
    let uid = std::fs::read_to_string(format!("/proc/{daemon_pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    assert_eq!(uid, user.uid.to_string(), "the daemon is not root");

    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}\n{}", host.log());
    let first = host.server_pids("fn-a")[0];
    host.wait_log("function server stopped", 1, Duration::from_secs(10))
        .unwrap();
    assert!(!alive(first));
    // A rootless daemon makes the next server's sandbox ahead too, and the
    // next call starts it there.
    host.spare_inits(SPARE_MADE, 1, Duration::from_secs(10));
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(host.server_pids("fn-a").len(), 2);
    let log = host.log();
    let second = log
        .lines()
        .filter(|l| l.contains("function server ready"))
        .nth(1)
        .unwrap();
    assert!(second.contains("from_spare=true"), "{log}");

    assert!(
        host.call("fn-crash")
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap()
            .is_ok()
    );
    let outcome = host.call("fn-crash").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(
        outcome.message.contains("exited with code 3"),
        "{outcome:?}"
    );
    assert!(
        host.call("fn-crash")
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap()
            .is_ok()
    );

    let mut pids: Vec<i32> = ["fn-a", "fn-crash"]
        .iter()
        .filter_map(|n| host.server_pids(n).last().copied())
        .collect();
    // fn-a is idle again by now: its spare, too, goes with the daemon.
    pids.extend(host.spare_inits(SPARE_MADE, 2, Duration::from_secs(10)));
    let status = host.daemon_mut().stop().expect("the daemon exits");
    assert!(status.success(), "{status:?}");
    for pid in pids {
        assert!(!alive(pid), "server or spare {pid} outlived the daemon");
    }
}
