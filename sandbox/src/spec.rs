//! What one run is: its root, command, user, network and limits. Both kinds
//! of run (a per-call run and a long-lived service run) start from a
//! [`RunSpec`].

use std::path::PathBuf;

use crate::mounts::BindMount;

/// The `PATH` of a run whose environment has none, and the one container
/// runtimes give images without an `Env` of their own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The most layers a run's root stacks: overlayfs's own limit (`OVL_MAX_STACK`).
pub const MAX_LAYERS: usize = 500;

/// A host user mapped into one run besides the sandbox's own ids, so that the
/// function can act on the host as that user: on a writable bind mount, the
/// files it makes are theirs (kpt's `--as-current-user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostUser {
    pub uid: u32,
    pub gid: u32,
}

/// Network access of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Network {
    /// A network namespace with only `lo` (up): a new one, or one of the
    /// run's kind's, one run at a time (see
    /// [`crate::NetworkNamespaces::PerKind`]).
    #[default]
    Isolated,
    /// The runner's own network namespace.
    Runner,
}

/// Resource limits of one run; `None` is no limit (the pids limit then comes
/// from [`crate::SandboxConfig::default_pids_limit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Memory (and memory+swap) of every process of the run, in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU time in thousandths of a CPU (Kubernetes millicores).
    pub cpu_millis: Option<u64>,
    /// Processes and threads of the run.
    pub pids: Option<u64>,
}

/// One run: the image's root and config, and what the caller asks of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunSpec {
    /// Read-only layer directories, bottom to top.
    pub layers: Vec<PathBuf>,
    /// Entrypoint and arguments; `argv[0]` is looked up in the `PATH` of `env`
    /// when it has no slash.
    pub argv: Vec<String>,
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    /// Absolute working directory inside the sandbox; created if missing.
    pub workdir: String,
    /// User, group and supplementary groups inside the sandbox.
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Network access.
    pub network: Network,
    /// Memory, CPU and pids limits.
    pub limits: Limits,
    /// Host files and directories mounted into the run, read-only unless
    /// asked otherwise (empty for most runs).
    pub mounts: Vec<BindMount>,
    /// A host user mapped into this run besides the sandbox's ids, so that
    /// `uid`/`gid` can be theirs (see [`crate::IdMap::inside_ids`]); `None`
    /// for most runs.
    pub caller: Option<HostUser>,
}
