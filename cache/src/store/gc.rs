//! Store management: listing what is cached, pruning to a size and verifying (and
//! repairing) the store.
//!
//! ```text
//! refs/<sha256 of the reference>   {"reference", "digest", "last_used"}
//! leases/<sha256 of the content>   {"digest", "layers"}: flock-ed (shared) while in use
//! tmp/.gc.lock                     shared while an image is materialized, exclusive
//!                                  while pruning or verifying
//! ```
//!
//! What is in use is what a held lease ([`super::lease`]) names; a lease file nobody
//! holds is stale and removed here.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::FlockArg;

use super::dir::{RefFile, Store, StoreError, fsync_dir, io_err, lock};
use super::lease::LeaseFile;
use crate::unpack::{LayerStats, remove_tree};
use fnrun_registry::digest::{Digest, Hasher};
use fnrun_registry::manifest::{self, MAX_METADATA_BYTES, Manifest};

/// One cached reference, as listed by [`crate::Cache::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// Normalized reference.
    pub reference: String,
    /// The manifest (or index) digest it resolves to, `sha256:...`.
    pub digest: String,
    /// Bytes of the blobs and unpacked layers it uses (shared ones counted in each image).
    pub bytes: u64,
    /// When it was last used (pulled or run), if recorded.
    pub last_used: Option<SystemTime>,
    /// Whether a lease holds it (a run is using it).
    pub in_use: bool,
}

/// What [`crate::Cache::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// References removed, least recently used first.
    pub removed_refs: Vec<String>,
    /// Blobs removed.
    pub removed_blobs: usize,
    /// Unpacked layers removed.
    pub removed_layers: usize,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Bytes the cache holds now.
    pub total_bytes: u64,
    /// References kept although over the limit (or asked to be removed)
    /// because they are in use.
    pub kept_in_use: Vec<String>,
    /// Images asked to be removed ([`crate::Cache::remove`]) that no cached
    /// reference matched, as given.
    pub not_found: Vec<String>,
}

/// An image named to [`crate::Cache::remove`] or [`crate::Cache::inspect`]:
/// its reference (normalized, when it parses as one), or its digest:
/// `sha256:HEX`, or at least 12 hex digits of it, as `cache list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selector {
    /// As given.
    pub(crate) raw: String,
    /// Normalized, if it parses as a reference.
    pub(crate) reference: Option<String>,
}

/// Fewest hex digits of a digest that name an image (the DIGEST column of
/// `cache list`).
const MIN_DIGEST_PREFIX: usize = 12;

impl Selector {
    fn matches(&self, reference: &str, digest: &str) -> bool {
        if self.reference.as_deref() == Some(reference) {
            return true;
        }
        let hex = self.raw.strip_prefix("sha256:").unwrap_or(&self.raw);
        (MIN_DIGEST_PREFIX..=64).contains(&hex.len())
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && digest
                .strip_prefix("sha256:")
                .is_some_and(|d| d.starts_with(&hex.to_ascii_lowercase()))
    }
}

/// What [`Store::prune`] removes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Prune<'a> {
    /// What no reference or lease uses.
    Unused,
    /// That, then least recently used references until the store fits.
    MaxBytes(u64),
    /// These images and what only they use (nothing else unused).
    Images(&'a [Selector]),
}

/// What [`crate::Cache::verify`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Blobs rehashed.
    pub blobs_checked: usize,
    /// Unpacked layers checked.
    pub layers_checked: usize,
    /// References checked.
    pub refs_checked: usize,
    /// Blobs removed: digest mismatch, unreadable, or not a blob at all.
    pub corrupt_blobs: Vec<String>,
    /// Unpacked layers removed (incomplete, or with a missing or unreadable size
    /// record); they are unpacked again on next use.
    pub broken_layers: Vec<String>,
    /// Broken layers left in place because a lease holds them.
    pub broken_in_use: Vec<String>,
    /// References removed: unreadable, or naming a missing manifest.
    pub dangling_refs: Vec<String>,
    /// Leftovers removed that a crash leaves behind and that are not damage: dead
    /// tmp/ sessions, stale leases, size records of layers never committed.
    pub leftovers_removed: usize,
}

impl VerifyReport {
    /// Whether verify found damage (which it removed, unless in use).
    pub fn damaged(&self) -> bool {
        !(self.corrupt_blobs.is_empty()
            && self.broken_layers.is_empty()
            && self.broken_in_use.is_empty()
            && self.dangling_refs.is_empty())
    }
}

