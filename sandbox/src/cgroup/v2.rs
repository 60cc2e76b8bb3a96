//! cgroup v2: one unified hierarchy.
//!
//! The parent cgroup gets `+memory +cpu +pids` in its `cgroup.subtree_control`
//! (and so does every cgroup between it and the base, this process's own
//! cgroup or the hierarchy's top), so that each run cgroup has the
//! controllers' files. v2 forbids processes in a cgroup whose controllers are
//! enabled for its children (the "no internal processes" rule): when the base
//! is this process's own cgroup, as in a delegated systemd unit or a pod, the
//! process first moves itself into a leaf next to the parent, `fnrun-daemon`.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::driver::{
    CPU, CPU_PERIOD_US, CgroupDriver, CgroupError, CgroupFs, Controllers, MEMORY, PIDS, Placement,
    Result, RunCgroup, Usage, Version, WrapPath, cpu_quota_us, delegation_hint, keyed, kill_pids,
    parse_pids, rmdir_retrying,
};
use crate::spec::Limits;

/// The leaf this process moves itself into when its own cgroup is the base.
pub const DAEMON_LEAF: &str = "fnrun-daemon";

/// The controllers fnrun enables, in the order written.
const WANTED: [&str; 3] = [MEMORY, CPU, PIDS];

/// The cgroup v2 driver.
#[derive(Debug)]
pub struct V2 {
    fs: Arc<dyn CgroupFs>,
    parent: PathBuf,
    controllers: Controllers,
}

impl V2 {
    /// Creates `parent` (below `base`, inside the hierarchy mounted at `mount`)
    /// and enables the controllers on the way down.
    pub fn new(fs: Arc<dyn CgroupFs>, mount: &Path, base: &Path, parent: &Path) -> Result<V2> {
        let rel = parent.strip_prefix(base).map_err(|_| {
            CgroupError::Unusable(format!(
                "cgroup parent {} is not below {}",
                parent.display(),
                base.display()
            ))
        })?;
        if !fs.exists(base) {
            return Err(CgroupError::Unusable(format!(
                "this process's cgroup {} does not exist",
                base.display()
            )));
        }
        let mut notes = Vec::new();
        let mut dir = base.to_owned();
        // The base is this process's own cgroup (which may have to be
        // emptied first), unless it is the hierarchy's root, which is exempt
        // from "no internal processes" and has no `cgroup.type`; the root of
        // a cgroup namespace (a container's own cgroup, in a mount of its
        // own) is not that root, and has one.
        let own_base = base != mount || fs.exists(&base.join("cgroup.type"));
        enable(fs.as_ref(), &dir, own_base, &mut notes)?;
        for part in rel.components() {
            dir.push(part);
            if !fs.exists(&dir) {
                fs.mkdir(&dir).wrap("create cgroup", &dir)?;
            }
            enable(fs.as_ref(), &dir, false, &mut notes)?;
        }
        nix::unistd::access(parent, nix::unistd::AccessFlags::W_OK).map_err(|e| {
            CgroupError::Unusable(format!(
                "cannot create cgroups in {}: {e}{}",
                parent.display(),
                delegation_hint()
            ))
        })?;

        let available = tokens(
            &fs.read(&parent.join("cgroup.controllers"))
                .unwrap_or_default(),
        );
        let enabled = tokens(
            &fs.read(&parent.join("cgroup.subtree_control"))
                .unwrap_or_default(),
        );
        let support = |c: &str| {
            if enabled.iter().any(|e| e == c) {
                Ok(())
            } else if !available.iter().any(|a| a == c) {
                Err(format!(
                    "the {c} controller is not available in {} (not delegated, or disabled)",
                    parent.display()
                ))
            } else {
                Err(notes
                    .iter()
                    .find(|n| n.starts_with(c))
                    .cloned()
                    .unwrap_or_else(|| format!("the {c} controller could not be enabled")))
            }
        };
        let controllers = Controllers {
            memory: support(MEMORY),
            cpu: support(CPU),
            pids: support(PIDS),
        };
        Ok(V2 {
            parent: parent.to_owned(),
            controllers,
            fs,
        })
    }
}

