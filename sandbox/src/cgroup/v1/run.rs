//! The cgroups of one run on v1, one per hierarchy, and its usage counters:
//! what the driver creates and the pool keeps. A leaf of `v1`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::cgroup::driver::{
    CPU, CPU_PERIOD_US, CgroupError, CgroupFs, MEMORY, PIDS, Result, RunCgroup, Usage, WrapPath,
    cpu_quota_us, keyed, kill_pids, parse_pids, read_whole, rmdir_retrying, write_command,
};
use crate::spec::Limits;

/// One hierarchy: its controllers and the parent cgroup in it.
#[derive(Debug, Clone)]
pub(in crate::cgroup) struct Parent {
    pub(in crate::cgroup) controllers: Vec<String>,
    pub(in crate::cgroup) dir: PathBuf,
}

impl Parent {
    pub(in crate::cgroup) fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// The cgroups of one run on v1, one per hierarchy.
#[derive(Debug)]
pub struct RunV1 {
    pub(in crate::cgroup) fs: Arc<dyn CgroupFs>,
    /// The directories not yet removed.
    pub(in crate::cgroup) dirs: Vec<Parent>,
    /// Their interface files used so far, kept open.
    pub(in crate::cgroup) open: OpenFiles,
}

/// The interface files of a run's cgroups that have been used, kept open for
/// the cgroups' life. A pooled slot serves run after run, and each open of a
/// cgroupfs file walks its path and sets up a kernfs open file: a warm call
/// opened and closed about 20 of them before. Closed before the directories
/// are removed.
#[derive(Debug, Default)]
pub(in crate::cgroup) struct OpenFiles {
    files: Mutex<Vec<OpenFile>>,
    /// Each directory's `tasks`, in the order of `dirs`, for the pool's
    /// thread move.
    tasks: OnceLock<Vec<File>>,
}

#[derive(Debug)]
struct OpenFile {
    /// The index of its directory in `dirs`.
    dir: usize,
    name: &'static str,
    write: bool,
    file: File,
}

impl RunV1 {
    /// The cgroups in `dirs`, none of their files open yet.
    pub(in crate::cgroup) fn new(fs: Arc<dyn CgroupFs>, dirs: Vec<Parent>) -> RunV1 {
        RunV1 {
            fs,
            dirs,
            open: OpenFiles::default(),
        }
    }

    /// The index in `dirs` of `controller`'s hierarchy.
    fn index(&self, controller: &str) -> Option<usize> {
        self.dirs.iter().position(|d| d.has(controller))
    }

    pub(in crate::cgroup) fn dir(&self, controller: &str) -> Option<&Path> {
        self.index(controller).map(|i| self.dirs[i].dir.as_path())
    }

    /// `f` on file `name` of directory `dir`, opened for writing or reading
    /// the first time and kept open.
    fn with_file<T>(
        &self,
        dir: usize,
        name: &'static str,
        write: bool,
        f: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut files = self.open.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = files
            .iter()
            .find(|o| o.dir == dir && o.name == name && o.write == write)
        {
            return f(&open.file);
        }
        let path = self.dirs[dir].dir.join(name);
        let file = if write {
            self.fs.open_write(&path)?
        } else {
            self.fs.open_read(&path)?
        };
        let out = f(&file);
        files.push(OpenFile {
            dir,
            name,
            write,
            file,
        });
        out
    }

    pub(in crate::cgroup) fn write(
        &self,
        controller: &str,
        file: &'static str,
        value: &str,
    ) -> Result<()> {
        let dir = self
            .index(controller)
            .ok_or_else(|| CgroupError::Unusable(format!("no cgroup v1 {controller} hierarchy")))?;
        self.with_file(dir, file, true, |f| write_command(f, value))
            .wrap("write", &self.dirs[dir].dir.join(file))
    }

    pub(in crate::cgroup) fn read(&self, controller: &str, file: &'static str) -> Option<String> {
        self.with_file(self.index(controller)?, file, false, read_whole)
            .ok()
    }

