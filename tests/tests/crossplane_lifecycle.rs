//! The life of a function's instance: started on the first call, stopped
//! after `idleTimeout`, leaving a spare sandbox made ahead in which the next
//! call starts it again, and after the spare's own `idleTimeout` nothing at
//! all (no process, cgroup holding one, or mount); a crashed server started
//! again on the next call, then with a backoff; a server that never listens
//! failing the call with UNAVAILABLE and its output; every server stopped
//! with the daemon; a server's image kept in the cache while the server or
//! its spare holds it, and pruned to `--cache-max-size` once neither does.

use std::time::{Duration, Instant};

use fnrun_tests::crossplane::{GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{
    Entry, FunctionHost, HostOpts, alive, busy_cgroups, descendants_named, leftover_servers,
};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::registry::{free_port, http_get};
use fnrun_tests::user::require_root;

const SPARE_MADE: &str = "function server's sandbox made ahead";
const SPARE_ENDED: &str = "function server's sandbox ended unused";

fn image(variant: Variant) -> BuiltImage {
    GoFunction::new(variant)
        .image()
        .and_then(|i| i.build())
        .expect("the image builds")
}

fn mounts() -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(|l| l.split(' ').skip(3).take(2).collect::<Vec<_>>().join(" "))
        .collect();
    lines.sort();
    lines
}

