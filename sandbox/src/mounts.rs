//! Host files and directories bind-mounted into a run (kpt's `--mount
//! type=bind,src=PATH,dst=PATH[,rw=true]`).
//!
//! The runner resolves a mount with [`BindMount::new`] before anything starts:
//! the source to a canonical absolute path (no symlink, `.` or `..` left),
//! opened and identified by device and inode; the target checked to be a
//! plain absolute path inside the run, outside the file systems the sandbox
//! mounts itself. Init then (`steps.rs`):
//! 1. while it still sees the host's tree, opens the source again by its
//!    canonical path without following any symlink (`openat2` with
//!    `RESOLVE_NO_SYMLINKS`), refuses it unless it is the very file the runner
//!    identified, clones its mount tree (`open_tree`, recursive) and makes the
//!    clone nosuid, nodev and, unless writable, read-only, recursively
//!    (`mount_setattr`);
//! 2. once the host's root is gone from its mount namespace, creates the
//!    target inside the new root, resolving every component inside it
//!    (`openat2` with `RESOLVE_IN_ROOT`, no magic links), and attaches the
//!    clone onto the opened target (`move_mount`): no path is resolved twice.
//!
//! So an image's symlinks cannot take the target out of the run's root, a
//! source swapped for another file after the runner checked it is refused,
//! and a read-only mount has no writable submount.

use std::ffi::CString;
use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// The most bind mounts one run may have.
pub const MAX_MOUNTS: usize = 32;

/// The file systems the sandbox mounts itself: a mount there could cover its
/// masked and read-only paths.
pub const RESERVED_TARGETS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The longest target path, in bytes (the kernel's `PATH_MAX` less its NUL).
const MAX_TARGET_BYTES: usize = 4095;

/// The most characters of a caller's path quoted in an error.
const MAX_QUOTED_CHARS: usize = 256;

/// A path from the caller, quoted and cut short for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotedPath(String);

impl QuotedPath {
    fn new(path: impl AsRef<std::ffi::OsStr>) -> Self {
        let text = path.as_ref().to_string_lossy();
        let mut quoted: String = text.chars().take(MAX_QUOTED_CHARS).collect();
        if quoted.len() < text.len() {
            quoted.push_str("...");
        }
        QuotedPath(quoted)
    }
}

impl fmt::Display for QuotedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Why a bind mount is refused before the run.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount source is empty")]
    EmptySource,
    #[error("mount source {0} has a `..` component")]
    SourceDotDot(QuotedPath),
    #[error("mount source {path}: {err}")]
    Source {
        path: QuotedPath,
        #[source]
        err: std::io::Error,
    },
    #[error("mount source {path} is a {kind}: only directories and regular files can be mounted")]
    SourceKind {
        path: QuotedPath,
        kind: &'static str,
    },
    #[error("mount target {0} is not an absolute path")]
    RelativeTarget(QuotedPath),
    #[error("mount target {path} has a {component:?} component")]
    TargetComponent {
        path: QuotedPath,
        component: &'static str,
    },
    #[error("mount target cannot be the root directory")]
    TargetIsRoot,
    #[error("mount target {path} is under {under}, which the sandbox mounts itself")]
    ReservedTarget {
        path: QuotedPath,
        under: &'static str,
    },
    #[error("mount target is {0} bytes long; at most {MAX_TARGET_BYTES} are allowed")]
    TargetTooLong(usize),
    #[error("mount {what} {path} contains a NUL byte")]
    NulByte {
        what: &'static str,
        path: QuotedPath,
    },
}

/// A host file or directory mounted into a run.
///
/// Made only by [`BindMount::new`], which resolves and checks it; the
/// sandbox then mounts exactly the file it identified.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BindMount {
    source: PathBuf,
    dev: u64,
    ino: u64,
    dir: bool,
    target: String,
    writable: bool,
}

impl BindMount {
    /// Resolves `source` (a host path; a relative one is taken from the
    /// current directory, as kustomize does) and checks `target` (an absolute
    /// path inside the run). Read-only unless `writable`.
    ///
    /// Refused: an empty source, a `..` in either path, a source that does
    /// not exist or is neither a directory nor a regular file, a target that
    /// is relative, `/`, has a `.` component, or lies under `/proc`, `/sys`
    /// or `/dev`.
    pub fn new(source: &Path, target: &str, writable: bool) -> Result<BindMount, MountError> {
        let target = check_target(target)?;
        if source.as_os_str().is_empty() {
            return Err(MountError::EmptySource);
        }
        if source.components().any(|c| c == Component::ParentDir) {
            return Err(MountError::SourceDotDot(QuotedPath::new(source)));
        }
        let source_err = |err| MountError::Source {
            path: QuotedPath::new(source),
            err,
        };
        if std::os::unix::ffi::OsStrExt::as_bytes(source.as_os_str()).contains(&0) {
            return Err(MountError::NulByte {
                what: "source",
                path: QuotedPath::new(source),
            });
        }
        // The caller's own symlinks are followed here, once; what the
        // sandbox opens later is this symlink-free path.
        let canonical = std::fs::canonicalize(source).map_err(source_err)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&canonical)
            .map_err(source_err)?;
        let meta = file.metadata().map_err(source_err)?;
        let kind = meta.file_type();
        let dir = kind.is_dir();
        if !dir && !kind.is_file() {
            let kind = if kind.is_symlink() {
                "symlink"
            } else if kind.is_socket() {
                "socket"
            } else if kind.is_fifo() {
                "fifo"
            } else if kind.is_block_device() || kind.is_char_device() {
                "device"
            } else {
                "special file"
            };
            return Err(MountError::SourceKind {
                path: QuotedPath::new(source),
                kind,
            });
        }
        Ok(BindMount {
            source: canonical,
            dev: meta.dev(),
            ino: meta.ino(),
            dir,
            target,
            writable,
        })
    }

    /// The host path, canonical.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The path inside the run, normalised (no repeated or trailing `/`).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether the function may write through it.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Whether the source is a directory (else a regular file).
    pub fn is_dir(&self) -> bool {
        self.dir
    }

    /// The device and inode number the runner resolved.
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The target's components, each with the target's path up to it,
    /// relative to the root: `[("a", "a"), ("b", "a/b")]` for `/a/b`.
    pub(crate) fn target_components(&self) -> Result<Vec<(CString, CString)>, MountError> {
        let nul = || MountError::NulByte {
            what: "target",
            path: QuotedPath::new(&self.target),
        };
        let mut prefix = String::new();
        let mut out = Vec::new();
        for name in self.target.split('/').filter(|c| !c.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(name);
            out.push((
                CString::new(name).map_err(|_| nul())?,
                CString::new(prefix.as_str()).map_err(|_| nul())?,
            ));
        }
        Ok(out)
    }
}

