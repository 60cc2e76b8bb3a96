//! Released composition functions, built from their module sources at a
//! pinned release and packaged as Crossplane packages
//! (`fnrun_tests::crossplane::UpstreamFunction`), hosted by `fnrun function
//! serve` and `fnrun serve --functions` and called as Crossplane calls them.
//!
//! function-patch-and-transform v0.10.7 (function-sdk-go v0.5.0, grpc-go
//! 1.79) composes a ConfigMap patched from the composite resource;
//! function-auto-ready v0.7.0 (function-sdk-go v0.7.1) marks that ConfigMap
//! ready once it is observed.

use std::process::Command;

use fnrun_tests::cli::Cli;
use fnrun_tests::crossplane::{
    AUTO_READY, CROSSPLANE_CONSTRAINT, Outcome, PATCH_AND_TRANSFORM, XPKG_ANNOTATION,
};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::process::check_output;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{require_root, root_and_rootless};

/// The request of `tests/data/crossplane/patch_and_transform_request.yaml`.
const REQUEST: &str = include_str!("../data/crossplane/patch_and_transform_request.yaml");

/// What function-patch-and-transform must answer to [`REQUEST`]: the
/// ConfigMap of its base with `data.color` patched from the XR's
/// `spec.color` through the Format transform, and the request's tag.
fn assert_composed(outcome: &Outcome, what: &str) {
    assert!(outcome.is_ok(), "{what}: {outcome:?}");
    assert_eq!(outcome.version, "v1", "{what}");
    assert_eq!(
        outcome.response()["meta"]["tag"],
        "patch-and-transform-1",
        "{what}"
    );
    let settings = outcome
        .desired_resource("settings")
        .unwrap_or_else(|| panic!("{what}: no desired resource settings: {outcome:?}"));
    assert_eq!(settings["apiVersion"], "v1", "{what}: {settings}");
    assert_eq!(settings["kind"], "ConfigMap", "{what}: {settings}");
    assert_eq!(settings["data"]["owner"], "fnrun", "{what}: {settings}");
    assert_eq!(
        settings["data"]["color"], "color-blue",
        "{what}: {settings}"
    );
}

fn push(registry: &Registry) -> String {
    PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            registry,
            "crossplane-contrib/function-patch-and-transform:v0.10.7",
        )
}

#[test]
fn the_package_has_the_layer_crossplanes_package_manager_reads() {
    let image = PATCH_AND_TRANSFORM
        .image()
        .and_then(|i| i.build())
        .expect("function-patch-and-transform builds and packages");
    let layout = image.layout();
    let read = |path: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let blob = |digest: &serde_json::Value| {
        layout
            .join("blobs/sha256")
            .join(digest.as_str().unwrap().trim_start_matches("sha256:"))
    };
    let index = read(&layout.join("index.json"));
    let manifest = read(&blob(&index["manifests"][0]["digest"]));
    let layers = manifest["layers"].as_array().unwrap();
    let annotated: Vec<&serde_json::Value> = layers
        .iter()
        .filter(|l| l["annotations"][XPKG_ANNOTATION.0] == XPKG_ANNOTATION.1)
        .collect();
    assert_eq!(annotated.len(), 1, "one base layer: {manifest}");
    assert!(
        std::ptr::eq(annotated[0], layers.last().unwrap()),
        "the base layer is the top one: {manifest}"
    );
    // The layer holds package.yaml alone: the release's Function with our
    // constraint, then its input CRD.
    let tar = blob(&annotated[0]["digest"]);
    let listing = check_output(Command::new("tar").arg("-tzf").arg(&tar)).unwrap();
    let files: Vec<&str> = listing
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| l.trim_start_matches("./"))
        .collect();
    assert_eq!(files, ["package.yaml"], "{listing}");
    let text = check_output(
        Command::new("tar")
            .arg("-xzOf")
            .arg(&tar)
            .arg("./package.yaml"),
    )
    .unwrap();
    let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert_eq!(
        docs[0]["apiVersion"], "meta.pkg.crossplane.io/v1beta1",
        "{text}"
    );
    assert_eq!(docs[0]["kind"], "Function", "{text}");
    assert_eq!(docs[0]["metadata"]["name"], "function-patch-and-transform");
    assert_eq!(
        docs[0]["spec"]["crossplane"]["version"],
        CROSSPLANE_CONSTRAINT
    );
    assert_eq!(docs[1]["kind"], "CustomResourceDefinition", "{text}");
    assert_eq!(docs[1]["spec"]["group"], "pt.fn.crossplane.io", "{text}");
    // The function is the entrypoint, as user nonroot.
    let config = read(&blob(&manifest["config"]["digest"]));
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/function"])
    );
    assert_eq!(config["config"]["User"], "65532:65532");
}

