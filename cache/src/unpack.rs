//! Layer unpacking into a tree usable as an overlayfs lower dir (mounted with `userxattr`).
//!
//! Containment: every entry is created with `*at` syscalls on a directory fd obtained
//! with `openat2(RESOLVE_IN_ROOT)` relative to the layer root fd, so neither `..` nor a
//! symlink (in this layer or hostile) can reach outside the layer directory. Entry paths
//! are normalized lexically first: absolute paths become relative to the layer root and a
//! `..` that would climb above it refuses the layer. Hard link targets are resolved the
//! same way, so they can only name files of this layer.
//!
//! Overlay conventions: `.wh.NAME` becomes a 0:0 character device `NAME` (unprivileged
//! users may create those since Linux 5.8) and `.wh..wh..opq` sets `user.overlay.opaque=y`
//! on its directory. Device nodes are skipped, setuid/setgid bits are dropped, xattrs
//! from the tar are ignored (a layer must not be able to set `user.overlay.*` itself),
//! and the metadata of the layer root (`./`) is not applied: the root stays 0755.
//!
//! Directories are created 0700 and get their final mode, owner and mtime after all
//! entries, deepest first, so rootless unpacking can fill a directory whose mode is 0555.
//!
//! Limits: the uncompressed tar stream is charged to a per-image [`Budget`] of bytes as
//! it is read (a decompression bomb stops at the limit) and every entry to its entry
//! limit; an entry whose declared size cannot fit fails before it is written.

use std::cmp::Reverse;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{
    FchmodatFlags, Mode, SFlag, UtimensatFlags, fchmod, fchmodat, fstatat, futimens, mkdirat,
    mknodat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};
use tar::EntryType;

use crate::LayerOwner;
use crate::digest::{Digest, Hasher, HashingReader};

/// The most path components an entry may have. Legitimate images stay far below; the
/// cap bounds recursion and open fds when removing a tree.
const MAX_DEPTH: usize = 256;
/// Caps for GNU long name/link entries and PAX extended headers (read into memory).
const MAX_LONG_NAME: u64 = 64 << 10;
const MAX_PAX_HEADER: u64 = 1 << 20;
/// The whiteout device number.
const WHITEOUT_DEV: libc::dev_t = 0;
const OPAQUE_XATTR: &[u8] = b"user.overlay.opaque\0";

/// Unpacked bytes and entry limits shared by the layers of one image.
#[derive(Debug)]
pub(crate) struct Budget {
    max_bytes: u64,
    max_entries: u64,
    bytes: AtomicU64,
    entries: AtomicU64,
    exceeded: AtomicBool,
}

/// Which limit of a [`Budget`] was exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exceeded {
    Bytes(u64),
    Entries(u64),
}

impl Budget {
    pub(crate) fn new(max_bytes: u64, max_entries: u64) -> Budget {
        Budget {
            max_bytes,
            max_entries,
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            exceeded: AtomicBool::new(false),
        }
    }

    pub(crate) fn charge(&self, bytes: u64, entries: u64) -> Result<(), Exceeded> {
        let b = self
            .bytes
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        let e = self
            .entries
            .fetch_add(entries, Ordering::Relaxed)
            .saturating_add(entries);
        if b > self.max_bytes {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Bytes(self.max_bytes));
        }
        if e > self.max_entries {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Entries(self.max_entries));
        }
        Ok(())
    }

    /// Fails if `bytes` more would not fit.
    fn check_fits(&self, bytes: u64) -> Result<(), Exceeded> {
        if self.bytes.load(Ordering::Relaxed).saturating_add(bytes) > self.max_bytes {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Bytes(self.max_bytes));
        }
        Ok(())
    }

    fn exceeded(&self) -> Option<Exceeded> {
        if !self.exceeded.load(Ordering::Relaxed) {
            return None;
        }
        if self.entries.load(Ordering::Relaxed) > self.max_entries {
            Some(Exceeded::Entries(self.max_entries))
        } else {
            Some(Exceeded::Bytes(self.max_bytes))
        }
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A layer that could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer {layer}: refusing entry \"{entry}\": {reason}")]
    Hostile {
        layer: String,
        entry: String,
        reason: HostileEntry,
    },
    #[error("layer {layer} is corrupt: {reason}")]
    Corrupt { layer: String, reason: CorruptLayer },
    #[error("layer {layer}: {what} digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        layer: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "image exceeds the unpacked size limit of {limit} bytes (while unpacking layer {layer})"
    )]
    TooLarge { layer: String, limit: u64 },
    #[error("image exceeds the limit of {limit} files (while unpacking layer {layer})")]
    TooManyEntries { layer: String, limit: u64 },
    #[error("layer {layer}: cannot {op} \"{entry}\": {err}")]
    Entry {
        layer: String,
        op: &'static str,
        entry: String,
        err: io::Error,
        /// The error comes from the layer's content (e.g. a parent that is a file), not the host.
        from_layer: bool,
    },
    #[error("failed to {op} {path}: {err}")]
    Io {
        op: &'static str,
        path: PathBuf,
        err: io::Error,
    },
}

/// Why an entry of a layer is refused: it tries to reach outside the layer.
#[derive(Debug, thiserror::Error)]
pub enum HostileEntry {
    #[error("the path leaves the layer root")]
    LeavesRoot,
    #[error("the path contains a NUL byte")]
    NulByte,
    #[error("the path is deeper than {MAX_DEPTH} components")]
    TooDeep,
    #[error("a non-directory entry names the layer root")]
    NamesRoot,
    #[error("a whiteout must name one file in its directory")]
    WhiteoutName,
    #[error("a hard link to the layer root")]
    LinkToRoot,
    #[error("a hard link named like the layer root")]
    LinkNamedRoot,
    #[error("hard link target \"{0}\" is not in this layer")]
    LinkOutside(String),
    #[error("hard link target \"{0}\" is a directory")]
    LinkToDirectory(String),
}

/// Why a layer cannot be read as a tar stream.
#[derive(Debug, thiserror::Error)]
pub enum CorruptLayer {
    #[error("cannot read the blob: {0}")]
    Blob(io::Error),
    #[error("cannot start zstd decompression: {0}")]
    Zstd(io::Error),
    #[error("cannot read the tar stream: {0}")]
    Stream(io::Error),
    #[error("{what} is larger than {limit} bytes")]
    Oversized { what: &'static str, limit: u64 },
    #[error("invalid size in the tar header: {0}")]
    HeaderSize(io::Error),
    #[error("invalid PAX header: {0}")]
    Pax(io::Error),
    #[error("invalid PAX {0} value")]
    PaxValue(String),
    #[error("a PAX size different from the header size is not supported")]
    PaxSize,
    #[error("sparse files are not supported")]
    Sparse,
    #[error("the tar stream ends inside a file ({written} of {size} bytes)")]
    Truncated { written: u64, size: u64 },
    #[error("a symlink without a valid target")]
    SymlinkTarget,
    #[error("a hard link without a target")]
    LinkTarget,
}

impl UnpackError {
    pub(crate) fn kind(&self) -> crate::ErrorKind {
        match self {
            UnpackError::Entry {
                from_layer: false, ..
            }
            | UnpackError::Io { .. } => crate::ErrorKind::Internal,
            _ => crate::ErrorKind::Corrupt,
        }
    }

