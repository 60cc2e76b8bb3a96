//! The launcher seam: how a planned run's init gets cloned.
//!
//! Two launchers stand behind [`Launcher`]: [`Direct`] clones from this
//! process; [`Spawner`] hands the plan to a small single-threaded process
//! that clones it there (see [`spawner`]) and falls back to [`Direct`] when
//! it cannot take a plan. Both end in the one clone routine,
//! [`clone::clone_init`]. [`launch`] turns the run's cgroup's
//! [`Placement`] into descriptors for it and maps its failures to errors.

pub(crate) mod clone;
pub(crate) mod spawner;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag};

use self::clone::{CloneError, Place};
pub(crate) use self::spawner::Spawner;
use crate::cgroup::{CgroupError, Placement, RunCgroup};
use crate::error::Error;
use crate::init::{Init, InitFds};
use crate::plan::Plan;
use crate::{Network, SandboxConfig};

/// Init, cloned.
#[derive(Debug)]
pub(crate) struct Launched {
    pub pid: libc::pid_t,
    /// How the parent waits for and kills init without pid reuse races.
    pub pidfd: OwnedFd,
    /// Init started in the run's cgroup (no need to move it there).
    pub placed: bool,
}

/// Why init was not cloned.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The clone routine failed (in this process or in the spawner).
    Init(CloneError),
    /// The spawner died with the request.
    SpawnerDied(Errno),
}

impl From<CloneError> for Failure {
    fn from(e: CloneError) -> Self {
        Failure::Init(e)
    }
}

/// A request to clone init.
pub(crate) struct Request<'a> {
    pub plan: &'a Plan,
    pub fds: InitFds,
    pub network: Network,
    pub place: Place<'a>,
}

/// Clones the init of a planned run.
pub(crate) trait Launcher: std::fmt::Debug + Send + Sync {
    fn clone_init(&self, request: &Request<'_>) -> Result<Launched, Failure>;

    /// The spawner's pid, while one runs.
    #[cfg(test)]
    fn spawner_pid(&self) -> Option<libc::pid_t> {
        None
    }
}

/// Clones init from this process.
#[derive(Debug)]
pub(crate) struct Direct {
    seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
}

impl Direct {
    pub fn new(seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>) -> Direct {
        Direct { seccomp }
    }

    /// The seccomp program of every plan that wants one.
    pub fn seccomp(&self) -> Option<&fnrun_seccomp::BpfProgram> {
        self.seccomp.as_deref()
    }
}

impl Launcher for Direct {
    fn clone_init(&self, request: &Request<'_>) -> Result<Launched, Failure> {
        let init = Init::new(request.plan, request.fds, self.seccomp.as_deref());
        Ok(clone::clone_init(
            &init,
            request.network == Network::Isolated,
            false,
            &request.place,
        )?)
    }
}

/// The launcher `config` asks for.
pub(crate) fn launcher(config: &SandboxConfig) -> Box<dyn Launcher> {
    let direct = Direct::new(config.seccomp.clone());
    if config.spawner {
        Box::new(Spawner::new(direct, config.spawner_exe.clone()))
    } else {
        Box::new(direct)
    }
}

/// Clones init for `plan` with `launcher`, starting it in `cgroup` when the
/// cgroup places it by clone (see [`Placement`]).
pub(crate) fn launch(
    launcher: &dyn Launcher,
    plan: &Plan,
    fds: InitFds,
    network: Network,
    cgroup: Option<&dyn RunCgroup>,
) -> Result<Launched, Error> {
    let placement = match cgroup {
        Some(c) => c.placement()?,
        None => Placement::AdmitAfter,
    };
    let place = match &placement {
        Placement::CloneInto(fd) => Place::Into(*fd),
        Placement::ThreadMove { enter, leave } => Place::Move {
            enter: enter.iter().map(AsFd::as_fd).collect(),
            leave: leave.clone(),
        },
        Placement::AdmitAfter => Place::After,
    };
    let moved = |op: &'static str, e: Errno| -> Error {
        let c = cgroup.expect("only a cgroup is moved into");
        c.placement_failed();
        CgroupError::Io {
            op,
            path: c.dirs().into_iter().next().unwrap_or_default(),
            source: e.into(),
        }
        .into()
    };
    let request = Request {
        plan,
        fds,
        network,
        place,
    };
    match launcher.clone_init(&request) {
        Ok(launched) => Ok(launched),
        Err(Failure::Init(CloneError::Enter(e))) => Err(moved("move the cloning thread into", e)),
        Err(Failure::Init(CloneError::Leave(e, pidfd))) => {
            if let Some(pidfd) = pidfd {
                // Killed before it was released; this process reaps it.
                let _ = nix::sys::wait::waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED);
            }
            Err(moved("move the cloning thread out of", e))
        }
        Err(Failure::Init(CloneError::Clone(e))) => Err(Error::errno("clone3")(e)),
        Err(Failure::SpawnerDied(e)) => Err(Error::errno(
            "clone init: the spawner died with the request",
        )(e)),
    }
}
