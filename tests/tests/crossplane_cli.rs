//! `fnrun function call` and `fnrun function serve`: a Crossplane function
//! from a terminal, without Docker, as root and rootless.

use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::crossplane::{
    Call, GoFunction, SAMPLE_DESIRED_RESOURCES, SAMPLE_REQUEST, SAMPLE_TAG, Variant,
    sample_request_json,
};
use fnrun_tests::function_host::alive;
use fnrun_tests::user::{TestUser, require_root, rootless_user};
use serde_norway::Value;

fn label_image() -> fnrun_tests::image::BuiltImage {
    let image = GoFunction::new(Variant::Label)
        .image()
        .and_then(|i| i.build())
        .expect("the image builds");
    image.share().expect("the image is readable by all");
    image
}

fn call_labels_every_desired_resource(user: Option<TestUser>) {
    let cli = match user {
        Some(user) => Cli::as_user(user).unwrap(),
        None => Cli::new().unwrap(),
    };
    let image = label_image();
    let request = cli.write_file("request.yaml", SAMPLE_REQUEST).unwrap();
    let out = cli.run(&["function", "call", &image.oci_ref(), &request], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let response: Value = serde_norway::from_str(&out.stdout).expect("the response is YAML");
    assert_eq!(response["meta"]["tag"].as_str(), Some(SAMPLE_TAG));
    assert_eq!(response["meta"]["ttl"].as_str(), Some("60s"));
    for name in SAMPLE_DESIRED_RESOURCES {
        assert_eq!(
            response["desired"]["resources"][*name]["resource"]["metadata"]["labels"]
                ["fnrun.dev/touched"]
                .as_str(),
            Some("true"),
            "{name}: {}",
            out.stdout
        );
    }
    assert_eq!(
        response["results"][0]["severity"].as_str(),
        Some("SEVERITY_NORMAL")
    );
    assert!(out.stderr.is_empty(), "{}", out.describe());
    // JSON on stdin works as well; the server is gone after each call.
    let json = sample_request_json().unwrap();
    let out = cli.run(
        &["function", "call", &image.oci_ref(), "-"],
        Some(json.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains("fnrun.dev/touched"),
        "{}",
        out.describe()
    );
}

#[test]
fn function_call_prints_the_response_as_yaml() {
    if !require_root("function_call_prints_the_response_as_yaml") {
        return;
    }
    call_labels_every_desired_resource(None);
}

#[test]
fn function_call_works_rootless() {
    let Some(user) = rootless_user("function_call_works_rootless") else {
        return;
    };
    call_labels_every_desired_resource(Some(user));
}

#[test]
fn function_call_exit_codes_follow_fnrun_run() {
    if !require_root("function_call_exit_codes_follow_fnrun_run") {
        return;
    }
    let cli = Cli::new().unwrap();
    let image = label_image();
    let image_ref = image.oci_ref();
    // Input that is not a RunFunctionRequest: 2, nothing started.
    for bad in ["metta: {}\n", "a: [\n", "meta: {tag: [1]}\n"] {
        let out = cli.run(&["function", "call", &image_ref, "-"], Some(bad.as_bytes()));
        assert_eq!(out.code, Some(2), "{bad:?}: {}", out.describe());
        assert!(out.stdout.is_empty());
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    }
    let out = cli.run(
        &["function", "call", &image_ref, "/no/such/request.yaml"],
        None,
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    // The function's own error status: 1, with its code and message.
    let fail = "input: {failWith: {code: 9, message: not today}}\n";
    let out = cli.run(
        &["function", "call", &image_ref, "-"],
        Some(fail.as_bytes()),
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .contains("the function answered FAILED_PRECONDITION: not today"),
        "{}",
        out.describe()
    );
    // DEADLINE_EXCEEDED: 124.
    let slow = GoFunction::new(Variant::Label)
        .delay(Duration::from_secs(5))
        .image()
        .and_then(|i| i.build())
        .unwrap();
    let out = cli.run(
        &[
            "function",
            "call",
            "--timeout",
            "500ms",
            &slow.oci_ref(),
            "-",
        ],
        Some(b"{}"),
    );
    assert_eq!(out.code, Some(124), "{}", out.describe());
    // A server that never listens: 1, UNAVAILABLE-class, with its output.
    let never = GoFunction::new(Variant::NeverListen)
        .image()
        .and_then(|i| i.build())
        .unwrap();
    let out = cli.run(
        &[
            "function",
            "call",
            "--start-timeout",
            "2s",
            &never.oci_ref(),
            "-",
        ],
        Some(b"{}"),
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .contains("did not answer gRPC on 127.0.0.1:9443 within 2s")
            && out.stderr.contains("never-listen"),
        "{}",
        out.describe()
    );
    // An image that does not exist: 1.
    let out = cli.run(
        &["function", "call", "oci:/no/such/layout:v1", "-"],
        Some(b"{}"),
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
}

#[test]
fn function_serve_hosts_one_function_for_crossplane_render() {
    if !require_root("function_serve_hosts_one_function_for_crossplane_render") {
        return;
    }
    let cli = Cli::new().unwrap();
    let image = label_image();
    let mut serve = cli.function_serve(&image.oci_ref()).expect("it serves");
    let listen = serve.addr().to_owned();
    let port = listen.rsplit(':').next().unwrap().to_owned();
    // The server started before the first call (its image is checked).
    let text = serve.log();
    assert!(text.contains("function server ready"), "{text}");
    // `crossplane render`'s Development runtime dials localhost:9443 over
    // h2c: any :authority reaches the one function.
    for authority in [format!("localhost:{port}"), "anything:1".to_owned()] {
        let outcome = Call::insecure(&listen)
            .authority(&authority)
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(outcome.version, "v1");
    }
    let pids: Vec<i32> = serve
        .log()
        .lines()
        .filter(|l| l.contains("function server ready"))
        .filter_map(|l| l.split(" pid=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 1, "one warm server");
    assert!(alive(pids[0]));
    let status = serve.stop().expect("it exits");
    assert!(status.success(), "{status:?}: {}", serve.log());
    assert!(!alive(pids[0]), "the function server outlived fnrun");
}

/// `function serve --listen localhost:PORT`, as its help says: each of the
/// name's addresses.
#[test]
fn function_serve_listens_on_a_host_name() {
    if !require_root("function_serve_listens_on_a_host_name") {
        return;
    }
    let cli = Cli::new().unwrap();
    let image = label_image();
    let port = fnrun_tests::registry::free_port().unwrap();
    let serve = cli
        .function_serve_with(
            &["--listen", &format!("localhost:{port}")],
            &image.oci_ref(),
        )
        .expect("it serves");
    let outcome = Call::insecure(&format!("127.0.0.1:{port}"))
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}\n{}", serve.log());
}
