//! Tests of the Crossplane v1 test parts themselves, without fnrun: the Go
//! function servers and the grpc-go client that calls like Crossplane, run
//! directly on the host (h2c and mTLS); the function images; the Python SDK
//! function run from its image's root filesystem alone; the certificates and
//! the sample request. A failing end-to-end test of fnrun's function host
//! then points at fnrun, not at its test parts.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fnrun_tests::certs::{Certs, TlsFiles};
use fnrun_tests::crossplane::{
    self, Api, Call, FUNCTION_PATH, FUNCTION_USER, GoFunction, Outcome, PYTHON_SDK_ANNOTATION,
    PYTHON_SDK_ENTRYPOINT, PYTHON_SDK_NAME, RunningFunction, SAMPLE_DESIRED_RESOURCES,
    SAMPLE_REQUEST, SAMPLE_TAG, ServerTls, Variant, python_sdk_image, service_names,
};
use fnrun_tests::fixtures::PongServer;
use fnrun_tests::image::BuiltImage;
use fnrun_tests::process::{check_output, run_capture};
use fnrun_tests::registry::free_port;
use fnrun_tests::tool_cache;
use fnrun_tests::user::require_root;
use serde_json::{Value, json};

/// The sample request, parsed.
fn sample() -> Value {
    serde_norway::from_str(SAMPLE_REQUEST).expect("the sample request is YAML")
}

/// The label function's checks on a response to the sample request: every
/// desired composed resource labelled and otherwise unchanged, the desired
/// composite unchanged, tag echoed with a ttl, context passed through, one
/// Normal result naming the function, the API version and the count.
fn assert_labelled(outcome: &Outcome, name: &str, version: &str, label: (&str, &str)) {
    assert!(outcome.is_ok(), "{outcome:?}");
    let request = sample();
    let response = outcome.response();
    assert_eq!(response["meta"], json!({"tag": SAMPLE_TAG, "ttl": "60s"}));
    assert_eq!(response["context"], request["context"]);
    assert_eq!(
        response["desired"]["composite"],
        request["desired"]["composite"]
    );
    let resources = response["desired"]["resources"]
        .as_object()
        .expect("desired resources");
    assert_eq!(
        resources.keys().map(String::as_str).collect::<Vec<_>>(),
        SAMPLE_DESIRED_RESOURCES
    );
    for (key, resource) in resources {
        let mut expected = request["desired"]["resources"][key].clone();
        expected["resource"]["metadata"]["labels"][label.0] = json!(label.1);
        assert_eq!(resource, &expected, "desired resource {key}");
    }
    // Labels already there stay.
    assert_eq!(
        resources["subnet-group"]["resource"]["metadata"]["labels"]["example.org/tier"],
        "gold"
    );
    assert_eq!(
        outcome.results(),
        [(
            "SEVERITY_NORMAL".to_owned(),
            format!(
                "{name} ({version}): labelled 3 desired composed resources with {}={}",
                label.0, label.1
            )
        )]
    );
}

const TOUCHED: (&str, &str) = ("fnrun.dev/touched", "true");

#[test]
fn go_programs_are_static_and_built_once() {
    for build in [crossplane::function_binary, crossplane::client_binary] {
        let first = build().expect("builds");
        assert_eq!(build().expect("cached"), first);
        assert!(first.starts_with(tool_cache::dir()), "{}", first.display());
        // A static binary has no program interpreter: ldd says so.
        let out = Command::new("ldd").arg(&first).output().expect("ldd runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains("not a dynamic executable"),
            "{}: {said}",
            first.display()
        );
    }
}

