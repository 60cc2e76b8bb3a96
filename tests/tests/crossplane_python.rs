//! A function written with the real Crossplane Python SDK, packaged as an
//! image (interpreter, grpcio, no shell), hosted by fnrun over mTLS as
//! Crossplane calls it: v1 and v1beta1, and a scale to zero and back.

use std::time::Duration;

use fnrun_tests::crossplane::{
    Api, PYTHON_SDK_ANNOTATION, PYTHON_SDK_NAME, SAMPLE_REQUEST, SAMPLE_TAG, python_sdk_image,
};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, alive};
use fnrun_tests::user::require_root;

#[test]
fn a_python_sdk_function_is_hosted_like_crossplane_calls_it() {
    if !require_root("a_python_sdk_function_is_hosted_like_crossplane_calls_it") {
        return;
    }
    let image = python_sdk_image().expect("the image builds");
    let host = FunctionHost::start(
        HostOpts::insecure(vec![
            Entry::new(PYTHON_SDK_NAME, &image.oci_ref()).set("idleTimeout", "2s"),
        ])
        .tls(HostTls::Mint),
    )
    .unwrap();
    for api in [Api::Auto, Api::V1beta1] {
        let outcome = host
            .call(PYTHON_SDK_NAME)
            .api(api)
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}\n{}", host.log());
        let response = outcome.response();
        assert_eq!(response["meta"]["tag"], SAMPLE_TAG);
        let annotations = &response["desired"]["composite"]["resource"]["metadata"]["annotations"];
        assert!(
            annotations.get(PYTHON_SDK_ANNOTATION).is_some(),
            "{response}"
        );
        let results = outcome.results();
        assert!(
            results[0]
                .1
                .starts_with(&format!("{PYTHON_SDK_NAME}: annotated XPostgres")),
            "{results:?}"
        );
    }
    // One server for both calls; it stops when idle and comes back.
    let first = host.server_pids(PYTHON_SDK_NAME);
    assert_eq!(first.len(), 1, "{}", host.log());
    host.wait_log("function server stopped", 1, Duration::from_secs(15))
        .unwrap();
    assert!(!alive(first[0]));
    let outcome = host
        .call(PYTHON_SDK_NAME)
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(host.server_pids(PYTHON_SDK_NAME).len(), 2);
}
