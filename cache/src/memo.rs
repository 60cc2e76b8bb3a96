//! The images this process found on the warm path and still leases, so that
//! the next call for the same reference finds its image without reading the
//! store again.
//!
//! A remembered image is used only while some holder in this process still
//! holds its [`Lease`]: a lease keeps every blob and layer of the image from
//! any prune, in this process or another, so what the image names is still
//! there. What a reference resolves to can change meanwhile (a tag pulled
//! again, an OCI layout's `index.json` rewritten), so each use also checks
//! that the file the reference was resolved through is the one that was
//! read: same device, inode, size, modification and change time. A
//! reference by digest resolves to the same image for ever. The new holder
//! shares the live lease (one `flock` for all the holders of a process, as
//! the pruner only asks whether anyone holds it).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::image::Image;
use crate::store::Lease;

/// At most this many references are remembered; past it, those whose lease
/// has ended are forgotten, and if that is not enough, all of them.
const MAX_ENTRIES: usize = 1024;

/// What a reference's resolution depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// A reference by digest: always the same image.
    Fixed,
    /// Resolved by reading this file (a reference record, a layout's index).
    File(PathBuf),
}

impl Resolution {
    /// What it reads now; `None` for a file that cannot be read (such a
    /// reference is not remembered).
    pub(crate) fn stamp(&self) -> Option<Stamp> {
        match self {
            Resolution::Fixed => Some(Stamp::Fixed),
            Resolution::File(path) => {
                let m = std::fs::metadata(path).ok()?;
                Some(Stamp::File {
                    dev: m.dev(),
                    ino: m.ino(),
                    size: m.size(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    ctime: (m.ctime(), m.ctime_nsec()),
                })
            }
        }
    }
}

/// Which version of a resolution was read: enough to see that its file was
/// replaced or rewritten since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    Fixed,
    File {
        dev: u64,
        ino: u64,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
}

struct Entry {
    image: Image,
    lease: Weak<Lease>,
    resolution: Resolution,
    stamp: Stamp,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct Memo {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Memo {
    /// The image remembered for `reference` and a share of its lease, if
    /// some holder still holds it and the reference still resolves through
    /// the same file. Costs a `stat` at most.
    pub(crate) fn find(&self, reference: &str) -> Option<(Image, Arc<Lease>)> {
        let (image, lease, resolution, stamp) = {
            let entries = self.lock();
            let e = entries.get(reference)?;
            (
                e.image.clone(),
                e.lease.upgrade()?,
                e.resolution.clone(),
                e.stamp,
            )
        };
        (resolution.stamp()? == stamp).then_some((image, lease))
    }

    /// Remembers `image`, found for `reference` through `resolution` as it
    /// was at `stamp` (taken before it was read), while `lease` lives.
    pub(crate) fn remember(
        &self,
        reference: &str,
        image: &Image,
        lease: &Arc<Lease>,
        resolution: Resolution,
        stamp: Stamp,
    ) {
        let mut entries = self.lock();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(reference) {
            entries.retain(|_, e| e.lease.strong_count() > 0);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            reference.to_owned(),
            Entry {
                image: image.clone(),
                lease: Arc::downgrade(lease),
                resolution,
                stamp,
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
