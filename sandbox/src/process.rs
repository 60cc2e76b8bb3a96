//! A run's init from launch to reap, shared by both kinds of run.
//!
//! [`Sandbox::start`] makes the pipes, plans the run, prepares its cgroup,
//! launches init, places it in the cgroup, writes its id maps and releases
//! it: init builds the root and then waits for the call, which
//! [`Started::go`] hands it. [`InitGuard`] then owns init: it waits for it, kills it (and everything
//! in its PID namespace and cgroup), reaps it and removes its cgroup, on
//! every path, drops included. [`ended`] reads how the run ended from init's
//! [`Report`]s, its wait status and the cgroup's usage.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus};
use tokio::io::unix::AsyncFd;

use crate::cgroup::{RunCgroup, Usage};
use crate::error::Error;
use crate::init::{InitFds, Report};
use crate::launch;
use crate::netns;
use crate::plan::{self, Plan};
use crate::{Network, RunSpec, Sandbox, sys};

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

/// The parent's ends of a started run's pipes.
pub(crate) struct ParentEnds {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    /// `None` when stderr shares stdout's pipe (a service run).
    pub stderr: Option<OwnedFd>,
    /// A service run's end of the sockets channel.
    pub sockets: Option<OwnedFd>,
    /// Init's [`Report`]s; read once init is reaped.
    pub report: OwnedFd,
}

/// A run whose init is released: it builds the root, then waits for
/// [`Started::go`].
pub(crate) struct Started {
    pub guard: InitGuard,
    pub ends: ParentEnds,
    /// What init walked, for error messages.
    pub plan: Plan,
    /// Just before the clone.
    pub at: Instant,
    /// The parent's end of the sync pipe, for the call's byte.
    pub go: Go,
}

impl Started {
    /// Lets the function exec (see [`Go::send`]).
    pub fn go(&self) {
        self.go.send();
    }
}

/// The parent's end of a run's sync pipe, once init is released: one more
/// byte lets the function exec.
pub(crate) struct Go(OwnedFd);

impl Go {
    /// Lets the function exec. A dead init is no error here: how it ended
    /// is read once it is reaped (its report, or [`Error::InitDied`]).
    pub fn send(&self) {
        let _ = sys::write_all(self.0.as_raw_fd(), &[1]);
    }
}

/// How a run's stdout and stderr reach the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A per-call run: stdout and stderr apart.
    Call,
    /// A service run: stdout and stderr in one pipe, and a sockets channel.
    Service,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(Error::errno("create a pipe"))
}