#[test]
fn label_function_over_h2c_labels_every_desired_resource() {
    let function = GoFunction::new(Variant::Label)
        .start(&ServerTls::Insecure)
        .expect("starts");
    let call = Call::insecure(function.addr()).request(SAMPLE_REQUEST);
    let outcome = call.clone().run().expect("calls");
    assert_eq!((outcome.version.as_str(), outcome.fallback), ("v1", false));
    assert_eq!(outcome.tls, None);
    assert_labelled(&outcome, "function-label", "v1", TOUCHED);

    // The same request as JSON, and straight to v1beta1 (it serves both).
    let json = crossplane::sample_request_json().expect("JSON");
    let again = call.clone().request(&json).run().expect("calls");
    assert_eq!(again.response, outcome.response);
    let beta = call.clone().api(Api::V1beta1).run().expect("calls");
    assert_eq!((beta.version.as_str(), beta.fallback), ("v1beta1", false));
    assert_labelled(&beta, "function-label", "v1beta1", TOUCHED);
}

#[test]
fn label_function_takes_its_label_name_and_a_status_to_fail_with() {
    let function = GoFunction::new(Variant::Label)
        .name("function-team")
        .label("team", "payments")
        .start(&ServerTls::Insecure)
        .expect("starts");
    let call = Call::insecure(function.addr()).request(SAMPLE_REQUEST);
    let outcome = call.clone().run().expect("calls");
    assert_labelled(&outcome, "function-team", "v1", ("team", "payments"));

    // A function's own status: FAILED_PRECONDITION with its message.
    let mut request = sample();
    request["input"]["failWith"] = json!({"code": 9, "message": "no database engine given"});
    let outcome = call
        .request(serde_json::to_string(&request).unwrap())
        .run()
        .expect("calls");
    assert_eq!(outcome.code, tonic::Code::FailedPrecondition, "{outcome:?}");
    assert_eq!(outcome.message, "no database engine given");
    assert_eq!(outcome.response, None);
}