    fn exceeded(layer: &str, e: Exceeded) -> UnpackError {
        match e {
            Exceeded::Bytes(limit) => UnpackError::TooLarge {
                layer: layer.to_owned(),
                limit,
            },
            Exceeded::Entries(limit) => UnpackError::TooManyEntries {
                layer: layer.to_owned(),
                limit,
            },
        }
    }
}

/// What one unpacked layer cost against the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LayerStats {
    /// Bytes of the uncompressed tar stream.
    pub bytes: u64,
    /// Tar entries.
    pub entries: u64,
}

/// Unpacks the layer blob at `blob` into `dest`, which must not exist yet.
///
/// Verifies the blob against `compressed` and the uncompressed tar against `diff_id`; on
/// any error `dest` is removed again.
pub(crate) fn unpack_layer(
    blob: &Path,
    compressed: &Digest,
    diff_id: &Digest,
    dest: &Path,
    owner: LayerOwner,
    budget: &Budget,
) -> Result<LayerStats, UnpackError> {
    let file = File::open(blob).map_err(|err| UnpackError::Io {
        op: "open layer blob",
        path: blob.to_owned(),
        err,
    })?;
    std::fs::create_dir(dest).map_err(|err| UnpackError::Io {
        op: "create layer directory",
        path: dest.to_owned(),
        err,
    })?;
    let result = unpack_into(file, compressed, diff_id, dest, owner, budget);
    if result.is_err()
        && let Err(e) = remove_tree(dest)
    {
        tracing::warn!(path = %dest.display(), error = %e, "failed to remove a partly unpacked layer");
    }
    result
}

fn unpack_into(
    file: File,
    compressed: &Digest,
    diff_id: &Digest,
    dest: &Path,
    owner: LayerOwner,
    budget: &Budget,
) -> Result<LayerStats, UnpackError> {
    let layer = compressed.to_string();
    let root = openat(
        nix::fcntl::AT_FDCWD,
        dest,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| UnpackError::Io {
        op: "open layer directory",
        path: dest.to_owned(),
        err: e.into(),
    })?;

    let corrupt = |reason: CorruptLayer| UnpackError::Corrupt {
        layer: layer.clone(),
        reason,
    };
    let mut buffered = BufReader::with_capacity(256 << 10, HashingReader::new(file));
    let magic = buffered
        .fill_buf()
        .map_err(|e| corrupt(CorruptLayer::Blob(e)))?;
    let decoder = if magic.starts_with(&[0x1f, 0x8b]) {
        Decoder::Gzip(Box::new(flate2::bufread::MultiGzDecoder::new(buffered)))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        // Concatenated frames are read like one stream; libzstd refuses frames whose
        // window exceeds 2^27 bytes (128 MiB), which bounds the decoder's memory.
        let mut d = zstd::stream::read::Decoder::with_buffer(buffered)
            .map_err(|e| corrupt(CorruptLayer::Zstd(e)))?;
        d.window_log_max(27)
            .map_err(|e| corrupt(CorruptLayer::Zstd(e)))?;
        Decoder::Zstd(d)
    } else {
        Decoder::Plain(buffered)
    };
    let stream = BudgetReader {
        inner: decoder,
        hasher: Hasher::default(),
        budget,
    };

    let mut unpacker = Unpacker {
        layer: layer.clone(),
        root,
        owner,
        budget,
        dirs: Vec::new(),
        entries: 0,
        buf: vec![0; 128 << 10],
        ignored_xattrs: false,
    };
    let mut archive = tar::Archive::new(stream);
    unpacker.run(&mut archive)?;

    // Hash everything after the end-of-archive marker too: the digests cover whole streams.
    let mut stream = archive.into_inner();
    io::copy(&mut stream, &mut io::sink()).map_err(|e| unpacker.stream_error(e))?;
    let tar_bytes = stream.hasher.len();
    let actual_diff_id = stream.hasher.finish();
    let (actual_compressed, _) = stream
        .inner
        .into_inner()
        .into_inner()
        .finish()
        .map_err(|e| corrupt(CorruptLayer::Blob(e)))?;
    if actual_compressed != *compressed {
        return Err(UnpackError::DigestMismatch {
            layer,
            what: "blob",
            expected: compressed.to_string(),
            actual: actual_compressed.to_string(),
        });
    }
    if actual_diff_id != *diff_id {
        return Err(UnpackError::DigestMismatch {
            layer,
            what: "diff_id",
            expected: diff_id.to_string(),
            actual: actual_diff_id.to_string(),
        });
    }

    unpacker.finish()?;
    Ok(LayerStats {
        bytes: tar_bytes,
        entries: unpacker.entries,
    })
}

enum Decoder<R: BufRead> {
    Plain(R),
    // Boxed: the decoder is much larger than the others (one per layer).
    Gzip(Box<flate2::bufread::MultiGzDecoder<R>>),
    Zstd(zstd::stream::read::Decoder<'static, R>),
}

impl<R: BufRead> Decoder<R> {
    fn into_inner(self) -> R {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => (*d).into_inner(),
            Decoder::Zstd(d) => d.finish(),
        }
    }
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
        }
    }
}

/// Hashes the uncompressed tar stream and charges it to the budget as it is read.
struct BudgetReader<'b, R> {
    inner: R,
    hasher: Hasher,
    budget: &'b Budget,
}

impl<R: Read> Read for BudgetReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.budget
            .charge(n as u64, 0)
            .map_err(|_| io::Error::other("unpacked size limit exceeded"))?;
        Ok(n)
    }
}

/// The fields of one tar member after applying GNU long names and PAX headers.
struct Meta {
    path: Vec<u8>,
    link: Option<Vec<u8>>,
    kind: EntryType,
    size: u64,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: i64,
}

#[derive(Default)]
struct Extensions {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

struct DeferredDir {
    path: Vec<Vec<u8>>,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: Option<i64>,
}

struct Unpacker<'b> {
    layer: String,
    root: OwnedFd,
    owner: LayerOwner,
    budget: &'b Budget,
    dirs: Vec<DeferredDir>,
    entries: u64,
    buf: Vec<u8>,
    ignored_xattrs: bool,
}