impl Sandbox {
    /// Starts a run of `spec`: on return, init is in its cgroup, under its
    /// limits, with its id maps, building the root.
    pub(crate) fn start(&self, spec: &RunSpec, kind: Kind) -> Result<Started, Error> {
        let at = Instant::now();
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let stderr = match kind {
            Kind::Call => Some(pipe()?),
            Kind::Service => None,
        };
        let sockets = match kind {
            Kind::Call => None,
            Kind::Service => Some(
                socketpair(
                    AddressFamily::Unix,
                    SockType::SeqPacket,
                    None,
                    SockFlag::SOCK_CLOEXEC,
                )
                .map_err(Error::errno("create the sockets channel"))?,
            ),
        };
        let (sync_read, sync_write) = pipe()?;
        let (report_read, report_write) = pipe()?;
        let fds = InitFds {
            sync: sync_read.as_raw_fd(),
            report: report_write.as_raw_fd(),
            stdin: stdin_read.as_raw_fd(),
            stdout: stdout_write.as_raw_fd(),
            stderr: stderr
                .as_ref()
                .map_or(stdout_write.as_raw_fd(), |(_, w)| w.as_raw_fd()),
            sockets: sockets.as_ref().map(|(_, theirs)| theirs.as_raw_fd()),
        };
        let run_tag = format!(
            "{:x}",
            at.elapsed().as_nanos() ^ u128::from(std::process::id())
        );
        // A per-call ISOLATED run takes a network namespace of its kind's,
        // where they are shared; it gives it back once its init is reaped.
        let net = match (&self.nets, kind, spec.network) {
            (Some(nets), Kind::Call, Network::Isolated) => nets.take_or_own(spec),
            _ => None,
        };
        let plan = plan::plan(&self.config, self.last_cap, spec, &run_tag, net.is_some())?;
        // The run's cgroup, with its limits, exists before init does.
        let limits = self.limiter.prepare(
            &spec.limits,
            self.config.default_pids_limit,
            self.config.best_effort_limits,
        )?;
        let launched = launch::launch(
            self.launcher.as_ref(),
            &plan,
            fds,
            match (&net, spec.network) {
                (Some(lease), _) => launch::Net::Join(lease.fd()),
                (None, Network::Isolated) => launch::Net::New,
                (None, Network::Runner) => launch::Net::Runner,
            },
            limits.cgroup.as_deref(),
        )?;
        let mut guard = InitGuard {
            pidfd: Some(launched.pidfd),
            pid: launched.pid,
            cgroup: limits.cgroup,
            net,
        };
        // Only init holds these now: EOF on the parent's ends means init and
        // everything it started are gone.
        drop((sync_read, report_write, stdin_read, stdout_write));
        let (stderr_read, sockets) = (
            stderr.map(|(read, _write)| read),
            sockets.map(|(ours, _theirs)| ours),
        );

        // Init waits on the sync pipe: nothing of the run happens before it
        // is in its cgroup, under its limits, with its id maps.
        if let Some(cgroup) = &mut guard.cgroup {
            cgroup.admit(launched.pid, launched.placed)?;
        }
        if let Some(nproc) = limits.nproc {
            sys::lower_nproc(launched.pid, nproc).map_err(|e| Error::Io {
                op: "set RLIMIT_NPROC of the sandbox",
                path: None,
                source: e.into(),
            })?;
        }
        self.config
            .id_map
            .write(launched.pid, spec.caller)
            .map_err(Error::io_at(
                "write the id maps of",
                format!("/proc/{}", launched.pid),
            ))?;
        sys::write_all(sync_write.as_raw_fd(), &[1]).map_err(Error::errno("release init"))?;
        Ok(Started {
            guard,
            ends: ParentEnds {
                stdin: stdin_write,
                stdout: stdout_read,
                stderr: stderr_read,
                sockets,
                report: report_read,
            },
            plan,
            at,
            go: Go(sync_write),
        })
    }
}

/// Owns a run's init: kills and reaps it, and removes its cgroup, if the run
/// is abandoned.
pub(crate) struct InitGuard {
    pidfd: Option<OwnedFd>,
    pid: libc::pid_t,
    /// The run's cgroup: removed once init is reaped, on every path.
    cgroup: Option<Box<dyn RunCgroup>>,
    /// Its kind's network namespace, given back once init is reaped (every
    /// process of the run is dead then), on every path.
    net: Option<netns::Lease>,
}

impl InitGuard {
    /// Init's pid (in this process's PID namespace).
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The run's memory at its highest so far, as its cgroup counts it;
    /// `None` without a cgroup or a memory controller.
    pub fn peak_memory(&self) -> Option<u64> {
        self.cgroup.as_ref()?.peak_memory()
    }

