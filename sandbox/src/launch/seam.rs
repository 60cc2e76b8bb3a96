//! The launcher seam itself: the [`Launcher`] trait with its request and
//! failure, and [`Direct`], the launcher that clones from this process (the
//! spawner falls back to it). Below `launch` and the spawner, which use it.

use std::sync::Arc;

use nix::errno::Errno;

use super::clone::{self, CloneError, Launched, Place};
use crate::Network;
use crate::init::{Init, InitFds};
use crate::plan::Plan;

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