    /// What the memory cgroup is charged with now (`None` without one):
    /// its processes' memory, and page cache and kernel objects (dentries,
    /// inodes) that its runs' reads and lookups charged to it, which outlive
    /// those runs' processes.
    pub(in crate::cgroup) fn memory_charged(&self) -> Option<u64> {
        self.number(MEMORY, "memory.usage_in_bytes")
    }

    fn number(&self, controller: &str, file: &'static str) -> Option<u64> {
        self.read(controller, file)
            .and_then(|s| s.trim().parse::<u64>().ok())
    }

    /// Each directory's `tasks` file, opened the first time.
    pub(in crate::cgroup) fn tasks(&self) -> Result<Vec<BorrowedFd<'_>>> {
        let tasks = match self.open.tasks.get() {
            Some(tasks) => tasks,
            None => {
                let files = self
                    .dirs
                    .iter()
                    .map(|d| {
                        let path = d.dir.join("tasks");
                        self.fs.open_write(&path).wrap("open", &path)
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.open.tasks.get_or_init(|| files)
            }
        };
        Ok(tasks.iter().map(AsFd::as_fd).collect())
    }

    /// The peak of the run's memory, as its memory cgroup counts it.
    pub(in crate::cgroup) fn peak_memory(&self) -> Option<u64> {
        self.number(MEMORY, "memory.max_usage_in_bytes")
    }

    /// Changes the limits from `from`, what the files hold now, to `to`,
    /// writing only what differs. `None` is no limit.
    pub(in crate::cgroup) fn apply(&self, from: &Limits, to: &Limits) -> Result<()> {
        if to.memory_bytes != from.memory_bytes {
            let value = to
                .memory_bytes
                .map_or_else(|| "-1".to_owned(), |b| b.to_string());
            // memory+swap, when swap accounting is on: no swapping past the
            // limit. It may never be below memory.limit_in_bytes, so it goes
            // first when the limit rises and last when it falls.
            let memsw = self.read(MEMORY, "memory.memsw.limit_in_bytes").is_some();
            let rises = to.memory_bytes.unwrap_or(u64::MAX) > from.memory_bytes.unwrap_or(u64::MAX);
            if memsw && rises {
                self.write(MEMORY, "memory.memsw.limit_in_bytes", &value)?;
            }
            self.write(MEMORY, "memory.limit_in_bytes", &value)?;
            if memsw && !rises {
                self.write(MEMORY, "memory.memsw.limit_in_bytes", &value)?;
            }
        }
        if to.cpu_millis != from.cpu_millis {
            match to.cpu_millis {
                Some(millis) => {
                    self.write(CPU, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                    self.write(CPU, "cpu.cfs_quota_us", &cpu_quota_us(millis).to_string())?;
                }
                None => self.write(CPU, "cpu.cfs_quota_us", "-1")?,
            }
        }
        if to.pids != from.pids {
            let value = to.pids.map_or_else(|| "max".to_owned(), |p| p.to_string());
            self.write(PIDS, "pids.max", &value)?;
        }
        Ok(())
    }

    /// The usage counters as they are now.
    pub(in crate::cgroup) fn counters(&self) -> Counters {
        Counters {
            oom_kills: self
                .read(MEMORY, "memory.oom_control")
                .and_then(|s| keyed(&s, "oom_kill")),
            failcnt: self.number(MEMORY, "memory.failcnt"),
            peak_memory_bytes: self.peak_memory(),
            cpu_ns: self.number("cpuacct", "cpuacct.usage"),
        }
    }

    /// The index of the directory whose `cgroup.procs` lists the run's
    /// processes for a kill: the freezer's, which can stop them first, when
    /// there is one.
    pub(in crate::cgroup) fn procs_dir(&self) -> Option<usize> {
        self.index("freezer")
            .or_else(|| (!self.dirs.is_empty()).then_some(0))
    }

    /// The processes in the run, as listed by directory `dir`'s hierarchy.
    /// Opened afresh each time: v1 keeps the pid list it read for an open
    /// `cgroup.procs` and shows it again, for a second after, to a read
    /// from the start of the same open file, so a kept one could say a
    /// cgroup is empty when it is not, or name pids since reused.
    pub(in crate::cgroup) fn procs(&self, dir: usize) -> Vec<libc::pid_t> {
        let path = self.dirs[dir].dir.join("cgroup.procs");
        parse_pids(&self.fs.read(&path).unwrap_or_default())
    }
}

impl RunCgroup for RunV1 {
    fn admit(&mut self, pid: libc::pid_t, placed: bool) -> Result<()> {
        if placed {
            return Ok(());
        }
        let pid = pid.to_string();
        for d in &self.dirs {
            let path = d.dir.join("cgroup.procs");
            self.fs
                .write(&path, &pid)
                .wrap("add the sandbox to", &path)?;
        }
        Ok(())
    }

    fn kill(&self) -> Result<()> {
        let Some(procs_dir) = self.procs_dir() else {
            return Ok(());
        };
        let freezer = self.dir("freezer").is_some();
        if self.procs(procs_dir).is_empty() {
            return Ok(());
        }
        // Frozen, nothing forks between reading the list and killing it, and
        // no pid is freed (so none is reused) meanwhile. Whatever happens
        // next, the cgroup is thawed (the guard), and a daemon that exits
        // meanwhile thaws it on its way out ([`thaw_frozen`]): a frozen
        // process never dies, and holds its PID namespace, and so its
        // container, with it.
        let frozen = match self.dir("freezer") {
            Some(dir) if freezer => {
                let state = dir.join("freezer.state");
                let guard = Frozen::register(state);
                self.write("freezer", "freezer.state", "FROZEN")?;
                for _ in 0..100 {
                    if self
                        .read("freezer", "freezer.state")
                        .is_some_and(|s| s.trim() == "FROZEN")
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Some(guard)
            }
            _ => None,
        };
        kill_pids(&self.procs(procs_dir));
        if let Some(guard) = frozen {
            // The killed processes die as soon as they are thawed.
            let thawed = self.write("freezer", "freezer.state", "THAWED");
            if thawed.is_ok() {
                guard.thawed();
            }
            thawed?;
        }
        Ok(())
    }

    fn usage(&self) -> Usage {
        self.counters().since(&Counters::default())
    }

    fn peak_memory(&self) -> Option<u64> {
        RunV1::peak_memory(self)
    }

    fn remove(&mut self) -> Result<()> {
        let fs = self.fs.clone();
        let mut first_error = None;
        // Closed first: indexed by `dirs`, which changes below.
        self.open = OpenFiles::default();
        let dirs = std::mem::take(&mut self.dirs);
        let mut left = Vec::new();
        for d in dirs {
            let kill = || {
                let procs = fs.read(&d.dir.join("cgroup.procs")).unwrap_or_default();
                kill_pids(&parse_pids(&procs));
            };
            match rmdir_retrying(fs.as_ref(), &d.dir, &kill) {
                Ok(()) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                    left.push(d);
                }
            }
        }
        self.dirs = left;
        first_error.map_or(Ok(()), Err)
    }

    fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.dir.clone()).collect()
    }
}

impl Drop for RunV1 {
    fn drop(&mut self) {
        if self.dirs.is_empty() {
            return;
        }
        let _ = self.kill();
        if let Err(e) = self.remove() {
            tracing::warn!(error = %e, "cannot remove a run cgroup");
        }
    }
}

/// A run's usage counters at one moment (`None`: the kernel has no such
/// file).
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::cgroup) struct Counters {
    pub(in crate::cgroup) oom_kills: Option<u64>,
    pub(in crate::cgroup) failcnt: Option<u64>,
    pub(in crate::cgroup) peak_memory_bytes: Option<u64>,
    pub(in crate::cgroup) cpu_ns: Option<u64>,
}

