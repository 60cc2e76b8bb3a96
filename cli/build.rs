//! Build facts for `fnrun --version`: git commit, target triple, rustc version.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = std::env::var("FNRUN_GIT_COMMIT")
        .ok()
        .or_else(|| output("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown commit".to_owned());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version = output(&rustc, &["--version"])
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FNRUN_GIT_COMMIT={commit}");
    println!(
        "cargo:rustc-env=FNRUN_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!("cargo:rustc-env=FNRUN_RUSTC_VERSION={rustc_version}");
    println!("cargo:rerun-if-env-changed=FNRUN_GIT_COMMIT");
    // Only where there is a git checkout: a path that does not exist would make
    // cargo rebuild every time (for example in a release tarball).
    if let Ok(head) = std::fs::read_to_string("../.git/HEAD") {
        println!("cargo:rerun-if-changed=../.git/HEAD");
        // HEAD names a branch, whose ref file is what moves on each commit.
        if let Some(branch) = head.trim().strip_prefix("ref: ") {
            for path in [
                format!("../.git/{branch}"),
                "../.git/packed-refs".to_owned(),
            ] {
                if std::path::Path::new(&path).exists() {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
        }
    }
}
