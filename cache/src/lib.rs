//! fnrun image cache: references, registry and OCI-layout transports, a verified
//! content-addressed store, and layer unpacking into overlayfs lower directories.
//!
//! [`Cache::get`] turns an [`ImageRef`] (from [`Cache::parse_reference`]) into an
//! [`Image`]: the unpacked layer directories (bottom to top) and the image config. Its
//! [`GetOptions`] say when to contact the registry, with which credentials, who watches
//! the layers arrive ([`PullProgress`], for progress bars) and whether to lease the image
//! against pruning ([`Lease`]). Every blob is verified against its digest before it is
//! stored or used, layers are unpacked once per diff_id and layer owner, and hostile
//! layer content cannot touch anything outside its layer directory (see [`unpack`]).
//! [`Image::read_file`] reads a file of the image's merged root without the host.

mod digest;
mod gc;
mod layout;
mod manifest;
mod progress;
mod reference;
mod registry;
mod rootfs;
mod store;
mod token;
mod unpack;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;

pub use crate::digest::DigestError;
pub use crate::gc::{CachedImage, Lease, PruneReport, VerifyReport};
pub use crate::layout::LayoutError;
pub use crate::manifest::ManifestError;
pub use crate::progress::{NoProgress, PullProgress};
pub use crate::reference::{DOCKER_HUB, ImageRef, ReferenceError};
pub use crate::registry::CaBundleError;
pub use crate::registry::RegistryError;
pub use crate::rootfs::{LayerStack, MAX_SYMLINKS, RootfsError};
pub use crate::store::StoreError;
pub use crate::unpack::UnpackError;

use crate::digest::Digest;
use crate::manifest::{Descriptor, ImageManifest, MAX_METADATA_BYTES, Manifest, ParsedConfig};
use crate::registry::{Registries, Repo};
use crate::store::{KeyedLocks, Store};
use crate::unpack::{Budget, Exceeded};

/// Default unpacked size limit of one image (4 GiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 4 << 30;
/// Limit on the number of files (tar entries) of one image, across its layers.
pub const MAX_IMAGE_FILES: u64 = 1 << 20;
/// Blob downloads running at once for one image.
const CONCURRENT_DOWNLOADS: usize = 4;

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
}

impl CacheConfig {
    /// Defaults: Docker Hub, no insecure registries, [`LayerOwner::Identity`], 4 GiB.
    pub fn new(root: impl Into<PathBuf>) -> CacheConfig {
        CacheConfig {
            root: root.into(),
            default_registry: DOCKER_HUB.to_owned(),
            insecure_registries: Vec::new(),
            owner: LayerOwner::Identity,
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            ca_bundle: None,
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
    fn tag(&self) -> String {
        match self {
            LayerOwner::Identity => "id".to_owned(),
            LayerOwner::Shift { uid, gid, size } => format!("shift-{uid}-{gid}-{size}"),
        }
    }

    fn validate(&self) -> Result<(), OwnerError> {
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
    /// Never contact the registry; fail with [`ErrorKind::NotCached`] if not cached.
    Never,
}

/// Registry credentials.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// No credentials (anonymous token, if the registry uses tokens).
    #[default]
    Anonymous,
    /// User name and password (or access token used as a password).
    Basic {
        /// User name.
        username: String,
        /// Password; never printed.
        password: String,
    },
    /// A registry token (docker's `registrytoken`): sent as is as
    /// `Authorization: Bearer` to the registry, without a token exchange.
    Bearer {
        /// The token; never printed.
        token: String,
    },
    /// An identity token (docker's `identitytoken`): an OAuth2 refresh token that is
    /// exchanged at the registry's token endpoint for a repository-scoped access token.
    IdentityToken {
        /// The refresh token; never printed.
        token: String,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credentials::Bearer { .. } => f.write_str("Bearer(<redacted>)"),
            Credentials::IdentityToken { .. } => f.write_str("IdentityToken(<redacted>)"),
        }
    }
}

/// How [`Cache::get`] gets an image. The default: policy `IfNotPresent`, anonymous,
/// nobody watching, no lease.
#[derive(Clone, Default)]
pub struct GetOptions {
    /// When to contact the registry.
    pub policy: PullPolicy,
    /// Registry credentials (unused for `oci:` and `oci-archive:` images).
    pub credentials: Credentials,
    /// Told of each layer's download and unpacking, e.g. to draw progress bars.
    pub progress: Option<Arc<dyn PullProgress>>,
    /// Lease the image (see [`Lease`]) before any prune can remove it: for an image
    /// about to be run. The lease is in [`Got::lease`].
    pub lease: bool,
}

impl GetOptions {
    /// The defaults with `policy`.
    pub fn new(policy: PullPolicy) -> GetOptions {
        GetOptions {
            policy,
            ..GetOptions::default()
        }
    }