impl Counters {
    /// What was used since `start`; the peak is not a counter (it is reset
    /// when a slot is taken) and is taken as it is.
    pub(in crate::cgroup) fn since(&self, start: &Counters) -> Usage {
        let delta =
            |now: Option<u64>, then: Option<u64>| now.map(|n| n.saturating_sub(then.unwrap_or(0)));
        Usage {
            oom_kills: delta(self.oom_kills, start.oom_kills),
            hit_memory_limit: delta(self.failcnt, start.failcnt).is_some_and(|n| n > 0),
            peak_memory_bytes: self.peak_memory_bytes,
            cpu_time: delta(self.cpu_ns, start.cpu_ns).map(Duration::from_nanos),
        }
    }
}

/// The `freezer.state` files of run cgroups this process froze and has not
/// thawed yet.
static FROZEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// One run cgroup frozen by [`RunV1::kill`]: thawed when dropped unless
/// [`Frozen::thawed`] says it was.
struct Frozen {
    state: PathBuf,
    done: bool,
}

impl Frozen {
    fn register(state: PathBuf) -> Frozen {
        FROZEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(state.clone());
        Frozen { state, done: false }
    }

    fn thawed(mut self) {
        self.done = true;
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.done
            && let Err(e) = std::fs::write(&self.state, "THAWED")
        {
            tracing::warn!(file = %self.state.display(), error = %e, "cannot thaw a run cgroup");
        }
        let mut frozen = FROZEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = frozen.iter().position(|s| *s == self.state) {
            frozen.swap_remove(i);
        }
    }
}

