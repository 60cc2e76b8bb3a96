//! One function run in a fresh sandbox.
//!
//! [`Sandbox::run`] clones a child into new user, mount, PID, IPC, UTS, cgroup
//! and (for [`Network::Isolated`]) network namespaces, maps ids, builds a root
//! filesystem from read-only layer directories with a throwaway writable layer,
//! pivots into it, hides or write-protects the sensitive parts of `/proc`,
//! `/sys` and `/dev`, drops every privilege, installs the seccomp filter of
//! [`SandboxConfig::seccomp`] (by default `fnrun_seccomp`'s profile) and execs
//! the function. The caller's input is written to its stdin while stdout and
//! stderr are read, so no size of either deadlocks; the timeout kills every
//! process of the run. Memory, CPU and pids [`Limits`] are enforced by a
//! cgroup per run (v1 or v2, see [`cgroup`]); [`Sandbox::limit_support`] says
//! what this host can enforce.
//!
//! The spawn is built directly on raw system calls (see [`child`] and [`sys`]):
//! all the child needs is prepared before clone, so it is safe to call from a
//! multi-threaded tokio runtime. `docs/sandbox.md` walks through the sequence.

pub mod cgroup;
mod child;
mod idmap;
mod limits;
mod overlay;
mod spawner;
mod stdio;
mod sys;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use tokio::io::unix::AsyncFd;

pub use crate::cgroup::{CgroupBase, CgroupConfig, Version as CgroupVersion};
use crate::child::{ExecPointers, Plan};
pub use crate::child::{ExecStage, Step};
pub use crate::idmap::IdMap;
pub use crate::limits::{Enforcement, LimitSupport, Limits};
pub use crate::overlay::OverlayMount;

/// Serves as the sandbox's spawner process if this process was started as one
/// (see [`SandboxConfig::spawner_exe`]), and never returns then; returns at
/// once otherwise. Call it first thing in `main`.
pub fn run_spawner_if_asked() {
    spawner::run_if_asked();
}

/// Network access of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// A new network namespace with only `lo` (up).
    #[default]
    Isolated,
    /// The runner's own network namespace.
    Runner,
}

/// Settings shared by every run of one [`Sandbox`].
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// An empty directory used as the mount point of each run's private scratch
    /// tmpfs (mounted only inside the run's own mount namespace, so runs never
    /// see each other and nothing is written to the host).
    pub scratch_dir: PathBuf,
    /// How ids inside the sandbox map to the host.
    pub id_map: IdMap,
    /// Most stdout bytes kept; more makes the run fail with
    /// [`Status::OutputTooLarge`].
    pub max_output_bytes: usize,
    /// How many trailing bytes of stderr are kept for error messages.
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
    /// run's user namespace (see [`LimitSupport`]).
    pub default_pids_limit: u64,
    /// Run anyway, with a warning, when a requested limit cannot be enforced
    /// on this host, instead of failing with [`Error::LimitUnavailable`].
    pub best_effort_limits: bool,
    /// Where the cgroups of runs go.
    pub cgroup: CgroupConfig,
    /// Clone each run's init from a small spawner process (started at the first
    /// run) instead of from this process: the daemon's memory is then never
    /// write-protected for a clone (see `spawner.rs`).
    pub spawner: bool,
    /// The binary exec'd as the spawner, once: a fresh process whose small
    /// address space makes each clone cheaper than from a fork of this one.
    /// It must call [`run_spawner_if_asked`] first thing in `main`. `None`
    /// forks the spawner from this process without exec (as in tests, whose
    /// binary has no such `main`).
    pub spawner_exe: Option<PathBuf>,
    /// How each run's overlay root is mounted (the switch exists to force
    /// the mount(2) path where the new mount API works).
    pub overlay: OverlayMount,
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
        }
    }
}

/// One function run.
#[derive(Debug, Clone)]
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
    /// The run is killed, with all its processes, after this long.
    pub timeout: Duration,
    /// Memory, CPU and pids limits.
    pub limits: Limits,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The function exited with this code.
    Exited(i32),
    /// The function was killed by this signal.
    Signaled(i32),
    /// The run passed its timeout and was killed.
    TimedOut,
    /// stdout passed `max_output_bytes` and the run was killed.
    OutputTooLarge,
    /// The kernel killed the run (or a process it could not do without) for
    /// going over its memory limit.
    OutOfMemory,
}

