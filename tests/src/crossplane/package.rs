//! Released composition functions, built from their module sources at a
//! pinned release ([`Toolchain::build_upstream`]), and packaged as Crossplane
//! packages the way `crossplane xpkg build` packages a function-sdk-go
//! function: the static binary at [`FUNCTION_PATH`] as the entrypoint, user
//! `65532`, and on top one layer with `package.yaml` whose descriptor carries
//! `io.crossplane.xpkg: base`, which Crossplane's package manager reads: the
//! release's own `package/crossplane.yaml` (a `meta.pkg.crossplane.io/v1beta1`
//! `Function`) with a Crossplane version constraint, then the CRDs of
//! `package/input/`, as one YAML stream.
//!
//! The one harness for packaging functions: [`UpstreamFunction::image`] for a
//! released function, [`package_image`] for any binary.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::go_function::{FUNCTION_PATH, FUNCTION_USER, GROUP, PASSWD};
use crate::go::Toolchain;
use crate::image::TestImage;

/// The layer annotation that marks a package's `package.yaml` layer.
pub const XPKG_ANNOTATION: (&str, &str) = ("io.crossplane.xpkg", "base");

/// The Crossplane versions the packages here declare they work with.
pub const CROSSPLANE_CONSTRAINT: &str = ">=v2.0.0-0";

/// A released function, built from its Go module at a pinned release.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamFunction {
    /// The package's name (`metadata.name` of its `Function`).
    pub name: &'static str,
    /// Its Go module, whose root is its `package main`.
    pub module: &'static str,
    /// The release, as pinned in `tests/go/upstream/<name>/go.mod`.
    pub version: &'static str,
}

/// `crossplane-contrib/function-patch-and-transform`: Crossplane's patch &
/// transform composition as a function.
pub const PATCH_AND_TRANSFORM: UpstreamFunction = UpstreamFunction {
    name: "function-patch-and-transform",
    module: "github.com/crossplane-contrib/function-patch-and-transform",
    version: "v0.10.7",
};

/// `crossplane-contrib/function-auto-ready`: marks composed resources ready
/// by their kind's health checks (a ConfigMap is ready once it exists). Its
/// go.mod names it `github.com/crossplane/function-auto-ready`, the name
/// it is built by; `tests/go/upstream/function-auto-ready` maps that name to
/// the repository's, which the Go module proxy serves it under (`replace`).
pub const AUTO_READY: UpstreamFunction = UpstreamFunction {
    name: "function-auto-ready",
    module: "github.com/crossplane/function-auto-ready",
    version: "v0.7.0",
};

impl UpstreamFunction {
    /// The function's binary (static), built once.
    pub fn binary(&self) -> Result<PathBuf> {
        Toolchain::find()?.build_upstream(self.name, self.module, self.name)
    }

    /// The module's sources as the Go module proxy served them (read-only,
    /// in the tests' module cache).
    pub fn sources(&self) -> Result<PathBuf> {
        let dir = Toolchain::find()?.module_dir(self.name, self.module)?;
        let go_mod = std::fs::read_to_string(dir.join("go.mod"))?;
        if !go_mod.starts_with(&format!("module {}\n", self.module)) {
            bail!(
                "{} holds another module than {}",
                dir.display(),
                self.module
            );
        }
        Ok(dir)
    }

    /// `package.yaml` of the release: its `package/crossplane.yaml` with
    /// `spec.crossplane.version` [`CROSSPLANE_CONSTRAINT`], then every file of
    /// `package/input/`, sorted, as one YAML stream.
    pub fn package_yaml(&self) -> Result<String> {
        package_yaml(&self.sources()?.join("package"))
    }

    /// The package image: see the module's documentation.
    pub fn image(&self) -> Result<TestImage> {
        Ok(package_image(&self.binary()?, &self.package_yaml()?))
    }
}

/// The `apiVersion`s of a package's `crossplane.yaml` that [`package_yaml`]
/// takes (function-patch-and-transform's is `v1beta1`, function-auto-ready's
/// `v1`).
const META_API_VERSIONS: [&str; 2] = [
    "meta.pkg.crossplane.io/v1",
    "meta.pkg.crossplane.io/v1beta1",
];

