//! Prometheus metrics at `/metrics` on `--metrics-listen`.

use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::{Registry, free_port, http_get};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_with_the_fnrun_prefix() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let daemon = Daemon::start(DaemonOpts::default().arg("--metrics-listen").arg(&addr))
        .expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs");
    let (code, body) = http_get(&addr, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    let samples: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert!(!samples.is_empty(), "no samples:\n{body}");
    assert!(
        samples.iter().all(|l| l.starts_with("fnrun_")),
        "metric names are prefixed fnrun_:\n{body}"
    );
}
