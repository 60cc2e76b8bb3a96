//! Reading a file of an image's root file system as the function sees it: the merged
//! view overlayfs makes of the unpacked layers, resolved without the host.
//!
//! The runner needs a few files of the image before the sandbox exists (`/etc/passwd`
//! and `/etc/group`, to resolve the image's `User`). Joining such a path onto a layer
//! directory and handing it to the kernel would let the image's own symlinks lead
//! anywhere on the host: `/etc -> /somewhere` is followed from the host's root. Here
//! the host resolves nothing. A path is walked one component at a time over the layer
//! stack, top layer first, the way overlayfs merges it (with the layer format of
//! [`crate::unpack`]):
//!
//! - a whiteout (a 0:0 character device) hides the name in every lower layer;
//! - a directory merges with the same-named directories below it, down to the first
//!   opaque one (`user.overlay.opaque=y`) or the first layer where the name is not a
//!   directory; the root merges every layer;
//! - any other entry hides everything below it.
//!
//! Symlinks are resolved in that merged view: an absolute target starts again at the
//! merged root, `..` never climbs above it, and at most [`MAX_SYMLINKS`] links are
//! followed (`ELOOP`). A symlink in an upper layer may name a file of a lower layer.
//!
//! Every lookup is relative to a directory file descriptor: `fstatat` and `readlinkat`
//! of one name (never a path), and `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS` to open what was looked up, so the kernel follows no symlink
//! and leaves no layer directory. The file itself must be a regular file and is read
//! up to a size cap.
//!
//! Cost: one `fstatat` per layer holding each directory on the path, one open per
//! directory entered and one per file; a file of a one-layer image is read with about
//! ten system calls.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use fnrun_registry::ErrorKind;
use fnrun_registry::digest::truncate;

/// Symlinks followed while resolving one path (Linux's `MAXSYMLINKS`).
pub(crate) const MAX_SYMLINKS: u32 = 40;
/// Names looked up in a layer while resolving one path. A path of a real image needs a
/// few per layer; the cap bounds the work a hostile chain of symlinks can cause.
const MAX_LOOKUPS: u32 = 1 << 16;
/// The whiteout device number.
const WHITEOUT_DEV: libc::dev_t = 0;

/// A file of the image's root file system that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot open layer directory {layer}: {err}")]
    OpenLayer { layer: PathBuf, err: io::Error },
    #[error("image path {path:?} is not absolute")]
    NotAbsolute { path: String },
    #[error("{path} in the image: too many levels of symbolic links (more than {MAX_SYMLINKS})")]
    TooManySymlinks { path: String },
    #[error("{path} in the image: resolving it takes more than {MAX_LOOKUPS} lookups")]
    TooManyLookups { path: String },
    #[error("{path} in the image is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} in the image is larger than {limit} bytes")]
    TooLarge { path: String, limit: u64 },
    #[error("cannot {op} {path} in the image (at {at:?} in layer {layer}): {err}")]
    Io {
        op: &'static str,
        path: String,
        /// The merged path being looked up when it failed.
        at: String,
        layer: PathBuf,
        err: io::Error,
    },
}

impl RootfsError {
    /// [`ErrorKind::Corrupt`] when the image's content is at fault (a symlink loop, a
    /// directory or an oversized file where a file is expected),
    /// [`ErrorKind::Internal`] when the host failed to read it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RootfsError::TooManySymlinks { .. }
            | RootfsError::TooManyLookups { .. }
            | RootfsError::NotRegular { .. }
            | RootfsError::TooLarge { .. } => ErrorKind::Corrupt,
            RootfsError::OpenLayer { .. }
            | RootfsError::NotAbsolute { .. }
            | RootfsError::Io { .. } => ErrorKind::Internal,
        }
    }
}

/// The layers of an image, opened: a read-only view of its merged root file system.
#[derive(Debug)]
pub struct LayerStack {
    /// Layer directories and their open root, top layer first.
    layers: Vec<(PathBuf, OwnedFd)>,
}

