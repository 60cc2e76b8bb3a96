//! What the Kubernetes tests of Crossplane share: a v2 XRD, a Composition
//! that pipelines the real function-patch-and-transform to compose a
//! ConfigMap, an XR of it, the shell blocks of docs/crossplane.md's steps,
//! and waits on conditions.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kube::ControlPlane;
use crate::process::run_capture;
use crate::workspace_root;

pub const XRD: &str = r#"
apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata:
  name: xapps.example.fnrun.dev
spec:
  group: example.fnrun.dev
  names:
    kind: XApp
    plural: xapps
  scope: Namespaced
  versions:
    - name: v1
      served: true
      referenceable: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                color:
                  type: string
"#;

pub const COMPOSITION: &str = r#"
apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: xapps.example.fnrun.dev
spec:
  compositeTypeRef:
    apiVersion: example.fnrun.dev/v1
    kind: XApp
  mode: Pipeline
  pipeline:
    - step: patch-and-transform
      functionRef:
        name: function-patch-and-transform
      input:
        apiVersion: pt.fn.crossplane.io/v1beta1
        kind: Resources
        resources:
          - name: settings
            base:
              apiVersion: v1
              kind: ConfigMap
              data:
                owner: fnrun
            patches:
              - type: FromCompositeFieldPath
                fromFieldPath: spec.color
                toFieldPath: data.color
                transforms:
                  - type: string
                    string:
                      type: Format
                      fmt: "color-%s"
            readinessChecks:
              - type: None
"#;

pub const XR: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
apiVersion: example.fnrun.dev/v1
kind: XApp
metadata:
  name: demo
  namespace: demo
spec:
  color: blue
"#;

/// The shell blocks of step `step` of docs/crossplane.md's section
/// `heading` (`## ...`), in order.
pub fn docs_step(heading: &str, step: u32) -> Vec<String> {
    let docs = std::fs::read_to_string(workspace_root().join("docs/crossplane.md")).unwrap();
    let section = docs
        .split(heading)
        .nth(1)
        .expect("the docs have the section")
        .split("\n## ")
        .next()
        .unwrap();
    let start = format!("\n{step}. ");
    let body = section
        .split(&start)
        .nth(1)
        .unwrap_or_else(|| panic!("the docs have no step {step}"));
    let body = body.split(&format!("\n{}. ", step + 1)).next().unwrap();
    body.split("```sh\n")
        .skip(1)
        .map(|block| {
            let block = block.split("```").next().unwrap();
            // The docs indent blocks inside the list item.
            block
                .lines()
                .map(|l| l.strip_prefix("   ").unwrap_or(l))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// Steps 2 and 3 of the docs' section `heading`, as the tests can follow
/// them: step 2 is Helm's way to pass `--package-runtime=Function=External`,
/// which [`crate::crossplane::Core`] gives Crossplane directly; of step 3 the
/// `kubectl apply` line is run in `dir` (there is no kubelet to roll the
/// manifests out: fnrun runs on the host as the Deployment says).
pub fn apply_steps_2_and_3(cp: &ControlPlane, dir: &Path, heading: &str) {
    assert!(
        docs_step(heading, 2)
            .concat()
            .contains("--package-runtime=Function=External")
    );
    let step3 = docs_step(heading, 3).concat();
    let apply = step3
        .lines()
        .find(|l| l.starts_with("kubectl apply"))
        .expect("step 3 applies the manifests");
    sh(cp, dir, apply);
}

/// Applies [`XRD`] and [`COMPOSITION`] once the XRD is established.
pub fn apply_xrd_and_composition(cp: &ControlPlane, log: &dyn Fn() -> String) {
    cp.apply(XRD).unwrap();
    wait_for(
        "the XRD established",
        Duration::from_secs(120),
        || {
            let xrd = cp.get_json(&["xrd", "xapps.example.fnrun.dev"]).ok()?;
            (condition(&xrd, "Established").as_deref() == Some("True")).then_some(())
        },
        log,
    );
    cp.apply(COMPOSITION).unwrap();
}

/// Runs `script` with `sh -e` in `dir`, with kubectl pointed at `cp`.
pub fn sh(cp: &ControlPlane, dir: &Path, script: &str) -> String {
    eprintln!("$ {script}");
    let out = run_capture(
        Command::new("sh")
            .args(["-ec", script])
            .current_dir(dir)
            .env("KUBECONFIG", cp.kubeconfig()),
        None,
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{script}: {out:?}");
    eprintln!("{}{}", out.stdout, out.stderr);
    out.stdout
}

/// Waits up to `timeout` for `check` to give a value.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    log: &dyn Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {timeout:?}\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn condition(object: &serde_json::Value, kind: &str) -> Option<String> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .map(str::to_owned)
}

/// Waits until the XApp `name` in namespace `demo` is Ready and Synced, and
/// checks the one ConfigMap composed for it.
pub fn assert_composed(cp: &ControlPlane, name: &str, color: &str, log: &dyn Fn() -> String) {
    let xr = wait_for(
        &format!("the XR {name} Ready"),
        Duration::from_secs(180),
        || {
            let xr = cp
                .get_json(&["xapps.example.fnrun.dev", name, "-n", "demo"])
                .ok()?;
            (condition(&xr, "Ready").as_deref() == Some("True")).then_some(xr)
        },
        log,
    );
    assert_eq!(condition(&xr, "Synced").as_deref(), Some("True"), "{xr}");
    let composed = cp
        .get_json(&[
            "configmaps",
            "-n",
            "demo",
            "-l",
            &format!("crossplane.io/composite={name}"),
        ])
        .unwrap();
    let items = composed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{composed}");
    assert_eq!(items[0]["data"]["owner"], "fnrun", "{composed}");
    assert_eq!(items[0]["data"]["color"], color, "{composed}");
    assert_eq!(
        items[0]["metadata"]["annotations"]["crossplane.io/composition-resource-name"], "settings",
        "{composed}"
    );
}
