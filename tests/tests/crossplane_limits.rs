//! A function server's sandbox: its memory, cpu and pids limits are the
//! function's, a server killed by its memory limit fails the call with
//! RESOURCE_EXHAUSTED, and an Isolated server has no network (only its own
//! loopback) while a Runner one shares the daemon's.

use std::path::PathBuf;
use std::time::Duration;

use fnrun_tests::crossplane::{GoFunction, Outcome, SAMPLE_REQUEST, Variant};
use fnrun_tests::fixtures::PongServer;
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::user::require_root;
use serde_json::json;

/// The cgroup v1 directory of `pid` in `controller`'s hierarchy.
fn cgroup_dir(pid: i32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| PathBuf::from(format!("/sys/fs/cgroup/{controllers}{path}")))
    })
}

fn read(dir: &std::path::Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_owned()
}

#[test]
fn a_server_runs_under_its_functions_limits() {
    if !require_root("a_server_runs_under_its_functions_limits") {
        return;
    }
    let image = GoFunction::new(Variant::Label)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-a", &image.oci_ref()).set(
            "resources",
            json!({"memory": "96Mi", "cpu": "500m", "pids": 64}),
        ),
    ]))
    .unwrap();
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let pid = host.server_pids("fn-a")[0];
    let Some(memory) = cgroup_dir(pid, "memory") else {
        eprintln!("SKIPPED: not a cgroup v1 host");
        return;
    };
    assert_eq!(
        read(&memory, "memory.limit_in_bytes"),
        (96u64 << 20).to_string()
    );
    let cpu = cgroup_dir(pid, "cpu").expect("a cpu cgroup");
    let quota: u64 = read(&cpu, "cpu.cfs_quota_us").parse().unwrap();
    let period: u64 = read(&cpu, "cpu.cfs_period_us").parse().unwrap();
    assert_eq!(quota * 1000 / period, 500, "quota {quota} period {period}");
    let pids = cgroup_dir(pid, "pids").expect("a pids cgroup");
    assert_eq!(read(&pids, "pids.max"), "64");
}

#[test]
fn a_server_killed_by_its_memory_limit_fails_the_call_with_resource_exhausted() {
    if !require_root("a_server_killed_by_its_memory_limit_fails_the_call_with_resource_exhausted") {
        return;
    }
    let image = GoFunction::new(Variant::MemoryHog)
        .hog_max_mib(1024)
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-hog", &image.oci_ref()).set("resources", json!({"memory": "64Mi"})),
    ]))
    .unwrap();
    let outcome = host.call("fn-hog").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::ResourceExhausted, "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("function fn-hog's server exceeded its memory limit of 64Mi and was killed"),
        "{outcome:?}"
    );
    // Started again on the next call, and killed again.
    let outcome = host.call("fn-hog").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::ResourceExhausted, "{outcome:?}");
    assert_eq!(host.server_pids("fn-hog").len(), 2, "{}", host.log());
}

/// The probe's findings: target -> (ok, detail).
fn probed(outcome: &Outcome) -> Vec<(String, bool, String)> {
    assert!(outcome.is_ok(), "{outcome:?}");
    outcome.response()["context"]["fnrun.dev/network-probe"]
        .as_object()
        .expect("the probe's context")
        .iter()
        .map(|(target, r)| {
            (
                target.clone(),
                r["ok"].as_bool().expect("ok"),
                r["detail"].as_str().expect("detail").to_owned(),
            )
        })
        .collect()
}

#[test]
fn an_isolated_server_has_no_network_and_a_runner_one_has_the_daemons() {
    if !require_root("an_isolated_server_has_no_network_and_a_runner_one_has_the_daemons") {
        return;
    }
    let pong = PongServer::start();
    let image = GoFunction::new(Variant::NetworkProbe)
        .probe_loopback(pong.port())
        .probe_timeout(Duration::from_secs(2))
        .image()
        .unwrap()
        .build()
        .unwrap();
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-isolated", &image.oci_ref()),
        Entry::new("fn-runner", &image.oci_ref()).set("network", "Runner"),
    ]))
    .unwrap();

    let outcome = host
        .call("fn-isolated")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    let found = probed(&outcome);
    assert_eq!(found.len(), 5, "{found:?}");
    for (target, ok, detail) in &found {
        assert!(!ok, "{target} reached from an isolated server: {detail}");
        if target.contains("203.0.113.1") || target.contains("1.1.1.1") {
            assert!(
                detail.contains("network is unreachable"),
                "{target}: {detail}"
            );
        }
    }
    // Its 127.0.0.1 is its own: the daemon's loopback server heard nothing.
    assert!(!pong.answered());

    let outcome = host
        .call("fn-runner")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    let found = probed(&outcome);
    let loopback = format!("tcp 127.0.0.1:{}", pong.port());
    assert!(
        found
            .iter()
            .any(|(t, ok, d)| *t == loopback && *ok && d == "reply pong"),
        "{found:?}"
    );
    assert!(pong.answered());
}