/// The result of a run that started.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Everything written to stdout (at most `max_output_bytes`).
    pub stdout: Vec<u8>,
    /// The last `stderr_tail_bytes` written to stderr.
    pub stderr_tail: Vec<u8>,
    /// From clone to the end of the run.
    pub elapsed: Duration,
    /// Highest memory use of the run, when its cgroup reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all the run's processes, when its cgroup reports it.
    pub cpu_time: Option<Duration>,
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec cannot be run (empty argv, bad paths, too many layers).
    #[error("invalid run: {0}")]
    InvalidSpec(String),
    /// A system call of the parent failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Building the sandbox failed inside the child.
    #[error("sandbox setup failed: {what}: {errno}")]
    Setup { what: String, errno: Errno },
    /// The function process could not be started.
    #[error("cannot start the function: {stage} ({path}): {errno}")]
    Exec {
        stage: &'static str,
        path: String,
        errno: Errno,
    },
    /// The sandbox's init died without reporting (e.g. killed by the kernel).
    #[error("sandbox init ended unexpectedly: {0}")]
    InitDied(String),
    /// A requested limit cannot be enforced on this host (and
    /// `best_effort_limits` is off).
    #[error("the {what} limit cannot be enforced on this host: {why}")]
    LimitUnavailable { what: &'static str, why: String },
    /// Placing the sandbox in its cgroup failed.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
}

impl Error {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Io { what, source }
    }

    fn errno(what: &'static str) -> impl FnOnce(Errno) -> Error {
        move |e| Error::Io {
            what,
            source: e.into(),
        }
    }
}

/// Runs functions. Cheap to share: `run` takes `&self`.
#[derive(Debug)]
pub struct Sandbox {
    config: SandboxConfig,
    last_cap: u32,
    limiter: limits::Limiter,
    spawner: Option<spawner::Spawner>,
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Hidden from the function (runc's and Docker's defaults): kernel memory,
/// keys, timer and scheduler internals, hardware and firmware interfaces.
const MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Read-only for the function (runc's and Docker's defaults): the kernel
/// tunables, and files that act on the whole host.
const READ_ONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

impl Sandbox {
    /// Checks the host and creates the scratch mount point.
    pub fn new(config: SandboxConfig) -> Result<Self, Error> {
        std::fs::create_dir_all(&config.scratch_dir).map_err(Error::io("create scratch dir"))?;
        // The sandbox's root (a mapped id) must be able to reach the mount point.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&config.scratch_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(Error::io("chmod scratch dir"))?;
        let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63);
        // Also removes the run cgroups of a daemon that crashed.
        let limiter = limits::Limiter::new(&config.cgroup);
        let spawner = config
            .spawner
            .then(|| spawner::Spawner::new(config.seccomp.clone(), config.spawner_exe.clone()));
        Ok(Sandbox {
            config,
            last_cap,
            limiter,
            spawner,
        })
    }

