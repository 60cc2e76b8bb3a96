//! Porch's `evaluator.FunctionEvaluator/EvaluateFunction` on the daemon's
//! `--listen` addresses, with tonic and with grpc-go (built from Debian's
//! grpc-go, stubs from `api/proto/evaluator/evaluator.proto`), root and
//! rootless: output and log, failures as Porch's runner reports them
//! (INTERNAL with the results and the stderr tail), bad input, `Tag`
//! resolution, allowed registries, health, reflection and `--prefetch`.

use std::time::Duration;

use fnrun_api::evaluator::function_evaluator_client::FunctionEvaluatorClient;
use fnrun_api::evaluator::{EvaluateFunctionRequest, EvaluateFunctionResponse};
use fnrun_tests::client;
use fnrun_tests::daemon::{Daemon, DaemonOpts, Socket};
use fnrun_tests::go;
use fnrun_tests::image::TestImage;
use fnrun_tests::krm::{self, RESOURCE_LIST, go_evaluate, labels, with_config};
use fnrun_tests::registry::Registry;
use fnrun_tests::user::root_and_rootless;
use tonic::Code;
use tonic::transport::Channel;

async fn evaluate(
    channel: Channel,
    image: &str,
    tag: &str,
    resource_list: &str,
) -> Result<EvaluateFunctionResponse, tonic::Status> {
    FunctionEvaluatorClient::new(channel)
        .evaluate_function(EvaluateFunctionRequest {
            resource_list: resource_list.as_bytes().to_vec(),
            image: image.to_owned(),
            tag: tag.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A log without its terminal colours (`ESC [ ... m`).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_function_returns_the_output_and_the_log() {
    let registry = Registry::start().expect("registry starts");
    let image = go::push_krm_function(&registry);
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let channel = daemon.channel().await.expect("connects");
    let out = evaluate(
        channel.clone(),
        &image,
        "",
        &with_config("{key: app, value: web, whoami: 'yes'}"),
    )
    .await
    .expect("evaluates");
    let output = text(&out.resource_list);
    assert_eq!(
        labels(&output, "app"),
        [Some("web".into()), Some("web".into())]
    );
    // kpt's defaults: nobody (of the root daemon's range), no network.
    assert_eq!(krm::result_starting(&output, "uid="), "uid=65534 gid=65534");
    assert_eq!(text(&out.log), "krmfn: labelled 2 resources\n");

    // Error results with exit 0 are Porch's to read: OK.
    let out = evaluate(channel.clone(), &image, "", &with_config("{fail: result}"))
        .await
        .expect("evaluates");
    assert!(
        krm::results(&text(&out.resource_list))
            .contains(&("error".into(), "value is not allowed".into()))
    );

    // The health of the service.
    assert_eq!(
        client::health(channel, fnrun_api::evaluator::SERVICE_NAME)
            .await
            .expect("health answers"),
        1,
        "SERVING"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_reported_as_porchs_runner_reports_them() {
    let registry = Registry::start().expect("registry starts");
    let image = go::push_krm_function(&registry);
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let channel = daemon.channel().await.expect("connects");
    let call = |image: String, tag: &'static str, input: String| {
        let channel = channel.clone();
        async move { evaluate(channel, &image, tag, &input).await }
    };

    // A function that exits non-zero: INTERNAL with its results and the
    // tail of its stderr.
    let err = call(image.clone(), "", with_config("{fail: exit}"))
        .await
        .expect_err("fails");
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().starts_with(&format!(
            "failed to evaluate function {image:?}: function exited with code 1; results: "
        )),
        "{}",
        err.message()
    );
    assert!(
        err.message()
            .contains("[error] apps/v1/Deployment/prod/web: value is not allowed"),
        "{}",
        err.message()
    );
    assert!(
        err.message()
            .ends_with("; stderr: krmfn: labelled 2 resources"),
        "{}",
        err.message()
    );
    // A crash without output: INTERNAL with its stderr.
    let err = call(image.clone(), "", with_config("{fail: crash}"))
        .await
        .expect_err("fails");
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message()
            .ends_with("stderr: krmfn: panic: asked to crash"),
        "{}",
        err.message()
    );
    // Output that is not a ResourceList: INTERNAL.
    let hello = TestImage::script("#!/bin/sh\ncat >/dev/null\necho hello >&2\necho hello\n")
        .push_to(&registry, "fns/hello:v1");
    let err = call(hello, "", RESOURCE_LIST.to_owned())
        .await
        .expect_err("fails");
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message()
            .contains("function output is not a ResourceList: document is not a YAML mapping"),
        "{}",
        err.message()
    );

    // Bad requests: INVALID_ARGUMENT, with a bounded message.
    let huge = format!(
        "apiVersion: config.kubernetes.io/v1\nkind: {}\nitems: []\n",
        "x".repeat(8 << 20)
    );
    for (image, input, want) in [
        (
            image.clone(),
            "- a\n".to_owned(),
            "input is not a ResourceList: document is not a YAML mapping but a sequence",
        ),
        (
            image.clone(),
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: 3\n".to_owned(),
            "items is a number, expected a sequence",
        ),
        (image.clone(), huge, "bytes elided"),
        (String::new(), RESOURCE_LIST.to_owned(), "image is required"),
        (
            "Not A Reference".to_owned(),
            RESOURCE_LIST.to_owned(),
            "Not A Reference",
        ),
    ] {
        let err = call(image, "", input).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(want), "{}", err.message());
        assert!(err.message().len() <= 2048, "{} bytes", err.message().len());
    }
    // No such image: NOT_FOUND.
    let err = call(
        registry.reference("fns/missing:v1"),
        "",
        RESOURCE_LIST.to_owned(),
    )
    .await
    .expect_err("not found");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

/// A function that says which image it is, after a pause.
fn versioned(version: &str, pause: u32) -> TestImage {
    TestImage::script(&format!(
        "#!/bin/sh\nsleep {pause}\ncat\necho 'results: [{{severity: info, message: \"{version}\"}}]'\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_is_a_version_constraint_resolved_against_the_registry() {
    let registry = Registry::start().expect("registry starts");
    for tag in [
        "v0.1.0",
        "v0.2.0",
        "v0.2.1-rc.1",
        "v1.0.0",
        "0.3.0",
        "latest",
    ] {
        versioned(tag, 0).push_to(&registry, &format!("fns/versioned:{tag}"));
    }
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let channel = daemon.channel().await.expect("connects");
    // Porch's pod evaluator: the image's own tag gives way to the highest
    // `v` tag within the constraint.
    let base = registry.reference("fns/versioned");
    for (image, tag, want) in [
        (format!("{base}:latest"), "~0.2", "v0.2.0"),
        (base.clone(), "< 1", "v0.2.0"),
        (base.clone(), ">= 0.2.1-0, < 1", "v0.2.1-rc.1"),
        (base.clone(), "^1", "v1.0.0"),
        (base.clone(), "v0.1.0", "v0.1.0"),
        (format!("{base}:v0.1.0"), "", "v0.1.0"),
        (format!("{base}:latest"), "", "latest"),
    ] {
        let out = evaluate(channel.clone(), &image, tag, RESOURCE_LIST)
            .await
            .unwrap_or_else(|e| panic!("{image} {tag}: {e:?}"));
        assert_eq!(
            krm::last_message(&text(&out.resource_list)),
            want,
            "{image} {tag}"
        );
    }
    let log = plain(&daemon.log());
    assert!(
        log.contains("resolved the image's tag") && log.contains("versioned:v1.0.0"),
        "{log}"
    );
    // No tag within it (tags without a `v` are not versions to Porch), not
    // a constraint, a digest: refused.
    let digest = format!("{base}@sha256:{}", "0".repeat(64));
    for (image, tag, code, want) in [
        (base.clone(), "> 2", Code::NotFound, "no tag of"),
        (base.clone(), "0.3.0", Code::NotFound, "satisfies \"0.3.0\""),
        (
            base.clone(),
            "newest",
            Code::InvalidArgument,
            "is not a version constraint",
        ),
        (
            digest,
            "^1",
            Code::InvalidArgument,
            "is pinned by its digest",
        ),
        (
            "oci:/some/layout:v1".to_owned(),
            "^1",
            Code::InvalidArgument,
            "needs a registry image",
        ),
    ] {
        let err = evaluate(channel.clone(), &image, tag, RESOURCE_LIST)
            .await
            .expect_err("refused");
        assert_eq!(err.code(), code, "{image} {tag}: {err:?}");
        assert!(err.message().contains(want), "{}", err.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_registries_prefetch_and_reflection() {
    let registry = Registry::start().expect("registry starts");
    let image = versioned("v1", 0).push_to(&registry, "fns/prefetched:v1");
    let missing = registry.reference("fns/missing:v1");
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--prefetch")
            .arg(&image)
            .arg(&missing),
    )
    .expect("fnrun serve starts");
    let pulled = fnrun_tests::wait_for(Duration::from_secs(60), || {
        let log = plain(&daemon.log());
        (log.contains("prefetched the image") && log.contains("cannot prefetch the image"))
            .then_some(log)
    })
    .unwrap_or_else(|| panic!("no prefetch in the log:\n{}", daemon.log()));
    assert!(pulled.contains("pulled=true"), "{pulled}");
    assert!(pulled.contains("fns/missing:v1"), "{pulled}");
    // The daemon serves meanwhile; the prefetched image runs from the cache
    // even with the registry gone.
    drop(registry);
    let channel = daemon.channel().await.expect("connects");
    let out = evaluate(channel.clone(), &image, "", RESOURCE_LIST)
        .await
        .expect("runs from the cache");
    assert_eq!(krm::last_message(&text(&out.resource_list)), "v1");

    // Reflection lists the service and gives its file.
    let (names, files) =
        fnrun_tests::reflection::v1(channel, &[fnrun_api::evaluator::SERVICE_NAME]).await;
    assert!(
        names
            .iter()
            .any(|n| n == fnrun_api::evaluator::SERVICE_NAME),
        "{names:?}"
    );
    let file = files
        .iter()
        .find(|f| f.package() == "evaluator")
        .unwrap_or_else(|| panic!("no evaluator file in {files:?}"));
    assert_eq!(file.service[0].method[0].name(), "EvaluateFunction");

    // Images of other registries: PERMISSION_DENIED, before any tag is listed.
    let restricted = Daemon::start(
        DaemonOpts::default()
            .arg("--allowed-registry")
            .arg("registry.example.org"),
    )
    .expect("fnrun serve starts");
    let channel = restricted.channel().await.expect("connects");
    for tag in ["", "^1"] {
        let err = evaluate(channel.clone(), &image, tag, RESOURCE_LIST)
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_go_evaluates_two_functions_at_once_root_and_rootless() {
    let registry = Registry::start().expect("registry starts");
    let krmfn = go::push_krm_function(&registry);
    let slow_a = versioned("a", 2).push_to(&registry, "fns/slow-a:v1");
    let slow_b = versioned("b", 2).push_to(&registry, "fns/slow-b:v1");
    for user in root_and_rootless("grpc_go_evaluates_two_functions_at_once_root_and_rootless") {
        let rootless = user.is_some();
        let mut opts = DaemonOpts::default();
        if let Some(user) = user {
            opts = opts.user(user);
        }
        let daemon = Daemon::start(opts).expect("fnrun serve starts");
        let target = match daemon.socket() {
            Socket::Path(path) => format!("unix:{}", path.display()),
            other => panic!("expected a unix path, not {other:?}"),
        };
        let call = |images: Vec<String>, tag: &'static str, input: String| {
            let target = target.clone();
            tokio::task::spawn_blocking(move || {
                let images: Vec<&str> = images.iter().map(String::as_str).collect();
                go_evaluate(&target, false, &images, tag, input.as_bytes())
            })
        };
        // Pulled first, so that the timed calls below only run.
        let warm = call(
            vec![slow_a.clone(), slow_b.clone()],
            "",
            RESOURCE_LIST.to_owned(),
        )
        .await
        .expect("joins")
        .expect("grpc-go calls");
        assert!(warm.iter().all(|c| c.code == "OK"), "{warm:?}");
        let calls = call(
            vec![slow_a.clone(), slow_b.clone(), krmfn.clone()],
            "",
            with_config("{key: app, value: web}"),
        )
        .await
        .expect("joins")
        .expect("grpc-go calls");
        assert_eq!(calls.len(), 3);
        for (call, want) in calls.iter().zip(["a", "b"]) {
            assert_eq!(call.code, "OK", "rootless={rootless}: {call:?}");
            assert_eq!(krm::last_message(&call.resource_list), want);
        }
        assert_eq!(
            labels(&calls[2].resource_list, "app"),
            [Some("web".into()), Some("web".into())]
        );
        assert_eq!(calls[2].log, "krmfn: labelled 2 resources\n");
        // Each function sleeps 2 s: run one after the other, the last would
        // end after 4 s.
        let last = calls
            .iter()
            .map(|c| c.finished_ms)
            .max()
            .unwrap_or_default();
        assert!(last < 3800, "rootless={rootless}: not at once: {calls:#?}");

        let failed = call(vec![krmfn.clone()], "", with_config("{fail: exit}"))
            .await
            .expect("joins")
            .expect("grpc-go calls");
        assert_eq!(failed[0].code, "Internal", "{failed:?}");
        assert!(
            failed[0].message.contains("value is not allowed")
                && failed[0]
                    .message
                    .ends_with("stderr: krmfn: labelled 2 resources"),
            "{failed:?}"
        );
    }
}
