//! Why a run could not start: one error type for the crate, each case with
//! what was being done and, where there is one, on which path.

use std::path::PathBuf;

use nix::errno::Errno;

use crate::cgroup::CgroupError;

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec cannot be run.
    #[error("invalid run: {0}")]
    InvalidSpec(#[from] SpecError),
    /// A system call of the parent failed.
    #[error("{op}{}: {source}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Io {
        op: &'static str,
        path: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    /// Building the sandbox failed inside it (a step of init).
    #[error("sandbox setup failed: {what}: {errno}")]
    Setup { what: String, errno: Errno },
    /// A bind mount could not be made inside the sandbox: the source cannot
    /// be reached from there, it changed, or the target cannot be made.
    #[error("cannot mount {host} on {target}: {what}: {errno}")]
    Mount {
        host: String,
        target: String,
        what: &'static str,
        errno: Errno,
    },
    /// The function process could not be started.
    #[error("cannot start the function: {stage} ({path}): {errno}")]
    Exec {
        stage: &'static str,
        path: String,
        errno: Errno,
    },
    /// The sandbox's init died without reporting (e.g. killed by the kernel).
    #[error("sandbox init ended unexpectedly: {status}")]
    InitDied { status: String },
    /// A requested limit cannot be enforced on this host (and
    /// `best_effort_limits` is off).
    #[error("the {what} limit cannot be enforced on this host: {why}")]
    LimitUnavailable { what: &'static str, why: String },
    /// Setting up the run's cgroup failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

impl Error {
    /// An [`Error::Io`] of operation `op`, on no particular path.
    pub(crate) fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Io {
            op,
            path: None,
            source,
        }
    }

    /// An [`Error::Io`] of operation `op` on `path`.
    pub(crate) fn io_at(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io {
            op,
            path: Some(path),
            source,
        }
    }

    /// An [`Error::Io`] from an errno.
    pub(crate) fn errno(op: &'static str) -> impl FnOnce(Errno) -> Error {
        move |e| Error::Io {
            op,
            path: None,
            source: e.into(),
        }
    }
}

/// Why a [`crate::RunSpec`] cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the image has no entrypoint or command")]
    NoCommand,
    #[error("working directory {0:?} is not absolute")]
    RelativeWorkdir(String),
    #[error("{what} {id} is not mapped (the sandbox maps {size} ids)")]
    Unmapped {
        what: &'static str,
        id: u32,
        size: u32,
    },
    /// A string handed to the kernel holds a NUL byte; `start` is its
    /// beginning, for the message.
    #[error("{what} {start:?} contains a NUL byte")]
    NulByte { what: &'static str, start: String },
    #[error("{0} is not UTF-8")]
    NotUtf8(PathBuf),
    #[error("the image has {0} layers; overlayfs stacks at most {max}", max = crate::spec::MAX_LAYERS)]
    TooManyLayers(usize),
    #[error("layer path {0} cannot be an overlay lower directory")]
    BadLayerPath(PathBuf),
    #[error("the overlay options for {0} layers do not fit in a page")]
    OverlayOptionsTooLong(usize),
    #[error("{0} bind mounts; at most {max} are allowed", max = crate::mounts::MAX_MOUNTS)]
    TooManyMounts(usize),
    #[error("two bind mounts on {0:?}")]
    DuplicateMountTarget(String),
    #[error("host user {uid}:{gid} cannot be mapped into the sandbox: {why}")]
    HostUser {
        uid: u32,
        gid: u32,
        why: &'static str,
    },
}
