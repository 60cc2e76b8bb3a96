//! What a cache is opened with and what a pull is given: settings, the owner of
//! unpacked files and the pull policy (registry credentials are `fnrun_registry`'s).

use std::path::PathBuf;
use std::time::Duration;

use fnrun_registry::DOCKER_HUB;

/// Default unpacked size limit of one image (4 GiB).
pub(crate) const DEFAULT_MAX_IMAGE_BYTES: u64 = 4 << 30;
/// Default deadline of one pull from a registry (5 minutes).
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(300);
/// Limit on the number of files (tar entries) of one image, across its layers.
pub(crate) const MAX_IMAGE_FILES: u64 = 1 << 20;

/// Cache settings.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Cache directory.
    pub root: PathBuf,
    /// Registry for unqualified references, e.g. `index.docker.io`.
    pub default_registry: String,
    /// `host[:port]` (or `host`, any port) allowed plain HTTP, in addition to loopback
    /// registries (127.0.0.0/8, ::1, localhost); everything else is HTTPS.
    pub insecure_registries: Vec<String>,
    /// Ownership of unpacked files.
    pub owner: LayerOwner,
    /// Unpacked size limit of one image.
    pub max_image_bytes: u64,
    /// PEM CA certificates trusted for HTTPS registries in addition to the system roots.
    pub ca_bundle: Option<Vec<u8>>,
    /// How long one pull from a registry may take, from the `get` that starts it (or
    /// waits for it) to its end: token, manifests, config and layers. Past it the pull
    /// fails with [`crate::Error::PullTimeout`]. `None`: no deadline (each read still
    /// has its own timeout).
    pub pull_timeout: Option<Duration>,
}

impl CacheConfig {
    /// Defaults: Docker Hub, no insecure registries, [`LayerOwner::Identity`], 4 GiB,
    /// pulls of at most [`DEFAULT_PULL_TIMEOUT`].
    pub fn new(root: impl Into<PathBuf>) -> CacheConfig {
        CacheConfig {
            root: root.into(),
            default_registry: DOCKER_HUB.to_owned(),
            insecure_registries: Vec::new(),
            owner: LayerOwner::Identity,
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            ca_bundle: None,
            pull_timeout: Some(DEFAULT_PULL_TIMEOUT),
        }
    }
}

/// Who owns the files of unpacked layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerOwner {
    /// Rootless runner: files are owned by the runner's own uid/gid (no chown); the
    /// sandbox maps that id to 0.
    Identity,
    /// Root runner: a file owned by uid u / gid g in the tar is chowned to
    /// (uid + u, gid + g); ids >= size become (uid + 65534, gid + 65534)
    /// (or the last id of the range if it is smaller).
    Shift {
        /// First host uid of the range.
        uid: u32,
        /// First host gid of the range.
        gid: u32,
        /// Number of ids in the range.
        size: u32,
    },
}

impl LayerOwner {
    /// The directory name under `layers/`: unpacked trees differ by owner.
    pub(crate) fn tag(&self) -> String {
        match self {
            LayerOwner::Identity => "id".to_owned(),
            LayerOwner::Shift { uid, gid, size } => format!("shift-{uid}-{gid}-{size}"),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), OwnerError> {
        if let LayerOwner::Shift { uid, gid, size } = *self {
            if size == 0 {
                return Err(OwnerError::EmptyRange);
            }
            if uid.checked_add(size - 1).is_none() || gid.checked_add(size - 1).is_none() {
                return Err(OwnerError::Overflow { uid, gid, size });
            }
        }
        Ok(())
    }
}

/// A [`LayerOwner`] that cannot own files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    #[error("invalid layer owner: the id range is empty")]
    EmptyRange,
    #[error("invalid layer owner: the id range {uid}/{gid}+{size} overflows")]
    Overflow { uid: u32, gid: u32, size: u32 },
}

/// When to contact the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PullPolicy {
    /// Use the cached image if the reference was resolved before; pull otherwise.
    #[default]
    IfNotPresent,
    /// Resolve the reference in the registry every time; reuse blobs and layers.
    Always,
    /// Never contact the registry; fail with [`fnrun_registry::ErrorKind::NotCached`] if not cached.
    Never,
}
