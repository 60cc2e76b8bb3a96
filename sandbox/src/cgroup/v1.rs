//! cgroup v1: one hierarchy per controller (or per group of co-mounted
//! controllers). A run gets a cgroup of the same name in each of the memory,
//! cpu, cpuacct, pids and freezer hierarchies that exist and are writable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{
    CPU, CPU_PERIOD_US, CgroupDriver, CgroupError, CgroupFs, Controllers, MEMORY, PIDS, Result,
    RunCgroup, Usage, Version, WrapPath, cpu_quota_us, delegation_hint, keyed, kill_pids,
    parse_pids, rmdir_retrying,
};
use crate::limits::Limits;

/// One hierarchy: its controllers and the parent cgroup in it.
#[derive(Debug, Clone)]
struct Parent {
    controllers: Vec<String>,
    dir: PathBuf,
}

impl Parent {
    fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// The cgroup v1 driver.
#[derive(Debug)]
pub struct V1 {
    fs: Arc<dyn CgroupFs>,
    parents: Vec<Parent>,
    controllers: Controllers,
}

impl V1 {
    /// Creates the parent cgroup in each hierarchy, given as its controllers
    /// and the parent's directory. Hierarchies where that fails are left out;
    /// an error only when none is usable.
    pub fn new(fs: Arc<dyn CgroupFs>, hierarchies: Vec<(Vec<String>, PathBuf)>) -> Result<V1> {
        let mut parents = Vec::new();
        let mut problems: Vec<(Vec<String>, String)> = Vec::new();
        for (controllers, dir) in hierarchies {
            match create_all(fs.as_ref(), &dir).and_then(|()| {
                nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).map_err(|e| {
                    CgroupError::Unusable(format!(
                        "cannot create cgroups in {}: {e}",
                        dir.display()
                    ))
                })
            }) {
                Ok(()) => parents.push(Parent { controllers, dir }),
                Err(e) => problems.push((controllers, e.to_string())),
            }
        }
        if parents.is_empty() {
            let why = problems
                .first()
                .map_or_else(|| "no cgroup v1 hierarchy".to_owned(), |(_, p)| p.clone());
            return Err(CgroupError::Unusable(format!(
                "no writable cgroup v1 hierarchy: {why}{}",
                delegation_hint()
            )));
        }
        let support = |c: &str, file: &str, missing: &str| -> Result<(), String> {
            match parents.iter().find(|p| p.has(c)) {
                Some(p) if fs.exists(&p.dir.join(file)) => Ok(()),
                Some(_) => Err(missing.to_owned()),
                None => Err(problems
                    .iter()
                    .find(|(cs, _)| cs.iter().any(|x| x == c))
                    .map_or_else(
                        || format!("no cgroup v1 {c} hierarchy is mounted"),
                        |(_, p)| p.clone(),
                    )),
            }
        };
        let controllers = Controllers {
            memory: support(
                MEMORY,
                "memory.limit_in_bytes",
                "the memory hierarchy has no memory.limit_in_bytes",
            ),
            cpu: support(
                CPU,
                "cpu.cfs_quota_us",
                "the kernel has no CFS bandwidth control (CONFIG_CFS_BANDWIDTH)",
            ),
            pids: support(PIDS, "pids.max", "the pids hierarchy has no pids.max"),
        };
        Ok(V1 {
            fs,
            parents,
            controllers,
        })
    }
}

/// `mkdir -p` through `fs`.
fn create_all(fs: &dyn CgroupFs, dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !fs.exists(d) {
        missing.push(d);
        d = d
            .parent()
            .ok_or_else(|| CgroupError::Unusable(format!("{} does not exist", dir.display())))?;
    }
    for d in missing.into_iter().rev() {
        match fs.mkdir(d) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).wrap("create cgroup", d);
            }
            _ => {}
        }
    }
    Ok(())
}

impl CgroupDriver for V1 {
    fn version(&self) -> Version {
        Version::V1
    }

    fn controllers(&self) -> &Controllers {
        &self.controllers
    }

