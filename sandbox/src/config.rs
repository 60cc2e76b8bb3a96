//! Settings shared by every run of one [`crate::Sandbox`].

use std::path::PathBuf;
use std::sync::Arc;

use crate::cgroup::CgroupConfig;
use crate::idmap::IdMap;
use crate::overlay::OverlayMount;

/// Settings shared by every run of one [`crate::Sandbox`].
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// An empty directory used as the mount point of each run's private scratch
    /// tmpfs (mounted only inside the run's own mount namespace, so runs never
    /// see each other and nothing is written to the host).
    pub scratch_dir: PathBuf,
    /// How ids inside the sandbox map to the host.
    pub id_map: IdMap,
    /// Most stdout bytes a per-call run keeps; more makes it fail with
    /// [`crate::Status::OutputTooLarge`].
    pub max_output_bytes: usize,
    /// How many trailing bytes of stderr (per-call runs) or of stdout and
    /// stderr together (service runs) are kept for error messages.
    pub stderr_tail_bytes: usize,
    /// Size of the tmpfs that holds a run's writable root layer.
    pub writable_bytes: u64,
    /// The sandbox's hostname.
    pub hostname: String,
    /// The seccomp program installed in the function right before exec
    /// (see `fnrun_seccomp`). `None` runs functions unconfined: only for
    /// operators who choose that explicitly.
    pub seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
    /// The pids limit of runs that do not ask for one (0: none). Always
    /// enforced: by the pids cgroup controller, else by `RLIMIT_NPROC` in the
    /// run's user namespace (see [`crate::LimitSupport`]).
    pub default_pids_limit: u64,
    /// Run anyway, with a warning, when a requested limit cannot be enforced
    /// on this host, instead of failing with [`crate::Error::LimitUnavailable`].
    pub best_effort_limits: bool,
    /// Where the cgroups of runs go.
    pub cgroup: CgroupConfig,
    /// Clone each run's init from a small spawner process (started at the first
    /// run) instead of from this process: this process's memory is then never
    /// write-protected for a clone (see `launch/spawner`).
    pub spawner: bool,
    /// The binary exec'd as the spawner, once: a fresh process whose small
    /// address space makes each clone cheaper than from a fork of this one.
    /// It must call [`crate::run_spawner_if_asked`] first thing in `main`.
    /// `None` forks the spawner from this process without exec (as in tests,
    /// whose binary has no such `main`).
    pub spawner_exe: Option<PathBuf>,
    /// How each run's overlay root is mounted (the switch exists to force
    /// the mount(2) path where the new mount API works).
    pub overlay: OverlayMount,
    /// Which network namespace an ISOLATED per-call run gets. A runner
    /// that cannot make namespaces for its runs to share (a rootless one)
    /// gives each run its own whatever this says
    /// ([`crate::Sandbox::shares_network_namespaces`]).
    pub network_namespaces: NetworkNamespaces,
}

/// Which network namespace an ISOLATED per-call run gets (function servers
/// always get their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkNamespaces {
    /// A new one for every run.
    PerRun,
    /// One of its kind's (equal [`crate::RunSpec`]s), one run at a time in
    /// each; see shared/SPEC.md, "Sandbox".
    #[default]
    PerKind,
}

impl SandboxConfig {
    /// Defaults for a scratch directory and id map.
    pub fn new(scratch_dir: PathBuf, id_map: IdMap) -> Self {
        SandboxConfig {
            scratch_dir,
            id_map,
            max_output_bytes: 100 << 20,
            stderr_tail_bytes: 4096,
            writable_bytes: 1 << 30,
            hostname: "function".to_owned(),
            seccomp: Some(Arc::new(fnrun_seccomp::default_program().expect(
                "the built-in seccomp profile compiles (a unit test checks it)",
            ))),
            default_pids_limit: 1024,
            best_effort_limits: false,
            cgroup: CgroupConfig::default(),
            spawner: true,
            spawner_exe: None,
            overlay: OverlayMount::Auto,
            network_namespaces: NetworkNamespaces::default(),
        }
    }
}
