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

/// `package.yaml` from a function's `package/` directory (see
/// [`UpstreamFunction::package_yaml`]).
pub fn package_yaml(dir: &Path) -> Result<String> {
    let path = dir.join("crossplane.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut meta: serde_json::Value =
        serde_norway::from_str(&text).with_context(|| format!("{} is not YAML", path.display()))?;
    if meta["apiVersion"] != "meta.pkg.crossplane.io/v1beta1" || meta["kind"] != "Function" {
        bail!(
            "{} is no meta.pkg.crossplane.io/v1beta1 Function",
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
