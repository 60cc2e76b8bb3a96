//! The crate's error: one variant per module's error, and the [`ErrorKind`] each maps
//! to, for the runner's one table of gRPC codes and exit codes.

use fnrun_registry::{ErrorKind, ManifestError, ReferenceError, RegistryError};

pub use crate::config::OwnerError;
use crate::layout::LayoutError;
use crate::store::StoreError;
use crate::unpack::{Exceeded, UnpackError};

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
    #[error(
        "image {reference}: the pull did not finish within the pull timeout of {} (--pull-timeout): the registry is slow or the image is large",
        seconds(*.timeout)
    )]
    PullTimeout {
        reference: String,
        timeout: std::time::Duration,
    },
    #[error("image {reference} exceeds the limit of {limit} files")]
    TooManyFiles { reference: String, limit: u64 },
    #[error(transparent)]
    Owner(#[from] OwnerError),
    #[error("internal error: a cache task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Tags are listed only for registry images.
    #[error("{reference} is not a registry image: it has no tags to list")]
    NotARegistry { reference: String },
    /// A registry's refusal, with what the caller knows of the credentials
    /// it sent: where they came from, or where they were looked for.
    #[error("{error}; {note}")]
    Refused { error: Box<Error>, note: String },
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
            // The registry did not deliver in time: as for one that does not answer.
            Error::PullTimeout { .. } => ErrorKind::Unavailable,
            Error::NotARegistry { .. } => ErrorKind::InvalidReference,
            Error::TooLarge { .. } | Error::TooManyFiles { .. } => ErrorKind::Corrupt,
            Error::Owner(_) | Error::Task(_) => ErrorKind::Internal,
            Error::Refused { error, .. } => error.kind(),
        }
    }

    /// This error with `note` (see [`Error::Refused`]) when it is a
    /// registry's refusal and there is a note; else as it is.
    pub fn noted(self, note: Option<&str>) -> Error {
        match note {
            Some(note) if self.kind() == ErrorKind::Unauthorized => Error::Refused {
                error: Box::new(self),
                note: note.to_owned(),
            },
            _ => self,
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

/// `300s`, `1.5s`, `200ms`: a duration as messages show it.
fn seconds(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d < std::time::Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}
