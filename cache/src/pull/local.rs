//! The warm path: an image the store (or its OCI layout) holds complete already,
//! found without network and without writing, in one blocking call.

use std::sync::Arc;

use super::{Puller, Resolved, Source};
use crate::config::MAX_IMAGE_FILES;
use crate::error::Error;
use crate::image::{Image, ImageDetails, LayerDetails};
use crate::layout;
use crate::memo::Resolution;
use crate::store::{CachedImage, StoreError};
use crate::unpack::Budget;
use fnrun_registry::ImageRef;
use fnrun_registry::digest::Digest;
use fnrun_registry::manifest::{self, ImageManifest, MAX_METADATA_BYTES, Manifest, ParsedConfig};

/// What [`Puller::inspect`] finds of an image.
pub(super) struct Inspected {
    pub(super) parsed: ParsedConfig,
    /// Charged with the layers already unpacked.
    pub(super) budget: Arc<Budget>,
    /// Indices of the layers not unpacked yet.
    pub(super) missing: Vec<usize>,
}

impl Puller {
    /// The image if everything it needs is here already (its record or layout, its
    /// config and every layer unpacked), found without network and without writing:
    /// the warm path of a run, done in one blocking call. `None` when something is
    /// missing (or it is an `oci-archive:`), for the full path to fetch or report.
    /// What `image`'s resolution reads, for [`crate::memo::Memo`]: the
    /// reference record or the layout's index; nothing for a reference by
    /// digest. `None` for an `oci-archive:`, which is never present.
    pub(crate) fn resolution(&self, image: &ImageRef) -> Option<Resolution> {
        match image {
            ImageRef::OciLayout { archive: true, .. } => None,
            ImageRef::OciLayout { path, .. } => Some(Resolution::File(path.join("index.json"))),
            ImageRef::Registry { .. } if image.pinned_digest().is_some() => Some(Resolution::Fixed),
            ImageRef::Registry { .. } => {
                Some(Resolution::File(self.store.ref_path(&image.to_string())))
            }
        }
    }

    pub(crate) fn present(&self, image: &ImageRef) -> Result<Option<Image>, Error> {
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
    pub(super) fn inspect(
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

    pub(super) fn image(&self, reference: String, digest: &Digest, parsed: ParsedConfig) -> Image {
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
    pub(super) fn resolve_local(
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

    /// The details of the cached `reference` ([`crate::Cache::inspect`]),
    /// `None` when its manifest or config is not stored.
    pub(crate) fn details(
        &self,
        reference: &str,
        digest: String,
        listed: Option<CachedImage>,
    ) -> Result<Option<ImageDetails>, Error> {
        let Some(resolved) = self.resolve_local(reference, None)? else {
            return Ok(None);
        };
        let m = &resolved.manifest;
        if !self.store.has_blob(&m.config.digest) {
            return Ok(None);
        }
        let bytes = self
            .store
            .read_blob(&m.config.digest, "config", MAX_METADATA_BYTES)?;
        let parsed = manifest::parse_config(&bytes, &m.config.digest, m.layers.len())?;
        let layers = m
            .layers
            .iter()
            .zip(&parsed.diff_ids)
            .map(|(l, diff_id)| LayerDetails {
                digest: l.digest.to_string(),
                size: l.size,
                diff_id: diff_id.to_string(),
                media_type: l.media_type.clone(),
                unpacked: self.store.unpacked_for_any_owner(diff_id),
            })
            .collect();
        let config = parsed.config;
        Ok(Some(ImageDetails {
            reference: reference.to_owned(),
            digest,
            manifest_digest: resolved.digest.to_string(),
            config_digest: m.config.digest.to_string(),
            size: listed.as_ref().map_or(0, |l| l.bytes),
            last_used: listed
                .as_ref()
                .and_then(|l| l.last_used)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
            in_use: listed.is_some_and(|l| l.in_use),
            entrypoint: config.entrypoint,
            cmd: config.cmd,
            env: config.env,
            working_dir: config.working_dir,
            user: config.user,
            layers,
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