#[tokio::test]
async fn label_function_serves_health_and_reflection_lists_it() {
    let function = tokio::task::spawn_blocking(|| {
        GoFunction::new(Variant::Label)
            .start(&ServerTls::Insecure)
            .expect("starts")
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", function.addr()))
        .unwrap()
        .connect()
        .await
        .expect("connects");
    for service in [
        "",
        "apiextensions.fn.proto.v1.FunctionRunnerService",
        "apiextensions.fn.proto.v1beta1.FunctionRunnerService",
    ] {
        let status = fnrun_tests::client::health(channel.clone(), service)
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e:?}"));
        assert_eq!(status, fnrun_tests::client::HEALTH_SERVING, "{service:?}");
    }
    let unknown = fnrun_tests::client::health(channel, "function-other").await;
    assert_eq!(
        unknown.expect_err("an unknown service").code(),
        tonic::Code::NotFound
    );
}

#[test]
fn v1beta1_only_function_is_reached_by_the_fallback() {
    let function = GoFunction::new(Variant::V1beta1Only)
        .start(&ServerTls::Insecure)
        .expect("starts");
    let call = Call::insecure(function.addr()).request(SAMPLE_REQUEST);
    let outcome = call.clone().run().expect("calls");
    assert_eq!(
        (outcome.version.as_str(), outcome.fallback),
        ("v1beta1", true)
    );
    assert_labelled(&outcome, "function-label", "v1beta1", TOUCHED);

    let v1 = call.api(Api::V1).run().expect("calls");
    assert_eq!(v1.code, tonic::Code::Unimplemented, "{v1:?}");
    assert_eq!((v1.version.as_str(), v1.fallback), ("v1", false));
}

/// A CA, the function's server certificate for its Service names, and
/// Crossplane's client certificate.
fn pki(name: &str) -> (Certs, TlsFiles, TlsFiles) {
    let certs = Certs::new().expect("certificates");
    let names = service_names(name, "crossplane-system");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let server = certs.server(name, &names).expect("server certificate");
    let client = certs.client("crossplane").expect("client certificate");
    (certs, server, client)
}

fn assert_unavailable(outcome: &Outcome, what: &str, needle: &str) {
    assert_eq!(
        outcome.code,
        tonic::Code::Unavailable,
        "{what}: {outcome:?}"
    );
    assert!(
        outcome.message.contains(needle),
        "{what}: {needle:?} not in {:?}",
        outcome.message
    );
}

#[test]
fn mtls_function_answers_only_clients_of_its_ca() {
    let (certs, server, client) = pki("function-label");
    let function = GoFunction::new(Variant::Label)
        .start(&ServerTls::Mtls(server.dir.clone()))
        .expect("starts");
    let sni = "function-label.crossplane-system";
    let crossplane = Call::mtls(function.addr(), &certs.ca_cert())
        .client_cert(&client)
        .server_name(sni)
        .authority(&format!("{sni}:9443"))
        .request(SAMPLE_REQUEST);
    let outcome = crossplane.clone().run().expect("calls");
    assert_labelled(&outcome, "function-label", "v1", TOUCHED);
    let tls = outcome.tls.as_ref().expect("TLS");
    assert_eq!((tls.alpn.as_str(), tls.server_name.as_str()), ("h2", sni));
    assert_eq!(tls.peer_common_name, "function-label");
    assert!(
        tls.peer_dns_names
            .iter()
            .flatten()
            .any(|n| n == "function-label.crossplane-system.svc.cluster.local"),
        "{tls:?}"
    );

    // Without a client certificate, or with one of another CA: refused.
    let anonymous = Call::mtls(function.addr(), &certs.ca_cert())
        .server_name(sni)
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_unavailable(&anonymous, "no client certificate", "");
    let stranger = certs.other_ca_client("stranger").expect("certificate");
    let outcome = crossplane
        .clone()
        .client_cert(&stranger)
        .run()
        .expect("calls");
    assert_unavailable(&outcome, "a client certificate of another CA", "");
    // The server's certificate must name the SNI and chain to the client's CA.
    let outcome = crossplane
        .clone()
        .server_name("function-other.crossplane-system")
        .run()
        .expect("calls");
    assert_unavailable(&outcome, "another name", "function-other.crossplane-system");
    let outcome = Call::mtls(function.addr(), &certs.other_ca_cert())
        .client_cert(&client)
        .server_name(sni)
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_unavailable(&outcome, "verified against another CA", "unknown authority");
    // h2c to a TLS server.
    let outcome = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_unavailable(&outcome, "h2c", "");
}

#[test]
fn the_client_requires_alpn_h2_as_crossplane_does() {
    let (certs, server, client) = pki("function-label");
    let port = free_port().expect("a port");
    let addr = format!("127.0.0.1:{port}");
    // A TLS server that negotiates no ALPN protocol.
    let mut tls_only = RunningFunction::spawn(
        Command::new("openssl")
            .args(["s_server", "-quiet", "-Verify", "1", "-accept", &addr])
            .arg("-cert")
            .arg(&server.cert)
            .arg("-key")
            .arg(&server.key)
            .arg("-CAfile")
            .arg(&server.ca),
    )
    .expect("openssl s_server starts");
    tls_only
        .wait_accepting(&addr, Duration::from_secs(20))
        .expect("openssl s_server listens");
    let outcome = Call::mtls(&addr, &certs.ca_cert())
        .client_cert(&client)
        .server_name("function-label.crossplane-system")
        .timeout(Duration::from_secs(5))
        .run()
        .expect("calls");
    assert_unavailable(&outcome, "no ALPN", "missing selected ALPN property");
}

#[test]
fn exit_on_second_call_function_answers_once_then_exits_3() {
    let mut function = GoFunction::new(Variant::ExitOnSecondCall)
        .start(&ServerTls::Insecure)
        .expect("starts");
    let call = Call::insecure(function.addr()).request(SAMPLE_REQUEST);
    assert_labelled(&call.run().expect("calls"), "function-label", "v1", TOUCHED);
    let second = call.run().expect("calls");
    assert_eq!(second.code, tonic::Code::Unavailable, "{second:?}");
    let status = function
        .wait_exit(Duration::from_secs(10))
        .expect("the function exits");
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert!(
        function
            .stderr()
            .contains("exit-on-second-call: exiting with status 3 on call 2"),
        "{}",
        function.stderr()
    );
}

/// The sockets a process has open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's fds")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

#[test]
fn never_listen_function_says_so_and_never_listens() {
    let mut function = GoFunction::new(Variant::NeverListen)
        .spawn(&ServerTls::Insecure, &[])
        .expect("spawns");
    let line = function
        .wait_for_stderr("never-listen", Duration::from_secs(20))
        .expect("it says why it does not listen");
    assert_eq!(
        line,
        "crossplanefn: never-listen: sleeping forever without listening"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(function.try_wait(), None, "it keeps running");
    assert_eq!(sockets(function.pid()), 0);
    let err = function
        .wait_listening(Duration::from_millis(200))
        .expect_err("it never listens");
    assert!(err.to_string().contains("did not listen"), "{err:#}");
}

#[test]
fn memory_hog_grows_until_its_limit_kills_it() {
    // Under a data limit (RLIMIT_DATA: writable private memory, which Go's
    // heap is) of 256 MiB the Go runtime runs out of memory; without a limit
    // it would stop at 2 GiB and fail the call.
    let mut function = GoFunction::new(Variant::MemoryHog)
        .hog_max_mib(2048)
        .spawn(&ServerTls::Insecure, &["prlimit", "--data=268435456", "--"])
        .expect("spawns");
    function
        .wait_listening(Duration::from_secs(20))
        .expect("listens");
    let outcome = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    let status = function
        .wait_exit(Duration::from_secs(20))
        .expect("the function dies");
    assert!(!status.success(), "{status:?}");
    let stderr = function.stderr();
    assert!(stderr.contains("memory-hog: 128 MiB in use"), "{stderr}");
    assert!(stderr.contains("out of memory"), "{stderr}");

    // Its own bound, for a limit that is not enforced (kept small here).
    let mut function = GoFunction::new(Variant::MemoryHog)
        .hog_max_mib(64)
        .spawn(&ServerTls::Insecure, &["prlimit", "--data=268435456", "--"])
        .expect("spawns");
    function
        .wait_listening(Duration::from_secs(20))
        .expect("listens");
    let outcome = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_eq!(outcome.code, tonic::Code::ResourceExhausted, "{outcome:?}");
    assert_eq!(
        outcome.message,
        "memory-hog: allocated 64 MiB and was not killed"
    );
}

/// The network probe's findings: target -> (ok, detail), from the response
/// context; checks the result message says the same.
fn probed(outcome: &Outcome) -> Vec<(String, bool, String)> {
    assert!(outcome.is_ok(), "{outcome:?}");
    let found: Vec<(String, bool, String)> =
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
            .collect();
    let results = outcome.results();
    assert_eq!(results.len(), 1, "{results:?}");
    for (target, ok, detail) in &found {
        let verdict = if *ok { "ok" } else { "failed" };
        assert!(
            results[0]
                .1
                .contains(&format!("{target} {verdict} ({detail})")),
            "{results:?}"
        );
    }
    // The request's context passes through beside it.
    assert_eq!(
        outcome.response()["context"]["apiextensions.crossplane.io/environment"],
        sample()["context"]["apiextensions.crossplane.io/environment"]
    );
    found
}

#[test]
fn network_probe_reports_what_it_reached_without_failing() {
    let pong = PongServer::start();
    let function = GoFunction::new(Variant::NetworkProbe)
        .probe_loopback(pong.port())
        .probe_external(&["127.0.0.1:1"])
        .probe_timeout(Duration::from_secs(2))
        .start(&ServerTls::Insecure)
        .expect("starts");
    let outcome = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    let found = probed(&outcome);
    let targets: Vec<&str> = found.iter().map(|(t, _, _)| t.as_str()).collect();
    let loopback = format!("tcp 127.0.0.1:{}", pong.port());
    assert_eq!(targets, ["tcp 127.0.0.1:1", &loopback, "udp 127.0.0.1:53"]);
    assert!(
        !found[0].1 && found[0].2.contains("connection refused"),
        "{found:?}"
    );
    assert_eq!(found[1], (loopback, true, "reply pong".to_owned()));
    assert!(pong.answered());
}

#[test]
fn network_probe_fails_every_default_target_without_a_network() {
    if !require_root("network_probe_fails_every_default_target_without_a_network") {
        return;
    }
    // A network namespace with only lo, up; the client joins it.
    let mut function = GoFunction::new(Variant::NetworkProbe)
        .spawn(
            &ServerTls::Insecure,
            &[
                "unshare",
                "--net",
                "--",
                "/bin/sh",
                "-c",
                "/bin/busybox ip link set lo up && exec \"$0\" \"$@\"",
            ],
        )
        .expect("spawns");
    function
        .wait_listening(Duration::from_secs(20))
        .expect("listens");
    let netns = format!("--net=/proc/{}/ns/net", function.pid());
    let outcome = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .wrapper(&["nsenter", &netns, "--"])
        .run()
        .expect("calls");
    let found = probed(&outcome);
    let targets: Vec<&str> = found.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(
        targets,
        [
            "tcp 1.1.1.1:53",
            "tcp 203.0.113.1:443",
            "udp 1.1.1.1:53",
            "udp 203.0.113.1:53"
        ]
    );
    for (target, ok, detail) in &found {
        assert!(!ok, "{target}: {detail}");
        assert!(
            detail.contains("network is unreachable"),
            "{target}: {detail}"
        );
    }
}

#[test]
fn bench_makes_calls_at_once_and_reports_latencies() {
    let function = GoFunction::new(Variant::Label)
        .delay(Duration::from_millis(100))
        .start(&ServerTls::Insecure)
        .expect("starts");
    let bench = Call::insecure(function.addr())
        .request(SAMPLE_REQUEST)
        .bench(24, 8)
        .expect("benchmarks");
    assert_eq!(
        (bench.calls, bench.concurrency, bench.ok),
        (24, 8, 24),
        "{bench:?}"
    );
    assert_eq!(bench.codes, [("OK".to_owned(), 24)].into(), "{bench:?}");
    assert_eq!(bench.versions, [("v1".to_owned(), 24)].into(), "{bench:?}");
    assert_eq!(bench.first_error, "");
    let l = &bench.latency_ms;
    assert!(100.0 <= l.min, "{bench:?}");
    assert!(
        l.min <= l.p50 && l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.max,
        "{bench:?}"
    );
    assert!(l.min <= l.mean && l.mean <= l.max, "{bench:?}");
    // Three waves of 100ms, not 24 calls one after the other.
    assert!(
        300.0 <= bench.elapsed_ms && bench.elapsed_ms < 1500.0,
        "{bench:?}"
    );

    // Failures are counted by code.
    let beta = GoFunction::new(Variant::V1beta1Only)
        .start(&ServerTls::Insecure)
        .expect("starts");
    let bench = Call::insecure(beta.addr())
        .api(Api::V1)
        .bench(5, 2)
        .expect("benchmarks");
    assert_eq!(bench.ok, 0, "{bench:?}");
    assert_eq!(bench.codes, [("Unimplemented".to_owned(), 5)].into());
    assert!(bench.first_error.contains("Unimplemented"), "{bench:?}");
}

#[test]
fn the_client_reads_yaml_and_json_and_refuses_what_is_not_a_request() {
    let function = GoFunction::new(Variant::Label)
        .start(&ServerTls::Insecure)
        .expect("starts");
    let call = Call::insecure(function.addr());
    // Strings that look like other YAML types stay strings: a timestamp in
    // the observed XR, a version like 16.3.
    let outcome = call.clone().request(SAMPLE_REQUEST).run().expect("calls");
    let via_json = call
        .clone()
        .request(crossplane::sample_request_json().unwrap())
        .run()
        .expect("calls");
    assert_eq!(outcome.response, via_json.response);
    assert_eq!(
        outcome.desired_resource("instance").unwrap()["spec"]["forProvider"]["engineVersion"],
        "16.3"
    );
    // An empty request is a request.
    let empty = call.clone().request("").run().expect("calls");
    assert!(empty.is_ok(), "{empty:?}");
    for (bad, why) in [
        ("meta: {tagg: x}\n", "unknown field"),
        ("{\"meta\": 3}", "RunFunctionRequest"),
        ("- a\n", "RunFunctionRequest"),
        ("a: [\n", "yaml"),
    ] {
        let err = call.clone().request(bad).run().expect_err(bad);
        assert!(format!("{err:#}").contains(why), "{bad:?}: {err:#}");
    }
}

/// The image's config, as skopeo reads it from the layout.
fn image_config(image: &BuiltImage) -> Value {
    let out = check_output(
        Command::new("skopeo")
            .args(["--insecure-policy", "inspect", "--config"])
            .arg(format!("oci:{}:{}", image.layout().display(), image.tag())),
    )
    .expect("skopeo inspect --config");
    let config: Value = serde_json::from_str(&out).expect("config JSON");
    config["config"].clone()
}

/// The uid a process runs as (real, effective, saved, filesystem).
fn uids(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn go_function_images_run_as_nonroot_from_their_rootfs() {
    if !require_root("go_function_images_run_as_nonroot_from_their_rootfs") {
        return;
    }
    for variant in Variant::ALL {
        let function = GoFunction::new(variant);
        let image = function
            .image()
            .expect("the binary builds")
            .build()
            .expect("the image builds");
        let config = image_config(&image);
        let mut entrypoint = vec![FUNCTION_PATH.to_owned()];
        entrypoint.extend(function.args());
        assert_eq!(config["Entrypoint"], json!(entrypoint), "{variant:?}");
        assert_eq!(config["Cmd"], Value::Null, "{variant:?}");
        assert_eq!(config["User"], FUNCTION_USER, "{variant:?}");
        if variant != Variant::Label {
            continue;
        }
        // Run the entrypoint in the unpacked rootfs as 65532, as a runtime
        // would (with --insecure appended), and call it.
        let dir = tempfile::tempdir().expect("tempdir");
        let rootfs = image.unpack(&dir.path().join("bundle")).expect("unpacks");
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("passwd");
        assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
        let mut running = RunningFunction::spawn(
            Command::new("/usr/sbin/chroot")
                .arg(format!("--userspec={FUNCTION_USER}"))
                .arg(&rootfs)
                .args(&entrypoint)
                .args(["--insecure", "--address=127.0.0.1:0"])
                .env_clear(),
        )
        .expect("spawns");
        running
            .wait_listening(Duration::from_secs(20))
            .expect("listens");
        assert_eq!(uids(running.pid()), "65532 65532 65532 65532");
        let outcome = Call::insecure(running.addr())
            .request(SAMPLE_REQUEST)
            .run()
            .expect("calls");
        assert_labelled(&outcome, "function-label", "v1", TOUCHED);
    }
}

/// The SDK's version, as the requirements pin it.
fn pinned_sdk_version() -> String {
    let requirements =
        fnrun_tests::workspace_root().join("tests/python/sdk-function/requirements.txt");
    std::fs::read_to_string(&requirements)
        .expect("requirements")
        .lines()
        .find_map(|l| l.strip_prefix("crossplane-function-sdk-python=="))
        .expect("the SDK is pinned")
        .trim()
        .to_owned()
}

/// Every file under `root`, relative, with its kind: what an image carries.
fn tree(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("lists") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if entry.file_type().expect("type").is_dir() {
                dirs.push(path);
                found.push(format!("{rel}/"));
            } else {
                found.push(rel);
            }
        }
    }
    found.sort();
    found
}

/// Runs the Python SDK function's entrypoint in `rootfs` as 65532 with an
/// empty environment (plus `env`), on `127.0.0.1:PORT` with `args`.
fn start_python_function(rootfs: &Path, args: &[&str], env: &[(&str, &str)]) -> RunningFunction {
    let addr = format!("127.0.0.1:{}", free_port().expect("a port"));
    let mut cmd = Command::new("/usr/sbin/chroot");
    cmd.arg(format!("--userspec={FUNCTION_USER}"))
        .arg(rootfs)
        .arg(PYTHON_SDK_ENTRYPOINT)
        .arg(format!("--address={addr}"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied());
    let mut function = RunningFunction::spawn(&mut cmd).expect("spawns");
    function
        .wait_accepting(&addr, Duration::from_secs(60))
        .expect("the Python function listens");
    function
}

/// The Python function's checks on a response to the sample request.
fn assert_annotated(outcome: &Outcome) {
    assert!(outcome.is_ok(), "{outcome:?}");
    let request = sample();
    let response = outcome.response();
    let sdk = pinned_sdk_version();
    assert_eq!(response["meta"], json!({"tag": SAMPLE_TAG, "ttl": "60s"}));
    assert_eq!(response["context"], request["context"]);
    assert_eq!(
        response["desired"]["resources"],
        request["desired"]["resources"]
    );
    let mut composite = request["desired"]["composite"].clone();
    composite["resource"]["metadata"] = json!({"annotations": {PYTHON_SDK_ANNOTATION: sdk}});
    assert_eq!(response["desired"]["composite"], composite);
    let results = outcome.results();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "SEVERITY_NORMAL");
    let message = &results[0].1;
    assert!(
        message.starts_with(&format!(
            "{PYTHON_SDK_NAME}: annotated XPostgres orders-db-7fw2k with {PYTHON_SDK_ANNOTATION}={sdk} (Python 3."
        )),
        "{message}"
    );
    assert!(
        message.ends_with("; 3 desired composed resources"),
        "{message}"
    );
}

#[test]
fn python_sdk_function_runs_from_its_image_alone() {
    if !require_root("python_sdk_function_runs_from_its_image_alone") {
        return;
    }
    let image = python_sdk_image().expect("the image builds");
    assert!(
        image.layout().starts_with(tool_cache::dir()),
        "{}",
        image.layout().display()
    );
    assert_eq!(python_sdk_image().expect("cached").layout(), image.layout());
    let config = image_config(&image);
    assert_eq!(config["Entrypoint"], json!([PYTHON_SDK_ENTRYPOINT]));
    assert_eq!(config["User"], FUNCTION_USER);

    let dir = tempfile::tempdir().expect("tempdir");
    let rootfs = image.unpack(&dir.path().join("bundle")).expect("unpacks");
    let files = tree(&rootfs);
    let has = |path: &str| files.iter().any(|f| f == path);
    let any = |pred: &dyn Fn(&str) -> bool| files.iter().any(|f| pred(f));
    // No shell, no busybox; the venv, the SDK, grpcio's extension.
    assert!(
        !has("bin/sh") && !has("bin/busybox"),
        "a shell in {files:?}"
    );
    assert!(has("venv/fn/pyvenv.cfg") && has("venv/fn/bin/python"));
    assert!(any(&|f| f.starts_with("venv/fn/lib/python3.")
        && f.ends_with("/site-packages/crossplane/function/runtime.py")));
    assert!(any(
        &|f| f.contains("/site-packages/grpc/_cython/cygrpc.") && f.ends_with(".so")
    ));
    // Stripped: no installers, tests or unused stdlib.
    for gone in [
        "/pip/",
        "/setuptools/",
        "/test/",
        "/tests/",
        "/idlelib/",
        "/tkinter/",
        "/ensurepip/",
        "/lib2to3/",
        "/config-3.",
    ] {
        assert!(!any(&|f| f.contains(gone)), "{gone} in the image");
    }
    // Byte code compiled into the image.
    assert!(any(
        &|f| f.contains("/crossplane/function/__pycache__/runtime.cpython-")
    ));

    // Every ELF file's libraries resolve inside the image, by its own loader.
    let loader = files
        .iter()
        .find(|f| f.contains("/ld-linux") && f.contains(".so"))
        .expect("the dynamic loader");
    let elves: Vec<&String> = files
        .iter()
        .filter(|f| !f.ends_with('/') && is_elf(&rootfs.join(f)))
        .collect();
    assert!(elves.len() > 20, "{elves:?}");
    for elf in elves {
        let out = run_capture(
            Command::new("/usr/sbin/chroot")
                .arg(&rootfs)
                .arg(format!("/{loader}"))
                .arg("--list")
                .arg(format!("/{elf}"))
                .env_clear(),
            None,
            Duration::from_secs(30),
        );
        assert!(
            !out.stdout.contains("not found") && out.stderr.is_empty(),
            "{elf}: {}",
            out.describe()
        );
    }

    // The entrypoint, as 65532 with nothing from the host but the devices a
    // runtime gives (grpc's seed comes from /dev/urandom): h2c, v1 and
    // v1beta1.
    let dev = rootfs.join("dev");
    std::fs::create_dir_all(&dev).expect("mkdir /dev");
    for (name, minor) in [
        ("null", "3"),
        ("zero", "5"),
        ("random", "8"),
        ("urandom", "9"),
    ] {
        check_output(
            Command::new("mknod")
                .arg(dev.join(name))
                .args(["-m", "666", "c", "1", minor]),
        )
        .expect("mknod");
    }
    let started = std::time::Instant::now();
    let function = start_python_function(&rootfs, &["--insecure"], &[]);
    eprintln!("the Python function listened after {:?}", started.elapsed());
    assert_eq!(uids(function.pid()), "65532 65532 65532 65532");
    let call = Call::insecure(function.addr()).request(SAMPLE_REQUEST);
    let outcome = call.clone().run().expect("calls");
    assert_eq!((outcome.version.as_str(), outcome.fallback), ("v1", false));
    assert_annotated(&outcome);
    let beta = call.api(Api::V1beta1).run().expect("calls");
    assert_eq!(beta.version, "v1beta1");
    assert_annotated(&beta);
    // The SDK logs JSON lines to stdout, one per call here.
    let logged = function.stdout();
    assert_eq!(
        logged.matches("annotated the composite resource").count(),
        2,
        "{logged}"
    );
    drop(function);

    // mTLS with its certificates from $TLS_SERVER_CERTS_DIR.
    let (certs, server, client) = pki(PYTHON_SDK_NAME);
    let in_image = rootfs.join("tls");
    std::fs::create_dir(&in_image).expect("mkdir /tls");
    for file in [&server.cert, &server.key, &server.ca] {
        let to = in_image.join(file.file_name().unwrap());
        std::fs::copy(file, &to).expect("copies");
        std::os::unix::fs::chown(&to, Some(65532), Some(65532)).expect("chown");
    }
    let function = start_python_function(&rootfs, &[], &[("TLS_SERVER_CERTS_DIR", "/tls")]);
    let sni = format!("{PYTHON_SDK_NAME}.crossplane-system");
    let crossplane = Call::mtls(function.addr(), &certs.ca_cert())
        .client_cert(&client)
        .server_name(&sni)
        .authority(&format!("{sni}:9443"))
        .request(SAMPLE_REQUEST);
    let outcome = crossplane.clone().run().expect("calls");
    assert_annotated(&outcome);
    assert_eq!(outcome.tls.as_ref().map(|t| t.alpn.as_str()), Some("h2"));
    let anonymous = Call::mtls(function.addr(), &certs.ca_cert())
        .server_name(&sni)
        .request(SAMPLE_REQUEST)
        .run()
        .expect("calls");
    assert_unavailable(&anonymous, "no client certificate", "");
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}