    /// Resolves when init has exited (its pidfd turns readable).
    pub fn exited(&self) -> impl Future<Output = std::io::Result<()>> + use<> {
        let fd = self.pidfd.as_ref().map(|fd| fd.try_clone());
        async move {
            let fd = fd.ok_or_else(|| std::io::Error::other("init was reaped"))??;
            // SAFETY: the AsyncFd owns `fd` (an OwnedFd) for its whole life, so
            // the descriptor stays open and the same.
            let afd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)?;
            let _ready = afd.readable().await?;
            Ok(())
        }
    }

    /// Whether init has exited already (its pidfd is readable), without
    /// waiting.
    pub fn has_exited(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return true;
        };
        // A pidfd that cannot be polled counts as exited: such a run is not
        // to be used.
        sys::readable_now(fd.as_raw_fd()).unwrap_or(true)
    }

    /// SIGKILL to init, which takes every process of its PID namespace along,
    /// and (belt and braces) to every process in the run's cgroup.
    pub fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            sys::pidfd_kill(fd.as_fd());
        }
        if let Some(cgroup) = &self.cgroup
            && let Err(e) = cgroup.kill()
        {
            tracing::warn!(error = %e, "cannot kill the processes of a run cgroup");
        }
    }

    /// Waits for init and collects its status.
    pub async fn reap(&mut self) -> Result<WaitStatus, Error> {
        self.exited()
            .await
            .map_err(Error::io("wait for the sandbox"))?;
        let fd = self.pidfd.take().expect("reaped once");
        let reaped = nix::sys::wait::waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED)
            .map_err(Error::errno("reap the sandbox"));
        // Init has exited: its PID namespace, and every process of the
        // run, are gone.
        drop(self.net.take());
        reaped
    }

    /// What the run has used so far, read from its cgroup; nothing without
    /// one.
    pub fn usage(&self) -> Usage {
        self.cgroup
            .as_ref()
            .map_or_else(Usage::default, |cgroup| cgroup.usage())
    }

    /// What the run used, read from its cgroup, which is then removed. Call
    /// once init is reaped.
    pub fn remove_cgroup(&mut self) -> Usage {
        let usage = self.usage();
        self.discard_cgroup();
        usage
    }

    /// Removes the run's cgroup without reading it. Call once init is
    /// reaped.
    pub fn discard_cgroup(&mut self) {
        if let Some(mut cgroup) = self.cgroup.take()
            && let Err(e) = cgroup.remove()
        {
            tracing::warn!(error = %e, "cannot remove a run cgroup");
        }
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        if let Some(fd) = self.pidfd.take() {
            sys::pidfd_kill(fd.as_fd());
            // A killed PID namespace init exits at once; reap it so that no
            // zombie is left behind.
            let _ = nix::sys::wait::waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED);
            tracing::debug!(pid = self.pid, "killed an abandoned sandbox");
        }
        drop(self.net.take());
        // After init: its PID namespace is gone, so the cgroup is (nearly) empty.
        self.remove_cgroup();
    }
}

/// How a run ended: `cut` when the parent ended it (a timeout, too much
/// output), else what init reported of the function, with the kernel's OOM
/// killer as the better explanation of a failure where the cgroup saw it.
pub(crate) fn ended(
    plan: &Plan,
    cut: Option<Status>,
    reports: &[Report],
    init_status: Option<WaitStatus>,
    usage: &Usage,
) -> Result<Status, Error> {
    // Init and the function stop at their first report.
    let reported = || match reports.first() {
        Some(Report::Failed { stage, errno }) => {
            Err(stage.error(plan, nix::errno::Errno::from_raw(*errno)))
        }
        // A raw wait status as the function's init saw it.
        Some(Report::Exited { status }) => Ok(if libc::WIFSIGNALED(*status) {
            Status::Signaled(libc::WTERMSIG(*status))
        } else {
            Status::Exited(libc::WEXITSTATUS(*status))
        }),
        // `read_all` leaves `Ready` out: only a result counts.
        None | Some(Report::Ready) => Err(Error::InitDied {
            status: init_status.map_or_else(|| "unknown".to_owned(), |s| format!("{s:?}")),
        }),
    };
    let status = match cut {
        Some(status) => return Ok(status),
        None => reported(),
    };
    Ok(match status {
        Ok(Status::Exited(code)) if code != 0 && out_of_memory(usage, code == 128 + 9) => {
            Status::OutOfMemory
        }
        Ok(Status::Signaled(sig)) if out_of_memory(usage, sig == libc::SIGKILL) => {
            Status::OutOfMemory
        }
        Err(Error::InitDied { .. }) if out_of_memory(usage, true) => Status::OutOfMemory,
        other => other?,
    })
}

/// Whether the kernel's OOM killer struck the run. Kernels that do not count
/// OOM kills (v1 before 4.13) only say that the limit was hit: then the run
/// must also have been killed by SIGKILL (`killed`).
fn out_of_memory(usage: &Usage, killed: bool) -> bool {
    usage
        .oom_kills
        .map_or(usage.hit_memory_limit && killed, |n| n > 0)
}