/// Checks a target path and returns it normalised.
fn check_target(target: &str) -> Result<String, MountError> {
    let quoted = || QuotedPath::new(target);
    if target.len() > MAX_TARGET_BYTES {
        return Err(MountError::TargetTooLong(target.len()));
    }
    if target.contains('\0') {
        return Err(MountError::NulByte {
            what: "target",
            path: quoted(),
        });
    }
    if !target.starts_with('/') {
        return Err(MountError::RelativeTarget(quoted()));
    }
    let mut normal = String::with_capacity(target.len());
    for component in target.split('/').filter(|c| !c.is_empty()) {
        match component {
            "." | ".." => {
                return Err(MountError::TargetComponent {
                    path: quoted(),
                    component: if component == "." { "." } else { ".." },
                });
            }
            _ => {
                normal.push('/');
                normal.push_str(component);
            }
        }
    }
    if normal.is_empty() {
        return Err(MountError::TargetIsRoot);
    }
    for under in RESERVED_TARGETS {
        if normal == under || normal.starts_with(&format!("{under}/")) {
            return Err(MountError::ReservedTarget {
                path: quoted(),
                under,
            });
        }
    }
    Ok(normal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn resolves_the_source_through_the_callers_symlinks() {
        let tmp = dir();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
        let m = BindMount::new(&tmp.path().join("link"), "/src//", false).unwrap();
        assert_eq!(m.source(), std::fs::canonicalize(&real).unwrap());
        assert_eq!(m.target(), "/src");
        assert!(m.is_dir() && !m.writable());
        let meta = std::fs::metadata(&real).unwrap();
        assert_eq!(m.id(), (meta.dev(), meta.ino()));
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let m = BindMount::new(&file, "/etc/f", true).unwrap();
        assert!(!m.is_dir() && m.writable());
        let parts: Vec<(String, String)> = m
            .target_components()
            .unwrap()
            .into_iter()
            .map(|(a, b)| (a.into_string().unwrap(), b.into_string().unwrap()))
            .collect();
        assert_eq!(
            parts,
            [("etc".into(), "etc".into()), ("f".into(), "etc/f".into())]
        );
    }

    #[test]
    fn refuses_bad_sources() {
        let tmp = dir();
        let cases: Vec<(PathBuf, &str)> = vec![
            (PathBuf::new(), "mount source is empty"),
            (tmp.path().join("a/../b"), "has a `..` component"),
            (tmp.path().join("missing"), "No such file or directory"),
            (PathBuf::from("/dev/null"), "is a device"),
        ];
        for (source, want) in cases {
            let err = BindMount::new(&source, "/x", false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{source:?}: {err}");
        }
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = BindMount::new(&fifo, "/x", false).unwrap_err();
        assert!(
            matches!(err, MountError::SourceKind { kind: "fifo", .. }),
            "{err}"
        );
    }

    #[test]
    fn refuses_bad_targets() {
        let tmp = dir();
        for (target, want) in [
            ("relative/x", "is not an absolute path"),
            ("", "is not an absolute path"),
            ("/", "cannot be the root directory"),
            ("//", "cannot be the root directory"),
            ("/a/../etc", "has a \"..\" component"),
            ("/a/./b", "has a \".\" component"),
            ("/proc", "under /proc"),
            ("/proc/sys/kernel", "under /proc"),
            ("/dev/shm", "under /dev"),
            ("//sys/", "under /sys"),
            ("/a\0b", "contains a NUL byte"),
        ] {
            let err = BindMount::new(tmp.path(), target, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{target:?}: {err}");
        }
        // Not reserved: only the prefix matches.
        assert!(BindMount::new(tmp.path(), "/devices", false).is_ok());
        assert!(BindMount::new(tmp.path(), "/processes/x", false).is_ok());
        let long = format!("/{}", "a".repeat(5000));
        let err = BindMount::new(tmp.path(), &long, false).unwrap_err();
        assert!(matches!(err, MountError::TargetTooLong(5001)), "{err}");
    }

    #[test]
    fn errors_quote_a_long_path_cut_short() {
        let long = format!("{}/missing", "x".repeat(100_000));
        let err = BindMount::new(Path::new(&long), "/x", false)
            .unwrap_err()
            .to_string();
        assert!(err.len() < 1024, "{} bytes", err.len());
        let err = BindMount::new(
            Path::new("/tmp"),
            &format!("rel{}", "y".repeat(4000)),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.len() < 1024, "{} bytes", err.len());
    }
}