    /// With registry `credentials`.
    pub fn credentials(mut self, credentials: Credentials) -> GetOptions {
        self.credentials = credentials;
        self
    }

    /// With `progress` told of each layer.
    pub fn progress(mut self, progress: Arc<dyn PullProgress>) -> GetOptions {
        self.progress = Some(progress);
        self
    }

    /// With a lease on the image.
    pub fn leased(mut self) -> GetOptions {
        self.lease = true;
        self
    }
}

impl fmt::Debug for GetOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetOptions")
            .field("policy", &self.policy)
            .field("credentials", &self.credentials)
            .field("progress", &self.progress.as_ref().map(|_| "PullProgress"))
            .field("lease", &self.lease)
            .finish()
    }
}

/// What [`Cache::get`] returns: the image, and its lease if one was asked for.
#[derive(Debug)]
pub struct Got {
    /// The image.
    pub image: Image,
    /// Held until dropped: keep it while the image is in use
    /// ([`GetOptions::lease`]; `None` otherwise).
    pub lease: Option<Lease>,
}

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

/// The parts of an image config a run needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env` (`NAME=value`).
    pub env: Vec<String>,
    /// `WorkingDir` (empty: `/`).
    pub working_dir: String,
    /// `User` (`uid[:gid]` or names; empty: root).
    pub user: String,
}

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
            Error::TooLarge { .. } | Error::TooManyFiles { .. } => ErrorKind::Corrupt,
            Error::Owner(_) | Error::Task(_) => ErrorKind::Internal,
        }
    }

    fn exceeded(reference: &str, e: Exceeded) -> Error {
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

/// Runs blocking store work off the async runtime.
async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    F: FnOnce() -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await?
}

/// Set when one layer of a pull has failed, for the others to stop.
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once set (never, if the setter is gone unset).
    async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|&set| set).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Where the blobs of an image being materialized come from.
#[derive(Clone)]
enum Source {
    /// The store only (no network).
    Local,
    /// The store, filled from a registry.
    Registry { repo: Repo, creds: Credentials },
    /// An OCI layout directory.
    Layout(PathBuf),
}

/// An extracted `oci-archive:`, removed when dropped unless it already was.
struct Extracted {
    path: PathBuf,
    removed: bool,
}

impl Drop for Extracted {
    fn drop(&mut self) {
        if !self.removed {
            let _ = unpack::remove_tree(&self.path);
        }
    }
}

/// An image whose single-platform manifest is known.
struct Resolved {
    reference: String,
    digest: Digest,
    manifest: ImageManifest,
}

/// What [`Inner::inspect`] finds of an image.
struct Inspected {
    parsed: ParsedConfig,
    /// Charged with the layers already unpacked.
    budget: Arc<Budget>,
    /// Indices of the layers not unpacked yet.
    missing: Vec<usize>,
}

struct Inner {
    store: Store,
    config: CacheConfig,
    owner_tag: String,
    registries: Registries,
    locks: KeyedLocks,
    /// When this process last recorded the use of each reference.
    touched: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// The image cache. `Send + Sync`; share it in an `Arc`.
pub struct Cache {
    inner: Arc<Inner>,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("root", &self.inner.store.root())
            .field("owner", &self.inner.config.owner)
            .finish()
    }
}

