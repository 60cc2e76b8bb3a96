//! A cache for what the tests build or install once and reuse across runs: a
//! Python venv, compiled Go clients, generated stubs. Entries are keyed by a
//! hash of everything that goes into them, built aside and renamed into place,
//! so an entry is either whole or absent; a lock keeps concurrent test
//! processes from building the same entry twice.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

/// The cache's root: `$FNRUN_TEST_CACHE`, else `/var/cache/fnrun-tests` as root,
/// else `$XDG_CACHE_HOME/fnrun-tests` (`~/.cache/fnrun-tests`).
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FNRUN_TEST_CACHE") {
        return PathBuf::from(dir);
    }
    if crate::user::is_root() {
        return PathBuf::from("/var/cache/fnrun-tests");
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fnrun-tests")
}

/// Holds an exclusive lock on `<dir>/<name>.lock` until dropped.
pub fn lock(dir: &Path, name: &str) -> Result<Flock<File>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("{name}.lock"));
    let file = File::create(&path).with_context(|| format!("cannot open {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("cannot lock {}", path.display()))
}

/// A cache key: a SHA-256 over labelled parts, so that no two different
/// sequences of parts give the same bytes.
#[derive(Default)]
pub struct Key(Sha256);

impl Key {
    pub fn new() -> Key {
        Key::default()
    }

    /// Adds one labelled part.
    pub fn part(&mut self, label: &str, bytes: impl AsRef<[u8]>) -> &mut Key {
        let bytes = bytes.as_ref();
        for piece in [label.as_bytes(), bytes] {
            self.0.update((piece.len() as u64).to_le_bytes());
            self.0.update(piece);
        }
        self
    }

    /// Adds every file under `dir` (relative path and contents, in order).
    pub fn tree(&mut self, dir: &Path) -> Result<&mut Key> {
        for path in files_under(dir)? {
            let contents =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let relative = path.strip_prefix(dir).unwrap_or(&path);
            self.part(&relative.to_string_lossy(), contents);
        }
        Ok(self)
    }

    /// The first 16 hex digits of the hash.
    pub fn short(&self) -> String {
        let digest = self.0.clone().finalize();
        hex::encode(&digest[..8])
    }
}

/// Every regular file under `dir`, sorted.
pub fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Builds the cache entry `path` with `build` (given a fresh directory next to
/// it, which it fills) unless it exists, under a lock; returns `path`.
pub fn entry(path: &Path, build: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let parent = path.parent().context("a cache entry has a parent")?;
    let name = path
        .file_name()
        .context("a cache entry has a name")?
        .to_string_lossy()
        .into_owned();
    let _lock = lock(parent, &name)?;
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let work = tempfile::Builder::new()
        .prefix(&format!(".{name}-"))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
    build(work.path())?;
    let work = work.keep();
    std::fs::rename(&work, path)
        .with_context(|| format!("cannot rename {} to {}", work.display(), path.display()))?;
    Ok(path.to_path_buf())
}

/// A set of `.proto` files under one import root.
#[derive(Debug, Clone)]
pub struct Protos {
    /// The import root (`-I`).
    pub root: PathBuf,
    /// The files, relative to `root`.
    pub files: Vec<PathBuf>,
    /// The Go import path the tests' Go programs import the files' stubs
    /// by, in the module `fnrun.test` (it wins over a `go_package` option);
    /// none for protos no Go program uses.
    pub go_package: Option<String>,
}

impl Protos {
    /// fnrun's `apiextensions.fn.proto.v1alpha1` API (`api/proto`); Go
    /// imports it as `fnrun.test/gen/v1alpha1`.
    pub fn fnrun_v1alpha1() -> Protos {
        Protos {
            root: crate::workspace_root().join("api/proto"),
            files: vec![PathBuf::from(
                "apiextensions/fn/proto/v1alpha1/run_function.proto",
            )],
            go_package: Some("fnrun.test/gen/v1alpha1".to_owned()),
        }
    }

    /// Porch's `evaluator` API (`api/proto/evaluator`); Go imports it as
    /// `fnrun.test/evaluator`.
    pub fn fnrun_evaluator() -> Protos {
        Protos {
            root: crate::workspace_root().join("api/proto"),
            files: vec![PathBuf::from("evaluator/evaluator.proto")],
            go_package: Some("fnrun.test/evaluator".to_owned()),
        }
    }

    /// Crossplane's `apiextensions.fn.proto.v1` API, as fnrun carries it
    /// (`api/proto`).
    pub fn crossplane_v1() -> Protos {
        Protos {
            root: crate::workspace_root().join("api/proto"),
            files: vec![PathBuf::from(
                "apiextensions/fn/proto/v1/run_function.proto",
            )],
            go_package: None,
        }
    }

    /// Adds the files' paths and contents to `key`.
    pub fn hash_into(&self, key: &mut Key) -> Result<()> {
        key.part("proto root", self.root.to_string_lossy().as_bytes());
        for file in &self.files {
            let path = self.root.join(file);
            let contents =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            key.part(&file.to_string_lossy(), contents);
        }
        if let Some(package) = &self.go_package {
            key.part("go package", package);
        }
        Ok(())
    }
}
