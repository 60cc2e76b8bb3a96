//! One function run in a fresh sandbox.
//!
//! [`Sandbox::run`] clones a child into new user, mount, PID, IPC, UTS, cgroup
//! and (for [`Network::Isolated`]) network namespaces, maps ids, builds a root
//! filesystem from read-only layer directories with a throwaway writable layer,
//! pivots into it, drops every privilege and execs the function. The caller's
//! input is written to its stdin while stdout and stderr are read, so no size of
//! either deadlocks; the timeout kills every process of the run.
//!
//! The spawn is built directly on raw system calls (see [`child`] and [`sys`]):
//! all the child needs is prepared before clone, so it is safe to call from a
//! multi-threaded tokio runtime. `docs/sandbox.md` walks through the sequence.

mod child;
mod idmap;
mod stdio;
mod sys;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use tokio::io::unix::AsyncFd;

use crate::child::{ExecPointers, Plan};
pub use crate::child::{ExecStage, Step};
pub use crate::idmap::IdMap;

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
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

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
        Ok(Sandbox { config, last_cap })
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
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
        //    upper layer lives in the scratch tmpfs. `userxattr` because the
        //    mount happens inside a user namespace.
        let (chdir, lowers) = overlay_lowers(&spec.layers, &scratch)?;
        if let Some(dir) = chdir {
            steps.push(Step::Chdir { path: c(&dir)? });
        }
        let overlay_opts =
            format!("lowerdir={lowers},upperdir={scratch}/upper,workdir={scratch}/work,userxattr");
        if overlay_opts.len() > 4000 {
            return Err(Error::InvalidSpec(format!(
                "{} layers do not fit in one overlay mount",
                spec.layers.len()
            )));
        }
        steps.push(mount(
            Some("overlay"),
            &root,
            Some("overlay"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&overlay_opts),
        )?);
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
        // 6. Drop the host's root for good.
        steps.push(Step::Detach {
            path: c(&format!("/{old_root}"))?,
        });
        steps.push(Step::Rmdir {
            path: c(&format!("/{old_root}"))?,
        });
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
        let (pid, pidfd) = spawn(&plan, spec.network)?;
        let mut guard = ChildGuard {
            pidfd: Some(pidfd),
            pid,
        };
        drop(child_fds);

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
        let reports = read_reports(report_read);
        let status = match status {
            Some(status) => status,
            None => self.interpret(&plan, &reports, init_status)?,
        };
        Ok(Outcome {
            status,
            stdout: io.stdout,
            stderr_tail: io.stderr_tail,
            elapsed: start.elapsed(),
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

/// Clones the sandbox's init, which runs the plan. Not async: the raw exec
/// pointers never live across an await.
fn spawn(plan: &Plan, network: Network) -> Result<(libc::pid_t, OwnedFd), Error> {
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
    // SAFETY: the child runs only `init_main`, which keeps to raw system calls
    // on the plan prepared before the clone and never returns.
    let pid = unsafe { sys::clone3(&mut args) }.map_err(Error::errno("clone3"))?;
    if pid == 0 {
        child::init_main(plan, &ptrs);
    }
    // SAFETY: clone3 with CLONE_PIDFD stored a new descriptor that we now own.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
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

    /// SIGKILL to init, which takes every process of its PID namespace along.
    fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            kill_pidfd(fd);
        }
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

/// The overlay `lowerdir` value (top layer first) and the directory to chdir
/// to first so the value can use short relative names.
fn overlay_lowers(layers: &[PathBuf], scratch: &str) -> Result<(Option<String>, String), Error> {
    if layers.is_empty() {
        return Ok((None, format!("{scratch}/empty")));
    }
    let mut names = Vec::with_capacity(layers.len());
    let parent = layers[0].parent();
    let same_parent = layers.iter().all(|l| l.parent() == parent);
    for layer in layers.iter().rev() {
        let s = if same_parent {
            layer
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
        } else {
            layer.to_str().map(str::to_owned)
        }
        .ok_or_else(|| Error::InvalidSpec(format!("layer {} is not UTF-8", layer.display())))?;
        if s.contains([':', ',', '\\']) || !layer.is_absolute() {
            return Err(Error::InvalidSpec(format!(
                "layer path {} cannot be an overlay lower directory",
                layer.display()
            )));
        }
        names.push(s);
    }
    let chdir = if same_parent {
        parent.map(path_str).transpose()?
    } else {
        None
    };
    Ok((chdir, names.join(":")))
}

#[cfg(test)]
mod tests;