/// `package.yaml` from a function's `package/` directory (see
/// [`UpstreamFunction::package_yaml`]).
pub fn package_yaml(dir: &Path) -> Result<String> {
    let path = dir.join("crossplane.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut meta: serde_json::Value =
        serde_norway::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))?;
    let api_version = meta["apiVersion"].as_str().unwrap_or_default();
    if !META_API_VERSIONS.contains(&api_version) || meta["kind"] != "Function" {
        bail!(
            "{} is no meta.pkg.crossplane.io/v1 or v1beta1 Function",
            path.display()
        );
    }
    if !meta["spec"].is_object() {
        meta["spec"] = serde_json::json!({});
    }
    meta["spec"]["crossplane"]["version"] = CROSSPLANE_CONSTRAINT.into();
    let mut stream = serde_norway::to_string(&meta)?;
    let inputs = dir.join("input");
    if inputs.is_dir() {
        for file in crate::tool_cache::files_under(&inputs)? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            stream.push_str("---\n");
            stream.push_str(text.trim_start_matches("---\n"));
            if !stream.ends_with('\n') {
                stream.push('\n');
            }
        }
    }
    Ok(stream)
}

/// A function package image: `binary` at [`FUNCTION_PATH`], entrypoint
/// `[/function]` (a runtime appends `--insecure` or its TLS flags), user
/// [`FUNCTION_USER`] with `nonroot` in `/etc/passwd`, no shell (as on
/// distroless), and the annotated `package.yaml` layer on top.
pub fn package_image(binary: &Path, package_yaml: &str) -> TestImage {
    TestImage::scratch()
        .binary(binary.to_path_buf(), FUNCTION_PATH)
        .file("/etc/passwd", PASSWD, 0o644)
        .file("/etc/group", GROUP, 0o644)
        .dir("/home/nonroot", 0o755)
        .entrypoint([FUNCTION_PATH])
        .user(FUNCTION_USER)
        .annotated_layer([("/package.yaml", package_yaml)], &[XPKG_ANNOTATION])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package_dir(crossplane_yaml: &str, inputs: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("crossplane.yaml"), crossplane_yaml).unwrap();
        if !inputs.is_empty() {
            std::fs::create_dir(dir.path().join("input")).unwrap();
        }
        for (name, text) in inputs {
            std::fs::write(dir.path().join("input").join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn package_yaml_takes_v1_and_v1beta1_functions_and_sets_the_constraint() {
        for api in META_API_VERSIONS {
            let dir = package_dir(
                &format!("---\napiVersion: {api}\nkind: Function\nmetadata:\n  name: f\n"),
                &[("b.yaml", "kind: B\n"), ("a.yaml", "---\nkind: A")],
            );
            let stream = package_yaml(dir.path()).unwrap();
            let docs: Vec<serde_json::Value> = stream
                .split("---\n")
                .filter(|d| !d.trim().is_empty())
                .map(|d| serde_norway::from_str(d).unwrap())
                .collect();
            assert_eq!(docs.len(), 3, "{stream}");
            assert_eq!(docs[0]["apiVersion"], api);
            assert_eq!(
                docs[0]["spec"]["crossplane"]["version"],
                CROSSPLANE_CONSTRAINT
            );
            // The inputs, sorted by file name.
            assert_eq!(docs[1]["kind"], "A");
            assert_eq!(docs[2]["kind"], "B");
        }
    }

    #[test]
    fn package_yaml_refuses_what_is_no_function() {
        for text in [
            "apiVersion: meta.pkg.crossplane.io/v1\nkind: Provider\n",
            "apiVersion: meta.pkg.crossplane.io/v2\nkind: Function\n",
        ] {
            let dir = package_dir(text, &[]);
            let err = package_yaml(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains("is no meta.pkg.crossplane.io/v1 or v1beta1 Function"),
                "{err}"
            );
        }
    }
}
