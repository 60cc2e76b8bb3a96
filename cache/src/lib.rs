//! fnrun image cache: references, registry and OCI-layout transports, a verified
//! content-addressed store, and layer unpacking into overlayfs lower directories.
//!
//! [`Cache::get`] turns an [`ImageRef`](fnrun_registry::ImageRef) (from [`Cache::parse_reference`]) into an
//! [`Image`]: the unpacked layer directories (bottom to top) and the image config. Its
//! [`GetOptions`] say when to contact the registry, with which credentials, who watches
//! the layers arrive ([`PullProgress`], for progress bars) and whether to lease the image
//! against pruning ([`Lease`]). Every blob is verified against its digest before it is
//! stored or used, layers are unpacked once per diff_id and layer owner, and hostile
//! layer content cannot touch anything outside its layer directory (module `unpack`).
//! [`Image::read_file`] reads a file of the image's merged root without the host.
//!
//! Modules: `cache` is the API; `pull` the orchestrator of a pull; `store` the
//! directory layout, leases and GC; `layout` the OCI layout transport; `unpack` and
//! `rootfs` write and read layer trees. References, manifests, digests, the registry
//! client and registry credentials are the `fnrun-registry` crate's. docs/cache.md
//! describes them.

mod cache;
mod config;
mod error;
mod image;
mod layout;
mod memo;
mod progress;
mod pull;
mod rootfs;
mod store;
mod unpack;

pub use crate::cache::{Cache, GetOptions, Got};
pub use crate::config::{CacheConfig, DEFAULT_PULL_TIMEOUT, LayerOwner, OwnerError, PullPolicy};
pub use crate::error::Error;
pub use crate::image::{Image, ImageDetails, LayerDetails};
pub use crate::layout::{BadArchive, BadBlob, LayoutError, NotLayout};
pub use crate::progress::PullProgress;
pub use crate::rootfs::{LayerStack, RootfsError};
pub use crate::store::{CachedImage, Lease, PruneReport, StoreError, VerifyReport};
#[doc(hidden)]
pub use crate::unpack::unpack_tar_for_fuzzing;
pub use crate::unpack::{CorruptLayer, HostileEntry, UnpackError};

/// Installs ring as the process's rustls provider, as the `fnrun` binary does, for tests
/// that open a cache or speak to a registry.
#[cfg(test)]
pub(crate) fn install_test_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests;