    fn parents(&self) -> Vec<PathBuf> {
        self.parents.iter().map(|p| p.dir.clone()).collect()
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn RunCgroup>> {
        // On error `run` is dropped, which removes what was created.
        let mut run = RunV1 {
            fs: self.fs.clone(),
            dirs: Vec::with_capacity(self.parents.len()),
        };
        for parent in &self.parents {
            let dir = parent.dir.join(name);
            self.fs.mkdir(&dir).wrap("create cgroup", &dir)?;
            run.dirs.push(Parent {
                controllers: parent.controllers.clone(),
                dir,
            });
        }
        run.apply(limits)?;
        Ok(Box::new(run))
    }

    fn sweep(&self, is_stale: &dyn Fn(&str) -> bool) -> Result<usize> {
        let mut names: Vec<String> = Vec::new();
        for parent in &self.parents {
            for name in self.fs.children(&parent.dir).wrap("list", &parent.dir)? {
                if is_stale(&name) && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        for name in &names {
            let mut run = RunV1 {
                fs: self.fs.clone(),
                dirs: self
                    .parents
                    .iter()
                    .map(|p| Parent {
                        controllers: p.controllers.clone(),
                        dir: p.dir.join(name),
                    })
                    .filter(|p| self.fs.exists(&p.dir))
                    .collect(),
            };
            run.kill()?;
            run.remove()?;
        }
        Ok(names.len())
    }
}

/// The cgroups of one run on v1, one per hierarchy.
#[derive(Debug)]
pub struct RunV1 {
    fs: Arc<dyn CgroupFs>,
    /// The directories not yet removed.
    dirs: Vec<Parent>,
}

impl RunV1 {
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|d| d.has(controller))
            .map(|d| d.dir.as_path())
    }

    fn write(&self, controller: &str, file: &str, value: &str) -> Result<()> {
        let dir = self
            .dir(controller)
            .ok_or_else(|| CgroupError::Unusable(format!("no cgroup v1 {controller} hierarchy")))?;
        let path = dir.join(file);
        self.fs.write(&path, value).wrap("write", &path)
    }

    fn read(&self, controller: &str, file: &str) -> Option<String> {
        self.fs.read(&self.dir(controller)?.join(file)).ok()
    }

    fn apply(&self, limits: &Limits) -> Result<()> {
        if let Some(bytes) = limits.memory_bytes {
            let bytes = bytes.to_string();
            self.write(MEMORY, "memory.limit_in_bytes", &bytes)?;
            // memory+swap, when swap accounting is on: no swapping past the
            // limit. Must not be below memory.limit_in_bytes, so it comes after.
            if self.read(MEMORY, "memory.memsw.limit_in_bytes").is_some() {
                self.write(MEMORY, "memory.memsw.limit_in_bytes", &bytes)?;
            }
        }
        if let Some(millis) = limits.cpu_millis {
            self.write(CPU, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            self.write(CPU, "cpu.cfs_quota_us", &cpu_quota_us(millis).to_string())?;
        }
        if let Some(pids) = limits.pids {
            self.write(PIDS, "pids.max", &pids.to_string())?;
        }
        Ok(())
    }

    /// The processes in the run, as listed by `controller`'s hierarchy.
    fn procs(&self, dir: &Path) -> Vec<libc::pid_t> {
        parse_pids(&self.fs.read(&dir.join("cgroup.procs")).unwrap_or_default())
    }
}

impl RunCgroup for RunV1 {
    fn clone_into(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    fn add(&self, pid: libc::pid_t) -> Result<()> {
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
        let Some(first) = self.dirs.first() else {
            return Ok(());
        };
        let freezer = self.dir("freezer");
        let procs_dir = freezer.unwrap_or(&first.dir);
        if self.procs(procs_dir).is_empty() {
            return Ok(());
        }
        // Frozen, nothing forks between reading the list and killing it, and
        // no pid is freed (so none is reused) meanwhile.
        if let Some(dir) = freezer {
            let state = dir.join("freezer.state");
            self.fs.write(&state, "FROZEN").wrap("write", &state)?;
            for _ in 0..100 {
                if self.fs.read(&state).is_ok_and(|s| s.trim() == "FROZEN") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        kill_pids(&self.procs(procs_dir));
        if let Some(dir) = freezer {
            // The killed processes die as soon as they are thawed.
            let state = dir.join("freezer.state");
            self.fs.write(&state, "THAWED").wrap("write", &state)?;
        }
        Ok(())
    }

    fn usage(&self) -> Usage {
        let number = |c: &str, f: &str| self.read(c, f).and_then(|s| s.trim().parse::<u64>().ok());
        Usage {
            oom_kills: self
                .read(MEMORY, "memory.oom_control")
                .and_then(|s| keyed(&s, "oom_kill")),
            hit_memory_limit: number(MEMORY, "memory.failcnt").is_some_and(|n| n > 0),
            peak_memory_bytes: number(MEMORY, "memory.max_usage_in_bytes"),
            cpu_time: number("cpuacct", "cpuacct.usage").map(Duration::from_nanos),
        }
    }

    fn remove(&mut self) -> Result<()> {
        let fs = self.fs.clone();
        let mut first_error = None;
        let dirs = std::mem::take(&mut self.dirs);
        let mut left = Vec::new();
        for d in dirs {
            let kill = || {
                kill_pids(&self.procs(&d.dir));
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