fn metric(addr: &str, series: &str) -> f64 {
    let (status, body) = http_get(addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    body.lines()
        .find(|l| l.starts_with(&format!("{series} ")))
        .unwrap_or_else(|| panic!("{series} missing:\n{body}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The files under `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A server's image is held in the cache (`--cache-max-size 1`, smaller
/// than any image) while the server runs and while the spare made after it
/// waits; when the spare ends unused, the last hold lets go and the cache is
/// pruned.
#[test]
fn a_servers_image_is_pruned_once_its_spare_lets_go() {
    if !require_root("a_servers_image_is_pruned_once_its_spare_lets_go") {
        return;
    }
    let image = image(Variant::Label);
    let host = FunctionHost::start(
        HostOpts::insecure(vec![
            Entry::new("fn-a", &image.oci_ref()).set("idleTimeout", "1s"),
        ])
        .arg("--cache-max-size")
        .arg("1"),
    )
    .unwrap();
    let blobs = host.daemon().cache_dir().join("blobs/sha256");
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        !files(&blobs).is_empty(),
        "the running server's image is gone"
    );

    host.wait_log("function server stopped", 1, Duration::from_secs(10))
        .unwrap();
    host.spare_inits(SPARE_MADE, 1, Duration::from_secs(10));
    assert!(!files(&blobs).is_empty(), "the spare's image is gone");

    // The spare ends after 10 s unused; the prune it asks for may wait up to
    // 10 s more (one prune every 10 s at most).
    host.spare_inits(SPARE_ENDED, 1, Duration::from_secs(30));
    let emptied = fnrun_tests::wait_for(Duration::from_secs(30), || {
        files(&blobs).is_empty().then_some(())
    });
    assert!(
        emptied.is_some(),
        "blobs left after the last hold: {:?}\n{}",
        files(&blobs),
        host.log()
    );
}

#[test]
fn an_idle_function_scales_to_zero_and_starts_again() {
    if !require_root("an_idle_function_scales_to_zero_and_starts_again") {
        return;
    }
    let image = image(Variant::Label);
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let host = FunctionHost::start(
        HostOpts::insecure(vec![
            Entry::new("fn-a", &image.oci_ref()).set("idleTimeout", "1s"),
        ])
        .arg("--metrics-listen")
        .arg(&metrics),
    )
    .unwrap();
    let daemon_pid = host.daemon().pid().unwrap();
    let mounts_before = mounts();
    assert_eq!(metric(&metrics, "fnrun_function_instances"), 0.0);

    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let pids = host.server_pids("fn-a");
    assert_eq!(pids.len(), 1);
    assert!(alive(pids[0]));
    assert_eq!(metric(&metrics, "fnrun_function_instances"), 1.0);
    assert_eq!(
        descendants_named(daemon_pid, "/function").len(),
        1,
        "one server process"
    );

    // Idle for a second: stopped, and nothing of it is left.
    host.wait_log("function server stopped", 1, Duration::from_secs(10))
        .unwrap();
    assert!(!alive(pids[0]), "the server outlived its idle timeout");
    assert_eq!(
        leftover_servers(daemon_pid, "/function", Duration::from_secs(5)),
        Vec::<i32>::new()
    );
    assert_eq!(metric(&metrics, "fnrun_function_instances"), 0.0);
    // In its place, a spare for the next instance: a sandbox made ahead,
    // whose init waits alone in its cgroup (counted in the sandbox pool).
    let spare = host.spare_inits(SPARE_MADE, 1, Duration::from_secs(10))[0];
    assert!(alive(spare));
    // Its one child waits at its exec: the spare runs no server yet.
    let waiting: Vec<i32> = children(spare)
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(
        std::fs::read(format!("/proc/{}/cmdline", waiting[0])).unwrap(),
        std::fs::read(format!("/proc/{spare}/cmdline")).unwrap(),
        "the spare runs a server already"
    );
    assert_eq!(run_cgroups(daemon_pid), 1, "{:?}", busy_cgroups(daemon_pid));
    assert_eq!(metric(&metrics, "fnrun_sandbox_pool_sandboxes"), 1.0);

    // The next call starts it again (its image is cached), in the spare.
    let started = Instant::now();
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let pids = host.server_pids("fn-a");
    assert_eq!(pids.len(), 2, "{}", host.log());
    assert_ne!(pids[0], pids[1]);
    assert_eq!(pids[1], spare, "the second instance is not the spare's");
    assert!(alive(pids[1]));
    assert_eq!(metric(&metrics, "fnrun_function_cold_starts_total"), 2.0);
    assert_eq!(metric(&metrics, "fnrun_function_spare_starts_total"), 1.0);
    assert_eq!(metric(&metrics, "fnrun_sandbox_pool_sandboxes"), 0.0);
    assert_eq!(
        metric(
            &metrics,
            "fnrun_function_calls_total{function=\"fn-a\",code=\"OK\"}"
        ),
        2.0
    );

    // Idle again: stopped, with a new spare, which ends unused after
    // another idleTimeout (10 s at least). Then nothing of the function is
    // left.
    host.wait_log("function server stopped", 2, Duration::from_secs(10))
        .unwrap();
    let ended = host.spare_inits(SPARE_ENDED, 1, Duration::from_secs(30));
    let second = host.spare_inits(SPARE_MADE, 2, Duration::ZERO)[1];
    assert_eq!(ended, [second]);
    assert!(!alive(pids[1]), "the server outlived its idle timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(second) || run_cgroups(daemon_pid) > 0 {
        assert!(
            Instant::now() < deadline,
            "the expired spare {second} is left: {:?}",
            busy_cgroups(daemon_pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        leftover_servers(daemon_pid, "/function", Duration::from_secs(5)),
        Vec::<i32>::new()
    );
    assert_eq!(mounts(), mounts_before);
    assert_eq!(metric(&metrics, "fnrun_sandbox_pool_sandboxes"), 0.0);
    assert_eq!(metric(&metrics, "fnrun_function_instances"), 0.0);
}

/// The children of process `pid`.
fn children(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default()
}

/// How many runs of the daemon have a cgroup holding a process (one
/// directory per hierarchy on cgroup v1, one run).
fn run_cgroups(daemon_pid: u32) -> usize {
    busy_cgroups(daemon_pid)
        .iter()
        .filter_map(|p| p.file_name())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[test]
fn a_crashed_server_is_started_again_then_with_a_backoff() {
    if !require_root("a_crashed_server_is_started_again_then_with_a_backoff") {
        return;
    }
    let image = image(Variant::ExitOnSecondCall);
    let host = FunctionHost::start(HostOpts::insecure(vec![Entry::new(
        "fn-a",
        &image.oci_ref(),
    )]))
    .unwrap();
    let call = || host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(call().is_ok());
    // The second call kills it: UNAVAILABLE, with how it ended and its output.
    let outcome = call();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("function fn-a's server exited with code 3")
            && outcome.message.contains("exiting with status 3 on call 2"),
        "{outcome:?}"
    );
    let first = host.server_pids("fn-a");
    assert!(!alive(first[0]));
    // The next call starts it again at once.
    assert!(call().is_ok(), "{}", host.log());
    let outcome = call();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    // Two failures in a row: the next start waits a second.
    let outcome = call();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(
        outcome.message.contains(
            "function fn-a is restarting after 2 failed starts or crashes: next start in"
        ) && outcome.message.contains("exited with code 3"),
        "{outcome:?}"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let outcome = call();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(host.server_pids("fn-a").len(), 3, "{}", host.log());
}

#[test]
fn a_server_that_never_listens_fails_the_call_with_its_output() {
    if !require_root("a_server_that_never_listens_fails_the_call_with_its_output") {
        return;
    }
    let image = image(Variant::NeverListen);
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-a", &image.oci_ref()).set("startTimeout", "2s"),
    ]))
    .unwrap();
    let started = Instant::now();
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(
        outcome.message.contains(
            "function fn-a's server did not answer gRPC on 127.0.0.1:9443 within 2s (connection refused); output:"
        ) && outcome.message.contains("never-listen"),
        "{outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server that never listened is gone.
    let daemon_pid = host.daemon().pid().unwrap();
    assert_eq!(
        leftover_servers(daemon_pid, "/function", Duration::from_secs(5)),
        Vec::<i32>::new()
    );
    assert_eq!(busy_cgroups(daemon_pid), Vec::<std::path::PathBuf>::new());
    // A call's deadline shorter than the start: DEADLINE_EXCEEDED, from
    // fnrun (never tonic's CANCELLED "Timeout expired") or from grpc-go's
    // own timer, whichever ends the call first.
    let outcome = host
        .call("fn-a")
        .request(SAMPLE_REQUEST)
        .timeout(Duration::from_millis(300))
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::DeadlineExceeded, "{outcome:?}");
    // fnrun's message quotes the deadline as it arrived: what was left of
    // the 300 ms when grpc-go sent the call.
    let fnruns = outcome
        .message
        .strip_prefix("function fn-a: the call's deadline of ")
        .and_then(|m| m.strip_suffix("ms passed while the function's server was starting"))
        .and_then(|ms| ms.parse::<u32>().ok())
        .is_some_and(|ms| (1..=300).contains(&ms));
    assert!(
        fnruns || outcome.message == "context deadline exceeded",
        "{outcome:?}"
    );
}

#[test]
fn stopping_the_daemon_stops_every_server() {
    if !require_root("stopping_the_daemon_stops_every_server") {
        return;
    }
    let image = image(Variant::Label);
    let mut host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-a", &image.oci_ref()).set("idleTimeout", 0),
        Entry::new("fn-b", &image.oci_ref()).set("idleTimeout", 0),
    ]))
    .unwrap();
    for name in ["fn-a", "fn-b"] {
        let outcome = host.call(name).request(SAMPLE_REQUEST).run().unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    let pids: Vec<i32> = ["fn-a", "fn-b"]
        .iter()
        .flat_map(|n| host.server_pids(n))
        .collect();
    assert_eq!(pids.len(), 2);
    let daemon_pid = host.daemon().pid().unwrap();
    let status = host.daemon_mut().stop().expect("the daemon exits");
    assert!(status.success(), "{status:?}");
    for pid in pids {
        assert!(!alive(pid), "server {pid} outlived the daemon");
    }
    assert_eq!(busy_cgroups(daemon_pid), Vec::<std::path::PathBuf>::new());
}
