//! Go programs of the tests, built in module mode with one Go
//! ([`Toolchain::find`]: `/usr/local/go/bin/go` unless `$FNRUN_TEST_GO` names
//! another) from the Go module proxy, against versions pinned in go.mod and
//! go.sum files of the repository (`-mod=readonly`, `GOTOOLCHAIN=local`):
//!
//! - the module `fnrun.test` in `tests/go/`: gRPC clients and servers of the
//!   tests on grpc-go (the release Crossplane v2 ships) and
//!   `github.com/crossplane/function-sdk-go`, one `package main` per
//!   directory ([`Toolchain::build`]). Stubs for fnrun's own protos (v1alpha1,
//!   Porch's evaluator) are generated at build time by `protoc` with the
//!   plugins that module pins as tools.
//! - wrapper modules in `tests/go/upstream/NAME/`, one per released program
//!   (a public composition function, the `crossplane` command), that require
//!   only that program, so that it builds with the versions of its own go.mod
//!   ([`Toolchain::build_upstream`]).
//!
//! Builds are cached in [`tool_cache::dir`]`/go`, keyed by a hash of the
//! sources, go.mod, go.sum, the protos, the build flags and `go version`; the module cache
//! (`GOMODCACHE`) and the build cache (`GOCACHE`) are there too, so a
//! module is downloaded once and a program is built once. Go builds run at
//! `nice -n 10` with `GOMAXPROCS=2`: the machines are shared.
//!
//! Debian packages: protobuf-compiler (`scripts/test` installs it). The Go
//! toolchain is the machine's, in `/usr/local/go`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process::check_output;
use crate::tool_cache::{self, Key, Protos};

/// Where the machines have their Go toolchain: the one Go the tests use,
/// unless `$FNRUN_TEST_GO` names another.
pub const GO: &str = "/usr/local/go/bin/go";

/// The module path of `tests/go/`.
const MODULE: &str = "fnrun.test";

/// The protoc plugins `tests/go/go.mod` pins as tools.
const PLUGINS: [(&str, &str); 2] = [
    (
        "protoc-gen-go",
        "google.golang.org/protobuf/cmd/protoc-gen-go",
    ),
    (
        "protoc-gen-go-grpc",
        "google.golang.org/grpc/cmd/protoc-gen-go-grpc",
    ),
];

/// `go build`'s flags for every program here: paths of the build machine
/// left out, and no DWARF compiled for any package. Nothing in the tests
/// debugs these programs, and a Go panic's trace does not need DWARF. The
/// large builds of a fresh machine (kube-apiserver, Crossplane) compile and
/// link for several minutes, on the suite's critical path.
const BUILD_FLAGS: [&str; 2] = ["-trimpath", "-gcflags=all=-dwarf=false"];

/// The linker flags every build starts with: no symbol table, no DWARF.
const LDFLAGS: &str = "-s -w";

/// [`BUILD_FLAGS`] and [`LDFLAGS`], as part of a build's key: programs
/// built with other flags are built again.
fn build_flags_key() -> String {
    format!("{} -ldflags={LDFLAGS}", BUILD_FLAGS.join(" "))
}

/// The Go toolchain.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub go: PathBuf,
    /// `go version`: part of every build's key.
    pub version: String,
}

