//! Pooled run cgroups (see the parent module's doc): idle slots, and the
//! run that holds one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::run::{Counters, RunV1};
use crate::cgroup::driver::{
    CgroupFs, Placement, Result, RunCgroup, Usage, WrapPath, write_command,
};
use crate::spec::Limits;

/// Idle slots kept at most; more are removed when their runs end.
pub(in crate::cgroup) const MAX_IDLE_SLOTS: usize = 64;
/// A slot still charged with more than this when its run ends is removed,
/// not reused. A run's reads and lookups charge page cache and kernel
/// objects (dentries, inodes) to its memory cgroup that outlive its
/// processes, and v1 refuses (`EBUSY`) a memory limit below a charge it
/// cannot reclaim: a later run's limit would fail in such a slot. Removing
/// the cgroup hands the charge to its parent.
pub(in crate::cgroup) const MAX_CARRIED_BYTES: u64 = 4 << 20;

/// Idle run cgroups, and where threads go back to (see the module's doc).
#[derive(Debug)]
pub(super) struct Pool {
    /// `tasks` of this process's own cgroup in each hierarchy, in the order
    /// of [`V1::parents`].
    pub(super) home: Vec<std::fs::File>,
    pub(super) idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
pub(super) struct Idle {
    pub(super) slots: Vec<Slot>,
    /// The driver is gone: slots are removed, not kept.
    pub(super) closed: bool,
}

impl Pool {
    /// A pool whose threads go back to `homes`, this process's own cgroups.
    /// Checks that they can: the calling thread moves (back) to its home.
    pub(super) fn new(fs: &dyn CgroupFs, homes: &[PathBuf]) -> Result<Pool> {
        let home = homes
            .iter()
            .map(|dir| {
                let path = dir.join("tasks");
                let file = fs.open_write(&path).wrap("open", &path)?;
                write_command(&file, "0").wrap("move this thread to", &path)?;
                Ok(file)
            })
            .collect::<Result<_>>()?;
        Ok(Pool {
            home,
            idle: Mutex::new(Idle::default()),
        })
    }

    pub(super) fn take(&self) -> Option<Slot> {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .pop()
    }

    /// Keeps `slot` for another run, or gives it back when the pool is
    /// closed or full.
    pub(super) fn put(&self, slot: Slot) -> Option<Slot> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.closed || idle.slots.len() >= MAX_IDLE_SLOTS {
            return Some(slot);
        }
        idle.slots.push(slot);
        None
    }
}

/// One pooled set of run cgroups. Dropping it kills what is in it and
/// removes it.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) cgroups: RunV1,
    /// The limits its files hold.
    pub(super) limits: Limits,
}

impl Slot {
    /// The limits of an idle slot: none that could hold up the thread that
    /// passes through to clone init (see the module's doc).
    pub(super) fn idle_limits(&self) -> Limits {
        Limits {
            memory_bytes: None,
            cpu_millis: None,
            pids: self.limits.pids.filter(|&p| p >= 2),
        }
    }
}

/// A run's cgroups, taken from a [`Pool`].
#[derive(Debug)]
pub(super) struct PooledRun {
    pub(super) pool: Arc<Pool>,
    /// `None` once given back.
    pub(super) slot: Option<Slot>,
    /// The run's limits, applied by `admit`.
    pub(super) limits: Limits,
    /// The counters when the run took the slot.
    pub(super) start: Counters,
    /// Cleared when a write to the slot failed: it is not reused.
    pub(super) reusable: std::sync::atomic::AtomicBool,
}

impl PooledRun {
    pub(super) fn cgroups(&self) -> &RunV1 {
        &self.slot.as_ref().expect("a slot until removed").cgroups
    }

    pub(super) fn spoil(&self) {
        self.reusable
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl RunCgroup for PooledRun {
    fn placement(&self) -> Result<Placement<'_>> {
        let enter = self.cgroups().tasks().inspect_err(|_| self.spoil())?;
        let leave = self
            .pool
            .home
            .iter()
            .take(enter.len())
            .map(std::os::fd::AsFd::as_fd)
            .collect();
        Ok(Placement::ThreadMove { enter, leave })
    }

    fn placement_failed(&self) {
        self.spoil();
    }

    fn admit(&mut self, pid: libc::pid_t, placed: bool) -> Result<()> {
        let limits = self.limits;
        let slot = self.slot.as_mut().expect("a slot until removed");
        if !placed {
            slot.cgroups.admit(pid, false)?;
        }
        let applied = slot.cgroups.apply(&slot.limits, &limits);
        slot.limits = limits;
        if applied.is_err() {
            self.spoil();
        }
        applied
    }

    fn kill(&self) -> Result<()> {
        self.cgroups().kill()
    }

    fn usage(&self) -> Usage {
        self.cgroups().counters().since(&self.start)
    }

    fn peak_memory(&self) -> Option<u64> {
        self.cgroups().peak_memory()
    }

    fn remove(&mut self) -> Result<()> {
        let Some(mut slot) = self.slot.take() else {
            return Ok(());
        };
        let empty = slot
            .cgroups
            .procs_dir()
            .is_some_and(|i| slot.cgroups.procs(i).is_empty());
        let carried = slot.cgroups.memory_charged().unwrap_or(0);
        let reusable = empty
            && carried <= MAX_CARRIED_BYTES
            && self.reusable.load(std::sync::atomic::Ordering::Relaxed)
            && {
                let idle = slot.idle_limits();
                let reset = slot.cgroups.apply(&slot.limits, &idle);
                slot.limits = idle;
                reset.is_ok()
            };
        let mut slot = if reusable {
            match self.pool.put(slot) {
                None => return Ok(()),
                Some(slot) => slot,
            }
        } else {
            slot
        };
        // Not reused: removed, with whatever is left in it.
        slot.cgroups.kill()?;
        slot.cgroups.remove()
    }

    fn dirs(&self) -> Vec<PathBuf> {
        self.slot
            .as_ref()
            .map_or_else(Vec::new, |s| s.cgroups.dirs())
    }
}

impl Drop for PooledRun {
    fn drop(&mut self) {
        if self.slot.is_none() {
            return;
        }
        let _ = self.kill();
        if let Err(e) = self.remove() {
            tracing::warn!(error = %e, "cannot free a run cgroup");
        }
    }
}
