//! Kubernetes mode against the real peers (a Kubernetes control plane and
//! the real Crossplane core, as in `crossplane_controller.rs`): a Function
//! whose image fnrun refuses, here for `--max-image-bytes`, gets
//! `RuntimeHealthy` False on its active revision with why: the image and the
//! limit, bounded.

use std::time::Duration;

use fnrun_tests::crossplane::controller::{service_account_kubeconfig, start_fnrun};
use fnrun_tests::crossplane::xr::{apply_steps_2_and_3, docs_step, sh, wait_for};
use fnrun_tests::crossplane::{Core, NAMESPACE, PATCH_AND_TRANSFORM, loopback_ip};
use fnrun_tests::kube::ControlPlane;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::require_root;
use fnrun_tests::workspace_root;

/// The docs' section whose steps set fnrun up.
const STEPS: &str = "## In Kubernetes, step by step";

#[test]
fn an_image_over_the_size_limit_says_so_in_the_revision_status() {
    if !require_root("an_image_over_the_size_limit_says_so_in_the_revision_status") {
        return;
    }
    let fn_name = PATCH_AND_TRANSFORM.name;
    let registry = Registry::start().expect("registry starts");
    let package = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            &registry,
            &format!(
                "crossplane-contrib/{fn_name}:{}",
                PATCH_AND_TRANSFORM.version
            ),
        );
    let cp = ControlPlane::start().expect("etcd and kube-apiserver start");
    let ip = loopback_ip();
    let core = Core::start(&cp, &[(&format!("{fn_name}.{NAMESPACE}"), ip)], &[])
        .expect("crossplane starts");
    let root = workspace_root();
    for block in docs_step(STEPS, 1) {
        sh(&cp, &root, &block);
    }
    apply_steps_2_and_3(&cp, &root, STEPS);
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&cp, work.path());
    let fnrun = start_fnrun(
        &cp,
        &kubeconfig,
        ip,
        "fnrun-a",
        &["--max-image-bytes", "1Mi"],
    );
    let logs = || {
        format!(
            "--- crossplane ---\n{}\n{}\n--- fnrun ---\n{}",
            core.log_tail(60),
            cp.log_tails(),
            fnrun.log()
        )
    };

    cp.apply(&format!(
        "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {fn_name}\nspec:\n  package: {package}\n"
    ))
    .unwrap();
    let unhealthy = wait_for(
        "RuntimeHealthy False with why",
        Duration::from_secs(180),
        || {
            let revisions = cp
                .get_json(&[
                    "functionrevisions",
                    "-l",
                    &format!("pkg.crossplane.io/package={fn_name}"),
                ])
                .ok()?;
            let active = revisions["items"]
                .as_array()?
                .iter()
                .find(|r| r["spec"]["desiredState"] == "Active")?
                .clone();
            let c = active["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "RuntimeHealthy")?
                .clone();
            (c["status"] == "False").then_some(c)
        },
        &logs,
    );
    let message = unhealthy["message"].as_str().unwrap_or_default();
    eprintln!("RuntimeHealthy: {message}");
    assert!(
        message.contains(&package)
            && message.contains("exceeds the unpacked size limit of 1048576 bytes"),
        "{unhealthy}"
    );
    assert!(message.len() <= 2048, "{unhealthy}");
}
