//! Running cargo and rustc: where the workspace and its target dir are, the host
//! triple, and builds.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo to run: the one that runs us, else `cargo` from PATH.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed non-UTF-8"))
}

fn status(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// The target directory cargo uses for this workspace (honours
/// `CARGO_TARGET_DIR` and `build.target-dir`).
pub fn target_dir(root: &Path) -> Result<PathBuf> {
    let metadata =
        output(
            cargo()
                .current_dir(root)
                .args(["metadata", "--no-deps", "--format-version", "1"]),
        )?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).context("cannot parse cargo metadata")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}

/// The host's target triple, from `rustc -vV`.
pub fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let version = output(Command::new(rustc).arg("-vV"))?;
    parse_host(&version).context("`rustc -vV` printed no `host:` line")
}

fn parse_host(version: &str) -> Option<String> {
    version
        .lines()
        .find_map(|line| line.strip_prefix("host:"))
        .map(|host| host.trim().to_owned())
}

/// Builds `package` in release mode as a statically linked binary for `triple`
/// and stripped, and returns the binary's path.
///
/// With an explicit `--target`, RUSTFLAGS reach only the target's crates, not
/// proc-macros or build scripts, which must stay dynamic host binaries.
pub fn build_static(
    root: &Path,
    package: &str,
    triple: &str,
    target_dir: &Path,
) -> Result<PathBuf> {
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !rustflags.is_empty() {
        rustflags.push(' ');
    }
    rustflags.push_str("-C target-feature=+crt-static -C strip=symbols");
    eprintln!("xtask: building {package} (static, {triple})");
    status(
        cargo()
            .current_dir(root)
            // CARGO_ENCODED_RUSTFLAGS would win over RUSTFLAGS.
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("RUSTFLAGS", rustflags)
            .args([
                "build",
                "--release",
                "--package",
                package,
                "--target",
                triple,
            ]),
    )?;
    let binary = target_dir.join(triple).join("release").join(package);
    if !binary.is_file() {
        bail!("cargo built {package} but {} is missing", binary.display());
    }
    Ok(binary)
}

/// Builds `bin` of `package` in release mode for the host and returns its path.
pub fn build_release_bin(root: &Path, package: &str, bin: &str) -> Result<PathBuf> {
    eprintln!("xtask: building {package} (release)");
    status(cargo().current_dir(root).args([
        "build",
        "--release",
        "--package",
        package,
        "--bin",
        bin,
    ]))?;
    let binary = target_dir(root)?.join("release").join(bin);
    if !binary.is_file() {
        bail!("cargo built {package} but {} is missing", binary.display());
    }
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_host_line() {
        let version = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nrelease: 1.95.0\n";
        assert_eq!(
            parse_host(version).as_deref(),
            Some("x86_64-unknown-linux-gnu")
        );
        assert_eq!(parse_host("rustc 1.95.0\n"), None);
    }

    #[test]
    fn finds_the_workspace_root() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(
            workspace_root()
                .join("examples")
                .join("functionio.yaml")
                .is_file()
        );
    }
}