impl Cache {
    /// Opens the cache at `config.root`, creating its layout and removing tmp/ leftovers
    /// of processes that are gone.
    ///
    /// Registries are spoken to with rustls, built without a crypto provider of its
    /// own: the program must install the process's default provider first (the `fnrun`
    /// binary installs ring in `main`). Without one this fails with
    /// [`RegistryError::NoCryptoProvider`].
    pub fn open(config: CacheConfig) -> Result<Cache, Error> {
        config.owner.validate()?;
        let owner_tag = config.owner.tag();
        let store = Store::open(&config.root, &owner_tag)?;
        let registries = Registries::new(
            config.insecure_registries.clone(),
            config.ca_bundle.as_deref(),
        )?;
        Ok(Cache {
            inner: Arc::new(Inner {
                store,
                config,
                owner_tag,
                registries,
                locks: KeyedLocks::default(),
                touched: Default::default(),
            }),
        })
    }

    /// The cache directory (absolute).
    pub fn root(&self) -> &Path {
        self.inner.store.root()
    }

    /// Parses and normalizes a reference with this cache's default registry. This (or
    /// [`ImageRef::parse`]) is the only way to make an [`ImageRef`], so [`Cache::get`]
    /// takes it as it is.
    pub fn parse_reference(&self, s: &str) -> Result<ImageRef, Error> {
        ImageRef::parse(s, &self.inner.config.default_registry)
    }

    /// Returns the image, pulling and unpacking what is missing as `options.policy`
    /// allows, reporting its layers to `options.progress` (see [`PullProgress`]) and,
    /// with `options.lease`, leasing it before any prune can remove it.
    ///
    /// An image that is complete in the cache and not to be resolved again (policy
    /// `IfNotPresent` or `Never`) is found without the network in one blocking call
    /// and reports nothing: nothing is pulled.
    pub async fn get(&self, reference: &ImageRef, options: GetOptions) -> Result<Got, Error> {
        let GetOptions {
            policy,
            credentials,
            progress,
            lease,
        } = options;
        if let Some(got) = self.get_present(reference, policy, lease).await? {
            return Ok(got);
        }
        let inner = self.inner.clone();
        let gc = blocking(move || Ok(inner.store.gc_lock(false)?)).await?;
        let progress = progress.unwrap_or_else(|| Arc::new(NoProgress));
        let image = self
            .get_unlocked(reference, policy, &credentials, &progress)
            .await?;
        let lease = match lease {
            true => {
                let (inner, i) = (self.inner.clone(), image.clone());
                Some(blocking(move || Ok(inner.store.lease_image(&i)?)).await?)
            }
            false => None,
        };
        drop(gc);
        Ok(Got { image, lease })
    }

    /// The warm path: the image (and its lease, if `lease`) when everything it needs
    /// is cached and `policy` does not ask to re-resolve it, in one blocking call.
    /// `None` sends the caller down the full path.
    async fn get_present(
        &self,
        reference: &ImageRef,
        policy: PullPolicy,
        lease: bool,
    ) -> Result<Option<Got>, Error> {
        if policy == PullPolicy::Always {
            return Ok(None);
        }
        let in_registry = matches!(reference, ImageRef::Registry { .. });
        let (inner, reference) = (self.inner.clone(), reference.clone());
        let found = blocking(move || {
            let _gc = inner.store.gc_lock(false)?;
            let Some(image) = inner.present(&reference)? else {
                return Ok(None);
            };
            let lease = match lease {
                true => Some(inner.store.lease_image(&image)?),
                false => None,
            };
            Ok(Some(Got { image, lease }))
        })
        .await?;
        if let Some(got) = &found
            && in_registry
        {
            self.touch(&got.image.reference).await;
        }
        Ok(found)
    }

