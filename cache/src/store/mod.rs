//! The content-addressed store under the cache root.
//!
//! ```text
//! blobs/sha256/<hex>                        verified blobs (manifests, configs, compressed layers)
//! layers/<owner-tag>/sha256/<diffid-hex>/   unpacked layer trees (overlay lower dirs)
//! layers/<owner-tag>/sha256/<diffid-hex>.json   what the layer cost (bytes, entries)
//! refs/<sha256 of the reference>            {"reference": ..., "digest": ...}
//! tmp/<session>/                            in-progress files of one live process
//! ```
//!
//! Everything is written under `tmp/`, synced and renamed into place, so a crash leaves
//! either nothing or a complete entry. Each process holds an flock on its own session
//! directory; at open, session directories whose lock is free (their process died) are
//! removed, so several processes can share one cache root.
//!
//! [`Store`]'s `impl` is split by concern across the modules of the store: [`dir`] reads
//! and writes blobs, layers and references; [`lease`] marks images in use; [`gc`] lists,
//! prunes and verifies. This file only gathers them.

mod dir;
mod gc;
mod lease;

pub use self::dir::StoreError;
pub(crate) use self::dir::{Store, TOUCH_INTERVAL};
pub use self::gc::{CachedImage, PruneReport, VerifyReport};
pub(crate) use self::gc::{Prune, Selector};
pub use self::lease::Lease;
