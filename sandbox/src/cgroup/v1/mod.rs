//! cgroup v1: one hierarchy per controller (or per group of co-mounted
//! controllers). A run gets a cgroup of the same name in each of the memory,
//! cpu, cpuacct, pids and freezer hierarchies that exist and are writable.
//!
//! # Pooled run cgroups
//!
//! Moving a process into a v1 cgroup (a pid written to `cgroup.procs`) takes
//! the kernel's `cgroup_threadgroup_rwsem` for writing, which waits for an RCU
//! grace period and holds up every fork and exit on the host meanwhile; v1
//! has no `CLONE_INTO_CGROUP`. A fresh memory cgroup per run is not cheap
//! either. So the cgroups of finished runs are kept in a [`Pool`] of slots
//! and reused, and init never moves: the thread that clones it first moves
//! itself, alone, into the slot (`"0"` written to each `tasks` file, which
//! migrates only the writer and skips that lock), clones init, which starts
//! in the slot like any child, and moves back to this process's own cgroups
//! ([`Placement::ThreadMove`]).
//!
//! An idle slot is empty, has no memory limit and no CPU quota (so that the
//! thread passing through is never throttled, and never the only task in a
//! memory cgroup at its limit) and a pids limit of at least 2 (the thread and
//! init). A run's limits are written once init exists, before it is released
//! ([`RunCgroup::admit`]), and only where they differ from the slot's; its
//! usage counters are the differences from when it took the slot (the peak is
//! reset instead). A slot that still holds a process when its run ends, or
//! whose files could not be written, is removed instead of reused; so is a
//! slot still charged with more than a few MiB (page cache, dentries and
//! inodes its runs charged to it, which outlive their processes): v1 refuses
//! a memory limit below a charge it cannot reclaim. A run with a memory
//! limit takes an idle slot only when its charge is below half that limit. The pool
//! needs this process's own cgroups to be writable (the thread must go back);
//! where they are not, every run gets cgroups of its own, as before.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::driver::{
    CPU, CgroupDriver, CgroupError, CgroupFs, Controllers, MEMORY, PIDS, Result, RunCgroup,
    Version, WrapPath, delegation_hint,
};
use crate::spec::Limits;

mod pool;
mod run;
pub(crate) use self::run::thaw_frozen;

use self::pool::{Pool, PooledRun, Slot};
pub use self::run::RunV1;
use self::run::{Counters, Parent};

/// One v1 hierarchy as [`V1::new`] takes it.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// The controllers fnrun uses that it carries.
    pub controllers: Vec<String>,
    /// The parent of run cgroups in it (created if missing).
    pub parent: PathBuf,
    /// The parent to use instead where `parent` cannot be created or
    /// written.
    pub fallback: Option<PathBuf>,
    /// This process's own cgroup in it.
    pub own: PathBuf,
}

/// The cgroup v1 driver.
#[derive(Debug)]
pub struct V1 {
    fs: Arc<dyn CgroupFs>,
    parents: Vec<Parent>,
    controllers: Controllers,
    /// Reused run cgroups; `None` when this process cannot move its threads
    /// back to its own cgroups.
    pool: Option<Arc<Pool>>,
}

