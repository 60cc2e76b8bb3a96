//! fnrun's side of an image registry: image references, content digests, OCI and
//! Docker manifests and image configs, the registry client (HTTPS or plain HTTP,
//! identity-token exchange, every byte verified), and the registry credentials of
//! container tools (docker `config.json`, credential helpers, Kubernetes pull secrets).
//!
//! The image cache (`fnrun-cache`) is built on it: it pulls through [`client`], parses
//! with [`manifest`] and stores blobs by [`digest`]. Nothing here knows the cache.
//!
//! Modules: `reference` and `manifest` the formats, `digest` the hashes; `client` the
//! transport (with its `token` exchange); `auth` what a request authenticates with and
//! `credentials` where that is found; `kind` the classes of failure.

mod auth;
pub mod client;
pub mod credentials;
pub mod digest;
mod kind;
pub mod manifest;
mod reference;

pub use crate::auth::Credentials;
pub use crate::client::{CaBundleError, RegistryError};
pub use crate::digest::DigestError;
pub use crate::kind::ErrorKind;
pub use crate::manifest::{ImageConfig, InvalidManifest, ManifestError, UnsupportedManifest};
pub use crate::reference::{
    DOCKER_HUB, ImageRef, ReferenceError, ReferenceProblem, RegistryProblem,
};

/// Installs ring as the process's rustls provider, as the `fnrun` binary does, for tests
/// that speak to a registry.
#[cfg(test)]
pub(crate) fn install_test_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