#[test]
fn function_serve_hosts_patch_and_transform() {
    if !require_root("function_serve_hosts_patch_and_transform") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = push(&registry);
    let cli = Cli::new().unwrap();
    let mut serve = cli.function_serve(&image).expect("it serves");
    let outcome = fnrun_tests::crossplane::Call::insecure(serve.addr())
        .authority("localhost:9443")
        .request(REQUEST)
        .run()
        .unwrap();
    assert_composed(&outcome, "fnrun function serve");
    let status = serve.stop().expect("it exits");
    assert!(status.success(), "{status:?}: {}", serve.log());
}

#[test]
fn serve_functions_hosts_patch_and_transform_root_and_rootless() {
    let registry = Registry::start().expect("registry starts");
    let image = push(&registry);
    for user in root_and_rootless("serve_functions_hosts_patch_and_transform_root_and_rootless") {
        let what = format!("fnrun serve --functions ({user:?})");
        let host = FunctionHost::start(
            HostOpts::insecure(vec![Entry::new(PATCH_AND_TRANSFORM.name, &image)])
                .user(user.clone()),
        )
        .expect("the host starts");
        // The first call starts the server: a 60 MB binary pulled, unpacked
        // and started on a loaded test machine may take more than the
        // default 30s.
        let outcome = host
            .call(PATCH_AND_TRANSFORM.name)
            .request(REQUEST)
            .timeout(std::time::Duration::from_secs(120))
            .run()
            .unwrap();
        assert_composed(&outcome, &what);
    }
}

/// A request as Crossplane sends function-auto-ready after
/// patch-and-transform: the ConfigMap `settings` desired (readiness
/// unspecified) and observed (it exists), and `other` desired but not
/// observed yet.
const AUTO_READY_REQUEST: &str = r#"
meta: {tag: auto-ready-1}
observed:
  composite:
    resource:
      apiVersion: example.fnrun.dev/v1
      kind: XApp
      metadata: {name: demo, namespace: demo}
      spec: {color: blue}
  resources:
    settings:
      resource:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: demo-settings, namespace: demo}
        data: {owner: fnrun, color: color-blue}
desired:
  composite:
    resource: {apiVersion: example.fnrun.dev/v1, kind: XApp}
  resources:
    settings:
      resource:
        apiVersion: v1
        kind: ConfigMap
        data: {owner: fnrun, color: color-blue}
    other:
      resource:
        apiVersion: v1
        kind: ConfigMap
        data: {owner: fnrun}
"#;

/// function-auto-ready, packaged from its release (a `meta.pkg.crossplane.io/v1`
/// Function, its module named otherwise than its repository) and served by
/// `fnrun function serve`: the observed ConfigMap is marked ready, the one
/// not observed yet is not.
#[test]
fn function_serve_hosts_auto_ready() {
    if !require_root("function_serve_hosts_auto_ready") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = AUTO_READY
        .image()
        .expect("function-auto-ready builds and packages")
        .push_to(
            &registry,
            &format!(
                "crossplane-contrib/{}:{}",
                AUTO_READY.name, AUTO_READY.version
            ),
        );
    let cli = Cli::new().unwrap();
    let mut serve = cli.function_serve(&image).expect("it serves");
    let outcome = fnrun_tests::crossplane::Call::insecure(serve.addr())
        .authority("localhost:9443")
        .request(AUTO_READY_REQUEST)
        .run()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let desired = &outcome.response()["desired"]["resources"];
    assert_eq!(desired["settings"]["ready"], "READY_TRUE", "{outcome:?}");
    assert_ne!(desired["other"]["ready"], "READY_TRUE", "{outcome:?}");
    assert_eq!(outcome.response()["meta"]["tag"], "auto-ready-1");
    let status = serve.stop().expect("it exits");
    assert!(status.success(), "{status:?}: {}", serve.log());
}
