//! Network policy: ISOLATED (the default) has only loopback in a fresh network
//! namespace; RUNNER shares the runner's network namespace.

use fnrun_api::v1alpha1::NetworkPolicy;
use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::fixtures::{PongServer, network_probe};
use fnrun_tests::functionio::{SAMPLE, last_message};
use fnrun_tests::registry::Registry;

/// Runs the network probe through the daemon with `policy` (None: unset) and
/// returns its report.
async fn probe(policy: Option<NetworkPolicy>) -> (String, bool) {
    let server = PongServer::start();
    let registry = Registry::start().expect("registry starts");
    let image = network_probe(server.port()).push_to(&registry, "fns/net:v1");
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let mut request = Run::new(&image, SAMPLE);
    if let Some(policy) = policy {
        request = request.network(policy);
    }
    let output = client::run_function(&mut client, request.build())
        .await
        .expect("runs");
    let report = last_message(&String::from_utf8_lossy(&output.output));
    (report, server.answered())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_network_is_isolated_with_only_loopback() {
    let (report, answered) = probe(None).await;
    assert!(report.starts_with("ifs=lo reply="), "{report}");
    assert!(
        !report.contains("pong") && !answered,
        "reached the runner's loopback: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_network_has_only_loopback() {
    let (report, answered) = probe(Some(NetworkPolicy::Isolated)).await;
    assert!(report.starts_with("ifs=lo reply="), "{report}");
    assert!(
        !report.contains("pong") && !answered,
        "reached the runner's loopback: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_network_reaches_the_runners_loopback() {
    let (report, answered) = probe(Some(NetworkPolicy::Runner)).await;
    assert!(report.ends_with("reply=pong"), "{report}");
    assert!(answered, "the listener saw no ping");
}

#[test]
fn cli_network_policy_flag() {
    let server = PongServer::start();
    let registry = Registry::start().expect("registry starts");
    let image = network_probe(server.port()).push_to(&registry, "fns/net:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "--network-policy", "Isolated", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        last_message(&out.stdout).starts_with("ifs=lo reply="),
        "{}",
        out.describe()
    );
    let out = cli.run(
        &["run", "--network-policy", "Runner", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        last_message(&out.stdout).ends_with("reply=pong"),
        "{}",
        out.describe()
    );
}