    /// The pid of the spawner process, while one runs (see
    /// [`SandboxConfig::spawner`]).
    pub fn spawner_pid(&self) -> Option<libc::pid_t> {
        self.spawner.as_ref().and_then(spawner::Spawner::pid)
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Which limits this host can enforce, and how: for the daemon to log.
    pub fn limit_support(&self) -> &LimitSupport {
        self.limiter.support()
    }

    /// Builds the child's plan for `spec`. Pure: no system calls.
    pub fn plan_steps(&self, spec: &RunSpec, run_tag: &str) -> Result<Vec<Step>, Error> {
        let c = |s: &str| cstring(s.as_bytes());
        let scratch = path_str(&self.config.scratch_dir)?;
        let root = format!("{scratch}/root");
        let old_root = format!(".fnrun-old-root-{run_tag}");
        let mut steps = Vec::with_capacity(40);
        let mount = |source: Option<&str>,
                     target: &str,
                     fstype: Option<&str>,
                     flags: libc::c_ulong,
                     data: Option<&str>|
         -> Result<Step, Error> {
            Ok(Step::Mount {
                source: source.map(c).transpose()?,
                target: c(target)?,
                fstype: fstype.map(c).transpose()?,
                flags,
                data: data.map(c).transpose()?,
            })
        };
        let mkdir = |path: &str, mode| {
            Ok::<_, Error>(Step::Mkdir {
                path: c(path)?,
                mode,
            })
        };

        // 1. Nothing we mount may propagate back to the host.
        steps.push(mount(
            None,
            "/",
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )?);
        // 2. A private tmpfs for the writable layer: it vanishes with the run.
        let tmpfs_opts = format!("mode=0755,size={}", self.config.writable_bytes);
        steps.push(mount(
            Some("fnrun"),
            &scratch,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&tmpfs_opts),
        )?);
        for dir in ["upper", "work", "root", "empty"] {
            steps.push(mkdir(&format!("{scratch}/{dir}"), 0o755)?);
        }
        // 3. The root filesystem: the read-only layers under an overlay whose
        //    upper layer lives in the scratch tmpfs (see `overlay`).
        steps.push(Step::Overlay(Box::new(overlay::plan(
            &spec.layers,
            &scratch,
            self.config.overlay,
        )?)));
        // 4. Pivot into it, keeping the old root reachable for the device binds.
        steps.push(mkdir(&format!("{root}/{old_root}"), 0o700)?);
        steps.push(Step::Chdir { path: c(&root)? });
        steps.push(Step::PivotRoot {
            put_old: c(&old_root)?,
        });
        // 5. API filesystems, mounted after the pivot so that symlinks in the
        //    image resolve inside the new root.
        steps.push(mkdir("/proc", 0o555)?);
        steps.push(mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        )?);
        steps.push(mkdir("/tmp", 0o1777)?);
        steps.push(mount(
            Some("tmpfs"),
            "/tmp",
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&format!("mode=1777,size={}", self.config.writable_bytes)),
        )?);
        steps.push(mkdir("/dev", 0o755)?);
        steps.push(mount(
            Some("tmpfs"),
            "/dev",
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("mode=0755,size=64k"),
        )?);
        for node in DEV_NODES {
            let target = format!("/dev/{node}");
            steps.push(Step::Touch {
                path: c(&target)?,
                mode: 0o666,
            });
            steps.push(mount(
                Some(&format!("/{old_root}/dev/{node}")),
                &target,
                None,
                libc::MS_BIND,
                None,
            )?);
        }
        for (link, target) in [
            ("/dev/fd", "/proc/self/fd"),
            ("/dev/stdin", "/proc/self/fd/0"),
            ("/dev/stdout", "/proc/self/fd/1"),
            ("/dev/stderr", "/proc/self/fd/2"),
        ] {
            steps.push(Step::Symlink {
                target: c(target)?,
                link: c(link)?,
            });
        }
        steps.push(mkdir("/dev/shm", 0o1777)?);
        steps.push(mount(
            Some("shm"),
            "/dev/shm",
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("mode=1777,size=64m"),
        )?);
        // 6. /sys, never writable. A new network namespace belongs to the
        //    run's user namespace, so a fresh sysfs (showing its own `lo`)
        //    may be mounted, read-only. In the runner's network namespace the
        //    kernel refuses a fresh sysfs and the host's would show the host's
        //    devices and cgroups: an empty read-only tmpfs stands in.
        steps.push(mkdir("/sys", 0o555)?);
        let read_only = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        steps.push(match spec.network {
            Network::Isolated => mount(Some("sysfs"), "/sys", Some("sysfs"), read_only, None)?,
            Network::Runner => mount(
                Some("tmpfs"),
                "/sys",
                Some("tmpfs"),
                read_only,
                Some("mode=0555"),
            )?,
        });
        // 7. Masked and read-only paths of /proc and /sys, then /dev itself
        //    read-only (its device binds and /dev/shm stay writable).
        for path in MASKED_PATHS {
            steps.push(Step::Mask { path: c(path)? });
        }
        for path in READ_ONLY_PATHS {
            steps.push(Step::BindReadOnly { path: c(path)? });
        }
        steps.push(Step::RemountReadOnly { path: c("/dev")? });
        // 8. Drop the host's root for good (only now: mounting a fresh proc
        //    or sysfs in a user namespace needs a fully visible one around).
        steps.push(Step::Detach {
            path: c(&format!("/{old_root}"))?,
        });
        steps.push(Step::Rmdir {
            path: c(&format!("/{old_root}"))?,
        });
        // 9. Leave the runner's session and process group: no controlling
        //    terminal to open through /dev/tty, and no terminal signals
        //    (Ctrl-C) reach the function.
        steps.push(Step::NewSession);
        steps.push(Step::Hostname {
            name: c(&self.config.hostname)?,
        });
        if spec.network == Network::Isolated {
            steps.push(Step::LoopbackUp);
        }
        Ok(steps)
    }

    fn plan(&self, spec: &RunSpec, fds: &ChildFds, run_tag: &str) -> Result<Plan, Error> {
        let Some(argv0) = spec.argv.first() else {
            return Err(Error::InvalidSpec(
                "the image has no entrypoint or command".to_owned(),
            ));
        };
        if !spec.workdir.starts_with('/') {
            return Err(Error::InvalidSpec(format!(
                "working directory {:?} is not absolute",
                spec.workdir
            )));
        }
        let size = self.config.id_map.size();
        for (what, id) in [("uid", spec.uid), ("gid", spec.gid)]
            .into_iter()
            .chain(spec.groups.iter().map(|g| ("group", *g)))
        {
            if id >= size {
                return Err(Error::InvalidSpec(format!(
                    "{what} {id} is not mapped (the sandbox maps {size} ids)"
                )));
            }
        }
        let path_var = spec
            .env
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or(DEFAULT_PATH);
        let exec_paths = if argv0.contains('/') {
            vec![cstring(argv0.as_bytes())?]
        } else {
            path_var
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| cstring(format!("{}/{argv0}", d.trim_end_matches('/')).as_bytes()))
                .collect::<Result<_, _>>()?
        };
        let mut prefixes = Vec::new();
        let mut prefix = String::new();
        for part in spec.workdir.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            prefixes.push(cstring(prefix.as_bytes())?);
        }
        Ok(Plan {
            sync_read: fds.sync_read.as_raw_fd(),
            report_write: fds.report_write.as_raw_fd(),
            stdin_read: fds.stdin_read.as_raw_fd(),
            stdout_write: fds.stdout_write.as_raw_fd(),
            stderr_write: fds.stderr_write.as_raw_fd(),
            can_setgroups: self.config.id_map.can_setgroups(),
            uid: spec.uid,
            gid: spec.gid,
            groups: spec.groups.clone(),
            steps: self.plan_steps(spec, run_tag)?,
            workdir: cstring(spec.workdir.as_bytes())?,
            workdir_prefixes: prefixes,
            exec_paths,
            argv: spec
                .argv
                .iter()
                .map(|a| cstring(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            env: spec
                .env
                .iter()
                .map(|e| cstring(e.as_bytes()))
                .collect::<Result<_, _>>()?,
            last_cap: self.last_cap,
            seccomp: self.config.seccomp.clone(),
        })
    }

    /// Runs `spec` with `input` on stdin.
    ///
    /// Returns the outcome of a run that started, whatever the function did;
    /// an error only when the sandbox could not be built or the function could
    /// not be executed. Dropping the future kills the run.
    pub async fn run(&self, spec: &RunSpec, input: &[u8]) -> Result<Outcome, Error> {
        let start = Instant::now();
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let (sync_read, sync_write) = pipe()?;
        let (report_read, report_write) = pipe()?;
        let child_fds = ChildFds {
            sync_read,
            report_write,
            stdin_read,
            stdout_write,
            stderr_write,
        };
        let run_tag = format!(
            "{:x}",
            start.elapsed().as_nanos() ^ u128::from(std::process::id())
        );
        let plan = self.plan(spec, &child_fds, &run_tag)?;
        // The run's cgroup, with its limits, exists before init does.
        let limits = self.limiter.prepare(
            &spec.limits,
            self.config.default_pids_limit,
            self.config.best_effort_limits,
        )?;
        let (pid, pidfd, placed) = spawn(
            &plan,
            spec.network,
            limits.cgroup.as_deref(),
            self.spawner.as_ref(),
        )?;
        let mut guard = ChildGuard {
            pidfd: Some(pidfd),
            pid,
            cgroup: limits.cgroup,
        };
        drop(child_fds);

        // Init waits on the sync pipe: nothing of the run happens before it is
        // in its cgroup, under its limits, with its id maps.
        if let Some(cgroup) = &mut guard.cgroup {
            cgroup.admit(pid, placed)?;
        }
        if let Some(nproc) = limits.nproc {
            limits::set_nproc(pid, nproc).map_err(Error::io("set RLIMIT_NPROC of the sandbox"))?;
        }
        self.config
            .id_map
            .write(pid)
            .map_err(Error::io("write id maps"))?;
        sys::write_all(sync_write.as_raw_fd(), &[1]).map_err(Error::errno("release child"))?;
        drop(sync_write);

        let stdio = stdio::Stdio::new(stdin_write, stdout_read, stderr_read)
            .map_err(Error::io("set up stdio"))?;
        let mut io = stdio::Pumped::default();
        let exited = guard.exited();
        let cfg = &self.config;
        let finished = tokio::time::timeout(spec.timeout, async {
            stdio
                .pump(input, cfg.max_output_bytes, cfg.stderr_tail_bytes, &mut io)
                .await;
            if !io.output_too_large {
                let _ = exited.await;
            }
        })
        .await;
        let status = if finished.is_err() {
            Some(Status::TimedOut)
        } else if io.output_too_large {
            Some(Status::OutputTooLarge)
        } else {
            None
        };
        if status.is_some() {
            guard.kill();
        }
        let init_status = guard.reap().await?;
        let usage = guard.remove_cgroup();
        let reports = read_reports(report_read);
        let status = match status {
            Some(status) => Ok(status),
            None => self.interpret(&plan, &reports, init_status),
        };
        let status = match status {
            // The OOM killer explains a run that failed, or an init that died,
            // better than the exit status does.
            Ok(Status::Exited(code)) if code != 0 && out_of_memory(&usage, code == 128 + 9) => {
                Status::OutOfMemory
            }
            Ok(Status::Signaled(sig)) if out_of_memory(&usage, sig == libc::SIGKILL) => {
                Status::OutOfMemory
            }
            Err(Error::InitDied(_)) if out_of_memory(&usage, true) => Status::OutOfMemory,
            other => other?,
        };
        Ok(Outcome {
            status,
            stdout: io.stdout,
            stderr_tail: io.stderr_tail,
            elapsed: start.elapsed(),
            peak_memory_bytes: usage.peak_memory_bytes,
            cpu_time: usage.cpu_time,
        })
    }

    fn interpret(
        &self,
        plan: &Plan,
        reports: &[(u32, u32, i32)],
        init_status: WaitStatus,
    ) -> Result<Status, Error> {
        for &(kind, step, value) in reports {
            let errno = Errno::from_raw(value);
            match kind {
                child::REPORT_SETUP => {
                    let what = match step {
                        child::INIT_WAIT => "wait for the parent".to_owned(),
                        child::INIT_IDS => "become root of the user namespace".to_owned(),
                        child::INIT_FORK => "fork the function".to_owned(),
                        child::INIT_PDEATHSIG => "set the parent death signal".to_owned(),
                        child::INIT_CGROUPNS => "create the cgroup namespace".to_owned(),
                        i => plan
                            .steps
                            .get(i as usize)
                            .map_or_else(|| format!("step {i}"), Step::describe),
                    };
                    return Err(Error::Setup { what, errno });
                }
                child::REPORT_EXEC => {
                    let stage = ExecStage::from_u32(step).unwrap_or(ExecStage::Exec);
                    let path = match stage {
                        ExecStage::Workdir => plan.workdir.to_string_lossy().into_owned(),
                        _ => plan.argv[0].to_string_lossy().into_owned(),
                    };
                    return Err(Error::Exec {
                        stage: stage.describe(),
                        path,
                        errno,
                    });
                }
                child::REPORT_EXIT => {
                    // A raw wait status as the function's init saw it.
                    return Ok(if libc::WIFSIGNALED(value) {
                        Status::Signaled(libc::WTERMSIG(value))
                    } else {
                        Status::Exited(libc::WEXITSTATUS(value))
                    });
                }
                _ => {}
            }
        }
        Err(Error::InitDied(format!("{init_status:?}")))
    }
}

