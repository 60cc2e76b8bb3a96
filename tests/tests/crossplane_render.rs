//! The real `crossplane render` (the CLI of `github.com/crossplane/cli/v2`
//! and the render engine of Crossplane's core, built from their modules:
//! `fnrun_tests::crossplane::render`) against `fnrun function serve` of the
//! real function-patch-and-transform package, as docs/crossplane.md's "From
//! a terminal" section says: each Function with the Development runtime, the
//! first on `fnrun function serve`'s default address (the runtime's default
//! target), the second on `--listen 127.0.0.1:9444` with the
//! `render.crossplane.io/runtime-development-target` annotation. fnrun runs
//! as root and rootless.

use fnrun_tests::cli::Cli;
use fnrun_tests::crossplane::PATCH_AND_TRANSFORM;
use fnrun_tests::crossplane::render::{crossplane, rendered};
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{TestUser, require_root, root_and_rootless};
use serde_json::json;

const XR: &str = include_str!("../data/crossplane/render/xr.yaml");
const COMPOSITION: &str = include_str!("../data/crossplane/render/composition.yaml");

/// The functions file of docs/crossplane.md, one Function per server.
fn functions(image: &str) -> String {
    format!(
        "apiVersion: pkg.crossplane.io/v1beta1
kind: Function
metadata:
  name: function-patch-and-transform
  annotations:
    render.crossplane.io/runtime: Development
spec:
  package: {image}
---
apiVersion: pkg.crossplane.io/v1beta1
kind: Function
metadata:
  name: function-patch-and-transform-2
  annotations:
    render.crossplane.io/runtime: Development
    render.crossplane.io/runtime-development-target: 127.0.0.1:9444
spec:
  package: {image}
"
    )
}

/// The composed resource `name` of `objects`, by Crossplane's
/// `crossplane.io/composition-resource-name` annotation.
fn composed<'a>(objects: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    let found: Vec<&serde_json::Value> = objects
        .iter()
        .filter(|o| o["metadata"]["annotations"]["crossplane.io/composition-resource-name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one composed resource {name}: {objects:#?}");
    found[0]
}

#[test]
fn crossplane_render_runs_a_pipeline_of_patch_and_transform_on_fnrun_function_serve() {
    let name = "crossplane_render_runs_a_pipeline_of_patch_and_transform_on_fnrun_function_serve";
    if !require_root(name) {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            &registry,
            "crossplane-contrib/function-patch-and-transform:v0.10.7",
        );
    for user in root_and_rootless(name) {
        render_with_function_serve(&image, user);
    }
}

/// The docs' steps, with `fnrun function serve` run as `user` (root if
/// none); `crossplane` runs as root.
fn render_with_function_serve(image: &str, user: Option<TestUser>) {
    let what = format!("{user:?}");
    let cli = match user {
        Some(user) => Cli::as_user(user).unwrap(),
        None => Cli::new().unwrap(),
    };
    let xr = cli.write_file("xr.yaml", XR).unwrap();
    let composition = cli.write_file("composition.yaml", COMPOSITION).unwrap();
    let fns = cli.write_file("functions.yaml", functions(image)).unwrap();

    // The docs' first command only: the first step's function is served, the
    // second's is not, and the render engine waits for it until --timeout.
    let render = |timeout: &str| {
        crossplane(
            cli.scratch(),
            &["render", &xr, &composition, &fns, "--timeout", timeout],
        )
        .unwrap()
    };
    let mut first = cli
        .function_serve_with(&[], image)
        .expect("fnrun function serve IMAGE serves");
    let out = render("10s");
    assert_ne!(out.code, Some(0), "{what}: {}", out.describe());

    // And the second.
    let mut second = cli
        .function_serve_with(&["--listen", "127.0.0.1:9444"], image)
        .expect("fnrun function serve --listen 127.0.0.1:9444 IMAGE serves");
    let out = render("60s");
    let objects = rendered(&out).unwrap_or_else(|e| {
        panic!(
            "{what}: {e:#}\nfirst server: {}\nsecond server: {}",
            first.log(),
            second.log()
        )
    });

    // The XR, then the composed resources: each ConfigMap as
    // function-patch-and-transform composes it from its base and patches,
    // with what Crossplane adds to every composed resource of a namespaced
    // XR: its composition-resource-name, a name generated from the XR's, the
    // XR's label and namespace, and the XR as controller.
    assert_eq!(objects.len(), 3, "{objects:#?}");
    let xr = &objects[0];
    assert_eq!(xr["apiVersion"], "example.fnrun.dev/v1", "{xr}");
    assert_eq!(xr["kind"], "XApp", "{xr}");
    assert_eq!(xr["metadata"]["name"], "demo", "{xr}");
    let synced = xr["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Synced"))
        .unwrap_or_else(|| panic!("no Synced condition: {xr}"));
    assert_eq!(synced["status"], "True", "{xr}");
    let mut names = Vec::new();
    let mut uids = Vec::new();
    for (resource, data, labels) in [
        (
            "settings",
            json!({"owner": "fnrun", "color": "color-blue"}),
            json!({"crossplane.io/composite": "demo"}),
        ),
        (
            "sizing",
            json!({"step": "sizing", "replicas": "3"}),
            json!({"crossplane.io/composite": "demo", "example.fnrun.dev/app": "demo"}),
        ),
    ] {
        let mut object = composed(&objects, resource).clone();
        let metadata = object["metadata"].as_object_mut().expect("metadata");
        let name = metadata.remove("name").unwrap_or_default();
        let owners = metadata
            .get_mut("ownerReferences")
            .and_then(|o| o.as_array_mut())
            .unwrap_or_else(|| panic!("no ownerReferences: {objects:#?}"));
        let uid = owners
            .first_mut()
            .and_then(|o| o.as_object_mut())
            .and_then(|o| o.remove("uid"))
            .unwrap_or_default();
        assert!(
            name.as_str().is_some_and(|n| n.starts_with("demo-")),
            "{resource}: {objects:#?}"
        );
        assert!(
            uid.as_str().is_some_and(|u| !u.is_empty()),
            "{resource}: {objects:#?}"
        );
        names.push(name);
        uids.push(uid);
        assert_eq!(
            object,
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "annotations": {"crossplane.io/composition-resource-name": resource},
                    "generateName": "demo-",
                    "labels": labels,
                    "namespace": "default",
                    "ownerReferences": [{
                        "apiVersion": "example.fnrun.dev/v1",
                        "kind": "XApp",
                        "name": "demo",
                        "controller": true,
                        "blockOwnerDeletion": true,
                    }],
                },
                "data": data,
            }),
            "{resource}: {objects:#?}"
        );
    }
    assert_ne!(names[0], names[1], "{objects:#?}");
    assert_eq!(uids[0], uids[1], "one owner: {objects:#?}");
    let refs: Vec<&serde_json::Value> = xr["spec"]["crossplane"]["resourceRefs"]
        .as_array()
        .unwrap_or_else(|| panic!("no resourceRefs: {xr}"))
        .iter()
        .map(|r| &r["name"])
        .collect();
    assert_eq!(refs.len(), 2, "{xr}");
    assert!(names.iter().all(|n| refs.contains(&n)), "{xr}: {names:?}");

    // Without the first, the first step's function is gone.
    let status = first.stop().expect("it exits");
    assert!(status.success(), "{what}: {status:?}: {}", first.log());
    let out = render("10s");
    assert_ne!(out.code, Some(0), "{what}: {}", out.describe());
    let status = second.stop().expect("it exits");
    assert!(status.success(), "{what}: {status:?}: {}", second.log());
}