impl Toolchain {
    /// Finds Go: `$FNRUN_TEST_GO`, else [`GO`], whatever `PATH` says (an
    /// older `go` there, such as Debian's, cannot build these modules).
    pub fn find() -> Result<Toolchain> {
        let go = std::env::var_os("FNRUN_TEST_GO")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(GO));
        if !go.is_file() {
            bail!(
                "{} is missing: the tests build their Go programs with the Go toolchain in /usr/local/go \
                 (or the one $FNRUN_TEST_GO names)",
                go.display()
            );
        }
        let version = check_output(Command::new(&go).arg("version"))?
            .trim()
            .to_owned();
        Ok(Toolchain { go, version })
    }

    /// `go` with the tests' environment: caches under the tool cache, the
    /// pinned versions only, this toolchain only, static binaries, two
    /// threads at a low priority.
    fn command(&self, dir: &Path) -> Command {
        let cache = tool_cache::dir().join("go");
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "10"])
            .arg(&self.go)
            .current_dir(dir)
            .env("GOMODCACHE", cache.join("mod"))
            .env("GOCACHE", cache.join("build-cache"))
            .env("GOFLAGS", "-mod=readonly")
            .env("GOTOOLCHAIN", "local")
            .env("GOWORK", "off")
            .env("GO111MODULE", "on")
            .env("GOMAXPROCS", "2")
            .env("CGO_ENABLED", "0");
        cmd
    }

    /// `go build` as every build here runs it: [`BUILD_FLAGS`], then
    /// `-ldflags` with [`LDFLAGS`] and `extra_ldflags`.
    fn go_build(&self, dir: &Path, extra_ldflags: &str) -> Command {
        let mut cmd = self.command(dir);
        cmd.arg("build").args(BUILD_FLAGS);
        if extra_ldflags.is_empty() {
            cmd.arg(format!("-ldflags={LDFLAGS}"));
        } else {
            cmd.arg(format!("-ldflags={LDFLAGS} {extra_ldflags}"));
        }
        cmd
    }

    /// Builds `tests/go/<program>` (package `main` of the module
    /// `fnrun.test`) with Go stubs for `protos` (each imported by its
    /// [`Protos::go_package`], which must lie in `fnrun.test/`); returns the
    /// binary.
    pub fn build(&self, program: &str, protos: &[Protos]) -> Result<PathBuf> {
        let module = crate::workspace_root().join("tests/go");
        let sources = module.join(program);
        if !sources.is_dir() {
            bail!("{} is not a directory", sources.display());
        }
        let mut key = Key::new();
        key.part("go", &self.version)
            .part("flags", build_flags_key())
            .part("go.mod", read(&module.join("go.mod"))?)
            .part("go.sum", read(&module.join("go.sum"))?)
            .tree(&sources)?;
        for set in protos {
            set.hash_into(&mut key)?;
        }
        let entry = tool_cache::dir()
            .join("go")
            .join(format!("{program}-{}", key.short()));
        let entry = tool_cache::entry(&entry, |work| {
            let src = work.join("src");
            copy_module(&module, &src)?;
            copy_tree(&sources, &src.join(program))?;
            if !protos.is_empty() {
                self.generate(&src, protos)?;
            }
            check_output(
                self.go_build(&src, "")
                    .arg("-o")
                    .arg(work.join(program))
                    .arg(format!("./{program}")),
            )
            .with_context(|| format!("cannot build tests/go/{program}"))?;
            std::fs::remove_dir_all(&src)?;
            Ok(())
        })?;
        Ok(entry.join(program))
    }

    /// Builds `package` (a `package main`) in the wrapper module
    /// `tests/go/upstream/<module>` into a binary named `name`; returns it.
    pub fn build_upstream(&self, module: &str, package: &str, name: &str) -> Result<PathBuf> {
        self.build_upstream_with(module, package, name, "")
    }

    /// [`Toolchain::build_upstream`] with `-ldflags` (as `-X` settings that
    /// stamp a release's version), part of the build's key.
    pub fn build_upstream_with(
        &self,
        module: &str,
        package: &str,
        name: &str,
        ldflags: &str,
    ) -> Result<PathBuf> {
        self.build_upstream_full(module, package, name, ldflags, None)
    }

    /// [`Toolchain::build_upstream`] with cgo on and the build tags `tags`
    /// (runc: its C `nsenter` and libseccomp), part of the build's key.
    pub fn build_upstream_cgo(
        &self,
        module: &str,
        package: &str,
        name: &str,
        tags: &str,
    ) -> Result<PathBuf> {
        self.build_upstream_full(module, package, name, "", Some(tags))
    }

    fn build_upstream_full(
        &self,
        module: &str,
        package: &str,
        name: &str,
        ldflags: &str,
        cgo_tags: Option<&str>,
    ) -> Result<PathBuf> {
        let dir = crate::workspace_root()
            .join("tests/go/upstream")
            .join(module);
        let mut key = Key::new();
        key.part("go", &self.version)
            .part("flags", build_flags_key())
            .part("go.mod", read(&dir.join("go.mod"))?)
            .part("go.sum", read(&dir.join("go.sum"))?)
            .part("package", package);
        if !ldflags.is_empty() {
            key.part("ldflags", ldflags);
        }
        if let Some(tags) = cgo_tags {
            key.part("cgo-tags", tags);
        }
        let entry = tool_cache::dir()
            .join("go")
            .join(format!("{name}-{}", key.short()));
        let entry = tool_cache::entry(&entry, |work| {
            let src = work.join("src");
            copy_module(&dir, &src)?;
            let mut build = self.go_build(&src, ldflags);
            if let Some(tags) = cgo_tags {
                build.env("CGO_ENABLED", "1").arg(format!("-tags={tags}"));
            }
            check_output(build.arg("-o").arg(work.join(name)).arg(package))
                .with_context(|| format!("cannot build {package} in tests/go/upstream/{module}"))?;
            std::fs::remove_dir_all(&src)?;
            Ok(())
        })?;
        Ok(entry.join(name))
    }

    /// The directory of `module`'s sources (as the wrapper module
    /// `tests/go/upstream/<wrapper>` requires it) in the module cache,
    /// downloaded if need be.
    pub fn module_dir(&self, wrapper: &str, module: &str) -> Result<PathBuf> {
        let dir = crate::workspace_root()
            .join("tests/go/upstream")
            .join(wrapper);
        let work = tempfile::Builder::new()
            .prefix("fnrun-go-")
            .tempdir()
            .context("cannot create a temp dir")?;
        copy_module(&dir, work.path())?;
        let out = check_output(
            self.command(work.path())
                .args(["mod", "download", "-json"])
                .arg(module),
        )
        .with_context(|| format!("cannot download {module}"))?;
        let info: serde_json::Value = serde_json::from_str(&out)
            .with_context(|| format!("go mod download printed no JSON object: {out}"))?;
        info["Dir"]
            .as_str()
            .map(PathBuf::from)
            .with_context(|| format!("go mod download gave no directory for {module}: {out}"))
    }

    /// The protoc plugins of `tests/go/go.mod`, built once; returns their
    /// directory.
    fn plugins(&self) -> Result<PathBuf> {
        let module = crate::workspace_root().join("tests/go");
        let mut key = Key::new();
        key.part("go", &self.version)
            .part("flags", build_flags_key())
            .part("go.mod", read(&module.join("go.mod"))?)
            .part("go.sum", read(&module.join("go.sum"))?);
        let entry = tool_cache::dir()
            .join("go")
            .join(format!("protoc-plugins-{}", key.short()));
        tool_cache::entry(&entry, |work| {
            let src = work.join("src");
            copy_module(&module, &src)?;
            for (name, package) in PLUGINS {
                check_output(
                    self.go_build(&src, "")
                        .arg("-o")
                        .arg(work.join(name))
                        .arg(package),
                )
                .with_context(|| format!("cannot build {package}"))?;
            }
            std::fs::remove_dir_all(&src)?;
            Ok(())
        })
    }

    /// Writes Go stubs for `protos` into the module copy `src`.
    fn generate(&self, src: &Path, protos: &[Protos]) -> Result<()> {
        let protoc = find_program("protoc", &[]).context(
            "protoc is missing; install the Debian package protobuf-compiler (scripts/test does)",
        )?;
        let plugins = self.plugins()?;
        for set in protos {
            let package = set.go_package.as_deref().with_context(|| {
                format!("{:?} need a Go package for the Go programs", set.files)
            })?;
            if !package.starts_with(&format!("{MODULE}/")) {
                bail!("Go stubs go into the module {MODULE}, not {package}");
            }
            // The M mapping wins over the files' own go_package options.
            let mapping: Vec<String> = set
                .files
                .iter()
                .map(|file| format!("M{}={package}", file.display()))
                .collect();
            let mut cmd = Command::new(&protoc);
            for (name, _) in PLUGINS {
                cmd.arg(format!("--plugin={name}={}", plugins.join(name).display()));
            }
            check_output(
                cmd.arg("-I")
                    .arg(&set.root)
                    .arg(format!("--go_out={}", src.display()))
                    .arg(format!("--go-grpc_out={}", src.display()))
                    .arg(format!("--go_opt=module={MODULE}"))
                    .arg(format!("--go-grpc_opt=module={MODULE}"))
                    .args(mapping.iter().map(|m| format!("--go_opt={m}")))
                    .args(mapping.iter().map(|m| format!("--go-grpc_opt={m}")))
                    .args(&set.files),
            )
            .context("cannot generate the Go stubs")?;
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Copies a module's go.mod and go.sum from `module` into `to`.
fn copy_module(module: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for file in ["go.mod", "go.sum"] {
        std::fs::copy(module.join(file), to.join(file))
            .with_context(|| format!("cannot copy {}", module.join(file).display()))?;
    }
    Ok(())
}

/// Copies every file under `from` into `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for file in tool_cache::files_under(from)? {
        let dest = to.join(file.strip_prefix(from).unwrap_or(&file));
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::copy(&file, &dest).with_context(|| format!("cannot copy {}", file.display()))?;
    }
    Ok(())
}

