//! The cache's API: [`Cache::open`], [`Cache::get`] with its [`GetOptions`], and the
//! management calls (list, prune, verify). The work is done by the pull orchestrator
//! ([`crate::pull`]) and the store ([`crate::store`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::config::{CacheConfig, PullPolicy};
use crate::error::Error;
use crate::image::{Image, ImageDetails};
use crate::memo::Resolution;
use crate::progress::{NoProgress, PullProgress};
use crate::pull::{Puller, blocking};
use crate::store::{
    CachedImage, Lease, Prune as PruneWhat, PruneReport, Selector, Store, VerifyReport,
};
use fnrun_registry::Credentials;
use fnrun_registry::ImageRef;
use fnrun_registry::client::{Registries, Repo};

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
    /// ([`GetOptions::lease`]; `None` otherwise). Holders in one process may
    /// share one lease: it ends when the last of them drops it.
    pub lease: Option<Arc<Lease>>,
}

/// The image cache. `Send + Sync`; share it in an `Arc`.
pub struct Cache {
    pub(crate) inner: Arc<Puller>,
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
    /// [`fnrun_registry::RegistryError::NoCryptoProvider`].
    pub fn open(config: CacheConfig) -> Result<Cache, Error> {
        config.owner.validate()?;
        let owner_tag = config.owner.tag();
        let store = Store::open(&config.root, &owner_tag)?;
        let registries = Registries::new(
            config.insecure_registries.clone(),
            config.ca_bundle.as_deref(),
        )?;
        Ok(Cache {
            inner: Arc::new(Puller::new(store, config, owner_tag, registries)),
        })
    }

    /// Opens the cache at `config.root` as [`Cache::open`] does, but only if it
    /// is one already: for commands that read or tidy a cache (list, verify,
    /// prune), which must not leave a cache's directories behind in whatever
    /// directory they were given. Otherwise fails with
    /// [`crate::StoreError::NotACache`] (kind [`fnrun_registry::ErrorKind::NotFound`]).
    pub fn open_existing(config: CacheConfig) -> Result<Cache, Error> {
        Store::check_existing(&config.root)?;
        Cache::open(config)
    }

    /// The cache directory (absolute).
    pub fn root(&self) -> &Path {
        self.inner.store.root()
    }

    /// The registry of unqualified references ([`CacheConfig::default_registry`]).
    pub fn default_registry(&self) -> &str {
        &self.inner.config.default_registry
    }

    /// Parses and normalizes a reference with this cache's default registry. This (or
    /// [`ImageRef::parse`]) is the only way to make an [`ImageRef`], so [`Cache::get`]
    /// takes it as it is. The path of an `oci:` or `oci-archive:` image is made
    /// absolute against the working directory (symbolic links are not resolved): the
    /// reference it is recorded under names the same layout from anywhere.
    pub fn parse_reference(&self, s: &str) -> Result<ImageRef, Error> {
        let registry = &self.inner.config.default_registry;
        let image = ImageRef::parse(s, registry)?;
        if let ImageRef::OciLayout {
            path, tag, archive, ..
        } = &image
            && path.is_relative()
            && let Ok(absolute) = std::path::absolute(path)
            && let Some(absolute) = absolute.to_str().filter(|a| !a.contains(':'))
        {
            let transport = if *archive { "oci-archive" } else { "oci" };
            let tag = tag.as_ref().map(|t| format!(":{t}")).unwrap_or_default();
            return Ok(ImageRef::parse(
                &format!("{transport}:{absolute}{tag}"),
                registry,
            )?);
        }
        Ok(image)
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
            .inner
            .get(reference, policy, &credentials, &progress)
            .await;
        progress.pull_over();
        let image = image?;
        let lease = match lease {
            true => {
                let (inner, i) = (self.inner.clone(), image.clone());
                Some(Arc::new(
                    blocking(move || Ok(inner.store.lease_image(&i)?)).await?,
                ))
            }
            false => None,
        };
        drop(gc);
        Ok(Got { image, lease })
    }