/// An entry-level failure before it is given the entry's name.
enum Fail {
    Hostile(HostileEntry),
    Corrupt(CorruptLayer),
    Exceeded(Exceeded),
    Stream(io::Error),
    Fs(&'static str, io::Error, bool),
}

impl From<Exceeded> for Fail {
    fn from(e: Exceeded) -> Fail {
        Fail::Exceeded(e)
    }
}

/// `fs(op)` turns an errno into a failure, deciding whether the layer's content caused it.
fn fs(op: &'static str) -> impl Fn(Errno) -> Fail {
    move |e| {
        let from_layer = matches!(
            e,
            Errno::ENOTDIR
                | Errno::EEXIST
                | Errno::ELOOP
                | Errno::EXDEV
                | Errno::ENOENT
                | Errno::EISDIR
                | Errno::EMLINK
                | Errno::ENAMETOOLONG
                | Errno::EINVAL
                | Errno::ENOTEMPTY
        );
        Fail::Fs(op, e.into(), from_layer)
    }
}

fn lossy(b: &[u8]) -> String {
    crate::digest::truncate(&String::from_utf8_lossy(b))
}

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Splits a tar path into components, dropping `.` and empty ones and applying `..`.
/// Absolute paths are relative to the layer root; a `..` above the root is refused.
fn normalize(path: &[u8]) -> Result<Vec<Vec<u8>>, Fail> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err(Fail::Hostile(HostileEntry::LeavesRoot));
                }
            }
            c => {
                if c.contains(&0) {
                    return Err(Fail::Hostile(HostileEntry::NulByte));
                }
                out.push(c.to_vec());
            }
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(Fail::Hostile(HostileEntry::TooDeep));
    }
    Ok(out)
}

fn join(comps: &[Vec<u8>]) -> Vec<u8> {
    if comps.is_empty() {
        return b".".to_vec();
    }
    comps.join(&b'/')
}

fn trim_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

fn read_capped<R: Read>(r: &mut R, cap: u64, what: &'static str) -> Result<Vec<u8>, Fail> {
    let mut v = Vec::new();
    r.take(cap + 1).read_to_end(&mut v).map_err(Fail::Stream)?;
    if v.len() as u64 > cap {
        return Err(Fail::Corrupt(CorruptLayer::Oversized { what, limit: cap }));
    }
    Ok(v)
}

fn timespec(secs: i64) -> TimeSpec {
    TimeSpec::new(secs as libc::time_t, 0)
}

