//! The network namespaces of a kind's runs (`NetworkNamespaces::PerKind`,
//! root only): shared one run at a time, never between kinds, ended with
//! the kind's last sandbox, owned by none of the runs.

use super::*;
use crate::NetworkNamespaces;

/// What a run says of its network namespace: its number, `/sys`'s
/// filesystem, `lo`'s state (in its own words) and its effective
/// capabilities.
const LOOK: &str = "ls -l /proc/self/ns/net | tr ' ' '\\n' | tail -1; stat -f -c %T /sys; \
                    cat /proc/net/dev | grep -c lo; grep CapEff /proc/self/status; \
                    cat /proc/sys/net/ipv4/tcp_no_metrics_save /proc/sys/net/ipv4/tcp_fastopen";

async fn look(fx: &Fixture, spec: &RunSpec) -> Vec<String> {
    let out = fx.sandbox.run(spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn a_kinds_runs_share_a_network_namespace_one_at_a_time() {
    shared_one_at_a_time(Fixture::new()).await;
}

/// The same with the direct launcher: the runner's clone thread enters the
/// kind's namespace instead of the spawner.
#[tokio::test]
async fn a_kinds_runs_share_a_network_namespace_without_the_spawner() {
    shared_one_at_a_time(Fixture::with(|c| c.spawner = false)).await;
}

async fn shared_one_at_a_time(fx: Fixture) {
    if !fx.sandbox.shares_network_namespaces() {
        eprintln!("SKIPPED: a rootless runner gives each run its own network namespace");
        return;
    }
    let nets = fx.sandbox.nets.clone().expect("shared");
    let spec = fx.spec(LOOK);
    // A sandbox of the kind made ahead: it holds one namespace of the kind.
    let mut held = fx.sandbox.prepare(&spec).unwrap();
    held.ready().await.unwrap();
    let held_ns = std::fs::read_link(format!("/proc/{}/ns/net", held.pid()))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(nets.counts(), (1, 1));

    let first = look(&fx, &spec).await;
    let second = look(&fx, &spec).await;
    // Another namespace than the one in use; given back clean, and reused.
    assert_ne!(first[0], held_ns);
    assert_eq!(first[0], second[0], "{first:?} {second:?}");
    // Made by the runner: no fresh sysfs (the run's user namespace does not
    // own it), lo up, no capability, the kind's sysctls.
    assert_eq!(first[1], "tmpfs", "{first:?}");
    assert_eq!(first[3], "CapEff:\t0000000000000000", "{first:?}");
    assert_eq!(first[4..], ["1", "0"], "{first:?}");
    assert_eq!(nets.counts(), (2, 1));

    // Another kind (another command) never shares one.
    let other = look(&fx, &fx.spec(&format!("{LOOK}; true"))).await;
    assert!(other[0] != first[0] && other[0] != held_ns, "{other:?}");
    // Its last sandbox ended, so did its namespaces.
    assert_eq!(nets.counts(), (2, 1));

    // The kind's last sandbox ends: its namespaces end.
    held.discard().await;
    assert_eq!(nets.counts(), (0, 0));

    // The cloning thread went back home: a run with the runner's network
    // is in this process's namespace.
    let mut runner = fx.spec(LOOK);
    runner.network = Network::Runner;
    let out = fx.sandbox.run(&runner, b"", TIMEOUT).await.unwrap();
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_eq!(
        text(&out.stdout).lines().next(),
        Some(own.to_string_lossy().as_ref())
    );
}

#[tokio::test]
async fn per_run_network_namespaces_are_new_for_every_run() {
    let fx = Fixture::with(|c| c.network_namespaces = NetworkNamespaces::PerRun);
    assert!(!fx.sandbox.shares_network_namespaces());
    let spec = fx.spec(LOOK);
    let mut held = fx.sandbox.prepare(&spec).unwrap();
    held.ready().await.unwrap();
    let first = look(&fx, &spec).await;
    // The run's own: its user namespace owns it, so a fresh sysfs.
    assert_eq!(first[1], "sysfs", "{first:?}");
    assert_eq!(first[3], "CapEff:\t0000000000000000", "{first:?}");
    held.discard().await;
}