    async fn get_unlocked(
        &self,
        image: &ImageRef,
        policy: PullPolicy,
        creds: &Credentials,
        progress: &Arc<dyn PullProgress>,
    ) -> Result<Image, Error> {
        match image {
            ImageRef::OciLayout { path, tag, archive } => {
                let reference = image.to_string();
                // An archive is extracted to tmp/ and read like a layout directory.
                let extracted = match archive {
                    true => Some(self.extract_archive(path).await?),
                    false => None,
                };
                let layout = extracted.as_ref().map_or(path, |e| &e.path).clone();
                let (p, t, r) = (layout.clone(), tag.clone(), reference.clone());
                let resolved = blocking(move || Ok(layout::resolve(&p, t.as_deref())?)).await;
                let result = match resolved {
                    Ok((digest, manifest)) => {
                        let resolved = Resolved {
                            reference: r,
                            digest,
                            manifest,
                        };
                        self.materialize(resolved, Source::Layout(layout), progress)
                            .await
                    }
                    Err(e) => Err(e),
                };
                let result = match (&extracted, result) {
                    (Some(e), Err(Error::Layout(err))) => {
                        Err(Error::Layout(err.relocated(&e.path, path)))
                    }
                    (_, result) => result,
                };
                if let Some(mut e) = extracted {
                    let path = e.path.clone();
                    e.removed = true;
                    // Left to the next sweep of tmp/ if it cannot be removed now.
                    let removed = tokio::task::spawn_blocking(move || {
                        unpack::remove_tree(&path).map_err(|err| (path, err))
                    })
                    .await;
                    if let Ok(Err((path, err))) = removed {
                        tracing::warn!(path = %path.display(), error = %err, "cannot remove an extracted oci-archive");
                    }
                }
                result
            }
            ImageRef::Registry {
                registry,
                repository,
                tag,
                ..
            } => {
                let repo = Repo {
                    registry: registry.clone(),
                    repository: repository.clone(),
                    reference: image.to_string(),
                };
                self.get_registry(
                    repo,
                    tag.as_deref(),
                    image.pinned_digest(),
                    policy,
                    creds,
                    progress,
                )
                .await
            }
        }
    }

    /// Extracts an `oci-archive:` tar into this process's tmp/ (swept if it dies).
    async fn extract_archive(&self, archive: &Path) -> Result<Extracted, Error> {
        let dest = self.inner.store.tmp_path("oci-archive");
        // Layers are compressed and an archive holds little else: twice the unpacked
        // limit bounds what an honest archive of one image needs.
        let limit = self.inner.config.max_image_bytes.saturating_mul(2);
        let archive = archive.to_owned();
        // The guard is made where the extraction runs: if this future is dropped
        // meanwhile, the extraction still finishes, and its result (the guard),
        // which nobody takes, removes what it extracted.
        blocking(move || {
            let extracted = Extracted {
                path: dest,
                removed: false,
            };
            layout::extract_archive(&archive, &extracted.path, limit)?;
            Ok(extracted)
        })
        .await
    }

    async fn get_registry(
        &self,
        repo: Repo,
        tag: Option<&str>,
        pinned: Option<Digest>,
        policy: PullPolicy,
        creds: &Credentials,
        progress: &Arc<dyn PullProgress>,
    ) -> Result<Image, Error> {
        let reference = repo.reference.clone();
        if policy != PullPolicy::Always {
            if let Some(image) = self.get_local(&reference, pinned.as_ref(), policy).await {
                return image;
            }
            if policy == PullPolicy::Never {
                return Err(Error::NotCached { reference });
            }
        }

        // Single flight: one pull of a reference at a time; a `get` that waited for
        // another's pull uses its result (blobs are single-flighted in `ensure_blob`).
        let _pull = self.inner.locks.lock(format!("pull/{reference}")).await;
        if policy == PullPolicy::IfNotPresent
            && let Some(image) = self.get_local(&reference, pinned.as_ref(), policy).await
        {
            return image;
        }

        tracing::info!(reference = %reference, "pulling image");
        let creds = &self.inner.registries.exchange(&repo, creds).await?;
        let (top, resolved) = self
            .resolve_remote(&repo, tag, pinned.as_ref(), creds)
            .await?;
        let image = self
            .materialize(
                resolved,
                Source::Registry {
                    repo: repo.clone(),
                    creds: creds.clone(),
                },
                progress,
            )
            .await?;
        let inner = self.inner.clone();
        blocking(move || Ok(inner.store.write_ref(&reference, &top)?)).await?;
        Ok(Image {
            pulled: true,
            ..image
        })
    }