impl LayerStack {
    /// Opens the layer directories `layers`, bottom to top (as [`crate::Image::layers`]).
    pub fn open(layers: &[PathBuf]) -> Result<LayerStack, RootfsError> {
        let layers = layers
            .iter()
            .rev()
            .map(|layer| {
                let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
                openat(nix::fcntl::AT_FDCWD, layer, flags, Mode::empty())
                    .map(|fd| (layer.clone(), fd))
                    .map_err(|e| RootfsError::OpenLayer {
                        layer: layer.clone(),
                        err: e.into(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(LayerStack { layers })
    }

    /// The regular file at the absolute `path` of the merged view, if there is one,
    /// read whole; an error if it is larger than `max_bytes`.
    ///
    /// `None` when nothing is at `path` (a missing name, a whiteout, a component that
    /// is not a directory, a dangling symlink), as `open` would fail with `ENOENT` or
    /// `ENOTDIR` in the sandbox.
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RootfsError> {
        if !path.starts_with('/') {
            return Err(RootfsError::NotAbsolute {
                path: truncate(path),
            });
        }
        let mut walk = Walk::new(self, path);
        let mut pending: VecDeque<Vec<u8>> = components(path.as_bytes()).collect();
        while let Some(name) = pending.pop_front() {
            match name.as_slice() {
                b"." => continue,
                b".." => {
                    walk.up()?;
                    continue;
                }
                _ => {}
            }
            match walk.lookup(&name)? {
                Entry::Missing => return Ok(None),
                Entry::Dir(dir) => walk.enter(name, dir),
                Entry::Symlink(part) => {
                    let target = walk.readlink(part, &name)?;
                    if target.is_empty() {
                        return Ok(None);
                    }
                    if target.starts_with(b"/") {
                        walk.restart_at_root();
                    }
                    for c in components(&target).collect::<Vec<_>>().into_iter().rev() {
                        pending.push_front(c);
                    }
                }
                // A file (or anything else) used as a directory: ENOTDIR.
                Entry::File(_) | Entry::Other(_) if !pending.is_empty() => return Ok(None),
                Entry::File(part) => return walk.read(part, &name, max_bytes).map(Some),
                Entry::Other(kind) => return Err(walk.not_regular(kind)),
            }
        }
        Err(walk.not_regular("a directory"))
    }
}

/// The components of a path: empty ones dropped, `.` and `..` kept, and a final `.` for
/// a trailing slash (which asks for a directory).
fn components(path: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    let trailing = path.len() > 1 && path.ends_with(b"/");
    path.split(|b| *b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .chain(trailing.then(|| b".".to_vec()))
}

/// A directory file descriptor: a layer root (owned by the stack) or one opened here.
#[derive(Debug)]
enum Fd<'s> {
    Root(BorrowedFd<'s>),
    Opened(OwnedFd),
}

impl Fd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Fd::Root(fd) => *fd,
            Fd::Opened(fd) => fd.as_fd(),
        }
    }
}

/// One directory of the merged view: the directory of that name in each layer that
/// contributes to it, top first (`usize` indexes [`LayerStack::layers`]).
#[derive(Debug)]
struct Merged<'s> {
    parts: Vec<(usize, Fd<'s>)>,
}

/// What a name is in the merged view; `usize` indexes [`Merged::parts`] (the layer
/// whose entry it is).
enum Entry<'s> {
    Missing,
    Dir(Merged<'s>),
    Symlink(usize),
    File(usize),
    Other(&'static str),
}

/// The state of resolving one path.
struct Walk<'s> {
    stack: &'s LayerStack,
    /// The path asked for, for messages.
    path: &'s str,
    /// The current directory: its name below the root and the layers that hold it,
    /// for each directory from the root down (no symlinks: real directories).
    levels: Vec<(Vec<u8>, Vec<usize>)>,
    dir: Merged<'s>,
    symlinks: u32,
    lookups: u32,
}

impl<'s> Walk<'s> {
    fn new(stack: &'s LayerStack, path: &'s str) -> Walk<'s> {
        Walk {
            stack,
            path,
            levels: Vec::new(),
            dir: Self::root(stack),
            symlinks: 0,
            lookups: 0,
        }
    }

    fn root(stack: &'s LayerStack) -> Merged<'s> {
        Merged {
            parts: (stack.layers.iter().enumerate())
                .map(|(i, (_, fd))| (i, Fd::Root(fd.as_fd())))
                .collect(),
        }
    }

    fn restart_at_root(&mut self) {
        self.levels.clear();
        self.dir = Self::root(self.stack);
    }

    /// The merged path of the current directory, with `name` appended if given.
    fn at(&self, name: Option<&[u8]>) -> String {
        let mut s = String::new();
        for n in self.levels.iter().map(|(n, _)| n.as_slice()).chain(name) {
            s.push('/');
            s.push_str(&String::from_utf8_lossy(n));
        }
        if s.is_empty() {
            s.push('/');
        }
        truncate(&s)
    }

    fn io(
        &self,
        op: &'static str,
        part: usize,
        name: Option<&[u8]>,
        err: impl Into<io::Error>,
    ) -> RootfsError {
        let layer = self.dir.parts[part].0;
        RootfsError::Io {
            op,
            path: truncate(self.path),
            at: self.at(name),
            layer: self.stack.layers[layer].0.clone(),
            err: err.into(),
        }
    }

    fn not_regular(&self, kind: &'static str) -> RootfsError {
        RootfsError::NotRegular {
            path: truncate(self.path),
            kind,
        }
    }

    /// Looks `name` up in the current directory, layer by layer.
    fn lookup(&mut self, name: &[u8]) -> Result<Entry<'s>, RootfsError> {
        let count = self.dir.parts.len();
        self.lookups = self
            .lookups
            .saturating_add(u32::try_from(count).unwrap_or(u32::MAX));
        if self.lookups > MAX_LOOKUPS {
            return Err(RootfsError::TooManyLookups {
                path: truncate(self.path),
            });
        }
        let mut merged: Vec<(usize, Fd<'s>)> = Vec::new();
        for (i, (layer, fd)) in self.dir.parts.iter().enumerate() {
            let st = match fstatat(
                fd.as_fd(),
                OsStr::from_bytes(name),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                // A name too long for the file system is in no layer.
                Err(Errno::ENOENT | Errno::ENAMETOOLONG) => continue,
                Err(e) => return Err(self.io("look up", i, Some(name), e)),
            };
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if !merged.is_empty() && !is_dir {
                // A whiteout or a non-directory below a directory ends the merge.
                break;
            }
            if !is_dir {
                return Ok(match st.st_mode & libc::S_IFMT {
                    libc::S_IFCHR if st.st_rdev == WHITEOUT_DEV => Entry::Missing,
                    libc::S_IFLNK => Entry::Symlink(i),
                    libc::S_IFREG => Entry::File(i),
                    _ => Entry::Other(kind(&st)),
                });
            }
            // Only a directory with layers below it can be opaque to them.
            let lower_layers = i + 1 < count;
            let flags = match lower_layers {
                true => OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                false => OFlag::O_PATH | OFlag::O_DIRECTORY,
            };
            let dir = open_beneath(fd.as_fd(), OsStr::from_bytes(name), flags)
                .map_err(|e| self.io("open directory", i, Some(name), e))?;
            let opaque = lower_layers
                && is_opaque(&dir)
                    .map_err(|e| self.io("read the attributes of", i, Some(name), e))?;
            merged.push((*layer, Fd::Opened(dir)));
            if opaque {
                break;
            }
        }
        Ok(match merged.is_empty() {
            true => Entry::Missing,
            false => Entry::Dir(Merged { parts: merged }),
        })
    }

    fn enter(&mut self, name: Vec<u8>, dir: Merged<'s>) {
        let layers = dir.parts.iter().map(|(l, _)| *l).collect();
        self.levels.push((name, layers));
        self.dir = dir;
    }

    /// `..`: the parent of the current directory, the root's being the root. Its
    /// directories are opened again from each layer's root by their names, which were
    /// looked up as directories before (no symlink, `.` or `..` among them).
    fn up(&mut self) -> Result<(), RootfsError> {
        if self.levels.pop().is_none() {
            return Ok(());
        }
        let Some((_, layers)) = self.levels.last() else {
            self.dir = Self::root(self.stack);
            return Ok(());
        };
        let path: Vec<&[u8]> = self.levels.iter().map(|(n, _)| n.as_slice()).collect();
        let path = path.join(&b'/');
        let mut parts = Vec::with_capacity(layers.len());
        for &layer in layers {
            let (dir, root) = &self.stack.layers[layer];
            let fd = open_beneath(
                root.as_fd(),
                OsStr::from_bytes(&path),
                OFlag::O_PATH | OFlag::O_DIRECTORY,
            )
            .map_err(|e| RootfsError::Io {
                op: "open directory",
                path: truncate(self.path),
                at: self.at(None),
                layer: dir.clone(),
                err: e.into(),
            })?;
            parts.push((layer, Fd::Opened(fd)));
        }
        self.dir = Merged { parts };
        Ok(())
    }

    /// The target of the symlink `name` of layer `part` of the current directory.
    fn readlink(&mut self, part: usize, name: &[u8]) -> Result<Vec<u8>, RootfsError> {
        self.symlinks += 1;
        if self.symlinks > MAX_SYMLINKS {
            return Err(RootfsError::TooManySymlinks {
                path: truncate(self.path),
            });
        }
        let fd = self.dir.parts[part].1.as_fd();
        readlinkat(fd, OsStr::from_bytes(name))
            .map(|t| t.into_encoded_bytes())
            .map_err(|e| self.io("read symlink", part, Some(name), e))
    }

    /// Reads the regular file `name` of layer `part` of the current directory.
    fn read(&self, part: usize, name: &[u8], max_bytes: u64) -> Result<Vec<u8>, RootfsError> {
        let dir = self.dir.parts[part].1.as_fd();
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let fd = open_beneath(dir, OsStr::from_bytes(name), flags)
            .map_err(|e| self.io("open", part, Some(name), e))?;
        let st = fstat(&fd).map_err(|e| self.io("inspect", part, Some(name), e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(self.not_regular(kind(&st)));
        }
        let mut bytes = Vec::new();
        File::from(fd)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| self.io("read", part, Some(name), e))?;
        if bytes.len() as u64 > max_bytes {
            return Err(RootfsError::TooLarge {
                path: truncate(self.path),
                limit: max_bytes,
            });
        }
        Ok(bytes)
    }
}

/// Opens `path` below `dir` without following any symlink or leaving `dir`.
fn open_beneath(dir: BorrowedFd<'_>, path: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2(dir, path, how)
}

/// Whether the directory `dir` (opened for reading) is an opaque overlay directory.
fn is_opaque(dir: &OwnedFd) -> Result<bool, Errno> {
    let mut value = [0u8; 2];
    // SAFETY: `dir` is an open descriptor, the name is a NUL-terminated static string
    // and `value` is a writable buffer of the length passed; nothing is retained.
    let n = unsafe {
        libc::fgetxattr(
            dir.as_raw_fd(),
            c"user.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    match n {
        1 => Ok(value[0] == b'y'),
        0 | 2 => Ok(false),
        _ => match Errno::last() {
            Errno::ENODATA | Errno::ENOTSUP | Errno::ERANGE => Ok(false),
            e => Err(e),
        },
    }
}

/// What a non-regular, non-directory file is, for messages.
fn kind(st: &FileStat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a fifo",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "of an unknown file type",
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;
    use crate::LayerOwner;
    use crate::unpack::testutil::{Member, TarBuilder, big_budget, gzip};
    use crate::unpack::unpack_layer;
    use fnrun_registry::digest::Digest;

    /// Layers unpacked by the cache's own unpacker from `tars` (bottom first).
    struct Unpacked {
        tmp: tempfile::TempDir,
        layers: Vec<PathBuf>,
    }

    fn unpack(tars: &[Vec<u8>]) -> Unpacked {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("layers")).unwrap();
        let mut layers = Vec::new();
        for (i, tar) in tars.iter().enumerate() {
            let gz = gzip(tar);
            let blob = tmp.path().join(format!("blob-{i}"));
            std::fs::write(&blob, &gz).unwrap();
            let dest = tmp.path().join("layers").join(i.to_string());
            unpack_layer(
                &blob,
                &Digest::of(&gz),
                &Digest::of(tar),
                &dest,
                LayerOwner::Identity,
                &big_budget(),
            )
            .unwrap();
            layers.push(dest);
        }
        Unpacked { tmp, layers }
    }

    impl Unpacked {
        fn read(&self, path: &str) -> Result<Option<Vec<u8>>, RootfsError> {
            LayerStack::open(&self.layers)?.read_file(path, 1 << 20)
        }

        fn text(&self, path: &str) -> Option<String> {
            self.read(path)
                .unwrap_or_else(|e| panic!("{path}: {e}"))
                .map(|b| String::from_utf8(b).unwrap())
        }
    }

    fn tar(members: Vec<Member<'_>>) -> Vec<u8> {
        let mut b = TarBuilder::new();
        for m in members {
            b.add(m);
        }
        b.tar()
    }

    #[test]
    fn files_directories_and_missing_names() {
        let img = unpack(&[tar(vec![
            Member::File(b"etc/passwd", b"root:x:0:0::/:/bin/sh\n", 0o644),
            Member::Dir(b"empty/", 0o755),
            Member::Fifo(b"run/fifo"),
        ])]);
        assert_eq!(img.text("/etc/passwd").unwrap(), "root:x:0:0::/:/bin/sh\n");
        assert_eq!(
            img.text("//etc/./passwd").unwrap(),
            "root:x:0:0::/:/bin/sh\n"
        );
        assert_eq!(
            img.text("/empty/../etc/passwd").unwrap(),
            "root:x:0:0::/:/bin/sh\n"
        );
        assert_eq!(
            img.text("/../../etc/passwd").unwrap(),
            "root:x:0:0::/:/bin/sh\n"
        );
        for missing in [
            "/etc/group",
            "/nope/passwd",
            "/etc/passwd/x",
            "/etc/passwd/",
        ] {
            assert_eq!(img.text(missing), None, "{missing}");
        }
        for (path, kind) in [
            ("/etc", "a directory"),
            ("/", "a directory"),
            ("/run/fifo", "a fifo"),
        ] {
            let err = img.read(path).unwrap_err();
            assert!(
                matches!(err, RootfsError::NotRegular { kind: k, .. } if k == kind),
                "{path}: {err}"
            );
            assert_eq!(err.kind(), ErrorKind::Corrupt);
            assert!(err.to_string().contains(path), "{err}");
        }
        let err = img.read("etc/passwd").unwrap_err();
        assert!(matches!(err, RootfsError::NotAbsolute { .. }), "{err}");
        // The cap: a file one byte over it is refused, not cut.
        let stack = LayerStack::open(&img.layers).unwrap();
        let len = "root:x:0:0::/:/bin/sh\n".len() as u64;
        assert!(stack.read_file("/etc/passwd", len).unwrap().is_some());
        let err = stack.read_file("/etc/passwd", len - 1).unwrap_err();
        assert!(matches!(err, RootfsError::TooLarge { limit, .. } if limit == len - 1));
        // A missing layer directory is the host's failure.
        let err = LayerStack::open(&[img.tmp.path().join("gone")]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    }

    #[test]
    fn whiteouts_opaque_directories_and_files_hide_lower_layers() {
        let img = unpack(&[
            tar(vec![
                Member::File(b"etc/passwd", b"lower", 0o644),
                Member::File(b"etc/group", b"lower group", 0o644),
                Member::File(b"usr/lib/os-release", b"lower", 0o644),
                Member::File(b"usr/share/keep", b"kept", 0o644),
                Member::File(b"var/file", b"lower", 0o644),
                Member::File(b"was-file", b"lower", 0o644),
                Member::File(b"root-file", b"lower", 0o644),
            ]),
            tar(vec![
                Member::File(b"etc/.wh.passwd", b"", 0o644),
                Member::Dir(b"usr/lib/", 0o755),
                Member::File(b"usr/lib/.wh..wh..opq", b"", 0o644),
                Member::File(b"usr/lib/new", b"upper", 0o644),
                Member::File(b"var", b"a file over a directory", 0o644),
                Member::File(b"was-file/inside", b"upper", 0o644),
                // An opaque layer root: overlayfs always merges the root.
                Member::File(b".wh..wh..opq", b"", 0o644),
            ]),
            tar(vec![Member::File(b"etc/.wh.group", b"", 0o644)]),
        ]);
        assert_eq!(img.text("/etc/passwd"), None, "whited out");
        assert_eq!(img.text("/etc/group"), None, "whited out two layers up");
        assert_eq!(img.text("/usr/lib/os-release"), None, "below an opaque dir");
        assert_eq!(img.text("/usr/lib/new").unwrap(), "upper");
        assert_eq!(img.text("/usr/share/keep").unwrap(), "kept", "merged");
        assert_eq!(img.text("/var/file"), None, "a file hides the directory");
        assert_eq!(img.text("/var").unwrap(), "a file over a directory");
        assert!(matches!(
            img.read("/was-file"),
            Err(RootfsError::NotRegular {
                kind: "a directory",
                ..
            })
        ));
        assert_eq!(img.text("/was-file/inside").unwrap(), "upper");
        assert_eq!(img.text("/root-file").unwrap(), "lower");

        // A whiteout of a whole directory, and a new one above it.
        let img = unpack(&[
            tar(vec![Member::File(b"etc/passwd", b"lower", 0o644)]),
            tar(vec![Member::File(b".wh.etc", b"", 0o644)]),
            tar(vec![Member::File(b"etc/group", b"top", 0o644)]),
        ]);
        assert_eq!(img.text("/etc/passwd"), None);
        assert_eq!(img.text("/etc/group").unwrap(), "top");
    }

    #[test]
    fn symlinks_resolve_in_the_merged_view_never_on_the_host() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("passwd"), b"host").unwrap();
        let host_dir = host.path().to_str().unwrap().as_bytes();
        let inside = format!("{}/passwd", host.path().display());
        let img = unpack(&[
            tar(vec![
                Member::File(b"private/etc/passwd", b"image", 0o644),
                Member::File(b"usr/share/base/passwd", b"base", 0o644),
                Member::File(b"top-file", b"at the root", 0o644),
                Member::Dir(b"a/b/c/", 0o755),
            ]),
            tar(vec![
                Member::Symlink(b"etc", b"/private/etc"),
                Member::Symlink(b"host-etc", host_dir),
                Member::Symlink(b"a/b/c/climb", b"../../../../../../top-file"),
                Member::Symlink(b"a/b/c/up", b".."),
                Member::Symlink(b"lower-abs", b"/usr/share/base/passwd"),
                Member::Symlink(b"usr/share/rel", b"base/passwd"),
                Member::Symlink(b"dangling", b"/nowhere"),
                Member::Symlink(b"file-as-dir", b"/top-file/"),
                Member::Symlink(b"chain", b"a/b/c/up/c/climb"),
            ]),
        ]);
        assert_eq!(img.text("/etc/passwd").unwrap(), "image");
        assert_eq!(
            img.text("/host-etc/passwd"),
            None,
            "the host is not the image"
        );
        assert_eq!(img.text("/a/b/c/climb").unwrap(), "at the root");
        assert_eq!(img.text("/a/b/c/up/c/climb").unwrap(), "at the root");
        assert_eq!(img.text("/a/b/c/up/../../top-file").unwrap(), "at the root");
        assert_eq!(img.text("/lower-abs").unwrap(), "base");
        assert_eq!(img.text("/usr/share/rel").unwrap(), "base");
        assert_eq!(img.text("/dangling"), None);
        assert_eq!(
            img.text("/file-as-dir"),
            None,
            "a trailing slash needs a directory"
        );
        assert_eq!(img.text("/chain").unwrap(), "at the root");

        // The host's path inside the image is the image's.
        let img = unpack(&[
            tar(vec![Member::File(inside.as_bytes(), b"image copy", 0o644)]),
            tar(vec![Member::Symlink(b"etc", host_dir)]),
        ]);
        assert_eq!(img.text("/etc/passwd").unwrap(), "image copy");
    }

    #[test]
    fn symlink_loops_and_long_chains_are_bounded() {
        let names: Vec<String> = (0..=41).map(|i| format!("s{i}")).collect();
        let mut members = vec![
            Member::Symlink(b"loop", b"loop"),
            Member::Symlink(b"ping", b"/pong"),
            Member::Symlink(b"pong", b"ping"),
            Member::File(b"s41", b"end", 0o644),
        ];
        for i in 0..41 {
            members.push(Member::Symlink(
                names[i].as_bytes(),
                names[i + 1].as_bytes(),
            ));
        }
        let img = unpack(&[tar(members)]);
        for path in ["/loop", "/ping", "/loop/passwd", "/s0"] {
            let err = img.read(path).unwrap_err();
            assert!(
                matches!(err, RootfsError::TooManySymlinks { .. }),
                "{path}: {err}"
            );
            assert_eq!(err.kind(), ErrorKind::Corrupt);
            assert!(err.to_string().contains("symbolic links"), "{err}");
        }
        // 40 links are followed, as Linux does.
        assert_eq!(img.text("/s1").unwrap(), "end");
    }

    /// The kernel's overlayfs as the reference: each path read through an overlay
    /// mount of the same layers (in a user and mount namespace, chrooted into it)
    /// must give what [`LayerStack::read_file`] gives.
    #[test]
    fn agrees_with_overlayfs() {
        let busybox = Path::new("/bin/busybox");
        let probe = Command::new("unshare").args(["-Urm", "true"]).status();
        if !busybox.exists() || !probe.is_ok_and(|s| s.success()) {
            eprintln!("skipping: needs /bin/busybox and unshare -Urm");
            return;
        }
        let busybox = std::fs::read(busybox).unwrap();
        let img = unpack(&[
            tar(vec![
                Member::File(b"bin/busybox", &busybox, 0o755),
                Member::File(b"etc/passwd", b"lower passwd", 0o644),
                Member::File(b"etc/group", b"lower group", 0o644),
                Member::File(b"usr/lib/a", b"lower a", 0o644),
                Member::File(b"usr/share/b", b"lower b", 0o644),
                Member::File(b"d/x", b"lower x", 0o644),
                Member::Dir(b"deep/er/", 0o755),
                Member::File(b"f", b"lower f", 0o644),
            ]),
            tar(vec![
                Member::File(b"etc/.wh.group", b"", 0o644),
                Member::Dir(b"usr/lib/", 0o755),
                Member::File(b"usr/lib/.wh..wh..opq", b"", 0o644),
                Member::File(b"usr/lib/c", b"upper c", 0o644),
                Member::File(b"d", b"upper d", 0o644),
                Member::Symlink(b"deep/er/up", b"../../usr/share/b"),
                Member::Symlink(b"abs", b"/etc/passwd"),
                Member::Symlink(b"f2", b"f/"),
                Member::Symlink(b"loop", b"loop2"),
                Member::Symlink(b"loop2", b"/loop"),
                Member::Symlink(b"root-up", b"../../../../etc/passwd"),
            ]),
            tar(vec![
                Member::Symlink(b"etc/shadow", b"../usr/lib/c"),
                Member::File(b"usr/share/.wh.b", b"", 0o644),
                Member::Symlink(b"deep/er/lib", b"/usr/lib"),
            ]),
        ]);
        let paths = [
            "/etc/passwd",
            "/etc/group",
            "/etc/shadow",
            "/usr/lib/a",
            "/usr/lib/c",
            "/usr/share/b",
            "/d",
            "/d/x",
            "/deep/er/up",
            "/deep/er/lib/c",
            "/deep/er/lib/../../etc/passwd",
            "/abs",
            "/f",
            "/f2",
            "/loop",
            "/root-up",
            "/etc",
            "/nothing",
        ];
        let lower: Vec<String> = (img.layers.iter().rev())
            .map(|p| p.display().to_string())
            .collect();
        let mnt = tempfile::tempdir().unwrap();
        for path in paths {
            let script = format!(
                "mount -t overlay overlay -o ro,userxattr,lowerdir={} {m} && exec chroot {m} /bin/busybox cat \"$1\"",
                lower.join(":"),
                m = mnt.path().display()
            );
            let out = Command::new("unshare")
                .args(["-Urm", "sh", "-c", &script, "sh", path])
                .output()
                .unwrap();
            let kernel = out.status.success().then_some(out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            match img.read(path) {
                Ok(ours) => assert_eq!(ours, kernel, "{path}: kernel said {stderr}"),
                Err(e) => assert!(kernel.is_none(), "{path}: {e}, but the kernel read it"),
            }
        }
    }
}
