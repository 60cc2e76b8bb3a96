//! The crate's error: one variant per module's error, and the [`ErrorKind`] each maps
//! to, for the runner's one table of gRPC codes and exit codes.

pub use crate::config::OwnerError;
use crate::layout::LayoutError;
use crate::manifest::ManifestError;
use crate::reference::ReferenceError;
use crate::registry::RegistryError;
use crate::store::StoreError;
use crate::unpack::{Exceeded, UnpackError};

/// The class of a cache error, for mapping to gRPC codes and exit codes.
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

/// A cache error. Messages never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("image {reference} is not cached and the pull policy is Never")]
    NotCached { reference: String },
    #[error("image {reference} exceeds the unpacked size limit of {limit} bytes")]
    TooLarge { reference: String, limit: u64 },
    #[error("image {reference} exceeds the limit of {limit} files")]
    TooManyFiles { reference: String, limit: u64 },
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error("internal error: a cache task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Tags are listed only for registry images.
    #[error("{reference} is not a registry image: it has no tags to list")]
    NotARegistry { reference: String },
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Reference(_) => ErrorKind::InvalidReference,
            Error::Manifest(e) => e.kind(),
            Error::Store(e) => e.kind(),
            Error::Unpack(e) => e.kind(),
            Error::Registry(e) => e.kind(),
            Error::Layout(e) => e.kind(),
            Error::NotCached { .. } => ErrorKind::NotCached,
            Error::NotARegistry { .. } => ErrorKind::InvalidReference,
            Error::TooLarge { .. } | Error::TooManyFiles { .. } => ErrorKind::Corrupt,
            Error::Owner(_) | Error::Task(_) => ErrorKind::Internal,
        }
    }

    pub(crate) fn exceeded(reference: &str, e: Exceeded) -> Error {
        match e {
            Exceeded::Bytes(limit) => Error::TooLarge {
                reference: reference.to_owned(),
                limit,
            },
            Exceeded::Entries(limit) => Error::TooManyFiles {
                reference: reference.to_owned(),
                limit,
            },
        }
    }
}