impl Unpacker<'_> {
    fn run<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), UnpackError> {
        // Raw mode: GNU long names and PAX headers come to us as members, so they are
        // read with a size cap instead of being buffered whole by the tar crate.
        let entries = archive
            .entries()
            .map_err(|e| self.stream_error(e))?
            .raw(true);
        let mut ext = Extensions::default();
        for entry in entries {
            let mut entry = entry.map_err(|e| self.stream_error(e))?;
            let header = entry.header().clone();
            let extension = match header.entry_type() {
                EntryType::GNULongName => read_capped(&mut entry, MAX_LONG_NAME, "a GNU long name")
                    .map(|v| ext.long_name = Some(trim_nuls(v))),
                EntryType::GNULongLink => read_capped(&mut entry, MAX_LONG_NAME, "a GNU long link")
                    .map(|v| ext.long_link = Some(trim_nuls(v))),
                EntryType::XHeader => read_capped(&mut entry, MAX_PAX_HEADER, "a PAX header")
                    .map(|v| ext.pax = Some(v)),
                EntryType::XGlobalHeader => Ok(()),
                _ => {
                    let ext = std::mem::take(&mut ext);
                    let fallback_name = ext
                        .long_name
                        .clone()
                        .unwrap_or_else(|| header.path_bytes().into_owned());
                    let meta = self
                        .meta(&header, ext)
                        .map_err(|f| self.named(&fallback_name, f))?;
                    let path = meta.path.clone();
                    self.entry(&mut entry, meta)
                        .map_err(|f| self.named(&path, f))?;
                    continue;
                }
            };
            extension.map_err(|f| self.named(b"", f))?;
        }
        Ok(())
    }

    fn meta(&mut self, header: &tar::Header, ext: Extensions) -> Result<Meta, Fail> {
        let size = header
            .entry_size()
            .map_err(|e| Fail::Corrupt(CorruptLayer::HeaderSize(e)))?;
        // Like Go's archive/tar, an empty or unparsable numeric field reads as 0.
        let mut meta = Meta {
            path: ext
                .long_name
                .unwrap_or_else(|| header.path_bytes().into_owned()),
            link: ext
                .long_link
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned())),
            kind: header.entry_type(),
            size,
            mode: header.mode().unwrap_or(0),
            uid: header.uid().unwrap_or(0),
            gid: header.gid().unwrap_or(0),
            mtime: header.mtime().unwrap_or(0).min(i64::MAX as u64) as i64,
        };
        if let Some(pax) = ext.pax {
            for field in tar::PaxExtensions::new(&pax) {
                let field = field.map_err(|e| Fail::Corrupt(CorruptLayer::Pax(e)))?;
                let value = field.value_bytes();
                let number = || -> Result<u64, Fail> {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| {
                            Fail::Corrupt(CorruptLayer::PaxValue(lossy(field.key_bytes())))
                        })
                };
                match field.key_bytes() {
                    b"path" => meta.path = value.to_vec(),
                    b"linkpath" => meta.link = Some(value.to_vec()),
                    b"uid" => meta.uid = number()?,
                    b"gid" => meta.gid = number()?,
                    b"size" if number()? != size => {
                        return Err(Fail::Corrupt(CorruptLayer::PaxSize));
                    }
                    b"mtime" => {
                        let s = std::str::from_utf8(value).unwrap_or("");
                        let secs = s.split('.').next().unwrap_or("");
                        meta.mtime = secs.parse().unwrap_or(meta.mtime);
                    }
                    k if !self.ignored_xattrs
                        && (k.starts_with(b"SCHILY.xattr.")
                            || k.starts_with(b"LIBARCHIVE.xattr.")) =>
                    {
                        self.ignored_xattrs = true;
                        tracing::debug!(layer = %self.layer, "ignoring extended attributes in layer");
                    }
                    _ => {}
                }
            }
        }
        Ok(meta)
    }

    fn named(&self, path: &[u8], f: Fail) -> UnpackError {
        let layer = self.layer.clone();
        let entry = lossy(path);
        match f {
            Fail::Hostile(reason) => UnpackError::Hostile {
                layer,
                entry,
                reason,
            },
            Fail::Corrupt(reason) => UnpackError::Corrupt { layer, reason },
            Fail::Exceeded(e) => UnpackError::exceeded(&layer, e),
            Fail::Stream(e) => self.stream_error(e),
            Fail::Fs(op, err, from_layer) => UnpackError::Entry {
                layer,
                op,
                entry,
                err,
                from_layer,
            },
        }
    }

    fn stream_error(&self, e: io::Error) -> UnpackError {
        match self.budget.exceeded() {
            Some(x) => UnpackError::exceeded(&self.layer, x),
            None => UnpackError::Corrupt {
                layer: self.layer.clone(),
                reason: CorruptLayer::Stream(e),
            },
        }
    }

    fn entry<R: Read>(&mut self, data: &mut R, meta: Meta) -> Result<(), Fail> {
        self.entries += 1;
        self.budget.charge(0, 1)?;
        let comps = normalize(&meta.path)?;
        let Some((name, parent)) = comps.split_last() else {
            // The layer root ("./"). Its metadata is deliberately not applied.
            return match meta.kind {
                EntryType::Directory => Ok(()),
                _ => Err(Fail::Hostile(HostileEntry::NamesRoot)),
            };
        };
        let name = name.clone();

        if let Some(target) = name.strip_prefix(b".wh.") {
            return self.whiteout(parent, target);
        }

        match meta.kind {
            EntryType::Regular | EntryType::Continuous => self.file(parent, &name, data, &meta),
            EntryType::Directory => self.dir(&comps, &meta),
            EntryType::Symlink => self.symlink(parent, &name, &meta),
            EntryType::Link => self.hardlink(&comps, &meta),
            EntryType::Fifo => self.fifo(parent, &name, &meta),
            EntryType::Char | EntryType::Block => {
                tracing::warn!(layer = %self.layer, entry = %lossy(&meta.path), "skipping device node in layer");
                Ok(())
            }
            EntryType::GNUSparse => Err(Fail::Corrupt(CorruptLayer::Sparse)),
            other => {
                tracing::warn!(layer = %self.layer, entry = %lossy(&meta.path), kind = ?other, "skipping unsupported tar entry type");
                Ok(())
            }
        }
    }

    /// Opens `comps` (relative to the layer root) with `flags`, confined to the root.
    fn resolve(&self, comps: &[Vec<u8>], flags: OFlag) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(self.root.as_fd(), os(&join(comps)), how)
    }

    /// The directory `comps`, creating missing components (0755, like Docker) if `create`.
    fn dir_fd(&mut self, comps: &[Vec<u8>], create: bool) -> Result<OwnedFd, Fail> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        match self.resolve(comps, flags) {
            Err(Errno::ENOENT) if create => {}
            r => return r.map_err(fs("open parent directory of")),
        }
        let mut cur = self
            .resolve(&[], flags)
            .map_err(fs("open layer root for"))?;
        for i in 0..comps.len() {
            match self.resolve(&comps[..=i], flags) {
                Ok(fd) => {
                    cur = fd;
                    continue;
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(fs("open parent directory of")(e)),
            }
            match mkdirat(cur.as_fd(), os(&comps[i]), Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(fs("create parent directory of")(e)),
            }
            self.dirs.push(DeferredDir {
                path: comps[..=i].to_vec(),
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: None,
            });
            cur = self
                .resolve(&comps[..=i], flags)
                .map_err(fs("open parent directory of"))?;
        }
        Ok(cur)
    }

    /// Removes whatever is at `dir/name`, except a directory when `keep_dir`.
    /// Returns whether a directory was kept.
    fn clear(&self, dir: BorrowedFd<'_>, name: &[u8], keep_dir: bool) -> Result<bool, Fail> {
        match fstatat(dir, os(name), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(fs("inspect")(e)),
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                if keep_dir {
                    return Ok(true);
                }
                remove_tree_at(dir, os(name)).map_err(|e| Fail::Fs("replace", e, false))?;
                Ok(false)
            }
            Ok(_) => {
                unlinkat(dir, os(name), UnlinkatFlags::NoRemoveDir).map_err(fs("replace"))?;
                Ok(false)
            }
        }
    }

    fn ids(&self, uid: u64, gid: u64) -> Option<(Uid, Gid)> {
        match self.owner {
            LayerOwner::Identity => None,
            LayerOwner::Shift {
                uid: base_uid,
                gid: base_gid,
                size,
            } => {
                let overflow = 65534u32.min(size.saturating_sub(1));
                let map = |base: u32, id: u64| {
                    let off = if id < u64::from(size) {
                        id as u32
                    } else {
                        overflow
                    };
                    base.saturating_add(off)
                };
                Some((
                    Uid::from_raw(map(base_uid, uid)),
                    Gid::from_raw(map(base_gid, gid)),
                ))
            }
        }
    }

    fn chown_fd(&self, fd: BorrowedFd<'_>, uid: u64, gid: u64) -> Result<(), Fail> {
        if let Some((u, g)) = self.ids(uid, gid) {
            fchown(fd, Some(u), Some(g)).map_err(|e| Fail::Fs("chown", e.into(), false))?;
        }
        Ok(())
    }

    fn chown_at(&self, dir: BorrowedFd<'_>, name: &[u8], uid: u64, gid: u64) -> Result<(), Fail> {
        if let Some((u, g)) = self.ids(uid, gid) {
            fchownat(
                dir,
                os(name),
                Some(u),
                Some(g),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| Fail::Fs("chown", e.into(), false))?;
        }
        Ok(())
    }

    fn whiteout(&mut self, parent: &[Vec<u8>], target: &[u8]) -> Result<(), Fail> {
        if target == b".wh..opq" {
            let dir = self.dir_fd(parent, true)?;
            return self.set_opaque(dir.as_fd());
        }
        if target.starts_with(b".wh.") {
            // Other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs): not needed by overlayfs.
            return Ok(());
        }
        if target.is_empty() || target == b"." || target == b".." {
            return Err(Fail::Hostile(HostileEntry::WhiteoutName));
        }
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), target, false)?;
        mknodat(
            dir.as_fd(),
            os(target),
            SFlag::S_IFCHR,
            Mode::empty(),
            WHITEOUT_DEV,
        )
        .map_err(|e| Fail::Fs("create whiteout", e.into(), false))?;
        self.chown_at(dir.as_fd(), target, 0, 0)
    }

    fn set_opaque(&self, dir: BorrowedFd<'_>) -> Result<(), Fail> {
        // fsetxattr needs a real (not O_PATH) fd; reopen the directory through ".".
        let fd = openat(
            dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Fail::Fs("open opaque directory", e.into(), false))?;
        // SAFETY: `fd` is an open directory fd owned by this function; the name is a
        // NUL-terminated static string and the value pointer/length describe a live
        // 1-byte slice. fsetxattr does not retain either pointer.
        let rc = unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                OPAQUE_XATTR.as_ptr().cast(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        if rc != 0 {
            return Err(Fail::Fs(
                "mark opaque directory",
                io::Error::last_os_error(),
                false,
            ));
        }
        Ok(())
    }

    fn file<R: Read>(
        &mut self,
        parent: &[Vec<u8>],
        name: &[u8],
        data: &mut R,
        meta: &Meta,
    ) -> Result<(), Fail> {
        self.budget.check_fits(meta.size)?;
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        let fd = openat(
            dir.as_fd(),
            os(name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(fs("create"))?;
        let mut file = File::from(fd);
        let mut written = 0u64;
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fail::Stream(e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| Fail::Fs("write", e, false))?;
            written += n as u64;
        }
        if written != meta.size {
            return Err(Fail::Corrupt(CorruptLayer::Truncated {
                written,
                size: meta.size,
            }));
        }
        self.chown_fd(file.as_fd(), meta.uid, meta.gid)?;
        fchmod(file.as_fd(), Mode::from_bits_truncate(meta.mode & 0o1777))
            .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
        let t = timespec(meta.mtime);
        futimens(file.as_fd(), &t, &t).map_err(|e| Fail::Fs("set mtime of", e.into(), false))?;
        Ok(())
    }

    fn dir(&mut self, comps: &[Vec<u8>], meta: &Meta) -> Result<(), Fail> {
        let Some((name, parent)) = comps.split_last() else {
            return Ok(());
        };
        let dir = self.dir_fd(parent, true)?;
        if !self.clear(dir.as_fd(), name, true)? {
            mkdirat(dir.as_fd(), os(name), Mode::from_bits_truncate(0o700))
                .map_err(fs("create directory"))?;
        }
        self.dirs.push(DeferredDir {
            path: comps.to_vec(),
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            mtime: Some(meta.mtime),
        });
        Ok(())
    }

    fn symlink(&mut self, parent: &[Vec<u8>], name: &[u8], meta: &Meta) -> Result<(), Fail> {
        let target = match &meta.link {
            Some(t) if !t.is_empty() && !t.contains(&0) => t.clone(),
            _ => return Err(Fail::Corrupt(CorruptLayer::SymlinkTarget)),
        };
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        symlinkat(os(&target), dir.as_fd(), os(name)).map_err(fs("create symlink"))?;
        self.chown_at(dir.as_fd(), name, meta.uid, meta.gid)?;
        let t = timespec(meta.mtime);
        utimensat(
            dir.as_fd(),
            os(name),
            &t,
            &t,
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| Fail::Fs("set mtime of", e.into(), false))
    }

    fn hardlink(&mut self, comps: &[Vec<u8>], meta: &Meta) -> Result<(), Fail> {
        let Some(link) = &meta.link else {
            return Err(Fail::Corrupt(CorruptLayer::LinkTarget));
        };
        let target = normalize(link)?;
        let Some((target_name, target_parent)) = target.split_last() else {
            return Err(Fail::Hostile(HostileEntry::LinkToRoot));
        };
        if target == comps {
            return Ok(());
        }
        let Some((name, parent)) = comps.split_last() else {
            return Err(Fail::Hostile(HostileEntry::LinkNamedRoot));
        };
        let target_dir = match self.dir_fd(target_parent, false) {
            Ok(fd) => fd,
            Err(Fail::Fs(_, e, _)) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(Fail::Hostile(HostileEntry::LinkOutside(lossy(link))));
            }
            Err(f) => return Err(f),
        };
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        match linkat(
            target_dir.as_fd(),
            os(target_name),
            dir.as_fd(),
            os(name),
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::ENOENT) => Err(Fail::Hostile(HostileEntry::LinkOutside(lossy(link)))),
            Err(Errno::EPERM) => Err(Fail::Hostile(HostileEntry::LinkToDirectory(lossy(link)))),
            Err(e) => Err(fs("create hard link")(e)),
        }
    }

    fn fifo(&mut self, parent: &[Vec<u8>], name: &[u8], meta: &Meta) -> Result<(), Fail> {
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        let mode = Mode::from_bits_truncate(meta.mode & 0o1777);
        mknodat(dir.as_fd(), os(name), SFlag::S_IFIFO, mode, 0).map_err(fs("create fifo"))?;
        self.chown_at(dir.as_fd(), name, meta.uid, meta.gid)?;
        // mknodat applied the umask; set the exact mode (a fifo is never a symlink).
        fchmodat(dir.as_fd(), os(name), mode, FchmodatFlags::FollowSymlink)
            .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
        let t = timespec(meta.mtime);
        utimensat(
            dir.as_fd(),
            os(name),
            &t,
            &t,
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| Fail::Fs("set mtime of", e.into(), false))
    }

    /// Applies directory metadata deepest first, fixes the root, and syncs the tree.
    fn finish(&mut self) -> Result<(), UnpackError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|d| Reverse(d.path.len()));
        for d in &dirs {
            let fd = match self.resolve(
                &d.path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            ) {
                Ok(fd) => fd,
                // Replaced by a later entry (or reachable only through a directory that
                // already has its final, restrictive mode): nothing to apply.
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR | Errno::EACCES) => continue,
                Err(e) => return Err(self.named(&join(&d.path), fs("open directory")(e))),
            };
            let apply = || -> Result<(), Fail> {
                self.chown_fd(fd.as_fd(), d.uid, d.gid)?;
                fchmod(fd.as_fd(), Mode::from_bits_truncate(d.mode & 0o1777))
                    .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
                if let Some(mtime) = d.mtime {
                    let t = timespec(mtime);
                    futimens(fd.as_fd(), &t, &t)
                        .map_err(|e| Fail::Fs("set mtime of", e.into(), false))?;
                }
                Ok(())
            };
            apply().map_err(|f| self.named(&join(&d.path), f))?;
        }
        let root = self.root.as_fd();
        self.chown_fd(root, 0, 0).map_err(|f| self.named(b".", f))?;
        fchmod(root, Mode::from_bits_truncate(0o755))
            .map_err(|e| self.named(b".", Fail::Fs("chmod", e.into(), false)))?;
        nix::unistd::syncfs(root)
            .map_err(|e| self.named(b".", Fail::Fs("sync", e.into(), false)))?;
        Ok(())
    }
}