/// Clones the sandbox's init, which runs the plan: in the `spawner` when there
/// is one and it takes the plan, else here. Not async: the raw exec pointers
/// never live across an await, the spawner's reply is a short blocking wait,
/// and the thread that enters a pooled v1 cgroup to clone init there leaves it
/// before anything else runs on it.
///
/// Init starts in `cgroup` when that cgroup allows it (see
/// [`cgroup::RunCgroup`]): by `CLONE_INTO_CGROUP` on v2, which kernels before
/// 5.7 lack, or from inside on v1. The returned flag says whether it did.
fn spawn(
    plan: &Plan,
    network: Network,
    cgroup: Option<&dyn cgroup::RunCgroup>,
    spawner: Option<&spawner::Spawner>,
) -> Result<(libc::pid_t, OwnedFd, bool), Error> {
    if let Some(spawner) = spawner {
        let into = cgroup.and_then(|c| c.clone_into());
        let moves = match cgroup {
            Some(c) if into.is_none() => c.thread_move()?,
            _ => None,
        };
        let failed_move = |e: Errno| {
            let c = cgroup.expect("only a cgroup is moved into");
            c.thread_move_failed();
            cgroup::CgroupError::Io {
                op: "move the spawner into or out of",
                path: c.dirs().into_iter().next().unwrap_or_default(),
                source: e.into(),
            }
        };
        match spawner.spawn(plan, network, spawner::Placement { into, moves }) {
            Ok(Some(spawned)) => return Ok(spawned),
            // Not for the spawner: cloned from here, below.
            Ok(None) => {}
            Err(spawner::Failed::Enter(e)) => return Err(failed_move(e).into()),
            Err(spawner::Failed::Clone(e)) => return Err(Error::errno("clone3")(e)),
            Err(spawner::Failed::Died(e)) => {
                return Err(Error::errno(
                    "clone init: the spawner died with the request",
                )(e));
            }
            Err(spawner::Failed::Leave(e, pidfd)) => {
                // Init was killed before it was released; this process is its
                // parent and reaps it.
                let _ = nix::sys::wait::waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED);
                return Err(failed_move(e).into());
            }
        }
    }
    let ptrs = ExecPointers::new(plan);
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_PIDFD;
    if network == Network::Isolated {
        flags |= libc::CLONE_NEWNET;
    }
    let mut pidfd: RawFd = -1;
    let mut args = sys::CloneArgs {
        flags: flags as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..sys::CloneArgs::default()
    };
    let into = cgroup.and_then(|c| c.clone_into());
    if let Some(fd) = into {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd.as_raw_fd() as u64;
    }
    let entered = match cgroup {
        Some(c) if into.is_none() => c.enter()?,
        _ => false,
    };
    let cloned = loop {
        // SAFETY: the child runs only `init_main`, which keeps to raw system
        // calls on the plan prepared before the clone and never returns.
        match unsafe { sys::clone3(&mut args) } {
            // A kernel without CLONE_INTO_CGROUP: the caller adds init to its
            // cgroup through cgroup.procs instead.
            Err(Errno::EINVAL | Errno::E2BIG) if args.flags & CLONE_INTO_CGROUP != 0 => {
                args.flags &= !CLONE_INTO_CGROUP;
                args.cgroup = 0;
            }
            result => break result,
        }
    };
    if let Ok(0) = cloned {
        child::init_main(plan, &ptrs);
    }
    let left = match cgroup {
        Some(c) if entered => c.leave(),
        _ => Ok(()),
    };
    let pid = cloned.map_err(Error::errno("clone3"))?;
    // SAFETY: clone3 with CLONE_PIDFD stored a new descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    if let Err(e) = left {
        // Init is still held on its sync pipe: end it rather than run with
        // this thread stuck in the run's cgroup.
        kill_pidfd(&pidfd);
        let _ = nix::sys::wait::waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED);
        return Err(e.into());
    }
    let placed = entered || args.flags & CLONE_INTO_CGROUP != 0;
    Ok((pid, pidfd, placed))
}