/// Something the store holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Item {
    /// `blobs/sha256/<hex>`.
    Blob(String),
    /// `layers/<owner-tag>/sha256/<hex>` (and its `.json`).
    Layer(String, String),
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The names in a directory (empty if it is missing).
fn names(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

impl Store {
    fn layers_root(&self) -> PathBuf {
        self.root().join("layers")
    }

    fn owner_tags(&self) -> Vec<String> {
        names(&self.layers_root())
            .into_iter()
            .filter(|t| self.layers_root().join(t).join("sha256").is_dir())
            .collect()
    }

    fn layer_path(&self, tag: &str, hex: &str) -> PathBuf {
        self.layers_root().join(tag).join("sha256").join(hex)
    }

    /// Reads a stored metadata blob (capped), without verifying it: GC only follows it.
    fn read_meta(&self, hex: &str) -> Option<Vec<u8>> {
        let f = File::open(self.blobs_dir().join(hex)).ok()?;
        let mut bytes = Vec::new();
        f.take(MAX_METADATA_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        (bytes.len() as u64 <= MAX_METADATA_BYTES).then_some(bytes)
    }

    /// Everything the manifest (or index) `digest` reaches in the store, itself included.
    fn reach(&self, digest: &Digest, tags: &[String], out: &mut HashSet<Item>, depth: u8) {
        out.insert(Item::Blob(digest.hex().to_owned()));
        let Some(bytes) = self.read_meta(digest.hex()) else {
            return;
        };
        match manifest::parse_manifest(&bytes, digest) {
            Ok(Manifest::Index(index)) if depth < 2 => {
                for m in &index.manifests {
                    if self.has_blob(&m.digest) {
                        self.reach(&m.digest, tags, out, depth + 1);
                    }
                }
            }
            Ok(Manifest::Image(m)) => {
                out.insert(Item::Blob(m.config.digest.hex().to_owned()));
                for l in &m.layers {
                    out.insert(Item::Blob(l.digest.hex().to_owned()));
                }
                let Some(cfg) = self.read_meta(m.config.digest.hex()) else {
                    return;
                };
                let Ok(parsed) = manifest::parse_config(&cfg, &m.config.digest, m.layers.len())
                else {
                    return;
                };
                for d in &parsed.diff_ids {
                    for tag in tags {
                        out.insert(Item::Layer(tag.clone(), d.hex().to_owned()));
                    }
                }
            }
            _ => {}
        }
    }

    /// The leases held right now; stale lease files are removed. Returns the items they
    /// hold, the manifest digests they name, and how many stale files were removed.
    fn held_leases(&self, tags: &[String]) -> (HashSet<Item>, HashSet<String>, usize) {
        let mut items = HashSet::new();
        let mut digests = HashSet::new();
        let mut stale = 0;
        for name in names(&self.leases) {
            let path = self.leases.join(&name);
            let Ok(file) = File::open(&path) else {
                continue;
            };
            match lock(file, FlockArg::LockExclusiveNonblock, &path) {
                Ok(Some(_held)) => {
                    // Nobody holds it: stale. Removed under the lock, so a new holder
                    // (which checks the inode after locking) retries with a new file.
                    if fs::remove_file(&path).is_ok() {
                        stale += 1;
                    }
                }
                Ok(None) => {
                    let Ok(bytes) = fs::read(&path) else { continue };
                    let Ok(lease) = serde_json::from_slice::<LeaseFile>(&bytes) else {
                        continue;
                    };
                    if let Ok(d) = Digest::parse(&lease.digest) {
                        self.reach(&d, tags, &mut items, 0);
                        digests.insert(d.hex().to_owned());
                    }
                    for l in &lease.layers {
                        if let Some((tag, hex)) = l.split_once('/') {
                            items.insert(Item::Layer(tag.to_owned(), hex.to_owned()));
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot check a lease"),
            }
        }
        (items, digests, stale)
    }

    /// Every reference record: (file name, record).
    fn refs(&self) -> Vec<(String, Option<RefFile>)> {
        names(self.refs_dir())
            .into_iter()
            .map(|name| {
                let record = fs::read(self.refs_dir().join(&name))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<RefFile>(&b).ok());
                (name, record)
            })
            .collect()
    }

    /// Sizes of everything stored.
    fn sizes(&self, tags: &[String]) -> HashMap<Item, u64> {
        let mut sizes = HashMap::new();
        for hex in names(self.blobs_dir()) {
            if let Ok(m) = fs::symlink_metadata(self.blobs_dir().join(&hex)) {
                sizes.insert(Item::Blob(hex), m.len());
            }
        }
        for tag in tags {
            let dir = self.layers_root().join(tag).join("sha256");
            for name in names(&dir) {
                if name.ends_with(".json") || !dir.join(&name).is_dir() {
                    continue;
                }
                let bytes = fs::read(dir.join(format!("{name}.json")))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<LayerStats>(&b).ok())
                    .map_or(0, |s| s.bytes);
                sizes.insert(Item::Layer(tag.clone(), name), bytes);
            }
        }
        sizes
    }

    /// Removes an unpacked layer: its directory is renamed into tmp/ (atomic), then its
    /// size record removed, then the tree deleted. A crash leaves a tmp/ leftover (swept)
    /// or a size record without a directory (ignored, overwritten by the next unpack).
    fn remove_layer(&self, tag: &str, hex: &str) -> Result<(), StoreError> {
        let dir = self.layer_path(tag, hex);
        let parent = self.layers_root().join(tag).join("sha256");
        if fs::symlink_metadata(&dir).is_ok() {
            let tmp = self.tmp_path("removed-layer");
            fs::rename(&dir, &tmp).map_err(io_err("move aside", &dir))?;
            let json = parent.join(format!("{hex}.json"));
            match fs::remove_file(&json) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &json)(e)),
            }
            fsync_dir(&parent)?;
            remove_tree(&tmp).map_err(io_err("remove", &tmp))?;
        } else {
            let json = parent.join(format!("{hex}.json"));
            let _ = fs::remove_file(&json);
            fsync_dir(&parent)?;
        }
        Ok(())
    }

    fn remove_item(&self, item: &Item) -> Result<(), StoreError> {
        match item {
            Item::Blob(hex) => {
                let path = self.blobs_dir().join(hex);
                match fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(io_err("remove", &path)(e)),
                }
            }
            Item::Layer(tag, hex) => self.remove_layer(tag, hex),
        }
    }

    pub(crate) fn list(&self) -> Vec<CachedImage> {
        let tags = self.owner_tags();
        let sizes = self.sizes(&tags);
        let (_, leased, _) = self.held_leases(&tags);
        let mut out = Vec::new();
        for (_, record) in self.refs() {
            let Some(r) = record else { continue };
            let Ok(d) = Digest::parse(&r.digest) else {
                continue;
            };
            let mut items = HashSet::new();
            self.reach(&d, &tags, &mut items, 0);
            let in_use = items
                .iter()
                .any(|i| matches!(i, Item::Blob(h) if leased.contains(h)));
            out.push(CachedImage {
                bytes: items.iter().filter_map(|i| sizes.get(i)).sum(),
                reference: r.reference,
                digest: r.digest,
                last_used: r.last_used.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
                in_use,
            });
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        out
    }

    /// Whether the layer `diff_id` is unpacked, for any layer owner (a root
    /// runner's shifted ids or a rootless one's own).
    pub(crate) fn unpacked_for_any_owner(&self, diff_id: &Digest) -> bool {
        self.owner_tags()
            .iter()
            .any(|tag| self.layer_path(tag, diff_id.hex()).is_dir())
    }

    /// The first cached reference `selector` names: (reference, digest).
    pub(crate) fn find(&self, selector: &Selector) -> Option<(String, String)> {
        let mut found: Vec<RefFile> = self
            .refs()
            .into_iter()
            .filter_map(|(_, r)| r)
            .filter(|r| selector.matches(&r.reference, &r.digest))
            .collect();
        // An exact reference before those of a matching digest.
        found.sort_by_key(|r| {
            (
                selector.reference.as_deref() != Some(&r.reference),
                r.reference.clone(),
            )
        });
        found.into_iter().next().map(|r| (r.reference, r.digest))
    }

    /// See [`crate::Cache::prune`] and [`crate::Cache::remove`]. With
    /// `dry_run`, reports what it would remove and removes nothing.
    pub(crate) fn prune(&self, what: Prune<'_>, dry_run: bool) -> Result<PruneReport, StoreError> {
        let tags = self.owner_tags();
        let sizes = self.sizes(&tags);
        let (leased_items, leased, _) = self.held_leases(&tags);
        let total: u64 = sizes.values().sum();
        let mut report = PruneReport {
            total_bytes: total,
            ..PruneReport::default()
        };
        if matches!(what, Prune::MaxBytes(m) if total <= m) {
            return Ok(report);
        }

        // Who uses what.
        struct Ref {
            name: String,
            reference: String,
            digest: String,
            last_used: u64,
            items: HashSet<Item>,
            in_use: bool,
        }
        let mut refs = Vec::new();
        let mut users: HashMap<Item, usize> = HashMap::new();
        for (name, record) in self.refs() {
            let Some(r) = record else { continue };
            let mut items = HashSet::new();
            if let Ok(d) = Digest::parse(&r.digest) {
                self.reach(&d, &tags, &mut items, 0);
            }
            for i in &items {
                *users.entry(i.clone()).or_default() += 1;
            }
            let in_use = items
                .iter()
                .any(|i| matches!(i, Item::Blob(h) if leased.contains(h)));
            refs.push(Ref {
                name,
                reference: r.reference,
                digest: r.digest,
                last_used: r.last_used.unwrap_or(0),
                items,
                in_use,
            });
        }
        for i in &leased_items {
            *users.entry(i.clone()).or_default() += 1;
        }

        // Unused items first (unless only named images go), then least
        // recently used references, or the named ones.
        let mut doomed: Vec<Item> = match what {
            Prune::Images(_) => Vec::new(),
            Prune::Unused | Prune::MaxBytes(_) => sizes
                .keys()
                .filter(|i| !users.contains_key(i))
                .cloned()
                .collect(),
        };
        doomed.sort();
        let mut remaining = total - doomed.iter().map(|i| sizes[i]).sum::<u64>();
        let mut doomed_refs: Vec<&Ref> = Vec::new();
        // Drops `r`'s uses; what nobody else uses then goes too.
        let mut release = |r: &Ref, doomed: &mut Vec<Item>, remaining: &mut u64| {
            let mut items: Vec<&Item> = r.items.iter().collect();
            items.sort();
            for i in items {
                let n = users.get_mut(i).expect("counted above");
                *n -= 1;
                if *n == 0
                    && let Some(size) = sizes.get(i)
                {
                    *remaining -= size;
                    doomed.push(i.clone());
                }
            }
        };
        match what {
            Prune::Unused => {}
            Prune::MaxBytes(max) => {
                refs.sort_by(|a, b| (a.last_used, &a.reference).cmp(&(b.last_used, &b.reference)));
                for r in &refs {
                    if remaining <= max {
                        break;
                    }
                    if r.in_use {
                        report.kept_in_use.push(r.reference.clone());
                        continue;
                    }
                    release(r, &mut doomed, &mut remaining);
                    doomed_refs.push(r);
                }
            }
            Prune::Images(selectors) => {
                for selector in selectors {
                    let named: Vec<&Ref> = refs
                        .iter()
                        .filter(|r| selector.matches(&r.reference, &r.digest))
                        .collect();
                    if named.is_empty() {
                        report.not_found.push(selector.raw.clone());
                    }
                    for r in named {
                        if doomed_refs.iter().any(|d| d.name == r.name)
                            || report.kept_in_use.contains(&r.reference)
                        {
                            continue;
                        }
                        if r.in_use {
                            report.kept_in_use.push(r.reference.clone());
                            continue;
                        }
                        release(r, &mut doomed, &mut remaining);
                        doomed_refs.push(r);
                    }
                }
            }
        }
        if dry_run {
            report.removed_refs = doomed_refs.iter().map(|r| r.reference.clone()).collect();
            for i in &doomed {
                match i {
                    Item::Blob(_) => report.removed_blobs += 1,
                    Item::Layer(..) => report.removed_layers += 1,
                }
                report.freed_bytes += sizes[i];
            }
            report.total_bytes = total - report.freed_bytes;
            return Ok(report);
        }

        // References first: a crash then leaves unused items, never a reference to
        // something missing.
        for r in &doomed_refs {
            let path = self.refs_dir().join(&r.name);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path)(e)),
            }
            report.removed_refs.push(r.reference.clone());
        }
        if !doomed_refs.is_empty() {
            fsync_dir(self.refs_dir())?;
        }
        for i in &doomed {
            self.remove_item(i)?;
            match i {
                Item::Blob(_) => report.removed_blobs += 1,
                Item::Layer(..) => report.removed_layers += 1,
            }
            report.freed_bytes += sizes[i];
        }
        if report.removed_blobs > 0 {
            fsync_dir(self.blobs_dir())?;
        }
        report.total_bytes = total - report.freed_bytes;
        Ok(report)
    }

    pub(crate) fn verify(&self) -> Result<VerifyReport, StoreError> {
        let mut report = VerifyReport::default();
        let tags = self.owner_tags();

        // Blobs: rehash each.
        let blobs = self.blobs_dir();
        for name in names(blobs) {
            let path = blobs.join(&name);
            report.blobs_checked += 1;
            let ok = is_hex64(&name)
                && fs::symlink_metadata(&path).is_ok_and(|m| m.is_file())
                && hash_file(&path).is_ok_and(|d| d.hex() == name);
            if !ok {
                let removed = match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => remove_tree(&path),
                    _ => fs::remove_file(&path),
                };
                removed.map_err(io_err("remove", &path))?;
                report.corrupt_blobs.push(format!("sha256:{name}"));
            }
        }
        fsync_dir(blobs)?;

        // Unpacked layers: each needs a readable size record (written before the
        // directory is committed); size records need their directory.
        let (leased_items, _, stale) = self.held_leases(&tags);
        report.leftovers_removed += stale;
        for tag in &tags {
            let dir = self.layers_root().join(tag).join("sha256");
            for name in names(&dir) {
                let path = dir.join(&name);
                if let Some(hex) = name.strip_suffix(".json")
                    && is_hex64(hex)
                {
                    if !dir.join(hex).is_dir() {
                        match fs::remove_file(&path) {
                            Ok(()) => report.leftovers_removed += 1,
                            // Removed with its broken layer just above.
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_err("remove", &path)(e)),
                        }
                    }
                    continue;
                }
                report.layers_checked += 1;
                let sound = is_hex64(&name)
                    && fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
                    && fs::read(dir.join(format!("{name}.json")))
                        .ok()
                        .and_then(|b| serde_json::from_slice::<LayerStats>(&b).ok())
                        .is_some();
                if sound {
                    continue;
                }
                let what = format!("{tag}/sha256:{name}");
                if leased_items.contains(&Item::Layer(tag.clone(), name.clone())) {
                    report.broken_in_use.push(what);
                    continue;
                }
                self.remove_layer(tag, &name)?;
                report.broken_layers.push(what);
            }
        }

        // References: readable, under their own name, naming a stored manifest.
        for (name, record) in self.refs() {
            report.refs_checked += 1;
            let sound = record.as_ref().is_some_and(|r| {
                Digest::of(r.reference.as_bytes()).hex() == name
                    && Digest::parse(&r.digest).is_ok_and(|d| self.has_blob(&d))
            });
            if !sound {
                let path = self.refs_dir().join(&name);
                fs::remove_file(&path).map_err(io_err("remove", &path))?;
                report
                    .dangling_refs
                    .push(record.map_or_else(|| format!("refs/{name}"), |r| r.reference));
            }
        }
        fsync_dir(self.refs_dir())?;

        report.leftovers_removed += self.sweep_tmp()?;
        Ok(report)
    }
}

