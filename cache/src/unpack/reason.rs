//! Why a layer is refused: an entry that tries to reach outside the layer, or a stream
//! that is not a readable tar. The payloads of [`super::UnpackError`], raised by every
//! stage of the unpacking; a leaf, so the stages and the error can all use them.

use std::io;

/// The most path components an entry may have. Legitimate images stay far below; the
/// cap bounds recursion and open fds when removing a tree.
pub(super) const MAX_DEPTH: usize = 256;

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
