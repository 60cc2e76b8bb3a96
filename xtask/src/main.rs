//! fnrun's development tasks, run as `cargo xtask <task>`.
//!
//! - `cargo xtask demo-image [--out DIR] [--tag TAG]`: builds `examples/demo-function`
//!   as a static binary and writes it as an OCI image layout (default
//!   `target/demo/oci`, tag `latest`).
//! - `cargo xtask demo`: builds the demo image and `fnrun`, then runs
//!   `fnrun run oci:target/demo/oci:latest examples/functionio.yaml`.

mod cargo;
mod elf;
mod oci;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "fnrun development tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the static demo function and write it as an OCI image layout.
    DemoImage(DemoImageArgs),
    /// Build the demo image and fnrun, then run the demo function on
    /// examples/functionio.yaml with `fnrun run`.
    Demo(DemoImageArgs),
}

#[derive(clap::Args)]
struct DemoImageArgs {
    /// Where to write the OCI image layout [default: TARGET_DIR/demo/oci].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The tag (`org.opencontainers.image.ref.name`) of the image.
    #[arg(long, default_value = "latest")]
    tag: String,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let root = cargo::workspace_root();
    match cli.task {
        Task::DemoImage(args) => {
            demo_image(&root, &args)?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Demo(args) => demo(&root, &args),
    }
}

/// Builds the demo image; returns the layout directory.
fn demo_image(root: &Path, args: &DemoImageArgs) -> Result<PathBuf> {
    let target_dir = cargo::target_dir(root)?;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => target_dir.join("demo").join("oci"),
    };
    let triple = cargo::host_triple()?;
    let binary = cargo::build_static(root, "demo-function", &triple, &target_dir)?;
    let function =
        std::fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
    if elf::has_interpreter(&function) {
        bail!(
            "{} is dynamically linked (it has an ELF interpreter); the demo image needs a static binary",
            binary.display()
        );
    }
    let arch = oci::architecture(std::env::consts::ARCH)?;
    let image = oci::write_layout(&out, &function, arch, &args.tag)?;
    eprintln!(
        "xtask: wrote oci:{}:{} ({arch}/linux)\n  manifest {}\n  config   {} ({} bytes)\n  layer    {} ({} bytes, diff_id {})",
        out.display(),
        args.tag,
        image.manifest_digest,
        image.config.digest,
        image.config.size,
        image.layer.digest,
        image.layer.size,
        image.diff_id,
    );
    Ok(out)
}

/// Builds the demo image and fnrun and runs the demo function; exits as fnrun did.
fn demo(root: &Path, args: &DemoImageArgs) -> Result<ExitCode> {
    let layout = demo_image(root, args)?;
    let fnrun = cargo::build_release_bin(root, "fnrun", "fnrun")?;
    let input = root.join("examples").join("functionio.yaml");
    let image = format!("oci:{}:{}", layout.display(), args.tag);
    eprintln!("xtask: {} run {image} {}", fnrun.display(), input.display());
    let status = Command::new(&fnrun)
        .arg("run")
        .arg(&image)
        .arg(&input)
        .status()
        .with_context(|| format!("cannot start {}", fnrun.display()))?;
    Ok(exit_code(status))
}

/// Maps a child's exit status to ours, the way a shell does (128 + signal).
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
