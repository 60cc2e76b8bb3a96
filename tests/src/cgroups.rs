//! Where a daemon started by these tests puts its run cgroups: `fnrun`
//! below its own cgroup in each hierarchy (the tests' own, since the daemon
//! is their child), and, on cgroup v1, at the top of a hierarchy where the
//! own cgroup could not be written (`CgroupBase::Auto`).

use std::path::PathBuf;

/// Every directory that may be the parent of run cgroups of a daemon this
/// process started, that exists.
pub fn run_parents() -> Vec<PathBuf> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |dir: PathBuf| {
        if dir.is_dir() && !out.contains(&dir) {
            out.push(dir);
        }
    };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        // v2 ("0::/path") is mounted at the root or at `unified`.
        let mounts: Vec<PathBuf> = if controllers.is_empty() {
            vec![root.to_owned(), root.join("unified")]
        } else {
            controllers
                .split(',')
                .map(|c| root.join(c.trim_start_matches("name=")))
                .collect()
        };
        for mount in mounts {
            push(mount.join(path).join("fnrun"));
        }
    }
    if let Ok(hierarchies) = std::fs::read_dir(root) {
        for h in hierarchies.flatten() {
            push(h.path().join("fnrun"));
        }
    }
    out
}
