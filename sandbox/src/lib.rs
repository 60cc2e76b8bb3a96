//! Function runs in fresh sandboxes.
//!
//! A [`Sandbox`] clones each run's init into new user, mount, PID, IPC, UTS,
//! cgroup and (for [`Network::Isolated`]) network namespaces (or, as root,
//! one of its kind's network namespaces: see [`NetworkNamespaces`]), maps ids, builds
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
//!   of the run. It can also be made in two halves: [`Sandbox::prepare`] makes
//!   the sandbox ahead of the call (namespaces, id maps, cgroup, the root; init
//!   then waits), and [`Sandbox::run_prepared`] is the call on it (the function
//!   forked, stripped of its privileges and exec'd only then); each
//!   [`PreparedRun`] serves one call;
//! - [`Sandbox::start_service`], a long-lived [`Service`], reached by TCP
//!   connections opened inside its network namespace and stopped on demand.
//!
//! The crate is a pipeline, one module a stage:
//! - `spec`, `config`: what a run is, and the settings of every run;
//! - `plan`, `steps`, `overlay`, `cstr`: the pure planner (what init will
//!   do, as C strings prepared before the clone);
//! - `init`: the child side, from clone to exec, and its typed reports;
//! - `launch`: the launcher seam (the spawner process, or a direct clone)
//!   over the one clone routine; `cgroup`, `limits`, `idmap`: what the
//!   parent sets up around it;
//! - `netns`: the network namespaces the runs of one kind share;
//! - `sandbox`: the [`Sandbox`] and what it sets up once; `process`:
//!   launch, placement, id maps and release, then the guard that kills,
//!   reaps and cleans up, and how a run ended; `run` and `service`: the two
//!   kinds of run; `stdio`: their pipes;
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
mod netns;
mod overlay;
mod plan;
mod process;
mod run;
mod sandbox;
mod service;
mod spec;
mod stdio;
mod steps;
mod sys;

pub use crate::cgroup::{CgroupBase, CgroupConfig, CgroupError, Version as CgroupVersion};
pub use crate::config::{NetworkNamespaces, SandboxConfig};
pub use crate::error::{Error, SpecError};
pub use crate::idmap::IdMap;
pub use crate::limits::{Enforcement, LimitSupport};
pub use crate::mounts::{BindMount, MAX_MOUNTS, MountError, QuotedPath, RESERVED_TARGETS};
pub use crate::overlay::OverlayMount;
pub use crate::process::Status;
pub use crate::run::{Ending, ForCall, Outcome, Prepared, PreparedRun};
pub use crate::sandbox::Sandbox;

/// Thaws the run cgroups (cgroup v1) that this process froze to kill a run
/// and has not thawed yet: for a daemon right before it exits, when another
/// of its threads may be killing a run. A frozen process never dies, so it
/// would outlive the daemon and hold its PID namespace (in a pod: the pod).
/// Returns how many it thawed.
pub fn thaw_frozen_runs() -> usize {
    crate::cgroup::v1::thaw_frozen()
}
pub use crate::service::{ExitWatch, ForService, PreparedService, Service, ServiceExit};
pub use crate::spec::{DEFAULT_PATH, HostUser, Limits, Network, RunSpec};

/// Serves as the sandbox's spawner process if this process was started as one
/// (see [`SandboxConfig::spawner_exe`]), and never returns then; returns at
/// once otherwise. Call it first thing in `main`.
pub fn run_spawner_if_asked() {
    launch::spawner::run_if_asked();
}

/// The messages between the runner and its spawner (postcard), for the
/// fuzz targets of `fnrun-fuzz`; not an API. Each function decodes its
/// message as the receiving side does and, if it decodes, encodes it again.
#[doc(hidden)]
pub mod spawner_codec {
    use crate::launch::spawner::protocol;

    /// The runner's receive buffer for a reply.
    pub const MAX_REPLY: usize = protocol::MAX_REPLY;

    /// A launch request (header and plan), as the spawner reads it.
    pub fn request(bytes: &[u8]) -> Option<Vec<u8>> {
        protocol::reencode_request(bytes)
    }

    /// The hello (the seccomp program), as the spawner reads it.
    pub fn hello(bytes: &[u8]) -> Option<Vec<u8>> {
        protocol::reencode_hello(bytes)
    }

    /// A reply, as the runner reads it.
    pub fn reply(bytes: &[u8]) -> Option<Vec<u8>> {
        protocol::reencode_reply(bytes)
    }
}

/// cgroupfs interface files as the cgroup drivers read them, for the fuzz
/// target of `fnrun-fuzz`; not an API.
#[doc(hidden)]
pub mod cgroup_files {
    /// The whole of an open interface file, read from its start, as a v1
    /// run's kept files are read each time.
    pub fn read_whole(file: &std::fs::File) -> std::io::Result<String> {
        crate::cgroup::read_whole(file)
    }

    /// The pids of a `cgroup.procs` or `tasks` file.
    pub fn pids(text: &str) -> Vec<libc::pid_t> {
        crate::cgroup::parse_pids(text)
    }

    /// The value of `key` in a flat keyed file (`memory.events`,
    /// `cpu.stat`, `memory.oom_control`).
    pub fn keyed(text: &str, key: &str) -> Option<u64> {
        crate::cgroup::keyed(text, key)
    }
}

#[cfg(test)]
mod tests;