/// Removes `path` and everything below it without following symlinks, making
/// directories writable first (a rootless layer may contain 0555 directories).
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name"));
    };
    let dir = openat(
        nix::fcntl::AT_FDCWD,
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    remove_tree_at(dir.as_fd(), name)
}

fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(e.into()),
    }
    // Only this process writes below the store's tmp/ and layer directories, and unlink
    // just said this is a directory, so following a symlink here is not a concern.
    fchmodat(
        parent,
        name,
        Mode::from_bits_truncate(0o700),
        FchmodatFlags::FollowSymlink,
    )?;
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let dup = fd.try_clone()?;
    let mut dir = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    for n in names {
        remove_tree_at(dup.as_fd(), os(&n))?;
    }
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    /// Builds a tar with raw headers so hostile names reach the unpacker unmodified.
    pub(crate) struct TarBuilder {
        data: Vec<u8>,
    }

    pub(crate) enum Member<'a> {
        File(&'a [u8], &'a [u8], u32),
        Dir(&'a [u8], u32),
        Symlink(&'a [u8], &'a [u8]),
        Hardlink(&'a [u8], &'a [u8]),
        Char(&'a [u8]),
        Fifo(&'a [u8]),
        /// A PAX extended header for the next member.
        Pax(&'a [(&'a str, &'a [u8])]),
    }

    fn pax_records(records: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in records {
            let rest = k.len() + v.len() + 3; // ' ', '=', '\n'
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            out.extend_from_slice(format!("{len} {k}=").as_bytes());
            out.extend_from_slice(v);
            out.push(b'\n');
        }
        out
    }

    impl TarBuilder {
        pub(crate) fn new() -> Self {
            TarBuilder { data: Vec::new() }
        }

        pub(crate) fn add(&mut self, m: Member<'_>) -> &mut Self {
            let mut h = tar::Header::new_gnu();
            let pax;
            let (path, kind, body, mode, link): (&[u8], EntryType, &[u8], u32, Option<&[u8]>) =
                match m {
                    Member::File(p, body, mode) => (p, EntryType::Regular, body, mode, None),
                    Member::Dir(p, mode) => (p, EntryType::Directory, b"", mode, None),
                    Member::Symlink(p, t) => (p, EntryType::Symlink, b"", 0o777, Some(t)),
                    Member::Hardlink(p, t) => (p, EntryType::Link, b"", 0o644, Some(t)),
                    Member::Char(p) => (p, EntryType::Char, b"", 0o666, None),
                    Member::Fifo(p) => (p, EntryType::Fifo, b"", 0o640, None),
                    Member::Pax(records) => {
                        pax = pax_records(records);
                        (
                            &b"PaxHeaders/x"[..],
                            EntryType::XHeader,
                            &pax[..],
                            0o644,
                            None,
                        )
                    }
                };
            // Raw name bytes: `set_path` would refuse `..` and absolute paths.
            let name = &mut h.as_old_mut().name;
            assert!(path.len() <= name.len());
            name[..path.len()].copy_from_slice(path);
            if let Some(link) = link {
                let l = &mut h.as_old_mut().linkname;
                l[..link.len()].copy_from_slice(link);
            }
            h.set_entry_type(kind);
            h.set_size(body.len() as u64);
            h.set_mode(mode);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_600_000_000);
            if kind == EntryType::Char {
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
            }
            h.set_cksum();
            self.data.extend_from_slice(h.as_bytes());
            self.data.extend_from_slice(body);
            let pad = (512 - body.len() % 512) % 512;
            self.data.extend(std::iter::repeat_n(0, pad));
            self
        }

        pub(crate) fn tar(&self) -> Vec<u8> {
            let mut t = self.data.clone();
            t.extend(std::iter::repeat_n(0, 1024));
            t
        }
    }

    pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// A test area: `base/layer` is the layer directory, `base/sentinel` a sibling that
    /// hostile entries try to reach.
    pub(crate) struct Area {
        pub _tmp: tempfile::TempDir,
        pub base: PathBuf,
        pub layer: PathBuf,
        pub blob: PathBuf,
    }

    pub(crate) fn area() -> Area {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_owned();
        std::fs::create_dir(base.join("sentinel")).unwrap();
        std::fs::write(base.join("sentinel/file"), b"keep").unwrap();
        Area {
            layer: base.join("layer"),
            blob: base.join("blob"),
            base,
            _tmp: tmp,
        }
    }

    impl Area {
        /// Unpacks `blob_bytes` whose digests are computed here (so only content is tested).
        pub(crate) fn unpack(
            &self,
            blob_bytes: &[u8],
            tar: &[u8],
            owner: LayerOwner,
            budget: &Budget,
        ) -> Result<LayerStats, UnpackError> {
            std::fs::write(&self.blob, blob_bytes).unwrap();
            unpack_layer(
                &self.blob,
                &Digest::of(blob_bytes),
                &Digest::of(tar),
                &self.layer,
                owner,
                budget,
            )
        }

        pub(crate) fn unpack_tar(&self, tar: &[u8]) -> Result<LayerStats, UnpackError> {
            self.unpack(&gzip(tar), tar, LayerOwner::Identity, &big_budget())
        }

        /// Nothing but `layer`, `blob` and the untouched sentinel exists around the layer.
        pub(crate) fn assert_contained(&self) {
            let mut names: Vec<String> = std::fs::read_dir(&self.base)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.retain(|n| n != "layer");
            assert_eq!(
                names,
                vec!["blob", "sentinel"],
                "unexpected files next to the layer"
            );
            let sentinel: Vec<_> = std::fs::read_dir(self.base.join("sentinel"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(sentinel, vec![std::ffi::OsString::from("file")]);
            assert_eq!(
                std::fs::read(self.base.join("sentinel/file")).unwrap(),
                b"keep"
            );
            assert!(!Path::new("/escape").exists() && !Path::new("/abs-escape").exists());
        }
    }

    pub(crate) fn big_budget() -> Budget {
        Budget::new(1 << 30, 1 << 20)
    }

    fn assert_refused(area: &Area, tar: &[u8]) -> UnpackError {
        let err = area
            .unpack_tar(tar)
            .expect_err("a hostile layer must be refused");
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        assert!(
            !area.layer.exists(),
            "a refused layer must not be left behind"
        );
        area.assert_contained();
        err
    }

    #[test]
    fn unpacks_regular_tree() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Dir(b"./", 0o755))
            .add(Member::Dir(b"bin/", 0o755))
            .add(Member::File(b"bin/fn", b"#!/bin/sh\necho hi\n", 0o755))
            .add(Member::File(b"etc/config", b"x=1", 0o644))
            .add(Member::Symlink(b"bin/link", b"/bin/fn"))
            .add(Member::Hardlink(b"bin/hard", b"bin/fn"))
            .add(Member::Fifo(b"run/fifo"))
            .add(Member::Dir(b"ro/", 0o555))
            .add(Member::File(b"ro/inside", b"data", 0o444))
            .tar();
        let stats = a.unpack_tar(&tar).unwrap();
        assert_eq!(stats.entries, 9);
        assert_eq!(stats.bytes, tar.len() as u64);
        let l = &a.layer;
        assert_eq!(
            std::fs::read(l.join("bin/fn")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(
            std::fs::read_link(l.join("bin/link")).unwrap(),
            Path::new("/bin/fn")
        );
        let fnm = std::fs::metadata(l.join("bin/fn")).unwrap();
        assert_eq!(fnm.permissions().mode() & 0o7777, 0o755);
        assert_eq!(fnm.mtime(), 1_600_000_000);
        assert_eq!(
            std::fs::metadata(l.join("bin/hard")).unwrap().ino(),
            fnm.ino()
        );
        assert!(
            std::fs::metadata(l.join("run/fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
        // Implicit parents get 0755; explicit modes apply after the contents.
        assert_eq!(
            std::fs::metadata(l.join("etc"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
        let ro = std::fs::metadata(l.join("ro")).unwrap();
        assert_eq!(ro.permissions().mode() & 0o7777, 0o555);
        assert_eq!(ro.mtime(), 1_600_000_000);
        assert_eq!(std::fs::read(l.join("ro/inside")).unwrap(), b"data");
        assert_eq!(
            std::fs::metadata(l).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        a.assert_contained();
        remove_tree(l).unwrap();
        assert!(!l.exists());
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::File(b"etc/.wh.removed", b"", 0o644))
            .add(Member::Dir(b"opaque/", 0o755))
            .add(Member::File(b"opaque/.wh..wh..opq", b"", 0o644))
            .add(Member::File(b"opaque/kept", b"k", 0o644))
            .add(Member::File(b".wh..wh.plnk", b"", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let wh = std::fs::symlink_metadata(a.layer.join("etc/removed")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        assert!(!a.layer.join("etc/.wh.removed").exists());
        assert!(!a.layer.join(".wh..wh.plnk").exists());
        assert!(!a.layer.join("opaque/.wh..wh..opq").exists());
        assert_eq!(
            read_xattr(&a.layer.join("opaque"), "user.overlay.opaque").as_deref(),
            Some(&b"y"[..])
        );
        assert!(read_xattr(&a.layer.join("etc"), "user.overlay.opaque").is_none());
        a.assert_contained();
    }

    pub(crate) fn read_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
        let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = [0u8; 64];
        // SAFETY: both strings are NUL-terminated CStrings alive for the call and `buf` is
        // a writable buffer of the length passed.
        let rc =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        (rc >= 0).then(|| buf[..rc as usize].to_vec())
    }

    #[test]
    fn refuses_dotdot_escape() {
        let a = area();
        let err = assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"../escape", b"x", 0o644))
                .tar(),
        );
        assert!(err.to_string().contains("leaves the layer root"), "{err}");
        assert!(
            matches!(
                err,
                UnpackError::Hostile {
                    reason: HostileEntry::LeavesRoot,
                    ..
                }
            ),
            "{err}"
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"a/../../sentinel/file", b"x", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Dir(b"../sentinel/newdir/", 0o755))
                .tar(),
        );
    }

    #[test]
    fn absolute_paths_stay_inside() {
        let a = area();
        let abs = format!("{}/abs-escape", a.base.display());
        let tar = TarBuilder::new()
            .add(Member::File(b"/abs-escape", b"x", 0o644))
            .add(Member::File(abs.as_bytes(), b"y", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        assert_eq!(std::fs::read(a.layer.join("abs-escape")).unwrap(), b"x");
        let inner = a.layer.join(abs.trim_start_matches('/'));
        assert_eq!(std::fs::read(inner).unwrap(), b"y");
        a.assert_contained();
    }

    #[test]
    fn symlinks_cannot_lead_out() {
        let a = area();
        let sentinel = a.base.join("sentinel");
        let sentinel = sentinel.to_str().unwrap().as_bytes();
        // Writing through a symlink resolves it inside the layer root; where that target
        // does not exist in the layer, the layer is refused.
        let refused: [(&[u8], &[u8], &[u8]); 4] = [
            (b"etc", b"/etc", b"etc/escape-passwd"),
            (b"abs", sentinel, b"abs/file"),
            (b"rel", b"../sentinel", b"rel/new"),
            (b"d", b"../../sentinel", b"d/file"),
        ];
        for (link, target, file) in refused {
            let tar = TarBuilder::new()
                .add(Member::Symlink(link, target))
                .add(Member::File(file, b"x", 0o644))
                .tar();
            assert_refused(&a, &tar);
        }
        assert!(!Path::new("/etc/escape-passwd").exists());

        let tar = TarBuilder::new()
            .add(Member::Dir(b"etc/", 0o755))
            .add(Member::Symlink(b"sys-etc", b"/etc"))
            .add(Member::File(b"sys-etc/escape-passwd", b"x", 0o644))
            .add(Member::Symlink(b"up", b"../.."))
            .add(Member::File(b"up/escape", b"y", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        assert!(!Path::new("/etc/escape-passwd").exists());
        assert_eq!(
            std::fs::read(a.layer.join("etc/escape-passwd")).unwrap(),
            b"x"
        );
        assert_eq!(std::fs::read(a.layer.join("escape")).unwrap(), b"y");
        a.assert_contained();
    }

    #[test]
    fn symlink_replacing_directory_does_not_redirect_later_entries() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Dir(b"d/", 0o755))
            .add(Member::Symlink(b"d", b"../sentinel"))
            .add(Member::File(b"d/file", b"x", 0o644))
            .tar();
        assert_refused(&a, &tar);
    }

    #[test]
    fn hardlinks_cannot_lead_out() {
        let a = area();
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"passwd", b"/etc/passwd"))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"x", b"../sentinel/file"))
                .tar(),
        );
        let outside = format!("{}/sentinel/file", a.base.display());
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"x", outside.as_bytes()))
                .tar(),
        );
        // Through a symlink that points out: resolved inside the root, where nothing is.
        let tar = TarBuilder::new()
            .add(Member::Symlink(b"s", b"../sentinel"))
            .add(Member::Hardlink(b"x", b"s/file"))
            .tar();
        assert_refused(&a, &tar);
        let tar = TarBuilder::new()
            .add(Member::Dir(b"d/", 0o755))
            .add(Member::Hardlink(b"x", b"d"))
            .tar();
        assert_refused(&a, &tar);
        assert!(
            std::fs::metadata(a.base.join("sentinel/file"))
                .unwrap()
                .nlink()
                == 1
        );
    }

    #[test]
    fn pax_headers_apply_but_xattrs_do_not() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Pax(&[
                ("path", b"pax/real-name"),
                ("mtime", b"1700000000.5"),
            ]))
            .add(Member::File(b"ignored-name", b"p", 0o644))
            .add(Member::Pax(&[("SCHILY.xattr.user.overlay.opaque", b"y")]))
            .add(Member::Dir(b"not-opaque/", 0o755))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let f = a.layer.join("pax/real-name");
        assert_eq!(std::fs::read(&f).unwrap(), b"p");
        assert_eq!(std::fs::metadata(&f).unwrap().mtime(), 1_700_000_000);
        assert!(!a.layer.join("ignored-name").exists());
        assert!(read_xattr(&a.layer.join("not-opaque"), "user.overlay.opaque").is_none());
        remove_tree(&a.layer).unwrap();

        let escape = TarBuilder::new()
            .add(Member::Pax(&[("path", b"../escape")]))
            .add(Member::File(b"innocent", b"x", 0o644))
            .tar();
        assert_refused(&a, &escape);
        let link_escape = TarBuilder::new()
            .add(Member::File(b"f", b"x", 0o644))
            .add(Member::Pax(&[("linkpath", b"../sentinel/file")]))
            .add(Member::Hardlink(b"l", b"f"))
            .tar();
        assert_refused(&a, &link_escape);
        let huge = vec![b'a'; 2 << 20];
        let oversized = TarBuilder::new()
            .add(Member::Pax(&[("comment", &huge)]))
            .add(Member::File(b"f", b"x", 0o644))
            .tar();
        assert_refused(&a, &oversized);
    }

    #[test]
    fn device_nodes_are_skipped() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Char(b"dev/null"))
            .add(Member::File(b"ok", b"1", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        assert!(std::fs::symlink_metadata(a.layer.join("dev/null")).is_err());
        assert!(a.layer.join("ok").exists());
        a.assert_contained();
    }

    #[test]
    fn whiteouts_with_traversal_are_refused() {
        let a = area();
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"../.wh.sentinel", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"a/.wh..", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b".wh...", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"x/.wh.", b"", 0o644))
                .tar(),
        );
        // A whiteout through a symlink resolves inside the layer, where nothing is.
        let tar = TarBuilder::new()
            .add(Member::Symlink(b"s", b"../sentinel"))
            .add(Member::File(b"s/.wh.file", b"", 0o644))
            .tar();
        assert_refused(&a, &tar);
        assert!(a.base.join("sentinel/file").exists());
    }

    #[test]
    fn setuid_and_setgid_are_stripped() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::File(b"suid", b"x", 0o4755))
            .add(Member::File(b"sgid", b"x", 0o2755))
            .add(Member::Dir(b"sgiddir/", 0o2775))
            .add(Member::Dir(b"sticky/", 0o1777))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(a.layer.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("suid"), 0o755);
        assert_eq!(mode("sgid"), 0o755);
        assert_eq!(mode("sgiddir"), 0o775);
        assert_eq!(mode("sticky"), 0o1777);
    }

    #[test]
    fn decompression_bomb_stops_at_the_limit() {
        let a = area();
        // 64 MiB of zeros compresses to ~64 KiB; the budget is 1 MiB.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, "bomb", io::repeat(0).take(64 << 20))
            .unwrap();
        let tar = tar.into_inner().unwrap();
        let gz = gzip(&tar);
        assert!(gz.len() < 1 << 20);
        let err = a
            .unpack(&gz, &tar, LayerOwner::Identity, &Budget::new(1 << 20, 100))
            .unwrap_err();
        assert!(
            matches!(err, UnpackError::TooLarge { limit, .. } if limit == 1 << 20),
            "{err}"
        );
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt);
        assert!(!a.layer.exists());

        // Many small files: the stream is charged as it is read, so this fails too.
        let mut b = TarBuilder::new();
        let names: Vec<String> = (0..3000).map(|i| format!("f{i}")).collect();
        for n in &names {
            b.add(Member::File(n.as_bytes(), b"", 0o644));
        }
        let tar = b.tar();
        let err = a
            .unpack(
                &gzip(&tar),
                &tar,
                LayerOwner::Identity,
                &Budget::new(1 << 30, 1000),
            )
            .unwrap_err();
        assert!(
            matches!(err, UnpackError::TooManyEntries { limit: 1000, .. }),
            "{err}"
        );
    }

    #[test]
    fn digest_mismatch_is_refused() {
        let a = area();
        let tar = TarBuilder::new().add(Member::File(b"f", b"x", 0o644)).tar();
        let gz = gzip(&tar);
        std::fs::write(&a.blob, &gz).unwrap();
        let wrong = Digest::of(b"something else");
        let err = unpack_layer(
            &a.blob,
            &wrong,
            &Digest::of(&tar),
            &a.layer,
            LayerOwner::Identity,
            &big_budget(),
        )
        .unwrap_err();
        assert!(
            matches!(err, UnpackError::DigestMismatch { what: "blob", .. }),
            "{err}"
        );
        assert!(!a.layer.exists());
        let err = unpack_layer(
            &a.blob,
            &Digest::of(&gz),
            &wrong,
            &a.layer,
            LayerOwner::Identity,
            &big_budget(),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                UnpackError::DigestMismatch {
                    what: "diff_id",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!a.layer.exists());
        // Trailing data after the end of the archive is covered by the diff_id.
        let mut padded = tar.clone();
        padded.extend_from_slice(b"trailing");
        let err = a
            .unpack(&gzip(&padded), &tar, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert!(
            matches!(
                err,
                UnpackError::DigestMismatch {
                    what: "diff_id",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn uncompressed_layers_and_long_names() {
        let a = area();
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/file", "d".repeat(200));
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        a.unpack(&tar, &tar, LayerOwner::Identity, &big_budget())
            .unwrap();
        assert_eq!(std::fs::read(a.layer.join(&long)).unwrap(), b"hi");
    }

    #[test]
    fn zstd_layers_in_one_or_several_frames() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, "etc/hello", &b"world"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let one = zstd::encode_all(&tar[..], 3).unwrap();
        let (head, tail) = tar.split_at(700);
        let mut two = zstd::encode_all(head, 1).unwrap();
        two.extend(zstd::encode_all(tail, 19).unwrap());
        for blob in [one, two] {
            let a = area();
            let stats = a
                .unpack(&blob, &tar, LayerOwner::Identity, &big_budget())
                .unwrap();
            assert_eq!(stats.bytes, tar.len() as u64);
            assert_eq!(std::fs::read(a.layer.join("etc/hello")).unwrap(), b"world");
            a.assert_contained();
        }
        // A truncated zstd stream is refused and leaves nothing behind.
        let a = area();
        let blob = zstd::encode_all(&tar[..], 3).unwrap();
        let cut = &blob[..blob.len() - 4];
        let err = a
            .unpack(cut, &tar, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        assert!(!a.layer.exists());
    }

    #[test]
    fn zstd_bomb_stops_at_the_limit() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        let big = vec![0u8; 8 << 20];
        h.set_size(big.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", &big[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let blob = zstd::encode_all(&tar[..], 19).unwrap();
        assert!(blob.len() < 4096, "{}", blob.len());
        let a = area();
        let err = a
            .unpack(
                &blob,
                &tar,
                LayerOwner::Identity,
                &Budget::new(1 << 20, 100),
            )
            .unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge { .. }), "{err}");
        assert!(!a.layer.exists());
    }

    #[test]
    fn shift_owner_maps_ids() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let a = area();
        let mut b = tar::Builder::new(Vec::new());
        for (name, uid) in [("root", 0u64), ("user", 1000), ("huge", 1 << 20)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o644);
            h.set_uid(uid);
            h.set_gid(uid);
            b.append_data(&mut h, name, &b""[..]).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let owner = LayerOwner::Shift {
            uid: 100_000,
            gid: 200_000,
            size: 65536,
        };
        a.unpack(&gzip(&tar), &tar, owner, &big_budget()).unwrap();
        let ids = |p: &str| {
            let m = std::fs::metadata(a.layer.join(p)).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(ids("root"), (100_000, 200_000));
        assert_eq!(ids("user"), (101_000, 201_000));
        assert_eq!(ids("huge"), (165_534, 265_534));
        assert_eq!(ids(""), (100_000, 200_000));
    }

    #[test]
    fn garbage_is_corrupt() {
        let a = area();
        let junk = vec![0x42u8; 2048];
        let err = a
            .unpack(&junk, &junk, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        let err = a
            .unpack(
                &[0x1f, 0x8b, 1, 2, 3],
                &junk,
                LayerOwner::Identity,
                &big_budget(),
            )
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        a.assert_contained();
    }
}