/// clone3's flag to start the child in the cgroup `clone_args.cgroup` refers
/// to (Linux 5.7; libc's constant is a truncated `c_int`).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Whether the kernel's OOM killer struck the run. Kernels that do not count
/// OOM kills (v1 before 4.13) only say that the limit was hit: then the run
/// must also have been killed by SIGKILL (`killed`).
fn out_of_memory(usage: &cgroup::Usage, killed: bool) -> bool {
    usage
        .oom_kills
        .map_or(usage.hit_memory_limit && killed, |n| n > 0)
}

/// The child's ends of the pipes; closed in the parent right after clone.
struct ChildFds {
    sync_read: OwnedFd,
    report_write: OwnedFd,
    stdin_read: OwnedFd,
    stdout_write: OwnedFd,
    stderr_write: OwnedFd,
}

/// Owns the sandbox's init: kills and reaps it if the run is abandoned.
struct ChildGuard {
    pidfd: Option<OwnedFd>,
    pid: libc::pid_t,
    /// The run's cgroup: removed once init is reaped, on every path.
    cgroup: Option<Box<dyn cgroup::RunCgroup>>,
}

impl ChildGuard {
    /// Resolves when init has exited (the pidfd turns readable).
    fn exited(&self) -> impl Future<Output = std::io::Result<()>> + use<> {
        let fd = self.pidfd.as_ref().map(|fd| fd.try_clone());
        async move {
            let fd = fd.ok_or_else(|| std::io::Error::other("reaped"))??;
            // SAFETY: the AsyncFd owns `fd` (an OwnedFd) for its whole life, so
            // the descriptor stays open and the same.
            let afd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)?;
            let _ready = afd.readable().await?;
            Ok(())
        }
    }

    /// SIGKILL to init, which takes every process of its PID namespace along,
    /// and (belt and braces) to every process in the run's cgroup.
    fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            kill_pidfd(fd);
        }
        if let Some(cgroup) = &self.cgroup {
            if let Err(e) = cgroup.kill() {
                tracing::warn!(error = %e, "cannot kill the processes of a run cgroup");
            }
        }
    }

    /// What the run used, read from its cgroup, which is then removed. Call
    /// once init is reaped.
    fn remove_cgroup(&mut self) -> cgroup::Usage {
        let Some(mut cgroup) = self.cgroup.take() else {
            return cgroup::Usage::default();
        };
        let usage = cgroup.usage();
        if let Err(e) = cgroup.remove() {
            tracing::warn!(error = %e, "cannot remove a run cgroup");
        }
        usage
    }

    /// Waits for init and collects its status.
    async fn reap(&mut self) -> Result<WaitStatus, Error> {
        self.exited()
            .await
            .map_err(Error::io("wait for the sandbox"))?;
        let fd = self.pidfd.take().expect("reaped once");
        nix::sys::wait::waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED)
            .map_err(Error::errno("reap the sandbox"))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(fd) = self.pidfd.take() {
            kill_pidfd(&fd);
            // A killed PID namespace init exits at once; reap it so that no
            // zombie is left behind.
            let _ = nix::sys::wait::waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED);
            tracing::debug!(pid = self.pid, "killed abandoned sandbox");
        }
        // After init: its PID namespace is gone, so the cgroup is (nearly) empty.
        self.remove_cgroup();
    }
}

fn kill_pidfd(fd: &OwnedFd) {
    // SAFETY: pidfd_send_signal with a live pidfd and no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

fn read_reports(fd: OwnedFd) -> Vec<(u32, u32, i32)> {
    use std::io::Read;
    let mut buf = Vec::new();
    // Every writer is gone once init is reaped: this read cannot block.
    let _ = std::fs::File::from(fd).read_to_end(&mut buf);
    buf.chunks_exact(child::REPORT_LEN)
        .filter_map(child::parse_report)
        .collect()
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(Error::errno("pipe"))
}

fn cstring(bytes: &[u8]) -> Result<CString, Error> {
    CString::new(bytes).map_err(|_| {
        Error::InvalidSpec(format!(
            "{:?} contains a NUL byte",
            String::from_utf8_lossy(bytes)
        ))
    })
}

fn path_str(path: &Path) -> Result<String, Error> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::InvalidSpec(format!("{} is not UTF-8", path.display())))
}

#[cfg(test)]
mod tests;