    /// The image from the local reference index, if it is there; `None` if it is not (or
    /// is incomplete and `policy` allows pulling it).
    async fn get_local(
        &self,
        reference: &str,
        pinned: Option<&Digest>,
        policy: PullPolicy,
    ) -> Option<Result<Image, Error>> {
        let inner = self.inner.clone();
        let (r, p) = (reference.to_owned(), pinned.cloned());
        let resolved = match blocking(move || inner.resolve_local(&r, p)).await {
            Ok(Some(resolved)) => resolved,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        // Nothing is pulled here; an incomplete image is pulled (and reported) afterwards.
        let quiet: Arc<dyn PullProgress> = Arc::new(NoProgress);
        match self.materialize(resolved, Source::Local, &quiet).await {
            Err(Error::NotCached { .. }) if policy == PullPolicy::IfNotPresent => {
                tracing::info!(reference = %reference, "cached image is incomplete; pulling");
                None
            }
            Ok(image) => {
                self.touch(reference).await;
                Some(Ok(image))
            }
            other => Some(other),
        }
    }

    /// Resolves the reference in the registry, storing the manifest (and index) blobs.
    /// Returns the digest the reference points to and the platform manifest.
    async fn resolve_remote(
        &self,
        repo: &Repo,
        tag: Option<&str>,
        pinned: Option<&Digest>,
        creds: &Credentials,
    ) -> Result<(Digest, Resolved), Error> {
        let regs = &self.inner.registries;
        let (bytes, top) = regs.manifest(repo, creds, tag, pinned).await?;
        let manifest = manifest::parse_manifest(&bytes, &top)?;
        self.store_blob(top.clone(), "manifest", bytes).await?;
        let (digest, manifest) = match manifest {
            Manifest::Image(m) => (top.clone(), m),
            Manifest::Index(index) => {
                let chosen = manifest::select_platform(&index, &top.to_string())?;
                let inner = self.inner.clone();
                let d = chosen.digest.clone();
                let cached = blocking(move || {
                    Ok(match inner.store.has_blob(&d) {
                        true => Some(inner.store.read_blob(&d, "manifest", MAX_METADATA_BYTES)?),
                        false => None,
                    })
                })
                .await;
                let bytes = match cached {
                    Ok(Some(b)) => b,
                    _ => {
                        let (b, _) = regs
                            .manifest(repo, creds, None, Some(&chosen.digest))
                            .await?;
                        self.store_blob(chosen.digest.clone(), "manifest", b.clone())
                            .await?;
                        b
                    }
                };
                match manifest::parse_manifest(&bytes, &chosen.digest)? {
                    Manifest::Image(m) => (chosen.digest, m),
                    Manifest::Index(_) => {
                        return Err(ManifestError::Unsupported {
                            digest: top.to_string(),
                            reason: "an index entry for this platform is itself an index".into(),
                        }
                        .into());
                    }
                }
            }
        };
        Ok((
            top,
            Resolved {
                reference: repo.reference.clone(),
                digest,
                manifest,
            },
        ))
    }

    /// Records the use of a cached reference, at most once a minute per reference.
    async fn touch(&self, reference: &str) {
        let now = std::time::Instant::now();
        let interval = std::time::Duration::from_secs(gc::TOUCH_INTERVAL);
        {
            let mut touched = self
                .inner
                .touched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if touched
                .get(reference)
                .is_some_and(|t| now.duration_since(*t) < interval)
            {
                return;
            }
            touched.retain(|_, t| now.duration_since(*t) < interval);
            touched.insert(reference.to_owned(), now);
        }
        let (inner, r) = (self.inner.clone(), reference.to_owned());
        let touched = blocking(move || Ok(inner.store.touch_ref(&r, gc::TOUCH_INTERVAL)?)).await;
        if let Err(e) = touched {
            tracing::warn!(reference, error = %e, "cannot record the last use of an image");
        }
    }

    async fn store_blob(
        &self,
        digest: Digest,
        what: &'static str,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let inner = self.inner.clone();
        blocking(move || Ok(inner.store.write_blob(&digest, what, &bytes)?)).await
    }

    /// Makes sure the config and every layer of `resolved` are available, unpacking
    /// missing layers, and returns the image. Layers are reported to `progress`.
    async fn materialize(
        &self,
        resolved: Resolved,
        source: Source,
        progress: &Arc<dyn PullProgress>,
    ) -> Result<Image, Error> {
        let Resolved {
            reference,
            digest,
            manifest,
        } = resolved;
        let inner = &self.inner;

        // The config, then what of the image is here already.
        let cfg = manifest.config.clone();
        self.ensure_blob(&cfg, "config", &source, &reference, &|_| {}, None)
            .await?;
        let Inspected {
            parsed,
            budget,
            missing,
        } = {
            let (inner, m, s, r) = (
                inner.clone(),
                manifest.clone(),
                source.clone(),
                reference.clone(),
            );
            blocking(move || inner.inspect(&m, &s, &r)).await?
        };

        // gzip cannot shrink a tar much below its size: if the compressed layers alone are
        // well over the limit, fail before downloading them.
        let max = inner.config.max_image_bytes;
        let compressed: u64 = missing.iter().map(|&i| manifest.layers[i].size).sum();
        let already = budget.used_bytes();
        if already.saturating_add(compressed) > max.saturating_add(max / 64).saturating_add(1 << 20)
        {
            return Err(Error::TooLarge {
                reference,
                limit: max,
            });
        }

        // Each layer is reported once: a blob listed twice is one download, one bar.
        let mut reported = HashSet::new();
        for (i, layer) in manifest.layers.iter().enumerate() {
            if !missing.contains(&i) && reported.insert(&layer.digest) {
                progress.layer_cached(&layer.digest.to_string(), layer.size);
            }
        }
        let quiet: Arc<dyn PullProgress> = Arc::new(NoProgress);
        let layer_progress: Vec<Arc<dyn PullProgress>> = missing
            .iter()
            .map(|&i| match reported.insert(&manifest.layers[i].digest) {
                true => progress.clone(),
                false => quiet.clone(),
            })
            .collect();

        // Each missing layer is downloaded, then unpacked as soon as its blob is
        // here, while the others download: a few layers at a time, each once.
        // When one fails, the others stop downloading and do not start unpacking,
        // and what already runs (an unpack, a commit) is waited for: a failed pull
        // returns with nothing of it still working or writing.
        // (Futures are collected into a Vec first: closures inside stream
        // combinators make the future not provably `Send`.)
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut layers = Vec::with_capacity(missing.len());
        for (&i, progress) in missing.iter().zip(layer_progress) {
            let layer = &manifest.layers[i];
            let (budget, source, reference) = (budget.clone(), &source, &reference);
            let diff_id = parsed.diff_ids[i].clone();
            let stop = Stop(stop.clone());
            layers.push(async move {
                if stop.is_set() {
                    return Ok(());
                }
                self.download_layer(layer, source, reference, progress.as_ref(), &stop)
                    .await?;
                self.ensure_layer(
                    layer.digest.clone(),
                    diff_id,
                    source,
                    budget,
                    reference,
                    progress,
                    &stop,
                )
                .await
            });
        }
        let mut results = futures::stream::iter(layers).buffer_unordered(CONCURRENT_DOWNLOADS);
        let mut failed = None;
        while let Some(result) = results.next().await {
            if let Err(e) = result
                && failed.is_none()
            {
                stop_tx.send_replace(true);
                failed = Some(e);
            }
        }
        drop(results);
        if let Some(e) = failed {
            return Err(e);
        }

        Ok(inner.image(reference, &digest, parsed))
    }

    /// [`Cache::ensure_blob`] for a layer, reported to `progress`.
    async fn download_layer(
        &self,
        layer: &Descriptor,
        source: &Source,
        reference: &str,
        progress: &dyn PullProgress,
        stop: &Stop,
    ) -> Result<(), Error> {
        let name = layer.digest.to_string();
        progress.layer_started(&name, layer.size);
        let on_bytes = |n| progress.layer_bytes(&name, n);
        self.ensure_blob(layer, "layer", source, reference, &on_bytes, Some(stop))
            .await?;
        progress.layer_downloaded(&name);
        Ok(())
    }

    /// Makes a blob available from `source`: present in the store (downloading it if
    /// allowed) or present in the layout. A download tells `on_bytes` of each chunk,
    /// and ends early, with `Ok` and nothing stored, once `stop` is set.
    async fn ensure_blob(
        &self,
        blob: &Descriptor,
        what: &'static str,
        source: &Source,
        reference: &str,
        on_bytes: &(dyn Fn(u64) + Sync),
        stop: Option<&Stop>,
    ) -> Result<(), Error> {
        let digest = &blob.digest;
        let store = &self.inner.store;
        match source {
            Source::Layout(path) => {
                let (p, d) = (path.clone(), digest.clone());
                blocking(move || Ok(layout::check_blob(&p, &d).map(drop)?)).await
            }
            Source::Local => {
                if store.has_blob(digest) {
                    Ok(())
                } else {
                    Err(Error::NotCached {
                        reference: reference.to_owned(),
                    })
                }
            }
            Source::Registry { repo, creds } => {
                if store.has_blob(digest) {
                    return Ok(());
                }
                let _guard = self
                    .inner
                    .locks
                    .lock(format!("blob/{}", digest.hex()))
                    .await;
                if store.has_blob(digest) {
                    return Ok(());
                }
                let tmp = store.tmp_path("blob");
                let fetch = self
                    .inner
                    .registries
                    .blob(repo, creds, what, blob, &tmp, on_bytes);
                match stop {
                    None => fetch.await?,
                    // Dropping the download removes its partial file.
                    Some(stop) => tokio::select! {
                        fetched = fetch => fetched?,
                        () = stop.wait() => return Ok(()),
                    },
                }
                let (inner, d) = (self.inner.clone(), digest.clone());
                blocking(move || Ok(inner.store.commit_blob(&tmp, &d)?)).await
            }
        }
    }

    /// Unpacks one layer unless it already is; charges it to `budget` either way. Reports
    /// the unpacking (if this call does it) and the end to `progress`. Does nothing once
    /// `stop` is set, unless the unpacking has started.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_layer(
        &self,
        blob: Digest,
        diff_id: Digest,
        source: &Source,
        budget: Arc<Budget>,
        reference: &str,
        progress: Arc<dyn PullProgress>,
        stop: &Stop,
    ) -> Result<(), Error> {
        let key = format!("layer/{}/{}", self.inner.owner_tag, diff_id.hex());
        let guard = self.inner.locks.lock(key).await;
        if stop.is_set() {
            return Ok(());
        }
        let inner = self.inner.clone();
        let source = source.clone();
        let reference = reference.to_owned();
        let name = blob.to_string();
        let (unpack_progress, unpack_name) = (progress.clone(), name.clone());
        blocking(move || {
            let _guard = guard;
            let store = &inner.store;
            if let Some(s) = store.layer_stats(&diff_id) {
                return budget
                    .charge(s.bytes, s.entries)
                    .map_err(|e| Error::exceeded(&reference, e));
            }
            let blob_path = match &source {
                Source::Layout(path) => layout::blob_path(path, &blob),
                _ => store.blob_path(&blob),
            };
            let tmp = store.tmp_path("layer");
            tracing::debug!(layer = %blob, diff_id = %diff_id, "unpacking layer");
            unpack_progress.layer_unpacking(&unpack_name);
            let stats = unpack::unpack_layer(
                &blob_path,
                &blob,
                &diff_id,
                &tmp,
                inner.config.owner,
                &budget,
            )
            .map_err(|e| match e {
                UnpackError::TooLarge { limit, .. } => {
                    Error::exceeded(&reference, Exceeded::Bytes(limit))
                }
                UnpackError::TooManyEntries { limit, .. } => {
                    Error::exceeded(&reference, Exceeded::Entries(limit))
                }
                e => e.into(),
            })?;
            store.commit_layer(&tmp, &diff_id, stats)?;
            Ok(())
        })
        .await?;
        progress.layer_done(&name);
        Ok(())
    }
}

