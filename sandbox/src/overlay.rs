//! The run's root filesystem: an overlay of the image's read-only layers with
//! a throwaway upper layer in the run's scratch tmpfs.
//!
//! Images have up to 127 layers (Docker's limit; overlayfs itself stacks 500).
//! mount(2) takes all its options in one page, and 127 layer directories
//! named by their 64-character digests do not fit in it. So:
//! - Where the kernel has it (Linux 6.8), the overlay is built with the new
//!   mount API, one `lowerdir+` per layer (`fsopen`, `fsconfig`, `fsmount`,
//!   `move_mount`): no option string to fit anywhere.
//! - Elsewhere (or with [`OverlayMount::Legacy`]), with mount(2): the
//!   layers' own names relative to their common directory when they fit in
//!   the page, else short names, as Docker's overlay2 does: one symlink per
//!   layer in the run's scratch tmpfs (`l/0`, `l/1`, …), created inside the
//!   run, so nothing is written on the host.
//!
//! The planner ([`plan`]) is pure; [`mount`] runs in the sandbox's init and
//! keeps to raw system calls on what the plan prepared.

use std::ffi::CString;
use std::path::PathBuf;

use nix::errno::Errno;

use serde::{Deserialize, Serialize};

use crate::cstr::{cstring, path_str};
use crate::error::{Error, SpecError};
use crate::spec::MAX_LAYERS;
use crate::sys;

/// How each run's overlay root is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverlayMount {
    /// The new mount API with one `lowerdir+` per layer where the kernel has
    /// it (Linux 6.8), else [`OverlayMount::Legacy`].
    #[default]
    Auto,
    /// mount(2) with one `lowerdir` option, through short names when the
    /// layers' own names do not fit in it.
    Legacy,
}

/// mount(2) copies at most a page of options, NUL included.
const MAX_OPTIONS: usize = 4095;
/// The longest string `fsconfig` takes (the kernel copies 256 bytes, NUL
/// included).
const MAX_FSCONFIG_STRING: usize = 255;

/// Everything [`mount`] needs, prepared before the clone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Overlay {
    /// The mount point.
    pub target: CString,
    /// The writable layer and overlayfs' work directory (same file system).
    pub upper: CString,
    pub work: CString,
    /// Where to chdir first: the layers' common directory, so that their
    /// names below are short and relative.
    pub dir: Option<CString>,
    /// The read-only layers, top first (relative to `dir` when it is set).
    pub lowers: Vec<CString>,
    /// Try the new mount API first.
    pub api: bool,
    /// The mount(2) fallback.
    pub legacy: Legacy,
}

/// The overlay as one mount(2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Legacy {
    /// Short names to create first: (link, layer), the link an absolute path
    /// in the scratch tmpfs, the layer its absolute directory. Empty when the
    /// layers' own names fit.
    pub links: Vec<(CString, CString)>,
    /// Where to chdir before the mount (the links' directory, or the layers'
    /// common one).
    pub dir: Option<CString>,
    /// The options: `lowerdir=…,upperdir=…,workdir=…,userxattr`.
    pub data: CString,
}

