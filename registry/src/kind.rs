//! The classes of an image failure, for the runner's one table of gRPC codes and exit
//! codes: this crate's errors each have a class, and so do the cache's, built on them.

/// The class of an image error (a reference, a manifest, a registry's or the cache's),
/// for mapping to gRPC codes and exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The reference is malformed.
    InvalidReference,
    /// Image, tag or platform not found in the registry or layout.
    NotFound,
    /// The registry refused the credentials.
    Unauthorized,
    /// Pull policy Never and the image is not cached.
    NotCached,
    /// The registry is unreachable or failing.
    Unavailable,
    /// Digest mismatch, hostile or corrupt content, size limit exceeded.
    Corrupt,
    /// A local failure (file system, task).
    Internal,
}
