//! The pull orchestrator: brings an image's manifest, config and layers into the store,
//! from a registry or an OCI layout, once per blob and layer (single flight), and finds
//! an image the store holds complete already.
//!
//! [`Puller`] holds what every pull shares: the store, the registry clients and the
//! in-process locks. Its `impl` is split by step across this module: this file resolves
//! a reference (registry, local reference index, OCI layout or archive) and records
//! its use; [`materialize`] fetches the config and layers and unpacks them;
//! [`local`] finds what is here already, without network and without writing (the warm
//! path of a run).
//!
//! A pull from a registry has a deadline ([`CacheConfig::pull_timeout`]), counted from
//! the `get` that starts it or waits for it: past it the token, manifest and config
//! requests are dropped, the layer downloads stop (their partial files removed) and
//! the pull fails with [`Error::PullTimeout`] once a layer being unpacked, if any, is
//! done.

mod local;
mod materialize;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::config::{CacheConfig, PullPolicy};
use crate::error::Error;
use crate::image::Image;
use crate::layout;
use crate::progress::{NoProgress, PullProgress};
use crate::store::{Store, TOUCH_INTERVAL};
use crate::unpack;
use fnrun_registry::Credentials;
use fnrun_registry::ImageRef;
use fnrun_registry::client::{Registries, Repo};
use fnrun_registry::digest::Digest;
use fnrun_registry::manifest::{
    self, ImageManifest, MAX_METADATA_BYTES, Manifest, ManifestError, UnsupportedManifest,
};

/// Runs blocking store work off the async runtime.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    F: FnOnce() -> Result<T, Error> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await?
}

/// What every pull of a cache shares.
pub(crate) struct Puller {
    pub(crate) store: Store,
    pub(crate) config: CacheConfig,
    /// The directory under `layers/` of this cache's layer owner.
    pub(crate) owner_tag: String,
    pub(crate) registries: Registries,
    locks: KeyedLocks,
    /// When this process last recorded the use of each reference.
    touched: Mutex<HashMap<String, Instant>>,
    /// Images found on the warm path that this process still leases.
    pub(crate) memo: crate::memo::Memo,
}

impl Puller {
    pub(crate) fn new(
        store: Store,
        config: CacheConfig,
        owner_tag: String,
        registries: Registries,
    ) -> Puller {
        Puller {
            store,
            config,
            owner_tag,
            registries,
            locks: KeyedLocks::default(),
            touched: Mutex::default(),
            memo: crate::memo::Memo::default(),
        }
    }

