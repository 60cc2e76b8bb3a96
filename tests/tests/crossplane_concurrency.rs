//! Concurrent calls to one function: one warm instance serves them over one
//! HTTP/2 connection, a cold start is made once however many calls find the
//! function stopped, and beyond `maxConcurrency` calls and as many waiting,
//! calls get RESOURCE_EXHAUSTED at once.

use std::time::Duration;

use fnrun_tests::crossplane::{GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::user::require_root;

fn image(delay: Duration) -> BuiltImage {
    GoFunction::new(Variant::Label)
        .delay(delay)
        .image()
        .and_then(|i| i.build())
        .expect("the image builds")
}

#[test]
fn concurrent_calls_share_one_warm_instance_started_once() {
    if !require_root("concurrent_calls_share_one_warm_instance_started_once") {
        return;
    }
    let image = image(Duration::from_millis(20));
    let host = FunctionHost::start(HostOpts::insecure(vec![Entry::new(
        "fn-a",
        &image.oci_ref(),
    )]))
    .unwrap();
    // 16 calls at once find the function stopped: one start serves them all.
    let bench = host
        .call("fn-a")
        .request(SAMPLE_REQUEST)
        .bench(64, 16)
        .unwrap();
    assert_eq!(bench.ok, 64, "{bench:?}");
    assert_eq!(host.server_pids("fn-a").len(), 1, "{}", host.log());
    // And again, warm: 20 ms each, 16 at once, so far less than 400 x 20 ms.
    let bench = host
        .call("fn-a")
        .request(SAMPLE_REQUEST)
        .bench(400, 16)
        .unwrap();
    assert_eq!(bench.ok, 400, "{bench:?}");
    assert!(bench.elapsed_ms < 4000.0, "not concurrent: {bench:?}");
    assert_eq!(host.server_pids("fn-a").len(), 1, "{}", host.log());
}

#[test]
fn beyond_max_concurrency_and_its_queue_calls_are_refused() {
    if !require_root("beyond_max_concurrency_and_its_queue_calls_are_refused") {
        return;
    }
    let image = image(Duration::from_secs(2));
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-a", &image.oci_ref()).set("maxConcurrency", 2),
    ]))
    .unwrap();
    // Warm it up first, so that the start is not what is measured.
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    // 10 at once: 2 run, 2 wait for them, 6 are refused at once.
    let bench = host
        .call("fn-a")
        .request(SAMPLE_REQUEST)
        .bench(10, 10)
        .unwrap();
    assert_eq!(bench.ok, 4, "{bench:?}");
    assert_eq!(bench.codes.get("ResourceExhausted"), Some(&6), "{bench:?}");
    assert!(
        bench
            .first_error
            .contains("function fn-a is at capacity: 2 calls in flight and 2 waiting"),
        "{bench:?}"
    );
    // The refused ones did not wait for the others.
    assert!(bench.latency_ms.min < 1000.0, "{bench:?}");
}
