//! The launcher seam: how a planned run's init gets cloned.
//!
//! Two launchers stand behind [`Launcher`]: [`Direct`] clones from this
//! process; [`Spawner`] hands the plan to a small single-threaded process
//! that clones it there (see [`spawner`]) and falls back to [`Direct`] when
//! it cannot take a plan. Both end in the one clone routine,
//! [`clone::clone_init`]. [`launch`] turns the run's cgroup's
//! [`Placement`] into descriptors for it and maps its failures to errors.

pub(crate) mod clone;
mod seam;
pub(crate) mod spawner;

use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag};

pub(crate) use self::clone::Launched;
pub(crate) use self::clone::Net;
use self::clone::{CloneError, Place};
pub(crate) use self::seam::{Direct, Failure, Launcher, Request};
pub(crate) use self::spawner::Spawner;
use crate::SandboxConfig;
use crate::cgroup::{CgroupError, Placement, RunCgroup};
use crate::error::Error;
use crate::init::InitFds;
use crate::plan::Plan;

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
    net: Net<'_>,
    cgroup: Option<&dyn RunCgroup>,
) -> Result<Launched, Error> {
    let placement = match cgroup {
        Some(c) => c.placement()?,
        None => Placement::AdmitAfter,
    };
    let place = match &placement {
        Placement::CloneInto(fd) => Place::Into(*fd),
        Placement::ThreadMove { enter, leave } => Place::Move {
            enter: enter.clone(),
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
        net,
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
            match cgroup {
                Some(_) => Err(moved("move the cloning thread out of", e)),
                // Only a kind's network namespace was left (see `Net::Join`).
                None => Err(Error::errno(
                    "clone init: return to the runner's network namespace",
                )(e)),
            }
        }
        Err(Failure::Init(CloneError::Clone(e))) => Err(Error::errno("clone3")(e)),
        Err(Failure::SpawnerDied(e)) => Err(Error::errno(
            "clone init: the spawner died with the request",
        )(e)),
    }
}