    /// The image of `image`, resolved, downloaded and unpacked as `policy` allows, its
    /// layers reported to `progress`. The caller holds the shared GC lock.
    pub(crate) async fn get(
        self: &Arc<Self>,
        image: &ImageRef,
        policy: PullPolicy,
        creds: &Credentials,
        progress: &Arc<dyn PullProgress>,
    ) -> Result<Image, Error> {
        match image {
            ImageRef::OciLayout {
                path, tag, archive, ..
            } => {
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
                            reference: r.clone(),
                            digest: digest.clone(),
                            manifest: manifest.clone(),
                        };
                        match self
                            .materialize(resolved, Source::Layout(layout.clone()), progress, None)
                            .await
                        {
                            Ok(image) => self
                                .record_layout(layout, r, digest, manifest)
                                .await
                                .map(|()| image),
                            Err(e) => Err(e),
                        }
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
    async fn extract_archive(self: &Arc<Self>, archive: &Path) -> Result<Extracted, Error> {
        let dest = self.store.tmp_path("oci-archive");
        // Layers are compressed and an archive holds little else: twice the unpacked
        // limit bounds what an honest archive of one image needs.
        let limit = self.config.max_image_bytes.saturating_mul(2);
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
        self: &Arc<Self>,
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

        // The pull's deadline counts from here: waiting for another's pull of the
        // same reference is part of it.
        let deadline = self
            .config
            .pull_timeout
            .and_then(|timeout| Deadline::after(timeout, &reference));
        let deadline = deadline.as_ref();

        // Single flight: one pull of a reference at a time; a `get` that waited for
        // another's pull uses its result (blobs are single-flighted in `ensure_blob`).
        let _pull = within(deadline, async {
            Ok(self.locks.lock(format!("pull/{reference}")).await)
        })
        .await?;
        if policy == PullPolicy::IfNotPresent
            && let Some(image) = self.get_local(&reference, pinned.as_ref(), policy).await
        {
            return image;
        }

        tracing::info!(reference = %reference, "pulling image");
        let (creds, (top, resolved)) = within(deadline, async {
            let creds = self.registries.exchange(&repo, creds).await?;
            let resolved = self
                .resolve_remote(&repo, tag, pinned.as_ref(), &creds)
                .await?;
            Ok((creds, resolved))
        })
        .await?;
        let image = self
            .materialize(
                resolved,
                Source::Registry {
                    repo: repo.clone(),
                    creds,
                },
                progress,
                deadline,
            )
            .await?;
        let inner = self.clone();
        blocking(move || Ok(inner.store.write_ref(&reference, &top)?)).await?;
        Ok(Image {
            pulled: true,
            ..image
        })
    }

    /// Records an image got from an OCI layout (or archive) as a registry
    /// image is recorded: its manifest and config copied into the store and
    /// its reference (`oci:PATH:TAG`) written, so that `cache list`, `cache
    /// inspect` and `cache rm` find it, and a prune counts it (its layers are
    /// unpacked in the store; their compressed blobs stay in the layout).
    async fn record_layout(
        self: &Arc<Self>,
        layout: PathBuf,
        reference: String,
        digest: Digest,
        manifest: ImageManifest,
    ) -> Result<(), Error> {
        let inner = self.clone();
        blocking(move || {
            let bytes = layout::read_blob(&layout, &digest)?;
            inner.store.write_blob(&digest, "manifest", &bytes)?;
            let config = &manifest.config.digest;
            let bytes = layout::read_blob(&layout, config)?;
            inner.store.write_blob(config, "config", &bytes)?;
            Ok(inner.store.write_ref(&reference, &digest)?)
        })
        .await
    }

    /// The image from the local reference index, if it is there; `None` if it is not (or
    /// is incomplete and `policy` allows pulling it).
    async fn get_local(
        self: &Arc<Self>,
        reference: &str,
        pinned: Option<&Digest>,
        policy: PullPolicy,
    ) -> Option<Result<Image, Error>> {
        let inner = self.clone();
        let (r, p) = (reference.to_owned(), pinned.cloned());
        let resolved = match blocking(move || inner.resolve_local(&r, p)).await {
            Ok(Some(resolved)) => resolved,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        // Nothing is pulled here; an incomplete image is pulled (and reported) afterwards.
        let quiet: Arc<dyn PullProgress> = Arc::new(NoProgress);
        match self
            .materialize(resolved, Source::Local, &quiet, None)
            .await
        {
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
        self: &Arc<Self>,
        repo: &Repo,
        tag: Option<&str>,
        pinned: Option<&Digest>,
        creds: &Credentials,
    ) -> Result<(Digest, Resolved), Error> {
        let regs = &self.registries;
        let (bytes, top) = regs.manifest(repo, creds, tag, pinned).await?;
        let manifest = manifest::parse_manifest(&bytes, &top)?;
        self.store_blob(top.clone(), "manifest", bytes).await?;
        let (digest, manifest) = match manifest {
            Manifest::Image(m) => (top.clone(), m),
            Manifest::Index(index) => {
                let chosen = manifest::select_platform(&index, &top.to_string())?;
                let inner = self.clone();
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
                            reason: UnsupportedManifest::NestedIndex,
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
    pub(crate) async fn touch(self: &Arc<Self>, reference: &str) {
        let now = Instant::now();
        let interval = Duration::from_secs(TOUCH_INTERVAL);
        {
            let mut touched = self
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
        let (inner, r) = (self.clone(), reference.to_owned());
        let touched = blocking(move || Ok(inner.store.touch_ref(&r, TOUCH_INTERVAL)?)).await;
        if let Err(e) = touched {
            tracing::warn!(reference, error = %e, "cannot record the last use of an image");
        }
    }

    async fn store_blob(
        self: &Arc<Self>,
        digest: Digest,
        what: &'static str,
        bytes: Vec<u8>,
    ) -> Result<(), Error> {
        let inner = self.clone();
        blocking(move || Ok(inner.store.write_blob(&digest, what, &bytes)?)).await
    }
}

/// When a pull from a registry must be over ([`CacheConfig::pull_timeout`]).
struct Deadline {
    at: tokio::time::Instant,
    timeout: Duration,
    reference: String,
}

impl Deadline {
    /// `timeout` from now; `None` if that is past the clock's range.
    fn after(timeout: Duration, reference: &str) -> Option<Deadline> {
        Some(Deadline {
            at: tokio::time::Instant::now().checked_add(timeout)?,
            timeout,
            reference: reference.to_owned(),
        })
    }

    /// Resolves at the deadline.
    async fn expired(&self) {
        tokio::time::sleep_until(self.at).await;
    }

    fn error(&self) -> Error {
        Error::PullTimeout {
            reference: self.reference.clone(),
            timeout: self.timeout,
        }
    }
}

/// `work`, or [`Error::PullTimeout`] if `deadline` comes first (`work` is then
/// dropped: what it fetched partly is removed, see `Registries::blob`).
async fn within<T>(
    deadline: Option<&Deadline>,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.at, work)
            .await
            .unwrap_or_else(|_| Err(deadline.error())),
        None => work.await,
    }
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

/// Per-key async locks, so one task fetches or unpacks a given blob or layer while the
/// others wait and then find it present.
#[derive(Default, Debug)]
pub(crate) struct KeyedLocks {
    map: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    pub(crate) async fn lock(&self, key: String) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(&key).and_then(Weak::upgrade) {
                Some(m) => m,
                None => {
                    let m = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(key, Arc::downgrade(&m));
                    m
                }
            }
        };
        mutex.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keyed_locks_serialize_one_key() {
        let locks = Arc::new(KeyedLocks::default());
        let g = locks.lock("a".into()).await;
        let l2 = locks.clone();
        let other = tokio::spawn(async move { l2.lock("b".into()).await });
        other.await.unwrap();
        let l3 = locks.clone();
        let mut same = tokio::spawn(async move {
            let _g = l3.lock("a".into()).await;
        });
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut same)
                .await
                .is_err()
        );
        drop(g);
        same.await.unwrap();
    }
}
