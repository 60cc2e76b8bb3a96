//! Progress bars of `fnrun pull` on a terminal: one bar per layer, named by its short
//! digest as `docker pull` does, with bytes, speed and ETA while it downloads and its
//! final state ("Pull complete", "Already exists") after.
//!
//! `fnrun pull` draws them only when stderr is a terminal: a script or a log reading the
//! output gets the one line per image on stdout and nothing else. A terminal whose `TERM`
//! is unset or `dumb` cannot redraw a line, and indicatif draws nothing there either.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use fnrun_cache::PullProgress;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// While the blob downloads.
const DOWNLOADING: &str =
    "{prefix}: {msg:17} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, ETA {eta}";
/// Once the bytes are in: the state and the layer's size.
const SETTLED: &str = "{prefix}: {msg:17} {total_bytes}";

/// The layers of one image, one bar each.
pub struct LayerBars {
    multi: MultiProgress,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    bars: HashMap<String, ProgressBar>,
    /// Set once the pull is over: a layer still unpacking on a detached task (after a
    /// sibling failed) must not redraw over the error line.
    closed: bool,
}

/// `docker pull`'s layer name: the first 12 hex digits of the digest.
fn short_digest(digest: &str) -> &str {
    let hex = digest.split_once(':').map_or(digest, |(_, hex)| hex);
    hex.get(..12).unwrap_or(hex)
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants: a parse error is a bug caught by the unit tests, and
    // still draws a plain bar rather than failing the pull.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl LayerBars {
    /// Bars drawn on stderr.
    pub fn stderr() -> LayerBars {
        LayerBars::with_target(ProgressDrawTarget::stderr())
    }

    fn with_target(target: ProgressDrawTarget) -> LayerBars {
        LayerBars {
            multi: MultiProgress::with_draw_target(target),
            state: Mutex::default(),
        }
    }

    /// Runs `f` on the bar of `digest`, unless the pull is over.
    fn with_bar(&self, digest: &str, f: impl FnOnce(&ProgressBar)) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let (false, Some(bar)) = (state.closed, state.bars.get(digest)) {
            f(bar);
        }
    }

    /// A new bar for `digest` of `total` bytes at `position`, unless the pull is over.
    /// Returns it.
    fn add(
        &self,
        digest: &str,
        total: u64,
        position: u64,
        template: &str,
        message: &'static str,
    ) -> Option<ProgressBar> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed || state.bars.contains_key(digest) {
            return None;
        }
        // Complete before it is added: adding draws it.
        let bar = ProgressBar::new(total)
            .with_style(style(template))
            .with_prefix(short_digest(digest).to_owned())
            .with_message(message)
            .with_position(position);
        let bar = self.multi.add(bar);
        state.bars.insert(digest.to_owned(), bar.clone());
        Some(bar)
    }

    /// Ends the display once the pull is over: bars left unfinished (a failed pull) stay
    /// as they are, marked stopped, and nothing redraws after this.
    pub fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        for bar in state.bars.values().filter(|b| !b.is_finished()) {
            bar.set_style(style(SETTLED));
            bar.abandon_with_message("Stopped");
        }
    }
}

impl PullProgress for LayerBars {
    fn layer_started(&self, digest: &str, total_bytes: u64) {
        self.add(digest, total_bytes, 0, DOWNLOADING, "Downloading");
    }

    fn layer_bytes(&self, digest: &str, n: u64) {
        self.with_bar(digest, |bar| bar.inc(n));
    }

    fn layer_downloaded(&self, digest: &str) {
        self.with_bar(digest, |bar| {
            // Also when another pull downloaded it: the blob is complete.
            bar.set_style(style(SETTLED));
            bar.set_position(bar.length().unwrap_or(0));
            bar.set_message("Download complete");
        });
    }

    fn layer_unpacking(&self, digest: &str) {
        self.with_bar(digest, |bar| bar.set_message("Extracting"));
    }

    fn layer_done(&self, digest: &str) {
        self.with_bar(digest, |bar| {
            bar.set_style(style(SETTLED));
            bar.finish_with_message("Pull complete");
        });
    }

    fn layer_cached(&self, digest: &str, total_bytes: u64) {
        if let Some(bar) = self.add(digest, total_bytes, total_bytes, SETTLED, "Already exists") {
            bar.finish();
        }
    }

    fn pull_over(&self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn bar(bars: &LayerBars, digest: &str) -> ProgressBar {
        bars.state.lock().unwrap().bars[digest].clone()
    }

    #[test]
    fn templates_parse() {
        for t in [DOWNLOADING, SETTLED] {
            ProgressStyle::with_template(t).unwrap();
        }
        assert_eq!(short_digest(LAYER), "0123456789ab");
        assert_eq!(short_digest("sha256:abc"), "abc");
    }

    #[test]
    fn a_layer_goes_from_started_to_done() {
        let bars = LayerBars::with_target(ProgressDrawTarget::hidden());
        bars.layer_started(LAYER, 100);
        bars.layer_bytes(LAYER, 40);
        bars.layer_bytes(LAYER, 60);
        let b = bar(&bars, LAYER);
        assert_eq!((b.position(), b.length()), (100, Some(100)));
        assert_eq!(b.prefix(), "0123456789ab");
        bars.layer_downloaded(LAYER);
        bars.layer_unpacking(LAYER);
        assert_eq!(b.message(), "Extracting");
        assert!(!b.is_finished());
        bars.layer_done(LAYER);
        assert!(b.is_finished());
        assert_eq!(b.message(), "Pull complete");
        // Calls for layers never started are ignored.
        bars.layer_bytes(OTHER, 5);
        bars.layer_done(OTHER);
        assert_eq!(bars.state.lock().unwrap().bars.len(), 1);
    }

    #[test]
    fn a_blob_another_pull_fetched_ends_full() {
        let bars = LayerBars::with_target(ProgressDrawTarget::hidden());
        bars.layer_started(LAYER, 100);
        bars.layer_downloaded(LAYER);
        bars.layer_done(LAYER);
        let b = bar(&bars, LAYER);
        assert_eq!(b.position(), 100);
        assert!(b.is_finished());
        bars.layer_cached(OTHER, 7);
        let b = bar(&bars, OTHER);
        assert!(b.is_finished());
        assert_eq!((b.position(), b.message().as_str()), (7, "Already exists"));
    }

    #[test]
    fn a_failed_pull_stops_its_bars() {
        let bars = LayerBars::with_target(ProgressDrawTarget::hidden());
        bars.layer_started(LAYER, 100);
        bars.layer_bytes(LAYER, 10);
        bars.close();
        let b = bar(&bars, LAYER);
        assert!(b.is_finished());
        assert_eq!(b.message(), "Stopped");
        // A detached unpack reporting late changes nothing.
        bars.layer_unpacking(LAYER);
        bars.layer_started(OTHER, 1);
        assert_eq!(b.message(), "Stopped");
        assert_eq!(bars.state.lock().unwrap().bars.len(), 1);
    }
}
