//! The real `crossplane render`: the `crossplane` command of
//! `github.com/crossplane/cli/v2` ([`crossplane_cli`], wrapper module
//! `tests/go/upstream/crossplane-cli`) and the render engine it runs,
//! `crossplane internal render` of Crossplane's core binary
//! ([`render_engine`], `tests/go/upstream/crossplane-render-engine`), both
//! built from their modules at pinned releases.
//!
//! From v2.3 `crossplane render` no longer runs the pipeline itself: it
//! hands a `RenderRequest` to the core's reconciler engine, in the Crossplane
//! image under Docker unless `--crossplane-binary` names a local core binary.
//! The engine calls each Function at the target its runtime gives: with the
//! `Development` runtime, `localhost:9443` or the Function's
//! `render.crossplane.io/runtime-development-target`, over h2c.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::go::Toolchain;
use crate::process::{Finished, run_capture};

/// The `crossplane` command (the CLI), built once.
pub fn crossplane_cli() -> Result<PathBuf> {
    Toolchain::find()?.build_upstream(
        "crossplane-cli",
        "github.com/crossplane/cli/v2/cmd/crossplane",
        "crossplane",
    )
}

/// Crossplane's core binary, for its `internal render` (what
/// `--crossplane-binary` takes), built once: the one
/// [`Core`](super::Core) runs, version-stamped as the release is.
pub fn render_engine() -> Result<PathBuf> {
    super::crossplane_binary()
}

/// The longest one `crossplane render` may take (its own `--timeout` is 1m).
pub const RENDER_GUARD: Duration = Duration::from_secs(150);

/// `crossplane ARGS...` in `dir`, with `--crossplane-binary` set to
/// [`render_engine`] when `args` start with `render`.
pub fn crossplane(dir: &Path, args: &[&str]) -> Result<Finished> {
    let mut cmd = Command::new(crossplane_cli()?);
    cmd.args(args).current_dir(dir).env("NO_COLOR", "1");
    if args.first() == Some(&"render") {
        cmd.arg(format!(
            "--crossplane-binary={}",
            render_engine()?.display()
        ));
    }
    Ok(run_capture(&mut cmd, None, RENDER_GUARD))
}

/// The objects of `crossplane render`'s output (a YAML stream), as JSON.
pub fn rendered(out: &Finished) -> Result<Vec<serde_json::Value>> {
    if out.code != Some(0) {
        bail!("crossplane render failed: {}", out.describe());
    }
    serde_norway::Deserializer::from_str(&out.stdout)
        .map(|doc| serde::Deserialize::deserialize(doc).map_err(anyhow::Error::from))
        .filter(|doc| !matches!(doc, Ok(serde_json::Value::Null)))
        .collect::<Result<Vec<serde_json::Value>>>()
        .with_context(|| {
            format!(
                "crossplane render printed no YAML stream: {}",
                out.describe()
            )
        })
}