/// The KRM function `tests/go/krmfn` (static, on `gopkg.in/yaml.v3`) as a
/// host binary: what kpt runs with `--exec`, to compare with fnrun running
/// its image.
pub fn krm_function_binary() -> Result<PathBuf> {
    Toolchain::find()?.build("krmfn", &[])
}

/// The KRM function `tests/go/krmfn` as an image: its binary is the
/// entrypoint, on busybox.
pub fn krm_function() -> Result<crate::image::TestImage> {
    let bin = krm_function_binary()?;
    let binary = std::fs::read(&bin).with_context(|| format!("cannot read {}", bin.display()))?;
    Ok(crate::image::TestImage::busybox()
        .file("/usr/local/bin/krmfn", binary, 0o755)
        .entrypoint(["/usr/local/bin/krmfn"]))
}

/// [`krm_function`] pushed to `registry` as `fns/krmfn:v1`, its reference;
/// panics if it cannot be built.
pub fn push_krm_function(registry: &crate::registry::Registry) -> String {
    krm_function()
        .expect("the Go KRM function builds")
        .push_to(registry, "fns/krmfn:v1")
}

/// `name` on `PATH`, else the first of `fallbacks` that exists.
pub fn find_program(name: &str, fallbacks: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|candidate| candidate.is_file())
}
