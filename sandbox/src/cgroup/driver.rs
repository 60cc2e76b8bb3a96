//! What every driver is and shares: the settings, the error, the driver and run
//! cgroup traits, the file operations ([`CgroupFs`]) and the helpers of both
//! versions. A leaf: `layout`, `v1` and `v2` build on it; [`super::detect`]
//! picks one.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::fd::BorrowedFd;

use crate::spec::Limits;

/// Where and how to find and create cgroups.
#[derive(Debug, Clone)]
pub struct CgroupConfig {
    /// Use cgroups at all. Off: only the rlimit fallback for the pids limit.
    pub enabled: bool,
    /// The mount table of this process (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// This process's cgroups (`/proc/self/cgroup`).
    pub self_cgroup: PathBuf,
    /// Where the cgroup filesystems are mounted (`/sys/fs/cgroup`).
    pub root: PathBuf,
    /// Where the parent cgroup goes.
    pub base: CgroupBase,
    /// The parent of every run cgroup, a relative path below `base`.
    pub parent: PathBuf,
    /// cgroup v1: keep the cgroups of finished runs for the next runs (see
    /// the `v1` module) instead of creating and removing them for each run.
    pub pool: bool,
}

/// Where the parent cgroup of runs goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupBase {
    /// Below this process's own cgroup, which is how v2 delegates (a
    /// systemd unit with `Delegate=yes`, a pod): runs count against the
    /// daemon's unit or pod, and its limits bound them all. On v1, which has
    /// no delegation, the same in each hierarchy where the own cgroup can be
    /// written, else at the top of that hierarchy.
    #[default]
    Auto,
    /// Below this process's own cgroup.
    Own,
    /// At the top of the hierarchy.
    Top,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            enabled: true,
            mountinfo: "/proc/self/mountinfo".into(),
            self_cgroup: "/proc/self/cgroup".into(),
            root: "/sys/fs/cgroup".into(),
            base: CgroupBase::Auto,
            parent: "fnrun".into(),
            pool: true,
        }
    }
}

/// The cgroup version a driver works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        })
    }
}

/// A failed cgroup operation.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file operation failed on this path.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No hierarchy this process can use.
    #[error("{0}")]
    Unusable(String),
}

/// A `Result` with a [`CgroupError`].
pub type Result<T, E = CgroupError> = std::result::Result<T, E>;

pub(super) trait WrapPath<T> {
    fn wrap(self, op: &'static str, path: &Path) -> Result<T>;
}

impl<T> WrapPath<T> for io::Result<T> {
    fn wrap(self, op: &'static str, path: &Path) -> Result<T> {
        self.map_err(|source| CgroupError::Io {
            op,
            path: path.to_owned(),
            source,
        })
    }
}

/// Whether a driver can enforce each kind of limit, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controllers {
    pub memory: Result<(), String>,
    pub cpu: Result<(), String>,
    pub pids: Result<(), String>,
}

/// What a run used, read from its cgroup after it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Processes the kernel's OOM killer killed in the run; `None` when the
    /// kernel does not say (v1 before 4.13).
    pub oom_kills: Option<u64>,
    /// The memory limit was reached at least once (allocations failed or had
    /// to reclaim).
    pub hit_memory_limit: bool,
    /// Highest memory use of the run.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of every process of the run.
    pub cpu_time: Option<Duration>,
}

/// One host's cgroup hierarchy layout: creates the cgroups of runs.
pub trait CgroupDriver: fmt::Debug + Send + Sync {
    /// v1 or v2.
    fn version(&self) -> Version;
    /// Which limits can be enforced.
    fn controllers(&self) -> &Controllers;
    /// The parent cgroup directories, one per hierarchy in use.
    #[cfg(test)]
    fn parents(&self) -> Vec<PathBuf>;
    /// Creates the cgroup `name` under the parent and applies `limits`; each
    /// limit given must be one [`Self::controllers`] supports. Nothing is left
    /// behind on failure.
    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn RunCgroup>>;
    /// Kills the processes of, and removes, every run cgroup under the parent
    /// for which `is_stale(name)` holds. Returns how many were removed.
    fn sweep(&self, is_stale: &dyn Fn(&str) -> bool) -> Result<usize>;
}

/// How a run's init gets into its cgroup, best first. The launcher acts on
/// it; the cgroup only says which way it takes.
#[derive(Debug)]
pub enum Placement<'a> {
    /// `clone3(CLONE_INTO_CGROUP)` with this cgroup directory (v2, Linux
    /// 5.7): init starts there.
    CloneInto(BorrowedFd<'a>),
    /// The cloning thread writes `"0"` to each `enter` file, which moves it
    /// alone into the run's cgroups, clones init there, and writes `"0"` to
    /// each `leave` file, back to this process's own cgroups (pooled v1
    /// cgroups: no `cgroup_threadgroup_rwsem`, see [`v1`]).
    ThreadMove {
        enter: Vec<BorrowedFd<'a>>,
        leave: Vec<BorrowedFd<'a>>,
    },
    /// [`RunCgroup::admit`] moves init in by its pid after the clone.
    AdmitAfter,
}