/// Plans the overlay of `layers` (bottom to top; none: an empty lower
/// directory in the scratch tmpfs) mounted at `{scratch}/root`, its writable
/// layer in `{scratch}/upper`.
pub(crate) fn plan(
    layers: &[PathBuf],
    scratch: &str,
    mode: OverlayMount,
) -> Result<Overlay, Error> {
    if layers.len() > MAX_LAYERS {
        return Err(SpecError::TooManyLayers(layers.len()).into());
    }
    let c = |s: &str| cstring("path", s.as_bytes());
    let upper = format!("{scratch}/upper");
    let work = format!("{scratch}/work");
    let tail = format!("upperdir={upper},workdir={work},userxattr");
    let (dir, names) = lower_names(layers, scratch)?;
    let plain = format!("lowerdir={},{tail}", names.join(":"));
    let legacy = if plain.len() <= MAX_OPTIONS {
        Legacy {
            links: Vec::new(),
            dir: dir.as_deref().map(c).transpose()?,
            data: c(&plain)?,
        }
    } else {
        let links_dir = format!("{scratch}/l");
        let links = layers
            .iter()
            .rev()
            .enumerate()
            .map(|(i, layer)| Ok((c(&format!("{links_dir}/{i}"))?, c(&path_str(layer)?)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        let short: Vec<String> = (0..layers.len()).map(|i| i.to_string()).collect();
        Legacy {
            links,
            dir: Some(c(&links_dir)?),
            data: c(&format!("lowerdir={},{tail}", short.join(":")))?,
        }
    };
    if legacy.data.as_bytes().len() > MAX_OPTIONS {
        // Only a scratch directory with a very long path gets here.
        return Err(SpecError::OverlayOptionsTooLong(layers.len()).into());
    }
    let api = mode == OverlayMount::Auto
        && names
            .iter()
            .chain([&upper, &work])
            .all(|n| n.len() <= MAX_FSCONFIG_STRING);
    Ok(Overlay {
        target: c(&format!("{scratch}/root"))?,
        upper: c(&upper)?,
        work: c(&work)?,
        dir: dir.as_deref().map(c).transpose()?,
        lowers: names.iter().map(|n| c(n)).collect::<Result<_, _>>()?,
        api,
        legacy,
    })
}

/// The layers' names, top first, and the directory they are relative to:
/// their common parent when they share one (as the cache's layers do), else
/// none (absolute names).
fn lower_names(layers: &[PathBuf], scratch: &str) -> Result<(Option<String>, Vec<String>), Error> {
    if layers.is_empty() {
        return Ok((None, vec![format!("{scratch}/empty")]));
    }
    let parent = layers[0].parent();
    let same_parent = layers.iter().all(|l| l.parent() == parent);
    let mut names = Vec::with_capacity(layers.len());
    for layer in layers.iter().rev() {
        let name = if same_parent {
            layer.file_name().and_then(|n| n.to_str())
        } else {
            layer.to_str()
        }
        .ok_or_else(|| SpecError::NotUtf8(layer.clone()))?;
        if name.contains([':', ',', '\\']) || !layer.is_absolute() {
            return Err(SpecError::BadLayerPath(layer.clone()).into());
        }
        names.push(name.to_owned());
    }
    let dir = match (same_parent, parent) {
        (true, Some(p)) => Some(path_str(p)?),
        _ => None,
    };
    Ok((dir, names))
}

/// Mounts the overlay (in the sandbox's init: raw system calls only).
pub(crate) fn mount(o: &Overlay) -> sys::SysResult<()> {
    if o.api {
        match mount_api(o) {
            Ok(()) => return Ok(()),
            Err(ApiError::Failed(e)) => return Err(e),
            Err(ApiError::Unsupported) => {}
        }
    }
    let legacy = &o.legacy;
    if let (false, Some(dir)) = (legacy.links.is_empty(), &legacy.dir) {
        // With links, `dir` is their directory, in the scratch tmpfs.
        sys::mkdir(dir, 0o755)?;
    }
    for (link, layer) in &legacy.links {
        sys::symlink(layer, link)?;
    }
    if let Some(dir) = &legacy.dir {
        sys::chdir(dir)?;
    }
    sys::mount(
        Some(c"overlay"),
        &o.target,
        Some(c"overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&legacy.data),
    )
}

/// Why the new mount API did not mount the overlay.
enum ApiError {
    /// This kernel has no new mount API or no `lowerdir+`: use mount(2).
    Unsupported,
    Failed(Errno),
}

impl From<Errno> for ApiError {
    fn from(e: Errno) -> Self {
        ApiError::Failed(e)
    }
}

fn mount_api(o: &Overlay) -> Result<(), ApiError> {
    if let Some(dir) = &o.dir {
        sys::chdir(dir)?;
    }
    let fs = match sys::fsopen(c"overlay") {
        Ok(fd) => fd,
        Err(Errno::ENOSYS) => return Err(ApiError::Unsupported),
        Err(e) => return Err(e.into()),
    };
    let result = (|| {
        for (i, lower) in o.lowers.iter().enumerate() {
            match sys::fsconfig_string(fs, c"lowerdir+", lower) {
                Ok(()) => {}
                // Before Linux 6.8 overlayfs has no such parameter.
                Err(Errno::EINVAL) if i == 0 => return Err(ApiError::Unsupported),
                Err(e) => return Err(e.into()),
            }
        }
        // As mount(2) names it in the mount table.
        sys::fsconfig_string(fs, c"source", c"overlay")?;
        sys::fsconfig_string(fs, c"upperdir", &o.upper)?;
        sys::fsconfig_string(fs, c"workdir", &o.work)?;
        sys::fsconfig_flag(fs, c"userxattr")?;
        sys::fsconfig_create(fs)?;
        let mnt = sys::fsmount(fs, libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV)?;
        let moved = sys::move_mount(mnt, &o.target);
        sys::close(mnt);
        Ok(moved?)
    })();
    sys::close(fs);
    result
}

/// The overlay's layers as absolute paths, for tests.
#[cfg(test)]
pub(crate) fn layer_paths(o: &Overlay) -> Vec<PathBuf> {
    let dir = o
        .dir
        .as_ref()
        .map(|d| std::path::Path::new(d.to_str().unwrap()));
    o.lowers
        .iter()
        .map(|l| {
            let l = std::path::Path::new(l.to_str().unwrap());
            dir.map_or_else(|| l.to_owned(), |d| d.join(l))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(n: usize) -> Vec<PathBuf> {
        (0..n)
            .map(|i| PathBuf::from(format!("/var/cache/fnrun/layers/id/sha256/{i:064x}")))
            .collect()
    }

    fn text(c: &CString) -> &str {
        c.to_str().unwrap()
    }

    #[test]
    fn a_few_layers_are_named_by_their_own_short_names() {
        let layers = digests(3);
        let o = plan(&layers, "/s", OverlayMount::Auto).unwrap();
        assert!(o.api);
        assert_eq!(
            text(o.dir.as_ref().unwrap()),
            "/var/cache/fnrun/layers/id/sha256"
        );
        // Top first, relative to their directory, for both paths.
        assert_eq!(text(&o.lowers[0]), format!("{:064x}", 2));
        assert_eq!(
            layer_paths(&o),
            layers.iter().rev().cloned().collect::<Vec<_>>()
        );
        assert!(o.legacy.links.is_empty());
        assert_eq!(o.legacy.dir, o.dir);
        assert_eq!(
            text(&o.legacy.data),
            format!(
                "lowerdir={:064x}:{:064x}:{:064x},upperdir=/s/upper,workdir=/s/work,userxattr",
                2, 1, 0
            )
        );
        assert_eq!(text(&o.target), "/s/root");
        assert!(!plan(&layers, "/s", OverlayMount::Legacy).unwrap().api);
    }

    #[test]
    fn deep_images_take_short_links_on_the_legacy_path() {
        for n in [70, 127, MAX_LAYERS] {
            let layers = digests(n);
            let o = plan(&layers, "/var/cache/fnrun/mnt", OverlayMount::Auto).unwrap();
            assert!(o.api, "{n}");
            assert_eq!(o.lowers.len(), n);
            let l = &o.legacy;
            assert_eq!(l.links.len(), n);
            assert!(l.data.as_bytes().len() <= MAX_OPTIONS, "{n}");
            assert_eq!(text(l.dir.as_ref().unwrap()), "/var/cache/fnrun/mnt/l");
            // Link i names the i-th layer from the top.
            assert_eq!(text(&l.links[0].0), "/var/cache/fnrun/mnt/l/0");
            assert_eq!(
                l.links[0].1.to_str().unwrap(),
                layers[n - 1].to_str().unwrap()
            );
            assert_eq!(
                l.links[n - 1].1.to_str().unwrap(),
                layers[0].to_str().unwrap()
            );
            assert!(text(&l.data).starts_with("lowerdir=0:1:2:"), "{n}");
        }
        // 60 digest names still fit in a page.
        assert!(
            plan(&digests(40), "/s", OverlayMount::Auto)
                .unwrap()
                .legacy
                .links
                .is_empty()
        );
    }

    #[test]
    fn more_layers_than_overlayfs_stacks_are_refused() {
        let e = plan(&digests(MAX_LAYERS + 1), "/s", OverlayMount::Auto).unwrap_err();
        assert!(e.to_string().contains("at most 500"), "{e}");
    }

    #[test]
    fn no_layers_mount_an_empty_directory_and_scattered_layers_are_absolute() {
        let o = plan(&[], "/s", OverlayMount::Auto).unwrap();
        assert_eq!(layer_paths(&o), vec![PathBuf::from("/s/empty")]);
        let scattered = [PathBuf::from("/a/x"), PathBuf::from("/b/y")];
        let o = plan(&scattered, "/s", OverlayMount::Auto).unwrap();
        assert_eq!(o.dir, None);
        assert_eq!(
            layer_paths(&o),
            vec![PathBuf::from("/b/y"), PathBuf::from("/a/x")]
        );
        for bad in ["/a/x:y", "/a/x,y", "relative"] {
            assert!(
                plan(&[PathBuf::from(bad)], "/s", OverlayMount::Auto).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn names_too_long_for_fsconfig_use_mount2() {
        let long = PathBuf::from(format!("/{}/layer", "d".repeat(300)));
        let other = PathBuf::from("/elsewhere/layer");
        let o = plan(&[long, other], "/s", OverlayMount::Auto).unwrap();
        assert!(!o.api);
    }
}
