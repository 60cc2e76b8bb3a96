//! A cached image as [`crate::Cache::get`] returns it: its layer directories and
//! the parts of its config a run needs.

use std::path::PathBuf;

use fnrun_registry::ImageConfig;

use crate::rootfs::{LayerStack, RootfsError};

/// A cached, unpacked image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Normalized reference.
    pub reference: String,
    /// Digest of the (single-platform) image manifest, `sha256:...`.
    pub digest: String,
    /// Unpacked layer directories, bottom to top, absolute.
    pub layers: Vec<PathBuf>,
    /// The parts of the image config a run needs.
    pub config: ImageConfig,
    /// Whether this `get` resolved the image in a registry (a pull), rather
    /// than from the local reference index or an OCI layout.
    pub pulled: bool,
}

impl Image {
    /// The image's merged root file system, read the way the sandbox's overlay shows
    /// it (see [`LayerStack`]).
    pub fn rootfs(&self) -> Result<LayerStack, RootfsError> {
        LayerStack::open(&self.layers)
    }

    /// The regular file at the absolute `path` of the image's root file system (see
    /// [`LayerStack::read_file`]).
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, RootfsError> {
        self.rootfs()?.read_file(path, max_bytes)
    }
}

/// What the cache holds of one image ([`crate::Cache::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageDetails {
    /// Normalized reference.
    pub reference: String,
    /// The digest it resolves to (an index's, for a multi-platform image).
    pub digest: String,
    /// The digest of this platform's image manifest.
    pub manifest_digest: String,
    /// The digest of the image config.
    pub config_digest: String,
    /// Bytes of its blobs and unpacked layers in the cache.
    pub size: u64,
    /// Last use (pulled or run), seconds since the epoch, if recorded.
    pub last_used: Option<u64>,
    /// Whether a run is using it.
    pub in_use: bool,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: String,
    /// `User`.
    pub user: String,
    /// The layers, base first.
    pub layers: Vec<LayerDetails>,
}

/// One layer of [`ImageDetails`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerDetails {
    /// The (compressed) blob's digest.
    pub digest: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// The digest of the uncompressed tar.
    pub diff_id: String,
    /// The media type.
    pub media_type: String,
    /// Whether it is unpacked in the cache (for any layer owner).
    pub unpacked: bool,
}