fn hash_file(path: &Path) -> io::Result<Digest> {
    let mut f = File::open(path)?;
    let mut h = Hasher::default();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(h.finish()),
            n => h.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unpack::testutil::{Member, TarBuilder, gzip};
    use crate::{Cache, CacheConfig, Error, GetOptions, Image, PullPolicy};
    use fnrun_registry::manifest::{OCI_CONFIG, OCI_MANIFEST, host_arch};

    const GZ_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

    fn layer(name: &str, size: usize) -> Vec<u8> {
        let data: Vec<u8> = (0..size)
            .map(|i| u8::try_from(i * 31 % 251).expect("below 251"))
            .collect();
        let path = format!("{name}.bin");
        TarBuilder::new()
            .add(Member::File(path.as_bytes(), &data, 0o644))
            .tar()
    }

    /// What a pull of `reference` with `layers` stores. Returns the blob digests
    /// (manifest, config, layer blobs...) and the diff_ids.
    struct Stored {
        blobs: Vec<(Digest, Vec<u8>)>,
        diff_ids: Vec<Digest>,
    }

    fn store_image(cache: &Cache, reference: &str, layers: &[&Vec<u8>], last_used: u64) -> Stored {
        let mut blobs = Vec::new();
        let mut descs = Vec::new();
        let mut diff_ids = Vec::new();
        for tar in layers {
            let gz = gzip(tar);
            let d = Digest::of(&gz);
            descs.push(format!(
                r#"{{"mediaType":"{GZ_LAYER}","digest":"{d}","size":{}}}"#,
                gz.len()
            ));
            blobs.push((d, gz));
            diff_ids.push(Digest::of(tar));
        }
        let ids: Vec<String> = diff_ids.iter().map(|d| format!("\"{d}\"")).collect();
        let config = format!(
            r#"{{"architecture":"{}","os":"linux","config":{{"Entrypoint":["/bin/fn"],"Env":["R={reference}"]}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
            host_arch(),
            ids.join(",")
        )
        .into_bytes();
        let cd = Digest::of(&config);
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"{cd}","size":{}}},"layers":[{}]}}"#,
            config.len(),
            descs.join(",")
        )
        .into_bytes();
        let md = Digest::of(&manifest);
        blobs.insert(0, (cd, config));
        blobs.insert(0, (md.clone(), manifest));
        let store = &cache.inner.store;
        for (d, b) in &blobs {
            store.write_blob(d, "blob", b).unwrap();
        }
        store
            .write_ref_file(&RefFile {
                reference: reference.to_owned(),
                digest: md.to_string(),
                last_used: Some(last_used),
            })
            .unwrap();
        Stored { blobs, diff_ids }
    }

    async fn get(cache: &Cache, reference: &str) -> Result<Image, Error> {
        let r = cache.parse_reference(reference).unwrap();
        cache
            .get(&r, GetOptions::new(PullPolicy::Never))
            .await
            .map(|got| got.image)
    }

    fn open(root: &Path) -> Cache {
        crate::install_test_crypto_provider();
        Cache::open(CacheConfig::new(root)).unwrap()
    }

    fn refs(cache: &Cache) -> Vec<String> {
        let mut v: Vec<String> = cache
            .inner
            .store
            .list()
            .into_iter()
            .map(|i| i.reference)
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn prune_evicts_least_recently_used_keeps_shared_and_leased() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = open(&tmp.path().join("cache"));
        let base = layer("base", 200_000);
        let (ta, tb, tc) = (layer("a", 10_000), layer("b", 20_000), layer("c", 30_000));
        store_image(&cache, "r.test/a:1", &[&base, &ta], 100);
        let b = store_image(&cache, "r.test/b:1", &[&base, &tb], 300);
        store_image(&cache, "r.test/c:1", &[&base, &tc], 200);
        for r in ["r.test/a:1", "r.test/b:1", "r.test/c:1"] {
            get(&cache, r).await.unwrap();
        }
        let list = cache.list().await.unwrap();
        assert_eq!(list.len(), 3);
        assert!(
            list.iter().all(|i| i.bytes > 200_000 && !i.in_use),
            "{list:?}"
        );
        // A get less than a minute after the recorded use does not rewrite it; our
        // fixtures' last use is in 1970, so it did.
        assert!(
            list.iter()
                .all(|i| i.last_used.unwrap() > UNIX_EPOCH + Duration::from_secs(1000))
        );
        // Back to the fixture's times for the order.
        let a = store_image(&cache, "r.test/a:1", &[&base, &ta], 100).diff_ids;
        let b_ids = store_image(&cache, "r.test/b:1", &[&base, &tb], 300).diff_ids;
        let c_ids = store_image(&cache, "r.test/c:1", &[&base, &tc], 200).diff_ids;
        let store = &cache.inner.store;
        let total = cache.prune_unused().await.unwrap().total_bytes;

        // Just over the limit: the least recently used image goes, the shared base stays.
        let r = cache.prune(total - 1).await.unwrap();
        assert_eq!(r.removed_refs, vec!["r.test/a:1".to_owned()]);
        assert!(r.removed_layers == 1 && r.removed_blobs == 3, "{r:?}");
        assert!(r.total_bytes < total);
        assert!(store.layer_dir(&a[0]).is_dir(), "the shared base stays");
        assert!(!store.layer_dir(&a[1]).exists());
        assert_eq!(refs(&cache), vec!["r.test/b:1", "r.test/c:1"]);

        // b is in use: prune to 0 takes c and keeps b and everything it uses.
        let (image_b, lease) = {
            let r = cache.parse_reference("r.test/b:1").unwrap();
            let got = cache
                .get(&r, GetOptions::new(PullPolicy::Never).leased())
                .await
                .unwrap();
            (got.image, got.lease.expect("a lease"))
        };
        // Another process (a second Cache on the same root) honours the lease too.
        let other = open(&tmp.path().join("cache"));
        let r = other.prune(0).await.unwrap();
        assert_eq!(r.removed_refs, vec!["r.test/c:1".to_owned()]);
        assert_eq!(r.kept_in_use, vec!["r.test/b:1".to_owned()]);
        assert!(!store.layer_dir(&c_ids[1]).exists());
        for l in &image_b.layers {
            assert!(l.is_dir(), "{}", l.display());
        }
        for (d, _) in &b.blobs {
            assert!(store.has_blob(d), "{d}");
        }
        assert!(cache.list().await.unwrap()[0].in_use);
        get(&cache, "r.test/b:1").await.unwrap();

        // Released: everything goes.
        drop(lease);
        let r = other.prune(0).await.unwrap();
        assert_eq!(r.removed_refs, vec!["r.test/b:1".to_owned()]);
        assert_eq!(r.total_bytes, 0);
        assert!(!store.layer_dir(&b_ids[0]).exists());
        assert!(names(store.blobs_dir()).is_empty());
        assert!(names(&store.leases).is_empty(), "stale leases are removed");
        assert!(matches!(
            get(&cache, "r.test/b:1").await,
            Err(Error::NotCached { .. })
        ));
    }

    #[tokio::test]
    async fn the_last_lease_holder_removes_the_lease_file() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = open(&tmp.path().join("cache"));
        store_image(&cache, "r.test/a:1", &[&layer("base", 10_000)], 1);
        let r = cache.parse_reference("r.test/a:1").unwrap();
        let leased = || GetOptions::new(PullPolicy::Never).leased();
        let first = cache.get(&r, leased()).await.unwrap().lease.unwrap();
        let second = cache.get(&r, leased()).await.unwrap().lease.unwrap();
        let leases = &cache.inner.store.leases;
        assert_eq!(names(leases).len(), 1, "both runs share one lease file");
        drop(first);
        assert_eq!(names(leases).len(), 1, "still held by the second run");
        assert!(cache.list().await.unwrap()[0].in_use);
        drop(second);
        assert!(
            names(leases).is_empty(),
            "runs must not leave lease files behind"
        );
        // And a new run leases it again.
        let third = cache.get(&r, leased()).await.unwrap().lease.unwrap();
        assert!(cache.list().await.unwrap()[0].in_use);
        drop(third);
    }

    #[tokio::test]
    async fn remove_takes_what_only_the_named_image_uses_and_keeps_leased_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = open(&tmp.path().join("cache"));
        let base = layer("base", 100_000);
        let a = store_image(&cache, "r.test/a:1", &[&base, &layer("a", 10_000)], 100);
        let b = store_image(&cache, "r.test/b:1", &[&base, &layer("b", 20_000)], 200);
        for r in ["r.test/a:1", "r.test/b:1"] {
            get(&cache, r).await.unwrap();
        }
        // Something unused that `rm` leaves to `prune`.
        let stray = b"stray".to_vec();
        cache
            .inner
            .store
            .write_blob(&Digest::of(&stray), "blob", &stray)
            .unwrap();
        let store = &cache.inner.store;
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

        // A dry run says what would go and removes nothing; so does prune's.
        let before = cache.list().await.unwrap();
        let dry = cache.remove(&names(&["r.test/a:1"]), true).await.unwrap();
        assert_eq!(dry.removed_refs, ["r.test/a:1"]);
        assert_eq!((dry.removed_blobs, dry.removed_layers), (3, 1), "{dry:?}");
        assert!(
            dry.freed_bytes > 10_000 && dry.freed_bytes < 100_000,
            "{dry:?}"
        );
        let dry_prune = cache.prune_dry_run(Some(0)).await.unwrap();
        assert_eq!(dry_prune.removed_refs, ["r.test/a:1", "r.test/b:1"]);
        assert_eq!(dry_prune.total_bytes, 0);
        let dry_unused = cache.prune_dry_run(None).await.unwrap();
        assert_eq!(
            (dry_unused.removed_blobs, dry_unused.removed_refs.len()),
            (1, 0)
        );
        assert_eq!(cache.list().await.unwrap(), before);
        assert!(store.has_blob(&Digest::of(&stray)));

        // Inspect by reference and by the short digest `cache list` shows.
        let details = cache.inspect("r.test/a:1").await.unwrap().expect("cached");
        assert_eq!(details.digest, a.blobs[0].0.to_string());
        assert_eq!(details.entrypoint, ["/bin/fn"]);
        assert_eq!(details.layers.len(), 2);
        assert!(details.layers.iter().all(|l| l.unpacked));
        assert_eq!(details.layers[1].diff_id, a.diff_ids[1].to_string());
        let short = &a.blobs[0].0.hex()[..12];
        assert_eq!(cache.inspect(short).await.unwrap(), Some(details));
        assert_eq!(cache.inspect("r.test/none:1").await.unwrap(), None);
        assert_eq!(cache.inspect(&short[..6]).await.unwrap(), None);

        // b is in use: rm keeps it; a goes with its own layer, the base stays.
        let lease = {
            let r = cache.parse_reference("r.test/b:1").unwrap();
            let got = cache
                .get(&r, GetOptions::new(PullPolicy::Never).leased())
                .await
                .unwrap();
            got.lease.expect("a lease")
        };
        let r = cache
            .remove(
                &names(&["r.test/a:1", "r.test/b:1", "r.test/none:1"]),
                false,
            )
            .await
            .unwrap();
        assert_eq!(r.removed_refs, ["r.test/a:1"]);
        assert_eq!(r.kept_in_use, ["r.test/b:1"]);
        assert_eq!(r.not_found, ["r.test/none:1"]);
        assert!(!store.layer_dir(&a.diff_ids[1]).exists());
        assert!(store.layer_dir(&a.diff_ids[0]).is_dir(), "b uses the base");
        assert!(
            store.has_blob(&Digest::of(&stray)),
            "rm leaves unused blobs to prune"
        );
        assert_eq!(refs(&cache), ["r.test/b:1"]);
        get(&cache, "r.test/b:1").await.unwrap();

        // Released: rm by digest takes b and the base.
        drop(lease);
        let r = cache
            .remove(&names(&[&b.blobs[0].0.to_string()]), false)
            .await
            .unwrap();
        assert_eq!(r.removed_refs, ["r.test/b:1"]);
        assert!(!store.layer_dir(&b.diff_ids[0]).exists());
        assert!(refs(&cache).is_empty());
    }

    #[tokio::test]
    async fn prune_within_limit_keeps_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = open(&tmp.path().join("cache"));
        let base = layer("base", 50_000);
        store_image(&cache, "r.test/a:1", &[&base], 1);
        get(&cache, "r.test/a:1").await.unwrap();
        let r = cache.prune(u64::MAX).await.unwrap();
        assert!(r.removed_refs.is_empty() && r.freed_bytes == 0, "{r:?}");
        get(&cache, "r.test/a:1").await.unwrap();
    }

    #[tokio::test]
    async fn verify_repairs_blobs_layers_and_refs() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let cache = open(&root);
        let (base, top) = (layer("base", 40_000), layer("top", 4_000));
        let s = store_image(&cache, "r.test/a:1", &[&base, &top], 1);
        get(&cache, "r.test/a:1").await.unwrap();
        let store = &cache.inner.store;
        let clean = cache.verify().await.unwrap();
        assert!(!clean.damaged(), "{clean:?}");
        assert_eq!(
            (
                clean.blobs_checked,
                clean.layers_checked,
                clean.refs_checked
            ),
            (4, 2, 1)
        );

        // Truncated size record of an unpacked layer, and a dead process's tmp/ session.
        let json = store.layer_stats_path(&s.diff_ids[1]);
        fs::write(&json, b"{\"bytes\":").unwrap();
        fs::create_dir_all(root.join("tmp/1-1/layer-0")).unwrap();
        let r = cache.verify().await.unwrap();
        assert!(r.damaged());
        assert_eq!(r.broken_layers.len(), 1, "{r:?}");
        assert!(r.broken_layers[0].ends_with(s.diff_ids[1].hex()));
        assert!(r.leftovers_removed >= 1 && !root.join("tmp/1-1").exists());
        assert!(!store.layer_dir(&s.diff_ids[1]).exists() && !json.exists());
        let image = get(&cache, "r.test/a:1").await.expect("unpacked again");
        assert!(image.layers[1].join("top.bin").is_file());

        // A corrupted layer blob (the layer stays unpacked: the image still runs).
        let layer_blob = &s.blobs[3].0;
        fs::write(store.blob_path(layer_blob), b"bit rot").unwrap();
        let r = cache.verify().await.unwrap();
        assert_eq!(r.corrupt_blobs, vec![layer_blob.to_string()]);
        assert!(!store.has_blob(layer_blob));
        get(&cache, "r.test/a:1").await.unwrap();

        // A corrupted manifest: the blob goes, then the reference to it.
        let manifest = &s.blobs[0].0;
        let mut bytes = fs::read(store.blob_path(manifest)).unwrap();
        bytes.truncate(bytes.len() / 2);
        fs::write(store.blob_path(manifest), bytes).unwrap();
        let r = cache.verify().await.unwrap();
        assert_eq!(r.corrupt_blobs, vec![manifest.to_string()]);
        assert_eq!(r.dangling_refs, vec!["r.test/a:1".to_owned()]);
        assert!(matches!(
            get(&cache, "r.test/a:1").await,
            Err(Error::NotCached { .. })
        ));
        // An unreadable reference record is dangling too.
        fs::write(root.join("refs").join("0".repeat(64)), b"{").unwrap();
        let r = cache.verify().await.unwrap();
        assert_eq!(r.dangling_refs.len(), 1, "{r:?}");

        // A new pull (here: storing the blobs again) works, and verify is clean.
        store_image(&cache, "r.test/a:1", &[&base, &top], 1);
        get(&cache, "r.test/a:1").await.unwrap();
        let r = cache.verify().await.unwrap();
        assert!(!r.damaged(), "{r:?}");
    }
}