fn tokens(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// Enables the wanted controllers that `dir` has in its subtree_control.
/// `may_move_self`: `dir` is this process's own cgroup, which must become
/// empty first.
fn enable(
    fs: &dyn CgroupFs,
    dir: &Path,
    may_move_self: bool,
    notes: &mut Vec<String>,
) -> Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let available = tokens(
        &fs.read(&dir.join("cgroup.controllers"))
            .wrap("read", &dir.join("cgroup.controllers"))?,
    );
    let enabled = tokens(&fs.read(&control).wrap("read", &control)?);
    let missing: Vec<&str> = WANTED
        .into_iter()
        .filter(|c| available.iter().any(|a| a == c) && !enabled.iter().any(|e| e == c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let command = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    match fs.write(&control, &command) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && may_move_self => {
            move_self(fs, dir)?;
            if fs.write(&control, &command).is_ok() {
                return Ok(());
            }
        }
        Err(_) => {}
    }
    // One at a time, so that one controller that cannot be enabled does not
    // keep the others off.
    for c in missing {
        if let Err(e) = fs.write(&control, &format!("+{c}")) {
            notes.push(format!(
                "{c} controller: cannot enable it in {}: {e}",
                control.display()
            ));
        }
    }
    Ok(())
}

/// Moves this process into `<own>/fnrun-daemon`, so that its own cgroup has
/// no processes and may enable controllers for its children.
fn move_self(fs: &dyn CgroupFs, own: &Path) -> Result<()> {
    let leaf = own.join(DAEMON_LEAF);
    if !fs.exists(&leaf) {
        fs.mkdir(&leaf).wrap("create cgroup", &leaf)?;
    }
    let procs = leaf.join("cgroup.procs");
    fs.write(&procs, &std::process::id().to_string())
        .wrap("move this process to", &procs)?;
    tracing::info!(cgroup = %leaf.display(), "moved the daemon into a leaf cgroup to enable controllers for runs");
    Ok(())
}

impl CgroupDriver for V2 {
    fn version(&self) -> Version {
        Version::V2
    }

    fn controllers(&self) -> &Controllers {
        &self.controllers
    }

    #[cfg(test)]
    fn parents(&self) -> Vec<PathBuf> {
        vec![self.parent.clone()]
    }

    fn create(&self, name: &str, limits: &Limits) -> Result<Box<dyn RunCgroup>> {
        let dir = self.parent.join(name);
        self.fs.mkdir(&dir).wrap("create cgroup", &dir)?;
        let mut run = RunV2 {
            fs: self.fs.clone(),
            dir,
            fd: None,
            removed: false,
        };
        // On error `run` is dropped, which removes the cgroup.
        run.apply(limits)?;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&run.dir)
            .wrap("open", &run.dir)?;
        run.fd = Some(fd.into());
        Ok(Box::new(run))
    }

    fn sweep(&self, is_stale: &dyn Fn(&str) -> bool) -> Result<usize> {
        let names = self.fs.children(&self.parent).wrap("list", &self.parent)?;
        let mut removed = 0;
        for name in names.into_iter().filter(|n| is_stale(n)) {
            let mut run = RunV2 {
                fs: self.fs.clone(),
                dir: self.parent.join(&name),
                fd: None,
                removed: false,
            };
            run.kill()?;
            run.remove()?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// The cgroup of one run on v2.
#[derive(Debug)]
pub struct RunV2 {
    fs: Arc<dyn CgroupFs>,
    dir: PathBuf,
    fd: Option<OwnedFd>,
    removed: bool,
}

impl RunV2 {
    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        self.fs.write(&path, value).wrap("write", &path)
    }

    fn read(&self, file: &str) -> Option<String> {
        self.fs.read(&self.dir.join(file)).ok()
    }

    fn apply(&self, limits: &Limits) -> Result<()> {
        if let Some(bytes) = limits.memory_bytes {
            self.write("memory.max", &bytes.to_string())?;
            // Swap would let the run go past its limit, only slower.
            if self.fs.exists(&self.dir.join("memory.swap.max")) {
                self.write("memory.swap.max", "0")?;
            }
        }
        if let Some(millis) = limits.cpu_millis {
            self.write(
                "cpu.max",
                &format!("{} {CPU_PERIOD_US}", cpu_quota_us(millis)),
            )?;
        }
        if let Some(pids) = limits.pids {
            self.write("pids.max", &pids.to_string())?;
        }
        Ok(())
    }

    fn procs(&self) -> Vec<libc::pid_t> {
        parse_pids(&self.read("cgroup.procs").unwrap_or_default())
    }
}

impl RunCgroup for RunV2 {
    fn placement(&self) -> Result<Placement<'_>> {
        Ok(match &self.fd {
            Some(fd) => Placement::CloneInto(fd.as_fd()),
            None => Placement::AdmitAfter,
        })
    }

    fn admit(&mut self, pid: libc::pid_t, placed: bool) -> Result<()> {
        if placed {
            return Ok(());
        }
        self.write("cgroup.procs", &pid.to_string())
    }

    fn kill(&self) -> Result<()> {
        if self.fs.exists(&self.dir.join("cgroup.kill")) {
            // Linux 5.14: every process, atomically with respect to forks.
            return self.write("cgroup.kill", "1");
        }
        if self.procs().is_empty() {
            return Ok(());
        }
        // Freeze first so that nothing forks between reading and killing.
        let frozen = self.write("cgroup.freeze", "1").is_ok();
        if frozen {
            for _ in 0..100 {
                if self.read("cgroup.events").and_then(|e| keyed(&e, "frozen")) == Some(1) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        kill_pids(&self.procs());
        if frozen {
            self.write("cgroup.freeze", "0")?;
        }
        Ok(())
    }

    fn usage(&self) -> Usage {
        let events = self.read("memory.events").unwrap_or_default();
        Usage {
            oom_kills: keyed(&events, "oom_kill"),
            hit_memory_limit: keyed(&events, "max").is_some_and(|n| n > 0),
            peak_memory_bytes: self.read("memory.peak").and_then(|s| s.trim().parse().ok()),
            cpu_time: self
                .read("cpu.stat")
                .and_then(|s| keyed(&s, "usage_usec"))
                .map(Duration::from_micros),
        }
    }

    fn remove(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.fd = None;
        let fs = self.fs.clone();
        rmdir_retrying(fs.as_ref(), &self.dir, &|| {
            let _ = self.kill();
        })?;
        self.removed = true;
        Ok(())
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.dir.clone()]
    }
}

impl Drop for RunV2 {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(error = %e, "cannot remove a run cgroup");
        }
    }
}
