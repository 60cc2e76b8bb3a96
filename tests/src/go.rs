//! Go programs of the tests, under `tests/go/<name>/`: gRPC clients built with
//! Debian's Go toolchain and its grpc-go (the library of Crossplane's
//! composition controller), in GOPATH mode and offline, against stubs that
//! `protoc` generates from `.proto` files at build time.
//!
//! A build is cached in [`tool_cache::dir`]`/go`, keyed by a hash of the
//! program's sources, the protos and the tools' versions: the first build takes
//! some ten seconds, later ones none.
//!
//! Programs that are not gRPC clients build the same way, against the same
//! libraries: `tests/go/krmfn`, a KRM function on `gopkg.in/yaml.v3`, is
//! built static and put into a test image ([`krm_function`]).
//!
//! Debian packages: golang-go, golang-google-grpc-dev,
//! golang-google-protobuf-dev, golang-gopkg-yaml.v3-dev, protobuf-compiler,
//! protoc-gen-go, protoc-gen-go-grpc (`scripts/test` installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process::check_output;
use crate::tool_cache::{self, Key, Protos};

/// Where Debian's `golang-*-dev` packages put their sources.
pub const DEBIAN_GOPATH: &str = "/usr/share/gocode";

/// The packages that provide what [`Toolchain::find`] looks for. grpc-go 1.33
/// marshals through `github.com/golang/protobuf`, which must be 1.4 or later
/// (a shim over `google.golang.org/protobuf`) to take the stubs
/// protoc-gen-go writes today.
pub const PACKAGES: &str = "golang-go golang-google-grpc-dev golang-google-protobuf-dev \
     golang-github-golang-protobuf-1-5-dev golang-gopkg-yaml.v3-dev protobuf-compiler \
     protoc-gen-go protoc-gen-go-grpc";

/// The Go libraries the programs build against: part of every build's key.
const LIBRARIES: &[&str] = &[
    "google.golang.org/grpc",
    "google.golang.org/protobuf",
    "github.com/golang/protobuf",
    "gopkg.in/yaml.v3",
];

/// The Go toolchain and the protoc plugins.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub go: PathBuf,
    pub protoc: PathBuf,
    pub protoc_gen_go: PathBuf,
    pub protoc_gen_go_grpc: PathBuf,
    /// The tools' versions, one per line: part of every build's key.
    pub versions: String,
}

impl Toolchain {
    /// Finds the tools on `PATH` (and `go` in `/usr/lib/go/bin`), and grpc-go
    /// under [`DEBIAN_GOPATH`].
    pub fn find() -> Result<Toolchain> {
        let missing = |what: &str| {
            anyhow::anyhow!(
                "{what} is missing; install the Debian packages {PACKAGES} (scripts/test does)"
            )
        };
        let go = find_program("go", &["/usr/lib/go/bin/go"]).ok_or_else(|| missing("go"))?;
        let protoc = find_program("protoc", &[]).ok_or_else(|| missing("protoc"))?;
        let protoc_gen_go =
            find_program("protoc-gen-go", &[]).ok_or_else(|| missing("protoc-gen-go"))?;
        let protoc_gen_go_grpc =
            find_program("protoc-gen-go-grpc", &[]).ok_or_else(|| missing("protoc-gen-go-grpc"))?;
        for library in LIBRARIES {
            if !Path::new(DEBIAN_GOPATH).join("src").join(library).is_dir() {
                return Err(missing(library));
            }
        }
        // grpc-go's codec needs github.com/golang/protobuf 1.4 or later (the
        // first with proto/registry.go): 1.3 cannot marshal today's stubs.
        if !Path::new(DEBIAN_GOPATH)
            .join("src/github.com/golang/protobuf/proto/registry.go")
            .is_file()
        {
            return Err(missing("github.com/golang/protobuf 1.4 or later"));
        }
        let mut versions = String::new();
        for (tool, arg) in [
            (&go, "version"),
            (&protoc, "--version"),
            (&protoc_gen_go, "--version"),
            (&protoc_gen_go_grpc, "--version"),
        ] {
            versions.push_str(check_output(Command::new(tool).arg(arg))?.trim());
            versions.push('\n');
        }
        Ok(Toolchain {
            go,
            protoc,
            protoc_gen_go,
            protoc_gen_go_grpc,
            versions,
        })
    }