/// Thaws every run cgroup this process has frozen and not thawed yet: for a
/// daemon about to exit while another of its threads is killing a run (a
/// frozen process never dies, so it would outlive the daemon, and hold its
/// container). Returns how many it thawed.
pub fn thaw_frozen() -> usize {
    let frozen = FROZEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    frozen
        .iter()
        .filter(|state| std::fs::write(state, "THAWED").is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the host's v1 freezer (root only): a cgroup frozen by a kill that
    /// has not finished is thawed by `thaw_frozen`, as the daemon does on
    /// its way out, and its killed process then dies.
    #[test]
    fn a_run_frozen_by_an_unfinished_kill_is_thawed_on_the_way_out() {
        let freezer = Path::new("/sys/fs/cgroup/freezer");
        if !freezer.join("cgroup.procs").exists() {
            eprintln!("skipped: no cgroup v1 freezer hierarchy here");
            return;
        }
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = freezer.join(format!("fnrun-test-thaw-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        /// Whatever the test found, nothing frozen or left on the host.
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
                for _ in 0..100 {
                    if std::fs::remove_dir(&self.0).is_ok() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        let _cleanup = Cleanup(dir.clone());
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        let state = dir.join("freezer.state");
        let guard = Frozen::register(state.clone());
        std::fs::write(&state, "FROZEN").unwrap();
        for _ in 0..1000 {
            if std::fs::read_to_string(&state).unwrap().trim() == "FROZEN" {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "FROZEN");
        // Killed while frozen: it cannot die yet.
        child.kill().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none(), "a frozen process died");
        // What the daemon does as it exits.
        assert!(thaw_frozen() >= 1);
        assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "THAWED");
        let status = child.wait().unwrap();
        assert!(!status.success());
        guard.thawed();
        assert!(
            !FROZEN
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&state)
        );
    }

    /// A guard dropped without `thawed` (the kill returned early) thaws.
    #[test]
    fn a_kill_that_returns_early_still_thaws() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("freezer.state");
        std::fs::write(&state, "FROZEN").unwrap();
        drop(Frozen::register(state.clone()));
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "THAWED");
        assert!(
            !FROZEN
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&state)
        );
    }
}
