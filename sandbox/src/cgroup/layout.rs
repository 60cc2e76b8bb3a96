//! Which cgroup hierarchies a host has, read from a mountinfo file and
//! `/proc/self/cgroup` (both parameters, so that tests use fakes).

use std::path::{Path, PathBuf};

use super::driver::{CPU, CgroupError, CgroupFs, MEMORY, PIDS, Result};

/// One mounted hierarchy and this process's cgroup in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// The controllers fnrun uses that it carries (v1); empty for v2.
    pub controllers: Vec<String>,
    /// Where it is mounted.
    pub mount: PathBuf,
    /// This process's cgroup directory in it.
    pub own: PathBuf,
}

/// The cgroup layout of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The unified hierarchy has controllers: everything happens there.
    V2(Hierarchy),
    /// Per-controller v1 hierarchies (also "hybrid" hosts whose unified
    /// hierarchy has no controllers).
    V1(Vec<Hierarchy>),
}

/// The v1 controllers fnrun creates cgroups in: the three limits, CPU
/// accounting, and the freezer for killing.
const V1_CONTROLLERS: [&str; 5] = [MEMORY, CPU, "cpuacct", PIDS, "freezer"];

/// Works out the layout from the text of a mountinfo file and of
/// `/proc/self/cgroup`, looking only at mounts below `root`: v2 when the
/// unified hierarchy has the memory, cpu or pids controller, else v1.
pub fn layout(
    mountinfo: &str,
    self_cgroup: &str,
    root: &Path,
    fs: &dyn CgroupFs,
) -> Result<Layout> {
    let mounts: Vec<Mount> = mountinfo
        .lines()
        .filter_map(Mount::parse)
        .filter(|m| m.mount_point.starts_with(root))
        .collect();
    let own_paths: Vec<(Vec<&str>, &str)> = self_cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some((
                controllers.split(',').filter(|c| !c.is_empty()).collect(),
                path,
            ))
        })
        .collect();

    // The unified hierarchy: at the root on a pure v2 host, at
    // `root/unified` on a hybrid one.
    let mut unified: Vec<&Mount> = mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
    unified.sort_by_key(|m| (m.mount_point != root, m.mount_point.components().count()));
    if let Some(m) = unified.first() {
        let controllers = fs
            .read(&m.mount_point.join("cgroup.controllers"))
            .unwrap_or_default();
        if controllers
            .split_whitespace()
            .any(|c| [MEMORY, CPU, PIDS].contains(&c))
        {
            let own = own_paths
                .iter()
                .find(|(c, _)| c.is_empty())
                .map(|(_, p)| *p)
                .unwrap_or("/");
            return Ok(Layout::V2(Hierarchy {
                controllers: Vec::new(),
                own: own_dir(m, own),
                mount: m.mount_point.clone(),
            }));
        }
    }

    let mut hierarchies = Vec::new();
    for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
        let controllers: Vec<String> = m
            .super_options
            .split(',')
            .filter(|o| V1_CONTROLLERS.contains(o))
            .map(str::to_owned)
            .collect();
        if controllers.is_empty()
            || hierarchies
                .iter()
                .any(|h: &Hierarchy| h.controllers == controllers)
        {
            continue;
        }
        let own = own_paths
            .iter()
            .find(|(c, _)| controllers.iter().all(|x| c.contains(&x.as_str())))
            .map(|(_, p)| *p)
            .unwrap_or("/");
        hierarchies.push(Hierarchy {
            own: own_dir(m, own),
            mount: m.mount_point.clone(),
            controllers,
        });
    }
    if hierarchies.is_empty() {
        let why = if unified.is_empty() {
            format!("no cgroup filesystem is mounted under {}", root.display())
        } else {
            format!(
                "the cgroup v2 hierarchy at {} has none of the memory, cpu and pids controllers, \
                 and no cgroup v1 hierarchy has them",
                unified[0].mount_point.display()
            )
        };
        return Err(CgroupError::Unusable(why));
    }
    Ok(Layout::V1(hierarchies))
}

/// One line of a mountinfo file.
#[derive(Debug)]
pub(super) struct Mount {
    /// The directory of the filesystem that is mounted (field 4).
    root: String,
    pub(super) mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

impl Mount {
    pub(super) fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let mut left = left.split(' ');
        let root = unescape(left.nth(3)?);
        let mount_point = PathBuf::from(unescape(left.next()?));
        let mut right = right.split(' ');
        let fstype = right.next()?.to_owned();
        let _source = right.next()?;
        let super_options = right.next().unwrap_or("").to_owned();
        Some(Mount {
            root,
            mount_point,
            fstype,
            super_options,
        })
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
pub(super) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's cgroup directory in mount `m`, from its path in
/// `/proc/self/cgroup` (relative to the hierarchy's top, or to the cgroup
/// namespace's root, which is what the mount shows then).
fn own_dir(m: &Mount, own: &str) -> PathBuf {
    let rel = Path::new(own)
        .strip_prefix(&m.root)
        .unwrap_or(Path::new(own));
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    m.mount_point.join(rel)
}
