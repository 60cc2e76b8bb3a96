//! The real kpt (1.0.0-beta.56, at `/usr/bin/kpt`) runs fnrun as its exec
//! function, so that kpt runs function images without Docker:
//! `kpt fn eval DIR --exec "fnrun run --krm -q IMAGE"` and a Kptfile
//! pipeline's `exec:` under `kpt fn render --allow-exec`.
//!
//! kpt reads the package, builds the ResourceList (with its path, index
//! and id annotations, and the function-input ConfigMap of `-- key=value`),
//! runs fnrun with it on stdin, reads the ResourceList fnrun prints (also
//! when the function fails: it shows its results) and writes the package
//! back. The function is the Go KRM function of `tests/go/krmfn`, in a
//! real registry; fnrun runs as root (as CI runs these tests).

use std::path::Path;

use fnrun_tests::krm::{self, fnrun_exec, run_kpt, tree};
use fnrun_tests::process::Finished;
use serde_norway::Value;

/// The label `key` of every resource kpt reads in the package at `root`
/// (written by [`krm::write_package`]), by file.
fn labels(root: &Path, key: &str) -> Vec<(String, Option<String>)> {
    const SKIPPED: [&str; 3] = ["drafts/draft.yaml", "db/scratch.yaml", "UPPER.YAML"];
    tree(root)
        .into_iter()
        .filter(|(path, docs)| {
            !SKIPPED.contains(&path.as_str()) && docs.iter().all(Value::is_mapping)
        })
        .flat_map(|(path, docs)| {
            docs.into_iter().map(move |doc| {
                let label = doc["metadata"]["labels"][key].as_str().map(str::to_owned);
                (path.clone(), label)
            })
        })
        .collect()
}

#[track_caller]
fn assert_ok(out: &Finished) {
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn kpt_fn_eval_exec_runs_fnrun_on_a_package() {
    let Some(kpt) = krm::kpt("kpt_fn_eval_exec_runs_fnrun_on_a_package") else {
        return;
    };
    let (_registry, image, dir) = krm::setup();
    let pkg = dir.path().join("pkg");
    std::fs::create_dir(&pkg).expect("mkdir");
    krm::write_package(&pkg).expect("package");
    let before = tree(&pkg);
    let exec = fnrun_exec(dir.path(), "-q", &image);

    let out = run_kpt(
        &kpt,
        dir.path(),
        &[
            "fn",
            "eval",
            "pkg",
            "--exec",
            &exec,
            "--",
            "key=app",
            "value=web",
        ],
        None,
    );
    assert_ok(&out);
    let labelled = labels(&pkg, "app");
    // Nine resources, in eight files and a link to one of them.
    assert_eq!(labelled.len(), 8, "{labelled:?}");
    for (path, label) in &labelled {
        assert_eq!(label.as_deref(), Some("web"), "{path}: {}", out.describe());
    }
    // kpt shows the function's results and its stderr (fnrun's -q: the
    // function's own).
    assert!(out.stderr.contains("[PASS] \""), "{}", out.describe());
    assert!(
        out.stderr
            .contains("[info]: labelled 9 resources with app=web"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("krmfn: labelled 9 resources"),
        "{}",
        out.describe()
    );

    // A failed function: kpt shows its results from fnrun's stdout and the
    // exit code, and leaves the package as it was.
    let labelled = tree(&pkg);
    let out = run_kpt(
        &kpt,
        dir.path(),
        &[
            "fn",
            "eval",
            "pkg",
            "--exec",
            &exec,
            "--",
            "key=tier",
            "value=x",
            "fail=exit",
        ],
        None,
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("[FAIL] \""), "{}", out.describe());
    assert!(
        out.stderr.contains("[error] ") && out.stderr.contains(": value is not allowed"),
        "{}",
        out.describe()
    );
    assert!(out.stderr.contains("Exit code: 1"), "{}", out.describe());
    assert_eq!(tree(&pkg), labelled);
    assert_ne!(labelled, before);

    // kpt refuses its container flags with --exec: fnrun's go in the exec
    // string, quoted as a shell would.
    let exec = format!(
        "{} --env 'GREETING=hello world'",
        fnrun_exec(dir.path(), "-q", &image)
    );
    let out = run_kpt(
        &kpt,
        dir.path(),
        &[
            "fn",
            "eval",
            "pkg",
            "--exec",
            &exec,
            "--results-dir",
            "results",
            "--",
            "env=GREETING",
        ],
        None,
    );
    assert_ok(&out);
    let results = std::fs::read_to_string(dir.path().join("results/results.yaml"))
        .expect("kpt's results.yaml");
    assert!(
        results.contains("env GREETING=\\\"hello world\\\" set=true")
            || results.contains("env GREETING=\"hello world\" set=true"),
        "{results}"
    );
}

#[test]
fn kpt_fn_render_runs_a_kptfile_pipelines_exec_functions() {
    let Some(kpt) = krm::kpt("kpt_fn_render_runs_a_kptfile_pipelines_exec_functions") else {
        return;
    };
    let (_registry, image, dir) = krm::setup();
    let pkg = dir.path().join("app");
    std::fs::create_dir(&pkg).expect("mkdir");
    krm::write(
        &pkg,
        "resources.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: blue\n",
        0o644,
    )
    .expect("resources");
    // A mutator and a validator, each fnrun running the function's image.
    let kptfile = |validator: &str| {
        format!(
            "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\npipeline:\n  mutators:\n  - exec: \"{}\"\n    configMap:\n      key: tier\n      value: gold\n  validators:\n  - exec: \"{}\"\n    configMap:\n{validator}",
            fnrun_exec(dir.path(), "-q", &image),
            fnrun_exec(dir.path(), "-q", &image),
        )
    };
    krm::write(&pkg, "Kptfile", &kptfile("      key: checked\n"), 0o644).expect("Kptfile");
    let out = run_kpt(
        &kpt,
        dir.path(),
        &["fn", "render", "app", "--allow-exec"],
        None,
    );
    assert_ok(&out);
    let files = tree(&pkg);
    for doc in &files["resources.yaml"] {
        assert_eq!(
            doc["metadata"]["labels"]["tier"].as_str(),
            Some("gold"),
            "{}",
            out.describe()
        );
        // A validator's changes are not kept.
        assert_eq!(doc["metadata"]["labels"]["checked"], Value::Null);
    }
    // kpt gives the pipeline the Kptfile too.
    assert_eq!(
        files["Kptfile"][0]["metadata"]["labels"]["tier"].as_str(),
        Some("gold")
    );

    // A validator that fails fails the render, and nothing is written.
    krm::write(
        &pkg,
        "Kptfile",
        &kptfile("      key: checked\n      fail: result\n"),
        0o644,
    )
    .expect("Kptfile");
    let before = std::fs::read_to_string(pkg.join("resources.yaml")).expect("read");
    let out = run_kpt(
        &kpt,
        dir.path(),
        &["fn", "render", "app", "--allow-exec"],
        None,
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("value is not allowed"),
        "{}",
        out.describe()
    );
    assert_eq!(
        std::fs::read_to_string(pkg.join("resources.yaml")).expect("read"),
        before
    );

    // Without --allow-exec, kpt refuses to run it at all.
    let out = run_kpt(&kpt, dir.path(), &["fn", "render", "app"], None);
    assert_ne!(out.code, Some(0), "{}", out.describe());
}