    /// Builds `tests/go/<program>` (package `main`, importable as
    /// `fnrun.test/<program>`) with Go stubs for `protos`, which the program
    /// imports by their `go_package`; returns the binary.
    pub fn build(&self, program: &str, protos: &[Protos]) -> Result<PathBuf> {
        let sources = crate::workspace_root().join("tests/go").join(program);
        if !sources.is_dir() {
            bail!("{} is not a directory", sources.display());
        }
        let mut key = Key::new();
        key.part("tools", &self.versions).tree(&sources)?;
        for library in LIBRARIES {
            key.stat_tree(&Path::new(DEBIAN_GOPATH).join("src").join(library))?;
        }
        for set in protos {
            set.hash_into(&mut key)?;
        }
        let root = tool_cache::dir().join("go");
        let entry = root.join(format!("{program}-{}", key.short()));
        let entry = tool_cache::entry(&entry, |work| {
            self.build_into(work, program, &sources, protos)
        })?;
        Ok(entry.join(program))
    }

    fn build_into(
        &self,
        work: &Path,
        program: &str,
        sources: &Path,
        protos: &[Protos],
    ) -> Result<()> {
        let gopath = work.join("gopath");
        let src = gopath.join("src");
        let package = src.join("fnrun.test").join(program);
        std::fs::create_dir_all(&package)?;
        for file in tool_cache::files_under(sources)? {
            let to = package.join(file.strip_prefix(sources).unwrap_or(&file));
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::copy(&file, &to).with_context(|| format!("cannot copy {}", file.display()))?;
        }
        for set in protos {
            // protoc-gen-go needs every file's Go import path: a proto
            // without a go_package option gets its set's.
            let mapping: Vec<String> = set
                .go_package
                .iter()
                .flat_map(|package| {
                    set.files
                        .iter()
                        .map(move |file| format!("M{}={package}", file.display()))
                })
                .collect();
            check_output(
                Command::new(&self.protoc)
                    .arg(format!(
                        "--plugin=protoc-gen-go={}",
                        self.protoc_gen_go.display()
                    ))
                    .arg(format!(
                        "--plugin=protoc-gen-go-grpc={}",
                        self.protoc_gen_go_grpc.display()
                    ))
                    .arg("-I")
                    .arg(&set.root)
                    .arg(format!("--go_out={}", src.display()))
                    .arg(format!("--go-grpc_out={}", src.display()))
                    .args(mapping.iter().map(|m| format!("--go_opt={m}")))
                    .args(mapping.iter().map(|m| format!("--go-grpc_opt={m}")))
                    .args(&set.files),
            )
            .context("cannot generate the Go stubs")?;
        }
        let go_cache = tool_cache::dir().join("go").join("build-cache");
        check_output(
            Command::new(&self.go)
                .args(["build", "-o"])
                .arg(work.join(program))
                .arg(format!("fnrun.test/{program}"))
                .current_dir(work)
                .env("GO111MODULE", "off")
                .env("GOPATH", format!("{}:{DEBIAN_GOPATH}", gopath.display()))
                .env("GOPROXY", "off")
                .env("GOFLAGS", "")
                .env("GOENV", "off")
                .env("GOCACHE", &go_cache)
                .env("CGO_ENABLED", "0"),
        )
        .with_context(|| format!("cannot build tests/go/{program}"))?;
        std::fs::remove_dir_all(&gopath)?;
        Ok(())
    }
}

/// The KRM function `tests/go/krmfn` (static, on `gopkg.in/yaml.v3`) as an
/// image: its binary is the entrypoint, on busybox.
pub fn krm_function() -> Result<crate::image::TestImage> {
    let bin = Toolchain::find()?.build("krmfn", &[])?;
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