impl V1 {
    /// Creates the parent cgroup in each hierarchy. Hierarchies where that
    /// fails are left out; an error only when none is usable. With `pool`,
    /// run cgroups are reused when this process can go back to its own.
    pub fn new(fs: Arc<dyn CgroupFs>, hierarchies: Vec<Hierarchy>, pool: bool) -> Result<V1> {
        let mut parents = Vec::new();
        let mut homes = Vec::new();
        let mut problems: Vec<(Vec<String>, String)> = Vec::new();
        let usable = |dir: &Path| {
            create_all(fs.as_ref(), dir).and_then(|()| {
                nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).map_err(|e| {
                    CgroupError::Unusable(format!(
                        "cannot create cgroups in {}: {e}",
                        dir.display()
                    ))
                })
            })
        };
        for Hierarchy {
            controllers,
            parent,
            fallback,
            own,
        } in hierarchies
        {
            let chosen = match (usable(&parent), fallback) {
                (Ok(()), _) => Ok(parent),
                (Err(e), Some(top)) => {
                    tracing::info!(
                        controllers = %controllers.join(","),
                        reason = %e,
                        top = %top.display(),
                        "cgroup v1: runs go to the top of the hierarchy, not below this process's cgroup"
                    );
                    usable(&top).map(|()| top)
                }
                (Err(e), None) => Err(e),
            };
            match chosen {
                Ok(dir) => {
                    parents.push(Parent { controllers, dir });
                    homes.push(own);
                }
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
        let pool = match pool.then(|| Pool::new(fs.as_ref(), &homes)) {
            Some(Ok(pool)) => Some(Arc::new(pool)),
            Some(Err(e)) => {
                tracing::info!(reason = %e, "cgroup v1: one cgroup per run, not pooled");
                None
            }
            None => None,
        };
        Ok(V1 {
            fs,
            parents,
            controllers,
            pool,
        })
    }

    /// The cgroups named `name`, created with no limits.
    fn create_dirs(&self, name: &str) -> Result<RunV1> {
        // On error `run` is dropped, which removes what was created.
        let mut run = RunV1::new(self.fs.clone(), Vec::with_capacity(self.parents.len()));
        for parent in &self.parents {
            let dir = parent.dir.join(name);
            self.fs.mkdir(&dir).wrap("create cgroup", &dir)?;
            run.dirs.push(Parent {
                controllers: parent.controllers.clone(),
                dir,
            });
        }
        Ok(run)
    }

    /// A new slot named `name` for `pool`.
    fn create_slot(&self, name: &str) -> Result<Slot> {
        Ok(Slot {
            cgroups: self.create_dirs(name)?,
            limits: Limits::default(),
        })
    }
}

impl Drop for V1 {
    /// Removes the idle slots; slots in use are removed when their runs end.
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            let idle = {
                let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.closed = true;
                std::mem::take(&mut idle.slots)
            };
            drop(idle);
        }
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

    #[cfg(test)]
    fn parents(&self) -> Vec<PathBuf> {
        self.parents.iter().map(|p| p.dir.clone()).collect()
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn RunCgroup>> {
        let Some(pool) = &self.pool else {
            let run = self.create_dirs(name)?;
            run.apply(&Limits::default(), limits)?;
            return Ok(Box::new(run));
        };
        // A slot carries what its earlier runs charged and left (at most
        // `MAX_CARRIED_BYTES`, see `PooledRun::remove`); a memory limit must
        // be set well above it, or the kernel may refuse it: else a fresh
        // slot, and this one is removed.
        let idle = pool.take().filter(|slot| {
            limits
                .memory_bytes
                .is_none_or(|limit| slot.cgroups.memory_charged().unwrap_or(0) <= limit / 2)
        });
        let fresh = idle.is_none();
        let slot = match idle {
            Some(slot) => slot,
            None => self.create_slot(name)?,
        };
        let mut run = PooledRun {
            pool: pool.clone(),
            slot: Some(slot),
            limits: *limits,
            start: Counters::default(),
            reusable: std::sync::atomic::AtomicBool::new(true),
        };
        if !fresh {
            run.start = run.cgroups().counters();
            if run.cgroups().dir(MEMORY).is_some()
                && let Err(e) = run
                    .cgroups()
                    .write(MEMORY, "memory.max_usage_in_bytes", "0")
            {
                // Not reused: dropping `run` removes the slot.
                run.spoil();
                return Err(e);
            }
        }
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
            let mut run = RunV1::new(
                self.fs.clone(),
                self.parents
                    .iter()
                    .map(|p| Parent {
                        controllers: p.controllers.clone(),
                        dir: p.dir.join(name),
                    })
                    .filter(|p| self.fs.exists(&p.dir))
                    .collect(),
            );
            run.kill()?;
            run.remove()?;
        }
        Ok(names.len())
    }
}