/// The cgroup of one run. Dropping it kills what is left in it and frees it
/// (removes it, or gives it back to its pool).
pub trait RunCgroup: fmt::Debug + Send {
    /// How init gets in (see [`Placement`]).
    fn placement(&self) -> Result<Placement<'_>> {
        Ok(Placement::AdmitAfter)
    }
    /// The [`Placement`]'s thread move failed: the cgroup is not reused.
    fn placement_failed(&self) {}
    /// Called with the sandbox's init `pid`, before init is released:
    /// moves it (all its threads) into the cgroup unless `placed` (by clone)
    /// and applies whatever limits are still to apply.
    fn admit(&mut self, pid: libc::pid_t, placed: bool) -> Result<()>;
    /// SIGKILL to every process in the cgroup.
    fn kill(&self) -> Result<()>;
    /// What the run used so far.
    fn usage(&self) -> Usage;
    /// The run's memory at its highest so far ([`Usage::peak_memory_bytes`]
    /// alone).
    fn peak_memory(&self) -> Option<u64> {
        self.usage().peak_memory_bytes
    }
    /// Kills what is left and removes the cgroup (retrying briefly while the
    /// kernel still counts exiting processes), or gives it back to its pool
    /// when nothing is left in it. Idempotent.
    fn remove(&mut self) -> Result<()>;
    /// The cgroup's directories (one per hierarchy), for messages and tests.
    fn dirs(&self) -> Vec<PathBuf>;
}

/// The file operations the drivers need: the seam between them and the
/// kernel's cgroup filesystem.
pub trait CgroupFs: fmt::Debug + Send + Sync {
    /// Reads a whole interface file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes `value` to an existing interface file in one write(2).
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Creates a cgroup (the kernel adds its interface files).
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty cgroup (its interface files go with it).
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Whether a file or cgroup exists.
    fn exists(&self, path: &Path) -> bool;
    /// The names of the child cgroups of `path`.
    fn children(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Opens an existing interface file for many writes, each one command
    /// (see [`write_command`]). By default the file itself. The v2 driver uses
    /// it only for files whose writes a fake need not interpret (`tasks`); the
    /// v1 driver keeps the files of its runs open (see [`v1`]), and its tests
    /// run on the host's hierarchies.
    fn open_write(&self, path: &Path) -> io::Result<std::fs::File> {
        std::fs::OpenOptions::new().write(true).open(path)
    }
    /// Opens an existing interface file for many reads (see [`read_whole`]).
    /// By default the file itself, as for [`CgroupFs::open_write`].
    fn open_read(&self, path: &Path) -> io::Result<std::fs::File> {
        std::fs::File::open(path)
    }
}

/// The whole content of an open interface file, read from its start: a
/// cgroupfs file read again from offset 0 shows its values as they are now.
/// A read that does not fill the buffer has read to the end (a cgroupfs
/// file is a `seq_file`, which fills what it is given), so a small file
/// takes one `pread`.
pub(crate) fn read_whole(file: &std::fs::File) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut text = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = file.read_at(&mut chunk, text.len() as u64)?;
        text.extend_from_slice(&chunk[..n]);
        if n < chunk.len() {
            break;
        }
    }
    String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `value` to an open interface file in one write(2), as cgroupfs
/// takes each write as one command.
pub(super) fn write_command(mut file: &std::fs::File, value: &str) -> io::Result<()> {
    use std::io::Write;
    let n = file.write(value.as_bytes())?;
    if n == value.len() {
        Ok(())
    } else {
        Err(io::Error::other("short write"))
    }
}

/// The real cgroup filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostFs;

impl CgroupFs for HostFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        // No O_CREAT: a missing interface file means a missing controller.
        write_command(&std::fs::OpenOptions::new().write(true).open(path)?, value)
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn children(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir()
                && let Some(name) = entry.file_name().to_str()
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }
}

/// The controllers fnrun uses.
pub(super) const MEMORY: &str = "memory";
pub(super) const CPU: &str = "cpu";
pub(super) const PIDS: &str = "pids";

/// Why an unprivileged process may not create cgroups, for messages.
pub(super) fn delegation_hint() -> String {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        String::new()
    } else {
        format!(" (uid {uid} has no delegated cgroup to create them in)")
    }
}

/// The pids listed in a `cgroup.procs` file.
pub(crate) fn parse_pids(text: &str) -> Vec<libc::pid_t> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The value of `key` in a flat keyed file (`memory.events`, `cpu.stat`,
/// `memory.oom_control`).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

/// SIGKILL to each pid; a pid that is already gone is fine. Never to this
/// process: one of its threads is in a pooled v1 cgroup while it clones a
/// run's init there, and would be listed if a kill raced that.
pub(super) fn kill_pids(pids: &[libc::pid_t]) {
    let me = libc::pid_t::try_from(std::process::id()).expect("pids are below pid_max (2^22)");
    for &pid in pids.iter().filter(|&&p| p != me) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// rmdir with retries while the kernel still counts exiting processes
/// (EBUSY): `kill` is called before each retry. A cgroup that is already gone
/// counts as removed.
pub(super) fn rmdir_retrying(fs: &dyn CgroupFs, dir: &Path, kill: &dyn Fn()) -> Result<()> {
    let mut delay = Duration::from_millis(1);
    let mut waited = Duration::ZERO;
    loop {
        match fs.rmdir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && waited < Duration::from_secs(2) => {
                kill();
                std::thread::sleep(delay);
                waited += delay;
                delay = (delay * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e).wrap("remove cgroup", dir),
        }
    }
}

/// The CFS quota for `millis` thousandths of a CPU per 100 ms period; the
/// kernel's minimum quota is 1 ms.
pub(super) fn cpu_quota_us(millis: u64) -> u64 {
    millis.saturating_mul(CPU_PERIOD_US / 1000).max(1000)
}

/// The CFS period used for CPU limits: 100 ms.
pub(super) const CPU_PERIOD_US: u64 = 100_000;
