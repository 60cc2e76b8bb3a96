//! Materializing an image: its config and every layer made available, missing layers
//! downloaded (a few at a time, each blob once) and unpacked as soon as each arrives.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;

use super::local::Inspected;
use super::{Deadline, Puller, Resolved, Source, Stop, blocking, within};
use crate::error::Error;
use crate::image::Image;
use crate::layout;
use crate::progress::{NoProgress, PullProgress};
use crate::unpack::{self, Budget, Exceeded, UnpackError};
use fnrun_registry::digest::Digest;
use fnrun_registry::manifest::Descriptor;

/// Blob downloads running at once for one image.
const CONCURRENT_DOWNLOADS: usize = 4;

impl Puller {
    /// Makes sure the config and every layer of `resolved` are available, unpacking
    /// missing layers, and returns the image. Layers are reported to `progress`.
    ///
    /// Past `deadline` the downloads stop and it fails with [`Error::PullTimeout`]
    /// once a layer being unpacked (if any) is done, as when a layer fails.
    pub(super) async fn materialize(
        self: &Arc<Self>,
        resolved: Resolved,
        source: Source,
        progress: &Arc<dyn PullProgress>,
        deadline: Option<&Deadline>,
    ) -> Result<Image, Error> {
        let Resolved {
            reference,
            digest,
            manifest,
        } = resolved;
        let inner = self;

        // The config, then what of the image is here already.
        let cfg = manifest.config.clone();
        within(
            deadline,
            self.ensure_blob(&cfg, "config", &source, &reference, &|_| {}, None),
        )
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
        let expired = async {
            match deadline {
                Some(deadline) => deadline.expired().await,
                None => std::future::pending().await,
            }
        };
        let mut expired = std::pin::pin!(expired);
        loop {
            let result = tokio::select! {
                result = results.next() => match result {
                    Some(result) => result,
                    None => break,
                },
                // The deadline stops the downloads as a failed layer does.
                () = &mut expired, if failed.is_none() => {
                    stop_tx.send_replace(true);
                    failed = deadline.map(Deadline::error);
                    continue;
                }
            };
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

    /// [`Puller::ensure_blob`] for a layer, reported to `progress`.
    async fn download_layer(
        self: &Arc<Self>,
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
        self: &Arc<Self>,
        blob: &Descriptor,
        what: &'static str,
        source: &Source,
        reference: &str,
        on_bytes: &(dyn Fn(u64) + Sync),
        stop: Option<&Stop>,
    ) -> Result<(), Error> {
        let digest = &blob.digest;
        let store = &self.store;
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
                let _guard = self.locks.lock(format!("blob/{}", digest.hex())).await;
                if store.has_blob(digest) {
                    return Ok(());
                }
                let tmp = store.tmp_path("blob");
                let fetch = self
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
                let (inner, d) = (self.clone(), digest.clone());
                blocking(move || Ok(inner.store.commit_blob(&tmp, &d)?)).await
            }
        }
    }

    /// Unpacks one layer unless it already is; charges it to `budget` either way. Reports
    /// the unpacking (if this call does it) and the end to `progress`. Does nothing once
    /// `stop` is set, unless the unpacking has started.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_layer(
        self: &Arc<Self>,
        blob: Digest,
        diff_id: Digest,
        source: &Source,
        budget: Arc<Budget>,
        reference: &str,
        progress: Arc<dyn PullProgress>,
        stop: &Stop,
    ) -> Result<(), Error> {
        let key = format!("layer/{}/{}", self.owner_tag, diff_id.hex());
        let guard = self.locks.lock(key).await;
        if stop.is_set() {
            return Ok(());
        }
        let inner = self.clone();
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
