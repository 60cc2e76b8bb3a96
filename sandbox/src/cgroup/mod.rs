//! cgroup limits and accounting for runs, on cgroup v1 and v2.
//!
//! A [`CgroupDriver`] stands for one host hierarchy layout ([`v1::V1`] or
//! [`v2::V2`]); it creates a [`RunCgroup`] per run under a parent cgroup
//! (`fnrun` by default; see [`CgroupBase`] for where), applies the run's
//! limits, places the sandbox's init in it, reads what the run used, kills what
//! is left and removes it. [`detect`] picks the driver from a mountinfo file and
//! a cgroup root, both parameters, so that the drivers run on a fake cgroupfs
//! in tests (every file operation goes through [`CgroupFs`]).
//!
//! Run cgroups are named `<pid namespace>-<daemon pid>-<daemon start
//! time>-<sandbox>-<run>`, so that [`CgroupDriver::sweep`] can tell the
//! leftovers of a daemon that died (its pid gone or reused) from the runs of
//! live daemons sharing the parent (see [`is_stale`]).

mod layout;
mod names;
pub mod v1;
pub mod v2;

mod driver;

pub use self::driver::{
    CgroupBase, CgroupConfig, CgroupDriver, CgroupError, CgroupFs, Controllers, HostFs, Placement,
    Result, RunCgroup, Usage, Version,
};
pub(crate) use self::driver::{keyed, parse_pids, read_whole};
pub use self::layout::{Layout, layout};
pub use self::names::{RunNames, is_stale};

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use self::driver::WrapPath;

/// Finds the hierarchy from `config` and sets up its driver: the parent
/// cgroup is created (and, on v2, its controllers enabled) here.
pub fn detect(config: &CgroupConfig, fs: Arc<dyn CgroupFs>) -> Result<Box<dyn CgroupDriver>> {
    let mountinfo = std::fs::read_to_string(&config.mountinfo).wrap("read", &config.mountinfo)?;
    let self_cgroup =
        std::fs::read_to_string(&config.self_cgroup).wrap("read", &config.self_cgroup)?;
    match layout(&mountinfo, &self_cgroup, &config.root, fs.as_ref())? {
        Layout::V2(h) => {
            let base = if config.base == CgroupBase::Top {
                &h.mount
            } else {
                &h.own
            };
            let parent = parent_dir(base, &config.parent)?;
            Ok(Box::new(v2::V2::new(fs, &h.mount, base, &parent)?))
        }
        Layout::V1(hs) => {
            let parents = hs
                .iter()
                .map(|h| {
                    let own = parent_dir(&h.own, &config.parent)?;
                    let top = parent_dir(&h.mount, &config.parent)?;
                    let (parent, fallback) = match config.base {
                        CgroupBase::Own => (own, None),
                        CgroupBase::Top => (top, None),
                        // Below this process's own cgroup, so that runs
                        // count against the limits of the daemon's pod or
                        // unit; at the top where that cannot be written.
                        CgroupBase::Auto if own == top => (own, None),
                        CgroupBase::Auto => (own, Some(top)),
                    };
                    Ok(v1::Hierarchy {
                        controllers: h.controllers.clone(),
                        parent,
                        fallback,
                        own: h.own.clone(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Box::new(v1::V1::new(fs, parents, config.pool)?))
        }
    }
}

/// The parent cgroup directory: `parent`, a plain relative path, below `base`.
fn parent_dir(base: &Path, parent: &Path) -> Result<PathBuf> {
    if parent.as_os_str().is_empty()
        || !parent
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(CgroupError::Unusable(format!(
            "cgroup parent {} is not a relative path",
            parent.display()
        )));
    }
    Ok(base.join(parent))
}

#[cfg(test)]
mod tests;
