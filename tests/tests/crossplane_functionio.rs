//! FunctionIO mode: an xfn-era image that reads FunctionIO YAML on stdin,
//! run per call behind the v1 API, the request and the response translated
//! with `fnrun_api::functionio_v1` (docs/crossplane.md has the mapping).

use fnrun_tests::crossplane::{SAMPLE_REQUEST, SAMPLE_TAG};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::image::TestImage;
use fnrun_tests::user::{require_root, rootless_user};
use serde_json::Value;

/// An xfn-style function: writes its input back, with a readiness check on
/// the `instance` resource (which v1 cannot carry), that resource's instance
/// class changed, and a Warning result saying what it saw.
const XFN_SCRIPT: &str = r#"#!/bin/sh
cat > /tmp/in.yaml
named=$(grep -c '^  - name: ' /tmp/in.yaml)
kind=$(sed -n '/^config:/,/^[a-z]/s/^  kind: //p' /tmp/in.yaml)
sed -e 's/^  - name: instance$/  - name: instance\n    readinessChecks:\n    - type: None/' \
    -e 's/instanceClass: db.t3.micro/instanceClass: db.t3.small/' /tmp/in.yaml
printf 'results:\n- severity: Warning\n  message: "xfn saw %s named resources and config %s"\n' "$named" "$kind"
"#;

fn sample() -> Value {
    serde_norway::from_str(SAMPLE_REQUEST).unwrap()
}

fn round_trip(user: Option<fnrun_tests::user::TestUser>) {
    let image = TestImage::script(XFN_SCRIPT).build().unwrap();
    image.share().unwrap();
    let failing =
        TestImage::script("#!/bin/sh\ncat >/dev/null\necho 'xfn: no bucket' >&2\nexit 3\n")
            .build()
            .unwrap();
    failing.share().unwrap();
    let garbage = TestImage::script("#!/bin/sh\ncat >/dev/null\necho not-yaml-at-all\n")
        .build()
        .unwrap();
    garbage.share().unwrap();
    let host = FunctionHost::start(
        HostOpts::insecure(vec![
            Entry::new("fn-xfn", &image.oci_ref()).set("mode", "functionio"),
            Entry::new("fn-failing", &failing.oci_ref()).set("mode", "functionio"),
            Entry::new("fn-garbage", &garbage.oci_ref()).set("mode", "functionio"),
        ])
        .user(user),
    )
    .unwrap();

    let outcome = host.call("fn-xfn").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}\n{}", host.log());
    let request = sample();
    let response = outcome.response();
    // The tag and the context come back; there is no TTL.
    assert_eq!(response["meta"]["tag"], SAMPLE_TAG);
    assert!(response["meta"].get("ttl").is_none(), "{response}");
    assert_eq!(response["context"], request["context"]);
    // Every desired resource comes back as it went, the label added, and
    // the request's readiness carried over (the readiness check is lost).
    let resources = response["desired"]["resources"].as_object().unwrap();
    let wanted = request["desired"]["resources"].as_object().unwrap();
    assert_eq!(
        resources.keys().collect::<Vec<_>>(),
        wanted.keys().collect::<Vec<_>>()
    );
    for (name, resource) in resources {
        let mut expected = wanted[name].clone();
        if name == "instance" {
            expected["resource"]["spec"]["forProvider"]["instanceClass"] =
                Value::from("db.t3.small");
        }
        // Connection details of desired composed resources ride along.
        assert_eq!(resource["resource"], expected["resource"], "{name}");
        assert_eq!(resource.get("ready"), expected.get("ready"), "{name}");
    }
    assert_eq!(
        response["desired"]["composite"]["resource"],
        request["desired"]["composite"]["resource"]
    );
    // The result: the script saw the observed and desired resources by name
    // and the input as config.
    let results = outcome.results();
    assert_eq!(
        results,
        [(
            "SEVERITY_WARNING".to_owned(),
            "xfn saw 5 named resources and config DatabaseConfig".to_owned()
        )]
    );

    // A function that fails: ABORTED with its exit code and stderr.
    let outcome = host
        .call("fn-failing")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Aborted, "{outcome:?}");
    assert_eq!(
        outcome.message,
        "function exited with code 3; stderr: xfn: no bucket"
    );
    // Output that is not FunctionIO: ABORTED too.
    let outcome = host
        .call("fn-garbage")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Aborted, "{outcome:?}");
    assert!(
        outcome
            .message
            .starts_with("function output is not a FunctionIO"),
        "{outcome:?}"
    );
}

#[test]
fn a_functionio_image_runs_per_call_behind_the_v1_api() {
    if !require_root("a_functionio_image_runs_per_call_behind_the_v1_api") {
        return;
    }
    round_trip(None);
}

#[test]
fn functionio_mode_works_rootless() {
    let Some(user) = rootless_user("functionio_mode_works_rootless") else {
        return;
    };
    round_trip(Some(user));
}

#[test]
fn a_functionio_image_in_server_mode_suggests_mode_functionio() {
    if !require_root("a_functionio_image_in_server_mode_suggests_mode_functionio") {
        return;
    }
    // The xfn image reads its stdin, finds nothing and exits at once: it is
    // no gRPC server.
    let image = TestImage::script(XFN_SCRIPT).build().unwrap();
    image.share().unwrap();
    let cli = fnrun_tests::cli::Cli::new().expect("cli");
    let request = cli.write_file("req.yaml", SAMPLE_REQUEST).unwrap();
    let out = cli.run(&["function", "call", &image.oci_ref(), &request], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(
            "(if it is a FunctionIO image, which reads stdin and exits, run it with \
             --mode functionio, or mode: functionio in the functions file)"
        ),
        "{}",
        out.describe()
    );
}
