//! Function runs in fresh sandboxes.
//!
//! A [`Sandbox`] clones each run's init into new user, mount, PID, IPC, UTS,
//! cgroup and (for [`Network::Isolated`]) network namespaces, maps ids, builds
//! a root filesystem from read-only layer directories with a throwaway
//! writable layer, pivots into it, hides or write-protects the sensitive parts
//! of `/proc`, `/sys` and `/dev`, drops every privilege, installs the seccomp
//! filter of [`SandboxConfig::seccomp`] and execs the function. Memory, CPU
//! and pids [`Limits`] are enforced by a cgroup per run (v1 or v2);
//! [`Sandbox::limit_support`] says what this host can enforce.
//!
//! Two kinds of run start from one [`RunSpec`]:
//! - [`Sandbox::run`], a per-call run: the input on stdin, stdout read (up to
//!   a limit) while stderr's tail is kept, a timeout that kills every process
//!   of the run;
//! - [`Sandbox::start_service`], a long-lived [`Service`], reached by TCP
//!   connections opened inside its network namespace and stopped on demand.
//!
//! The crate is a pipeline, one module a stage:
//! - `spec`, `config`: what a run is, and the settings of every run;
//! - `plan`, `steps`, `overlay`: the pure planner (what init will do, as C
//!   strings prepared before the clone);
//! - `init`: the child side, from clone to exec, and its typed reports;
//! - `launch`: the launcher seam (the spawner process, or a direct clone)
//!   over the one clone routine; `cgroup`, `limits`, `idmap`: what the
//!   parent sets up around it;
//! - `process`: launch, placement, id maps and release, then the guard that
//!   kills, reaps and cleans up; `run` and `service`: the two kinds of run;
//!   `stdio`: their pipes;
//! - `sys`: every raw system call.
//!
//! `docs/sandbox.md` walks through the sequence and says why each step is
//! there.

mod cgroup;
mod config;
mod cstr;
mod error;
mod idmap;
mod init;
mod launch;
mod limits;
mod mounts;
mod overlay;
mod plan;
mod process;
mod run;
mod service;
mod spec;
mod stdio;
mod steps;
mod sys;

pub use crate::cgroup::{CgroupBase, CgroupConfig, CgroupError, Version as CgroupVersion};
pub use crate::config::SandboxConfig;
pub use crate::error::{Error, SpecError};
pub use crate::idmap::IdMap;
pub use crate::limits::{Enforcement, LimitSupport};
pub use crate::mounts::{BindMount, MAX_MOUNTS, MountError, QuotedPath, RESERVED_TARGETS};
pub use crate::overlay::OverlayMount;
pub use crate::run::{Outcome, Status};
pub use crate::service::{ExitWatch, Service, ServiceExit};
pub use crate::spec::{DEFAULT_PATH, HostUser, Limits, Network, RunSpec};

/// Serves as the sandbox's spawner process if this process was started as one
/// (see [`SandboxConfig::spawner_exe`]), and never returns then; returns at
/// once otherwise. Call it first thing in `main`.
pub fn run_spawner_if_asked() {
    launch::spawner::run_if_asked();
}

/// Runs functions. Cheap to share: every run takes `&self`.
#[derive(Debug)]
pub struct Sandbox {
    config: SandboxConfig,
    /// Highest capability number of the running kernel.
    last_cap: u32,
    limiter: limits::Limiter,
    launcher: Box<dyn launch::Launcher>,
}

impl Sandbox {
    /// Checks the host, creates the scratch mount point, and removes the run
    /// cgroups a crashed runner left behind.
    pub fn new(config: SandboxConfig) -> Result<Self, Error> {
        let scratch = &config.scratch_dir;
        std::fs::create_dir_all(scratch).map_err(Error::io_at("create", scratch))?;
        // The sandbox's root (a mapped id) must be able to reach the mount point.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o755))
            .map_err(Error::io_at("chmod", scratch))?;
        let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63);
        let limiter = limits::Limiter::new(&config.cgroup);
        let launcher = launch::launcher(&config);
        Ok(Sandbox {
            config,
            last_cap,
            limiter,
            launcher,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Which limits this host can enforce, and how: for the runner to log.
    pub fn limit_support(&self) -> &LimitSupport {
        self.limiter.support()
    }

    /// The spawner's pid, while one runs (see [`SandboxConfig::spawner`]).
    #[cfg(test)]
    pub(crate) fn spawner_pid(&self) -> Option<libc::pid_t> {
        self.launcher.spawner_pid()
    }
}

#[cfg(test)]
mod tests;
