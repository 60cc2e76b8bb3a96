//! The Java program of the tests: `tests/java/`, a Maven module on grpc-java
//! (grpc-netty-shaded) and protobuf-java at the versions its pom.xml pins,
//! built with the machine's JDK 17 (`javac`, `java`) and Maven (`mvn`), the
//! Debian packages `openjdk-17-jdk-headless` and `maven` (`scripts/test`
//! installs them).
//!
//! Maven's local repository lives in the tests' tool cache
//! ([`tool_cache::dir`]`/maven/repository`): an artifact is downloaded once,
//! and a build whose artifacts are all there runs offline (`mvn -o`, tried
//! first). The build (the jar and its `lib/`) is cached in
//! [`tool_cache::dir`]`/java`, keyed by a hash of the module's files, the
//! protos it compiles and the versions of `java` and `mvn`. Maven runs at
//! `nice -n 10` on one thread: the machines are shared.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

use crate::go::find_program;
use crate::process::check_output;
use crate::tool_cache::{self, Key, Protos};

/// The module's jar, as `tests/java/pom.xml` names it.
const JAR: &str = "grpc-java-client.jar";

/// The protos the client compiles (`-Dfnrun.protos`, fnrun's `api/proto`).
fn protos() -> [Protos; 3] {
    [
        Protos::fnrun_v1alpha1(),
        Protos::fnrun_evaluator(),
        Protos::crossplane_v1(),
    ]
}

/// `java` and `mvn`: `$PATH`, else Debian's.
fn tools() -> Result<(PathBuf, PathBuf)> {
    let java = find_program("java", &["/usr/bin/java"]).context(
        "java is missing; install the Debian package openjdk-17-jdk-headless (scripts/test does)",
    )?;
    let mvn = find_program("mvn", &["/usr/bin/mvn"])
        .context("mvn is missing; install the Debian package maven (scripts/test does)")?;
    Ok((java, mvn))
}

/// `tests/java/`'s client, built once: its jar, whose manifest puts the
/// `lib/` beside it on the class path (`java -jar JAR`).
pub fn grpc_java_client() -> Result<PathBuf> {
    // The key asks `java` and `mvn` their versions: once per test process.
    static JAR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(jar) = JAR.get() {
        return Ok(jar.clone());
    }
    let jar = build()?;
    Ok(JAR.get_or_init(|| jar).clone())
}

fn build() -> Result<PathBuf> {
    let (java, mvn) = tools()?;
    let module = crate::workspace_root().join("tests/java");
    let mut key = Key::new();
    // Both print their versions on stderr (java) or stdout (mvn).
    key.part("java", version(&java, "-version")?)
        .part("mvn", version(&mvn, "-version")?)
        .part("pom.xml", std::fs::read(module.join("pom.xml"))?)
        .tree(&module.join("src"))?;
    for set in protos() {
        set.hash_into(&mut key)?;
    }
    let entry = tool_cache::dir()
        .join("java")
        .join(format!("grpc-java-client-{}", key.short()));
    let entry = tool_cache::entry(&entry, |work| {
        let src = work.join("src");
        // The module's pom.xml and src/ (not a developer's target/).
        for file in tool_cache::files_under(&module.join("src"))?
            .into_iter()
            .chain([module.join("pom.xml")])
        {
            let dest = src.join(file.strip_prefix(&module).unwrap_or(&file));
            if let Some(dir) = dest.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::copy(&file, &dest)
                .with_context(|| format!("cannot copy {}", file.display()))?;
        }
        let repository = tool_cache::dir().join("maven/repository");
        let protos = crate::workspace_root().join("api/proto");
        let package = |offline: bool| {
            let mut cmd = Command::new("nice");
            cmd.args(["-n", "10"])
                .arg(&mvn)
                .args(["-B", "-q", "-T", "1"])
                .args(offline.then_some("-o"))
                .arg(format!("-Dmaven.repo.local={}", repository.display()))
                .arg(format!("-Dfnrun.protos={}", protos.display()))
                .arg("package")
                .current_dir(&src)
                .env("MAVEN_OPTS", "-XX:ActiveProcessorCount=1");
            check_output(&mut cmd)
        };
        // Offline first: with every artifact in the local repository, no
        // registry is asked.
        if package(true).is_err() {
            package(false).context("cannot build tests/java with Maven")?;
        }
        let target = src.join("target");
        std::fs::rename(target.join(JAR), work.join(JAR))?;
        std::fs::rename(target.join("lib"), work.join("lib"))?;
        std::fs::remove_dir_all(&src)?;
        Ok(())
    })?;
    Ok(entry.join(JAR))
}

/// What `tool VERSION_FLAG` prints, on stdout and stderr.
fn version(tool: &Path, flag: &str) -> Result<String> {
    let out = Command::new(tool)
        .arg(flag)
        .output()
        .with_context(|| format!("cannot run {}", tool.display()))?;
    if !out.status.success() {
        bail!("{} {flag} failed: {:?}", tool.display(), out);
    }
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// `java -jar` the client with `args`, as a command to run.
pub fn grpc_java_command(args: &[&str]) -> Result<Command> {
    let jar = grpc_java_client()?;
    let (java, _) = tools()?;
    let mut cmd = Command::new(java);
    // A small JVM that starts fast: the client makes one call.
    cmd.args([
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
    ])
    .arg("-jar")
    .arg(jar)
    .args(args);
    Ok(cmd)
}
