//! Progress of a pull, reported layer by layer, for a caller that shows it (the progress
//! bars of `fnrun pull`). The daemon does not watch its pulls: without an observer, a pull
//! reports to [`NoProgress`].
//!
//! Only layers are reported: manifests and the config are small and come first.

/// Observes the layers of a pull ([`crate::GetOptions::progress`]).
///
/// Every layer of the image is reported once (a layer listed twice in a manifest, once),
/// in one of two ways:
/// - already unpacked: [`layer_cached`](PullProgress::layer_cached) alone;
/// - otherwise: [`layer_started`](PullProgress::layer_started), any number of
///   [`layer_bytes`](PullProgress::layer_bytes) while this pull downloads the blob,
///   [`layer_downloaded`](PullProgress::layer_downloaded) once the blob is verified and
///   stored, [`layer_unpacking`](PullProgress::layer_unpacking) if this pull unpacks it,
///   and [`layer_done`](PullProgress::layer_done) when it is ready.
///
/// A blob that was stored already, or that another pull downloaded meanwhile (one
/// download per blob at a time), gets no `layer_bytes`; a layer that another pull
/// unpacked gets no `layer_unpacking`: both still end with `layer_done`. If the pull
/// fails, the calls stop wherever it failed (an unpacking already under way may still
/// report `layer_unpacking`): the pull's result is the end.
///
/// Digests are `sha256:<hex>` strings of the compressed blobs, sizes their sizes from
/// the manifest. Calls for different layers come from concurrent tasks, and must not
/// block: they run on the pull's own tasks. All methods do nothing by default.
pub trait PullProgress: Send + Sync {
    /// The layer blob of `total_bytes` is needed: its download starts (or waits for
    /// another pull's download of it).
    fn layer_started(&self, digest: &str, total_bytes: u64) {
        let _ = (digest, total_bytes);
    }

    /// `n` more bytes of the layer blob arrived (not verified until the end).
    fn layer_bytes(&self, digest: &str, n: u64) {
        let _ = (digest, n);
    }

    /// The layer blob is verified and stored.
    fn layer_downloaded(&self, digest: &str) {
        let _ = digest;
    }

    /// This pull unpacks the layer now.
    fn layer_unpacking(&self, digest: &str) {
        let _ = digest;
    }

    /// The layer is unpacked and ready.
    fn layer_done(&self, digest: &str) {
        let _ = digest;
    }

    /// The layer of `total_bytes` was unpacked before: nothing to download.
    fn layer_cached(&self, digest: &str, total_bytes: u64) {
        let _ = (digest, total_bytes);
    }

    /// The pull is over, done or failed: whatever is still running for it (a
    /// layer unpacking on a detached task after a sibling failed) must not be
    /// shown any more, since the caller prints next.
    fn pull_over(&self) {}
}

/// A [`PullProgress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoProgress;

impl PullProgress for NoProgress {}