    /// The warm path: the image (and its lease, if `lease`) when everything it needs
    /// is cached and `policy` does not ask to re-resolve it, in one blocking call,
    /// or with none when this process still leases the image it found for the same
    /// reference (see [`crate::memo`]). `None` sends the caller down the full path.
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
        if lease && let Some((image, lease)) = self.inner.memo.find(&reference.to_string()) {
            if in_registry {
                self.inner.touch(&image.reference).await;
            }
            return Ok(Some(Got {
                image,
                lease: Some(lease),
            }));
        }
        let (inner, reference) = (self.inner.clone(), reference.clone());
        let found = blocking(move || {
            // Before anything is read: a change after it is seen next time.
            let resolution = inner.resolution(&reference);
            let stamp = resolution.as_ref().and_then(Resolution::stamp);
            let _gc = inner.store.gc_lock(false)?;
            let Some(image) = inner.present(&reference)? else {
                return Ok(None);
            };
            let lease = match lease {
                true => Some(Arc::new(inner.store.lease_image(&image)?)),
                false => None,
            };
            if let (Some(lease), Some(resolution), Some(stamp)) = (&lease, resolution, stamp) {
                let key = reference.to_string();
                inner.memo.remember(&key, &image, lease, resolution, stamp);
            }
            Ok(Some(Got { image, lease }))
        })
        .await?;
        if let Some(got) = &found
            && in_registry
        {
            self.inner.touch(&got.image.reference).await;
        }
        Ok(found)
    }

    /// The tags of the repository of `reference` (a registry image; its own
    /// tag or digest is ignored), as the registry lists them: at most 100,000,
    /// names that are not tags dropped.
    pub async fn list_tags(
        &self,
        reference: &ImageRef,
        credentials: &Credentials,
    ) -> Result<Vec<String>, Error> {
        let ImageRef::Registry {
            registry,
            repository,
            ..
        } = reference
        else {
            return Err(Error::NotARegistry {
                reference: reference.to_string(),
            });
        };
        let repo = Repo {
            registry: registry.clone(),
            repository: repository.clone(),
            reference: format!("{registry}/{repository}"),
        };
        let registries = &self.inner.registries;
        let creds = registries.exchange(&repo, credentials).await?;
        Ok(registries.tags(&repo, &creds).await?)
    }

    /// Every cached reference with its size and last use, sorted by reference.
    pub async fn list(&self) -> Result<Vec<CachedImage>, Error> {
        let inner = self.inner.clone();
        blocking(move || Ok(inner.store.list())).await
    }

    /// Removes what no reference or lease uses, then the least recently used references
    /// (and what only they use) until the cache holds at most `max_bytes`. Never removes
    /// what a lease holds. Does nothing if the cache is already within `max_bytes`.
    pub async fn prune(&self, max_bytes: u64) -> Result<PruneReport, Error> {
        self.prune_inner(Some(max_bytes)).await
    }

    /// Removes every blob and layer that no reference or lease uses.
    pub async fn prune_unused(&self) -> Result<PruneReport, Error> {
        self.prune_inner(None).await
    }

    async fn prune_inner(&self, max_bytes: Option<u64>) -> Result<PruneReport, Error> {
        let what = match max_bytes {
            Some(max) => PruneWhat::MaxBytes(max),
            None => PruneWhat::Unused,
        };
        self.prune_as(what, false).await
    }

    /// What [`Cache::prune`] (`Some(max_bytes)`) or [`Cache::prune_unused`]
    /// (`None`) would remove, removing nothing.
    pub async fn prune_dry_run(&self, max_bytes: Option<u64>) -> Result<PruneReport, Error> {
        let what = match max_bytes {
            Some(max) => PruneWhat::MaxBytes(max),
            None => PruneWhat::Unused,
        };
        self.prune_as(what, true).await
    }

    /// Removes the named images (references, or digests as `cache list`
    /// shows them: `sha256:HEX` or at least 12 hex digits) and the blobs and
    /// layers only they use, as `podman rmi` does. An image in use (leased by
    /// a run) is kept and reported in `kept_in_use`; a name no cached
    /// reference matches is reported in `not_found`. With `dry_run`, reports
    /// what it would remove and removes nothing.
    pub async fn remove(&self, images: &[String], dry_run: bool) -> Result<PruneReport, Error> {
        let selectors = self.selectors(images);
        let inner = self.inner.clone();
        blocking(move || {
            let _gc = inner.store.gc_lock(true)?;
            Ok(inner.store.prune(PruneWhat::Images(&selectors), dry_run)?)
        })
        .await
    }

    async fn prune_as(
        &self,
        what: PruneWhat<'static>,
        dry_run: bool,
    ) -> Result<PruneReport, Error> {
        let inner = self.inner.clone();
        blocking(move || {
            let _gc = inner.store.gc_lock(true)?;
            Ok(inner.store.prune(what, dry_run)?)
        })
        .await
    }

    fn selectors(&self, images: &[String]) -> Vec<Selector> {
        images
            .iter()
            .map(|raw| Selector {
                raw: raw.clone(),
                reference: self.parse_reference(raw).ok().map(|r| r.to_string()),
            })
            .collect()
    }

    /// What the cache holds of `image` (a reference, or a digest as `cache
    /// list` shows it), without the network and without changing anything:
    /// its digests, size, last use, config and layers. `None` when it is not
    /// cached.
    pub async fn inspect(&self, image: &str) -> Result<Option<ImageDetails>, Error> {
        let selector = self.selectors(&[image.to_owned()]).remove(0);
        let inner = self.inner.clone();
        blocking(move || {
            let _gc = inner.store.gc_lock(false)?;
            let Some((reference, digest)) = inner.store.find(&selector) else {
                return Ok(None);
            };
            let listed = inner
                .store
                .list()
                .into_iter()
                .find(|i| i.reference == reference);
            inner.details(&reference, digest, listed)
        })
        .await
    }

    /// Rehashes every blob and checks every unpacked layer and reference, removing what
    /// is damaged (so that it is fetched or unpacked again), and sweeps tmp/.
    pub async fn verify(&self) -> Result<VerifyReport, Error> {
        let inner = self.inner.clone();
        blocking(move || {
            let _gc = inner.store.gc_lock(true)?;
            Ok(inner.store.verify()?)
        })
        .await
    }
}
