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
//!
//! One module each: `stream` (decompression, hashing, the budget), `meta` (tar headers,
//! long names, PAX, path normalization), `confined` (the confined writes into the layer
//! directory) and `remove` (tree removal); this file reads the members and dispatches.

mod confined;
mod fail;
mod meta;
mod reason;
mod remove;
mod stream;
#[cfg(test)]
pub(crate) mod testutil;

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use tar::EntryType;

use self::confined::LayerTree;
use self::fail::{Fail, lossy};
use self::meta::{
    Extensions, MAX_LONG_NAME, MAX_PAX_HEADER, Meta, normalize, read_capped, trim_nuls,
};
pub use self::reason::{CorruptLayer, HostileEntry};
pub(crate) use self::remove::remove_tree;
pub(crate) use self::stream::{Budget, Exceeded};
use crate::config::LayerOwner;
use fnrun_registry::digest::Digest;

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

impl UnpackError {
    pub(crate) fn kind(&self) -> fnrun_registry::ErrorKind {
        match self {
            UnpackError::Entry {
                from_layer: false, ..
            }
            | UnpackError::Io { .. } => fnrun_registry::ErrorKind::Internal,
            _ => fnrun_registry::ErrorKind::Corrupt,
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

/// The unpacker as the cache runs it, for the `layer` fuzz target of
/// `fnrun-fuzz` only (hidden: not part of the cache's API). Unpacks the
/// uncompressed tar at `blob` into `dest`, which must not exist, with
/// `max_bytes` and `max_entries` left in the image's budget and the runner's
/// own ids as owner; returns the tar's bytes and entries, or the error and
/// how the daemon would classify it.
#[doc(hidden)]
pub fn unpack_tar_for_fuzzing(
    blob: &Path,
    dest: &Path,
    max_bytes: u64,
    max_entries: u64,
) -> Result<(u64, u64), (UnpackError, fnrun_registry::ErrorKind)> {
    let tar = std::fs::read(blob).map_err(|err| {
        let e = UnpackError::Io {
            op: "read layer blob",
            path: blob.to_owned(),
            err,
        };
        let kind = e.kind();
        (e, kind)
    })?;
    let digest = Digest::of(&tar);
    let budget = Budget::new(max_bytes, max_entries);
    match unpack_layer(blob, &digest, &digest, dest, LayerOwner::Identity, &budget) {
        Ok(stats) => Ok((stats.bytes, stats.entries)),
        Err(e) => {
            let kind = e.kind();
            Err((e, kind))
        }
    }
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
    let tree = LayerTree::open(dest, owner).map_err(|e| UnpackError::Io {
        op: "open layer directory",
        path: dest.to_owned(),
        err: e.into(),
    })?;
    let corrupt = |reason: CorruptLayer| UnpackError::Corrupt {
        layer: layer.clone(),
        reason,
    };
    let stream = stream::open(file, budget).map_err(corrupt)?;

    let mut unpacker = Unpacker {
        layer: layer.clone(),
        tree,
        budget,
        entries: 0,
        ignored_xattrs: false,
    };
    let mut archive = tar::Archive::new(stream);
    unpacker.run(&mut archive)?;

    // Hash everything after the end-of-archive marker too: the digests cover whole streams.
    let mut stream = archive.into_inner();
    io::copy(&mut stream, &mut io::sink()).map_err(|e| unpacker.stream_error(e))?;
    let digests = stream.finish().map_err(corrupt)?;
    if digests.blob != *compressed {
        return Err(UnpackError::DigestMismatch {
            layer,
            what: "blob",
            expected: compressed.to_string(),
            actual: digests.blob.to_string(),
        });
    }
    if digests.diff_id != *diff_id {
        return Err(UnpackError::DigestMismatch {
            layer,
            what: "diff_id",
            expected: diff_id.to_string(),
            actual: digests.diff_id.to_string(),
        });
    }

    unpacker.finish()?;
    Ok(LayerStats {
        bytes: digests.tar_bytes,
        entries: unpacker.entries,
    })
}

/// Unpacks the members of one layer's tar stream into its [`LayerTree`].
struct Unpacker<'b> {
    layer: String,
    tree: LayerTree,
    budget: &'b Budget,
    entries: u64,
    ignored_xattrs: bool,
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
                    let meta =
                        meta::parse(&header, ext).map_err(|f| self.named(&fallback_name, f))?;
                    if meta.xattrs && !self.ignored_xattrs {
                        self.ignored_xattrs = true;
                        tracing::debug!(layer = %self.layer, "ignoring extended attributes in layer");
                    }
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
            return self.tree.whiteout(parent, target);
        }

        match meta.kind {
            EntryType::Regular | EntryType::Continuous => {
                self.budget.check_fits(meta.size)?;
                self.tree.file(parent, &name, data, &meta)
            }
            EntryType::Directory => self.tree.dir(&comps, &meta),
            EntryType::Symlink => self.tree.symlink(parent, &name, &meta),
            EntryType::Link => self.tree.hardlink(&comps, &meta),
            EntryType::Fifo => self.tree.fifo(parent, &name, &meta),
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

    /// Applies directory metadata deepest first, fixes the root, and syncs the tree.
    fn finish(&mut self) -> Result<(), UnpackError> {
        self.tree.finish().map_err(|(path, f)| self.named(&path, f))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use super::*;
    use crate::unpack::testutil::{Member, TarBuilder, area};

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
}