impl Inner {
    /// The image if everything it needs is here already (its record or layout, its
    /// config and every layer unpacked), found without network and without writing:
    /// the warm path of a run, done in one blocking call. `None` when something is
    /// missing (or it is an `oci-archive:`), for the full path to fetch or report.
    fn present(&self, image: &ImageRef) -> Result<Option<Image>, Error> {
        let (resolved, source) = match image {
            ImageRef::OciLayout { archive: true, .. } => return Ok(None),
            ImageRef::OciLayout { path, tag, .. } => {
                let (digest, manifest) = layout::resolve(path, tag.as_deref())?;
                let resolved = Resolved {
                    reference: image.to_string(),
                    digest,
                    manifest,
                };
                (resolved, Source::Layout(path.clone()))
            }
            ImageRef::Registry { .. } => {
                let reference = image.to_string();
                match self.resolve_local(&reference, image.pinned_digest())? {
                    Some(resolved) => (resolved, Source::Local),
                    None => return Ok(None),
                }
            }
        };
        let present = match &source {
            Source::Layout(path) => {
                layout::check_blob(path, &resolved.manifest.config.digest).is_ok()
            }
            _ => self.store.has_blob(&resolved.manifest.config.digest),
        };
        if !present {
            return Ok(None);
        }
        let inspected = self.inspect(&resolved.manifest, &source, &resolved.reference)?;
        if !inspected.missing.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.image(
            resolved.reference,
            &resolved.digest,
            inspected.parsed,
        )))
    }

    /// Reads and parses the config of `manifest` (present in `source`), charges the
    /// layers already unpacked to a new budget and lists the missing ones.
    fn inspect(
        &self,
        manifest: &ImageManifest,
        source: &Source,
        reference: &str,
    ) -> Result<Inspected, Error> {
        let cfg = &manifest.config;
        let config_bytes = match source {
            Source::Layout(path) => layout::read_blob(path, &cfg.digest)?,
            _ => self
                .store
                .read_blob(&cfg.digest, "config", MAX_METADATA_BYTES)?,
        };
        let parsed = manifest::parse_config(&config_bytes, &cfg.digest, manifest.layers.len())?;
        let budget = Arc::new(Budget::new(self.config.max_image_bytes, MAX_IMAGE_FILES));
        let mut missing = Vec::new();
        for (i, diff_id) in parsed.diff_ids.iter().enumerate() {
            match self.store.layer_stats(diff_id) {
                Some(s) => budget
                    .charge(s.bytes, s.entries)
                    .map_err(|e| Error::exceeded(reference, e))?,
                None => missing.push(i),
            }
        }
        Ok(Inspected {
            parsed,
            budget,
            missing,
        })
    }

    fn image(&self, reference: String, digest: &Digest, parsed: ParsedConfig) -> Image {
        Image {
            digest: digest.to_string(),
            layers: parsed
                .diff_ids
                .iter()
                .map(|d| self.store.layer_dir(d))
                .collect(),
            config: parsed.config,
            reference,
            pulled: false,
        }
    }

    /// The image recorded for `reference` (or pinned by digest), if its manifest is stored.
    fn resolve_local(
        &self,
        reference: &str,
        pinned: Option<Digest>,
    ) -> Result<Option<Resolved>, Error> {
        let Some(top) = pinned.or_else(|| self.store.read_ref(reference)) else {
            return Ok(None);
        };
        let Some(bytes) = self.read_local_manifest(&top)? else {
            return Ok(None);
        };
        let (digest, manifest) = match manifest::parse_manifest(&bytes, &top)? {
            Manifest::Image(m) => (top, m),
            Manifest::Index(index) => {
                let chosen = manifest::select_platform(&index, &top.to_string())?;
                let Some(bytes) = self.read_local_manifest(&chosen.digest)? else {
                    return Ok(None);
                };
                match manifest::parse_manifest(&bytes, &chosen.digest)? {
                    Manifest::Image(m) => (chosen.digest, m),
                    Manifest::Index(_) => return Ok(None),
                }
            }
        };
        Ok(Some(Resolved {
            reference: reference.to_owned(),
            digest,
            manifest,
        }))
    }

    /// A stored manifest, or `None` if it is missing or was corrupt (and removed).
    fn read_local_manifest(&self, digest: &Digest) -> Result<Option<Vec<u8>>, Error> {
        if !self.store.has_blob(digest) {
            return Ok(None);
        }
        match self.store.read_blob(digest, "manifest", MAX_METADATA_BYTES) {
            Ok(b) => Ok(Some(b)),
            Err(e @ StoreError::CorruptBlob { .. }) => {
                tracing::warn!(error = %e, "dropping corrupt cached manifest");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Installs ring as the process's rustls provider, as the `fnrun` binary does, for tests
/// that open a cache or speak to a registry.
#[cfg(test)]
pub(crate) fn install_test_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests;
