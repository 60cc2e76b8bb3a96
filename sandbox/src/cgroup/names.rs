//! Names of run cgroups, and which of them a dead runner left behind.

/// Names of run cgroups: `<pid namespace>-<pid>-<start time>-<sandbox>-<run>`.
#[derive(Debug, Clone)]
pub struct RunNames {
    prefix: String,
    sandbox: u64,
}

impl RunNames {
    /// Names for a new sandbox of this process.
    pub fn new() -> RunNames {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SANDBOXES: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let start = start_time(pid).unwrap_or(0);
        RunNames {
            prefix: format!("{}-{pid}-{start}", pid_namespace()),
            sandbox: SANDBOXES.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The name of run number `run`.
    pub fn run(&self, run: u64) -> String {
        format!("{}-{}-{run}", self.prefix, self.sandbox)
    }

    /// Whether `name` is a run of this sandbox.
    #[cfg(test)]
    pub fn is_mine(&self, name: &str) -> bool {
        name.strip_prefix(&format!("{}-{}-", self.prefix, self.sandbox))
            .is_some_and(|n| n.parse::<u64>().is_ok())
    }
}

impl Default for RunNames {
    fn default() -> Self {
        RunNames::new()
    }
}

/// Whether `name` is a run cgroup of a daemon that is gone: a daemon of this
/// PID namespace whose pid does not exist or belongs to a process started at
/// another time. Never stale: names of another form (not ours to remove), and
/// runs of daemons in other PID namespaces (another pod sharing a v1
/// hierarchy, perhaps still draining), whose liveness cannot be checked from
/// here. Their processes die with their daemon anyway (init has a parent
/// death signal); only empty directories could be left.
pub fn is_stale(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    let [ns, pid, start, sandbox, run] = parts[..] else {
        return false;
    };
    let (Ok(ns), Ok(pid), Ok(start), Ok(_), Ok(_)) = (
        ns.parse::<u64>(),
        pid.parse::<u32>(),
        start.parse::<u64>(),
        sandbox.parse::<u64>(),
        run.parse::<u64>(),
    ) else {
        return false;
    };
    ns == pid_namespace() && start_time(pid) != Some(start)
}

/// The inode of this process's PID namespace.
pub(super) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// A process's start time in clock ticks since boot (field 22 of its stat).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}
