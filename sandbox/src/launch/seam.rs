//! The launcher seam itself: the [`Launcher`] trait with its request and
//! failure, and [`Direct`], the launcher that clones from this process (the
//! spawner falls back to it). Below `launch` and the spawner, which use it.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;

use super::clone::{self, CloneError, Launched, Net, Place};
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
    pub net: Net<'a>,
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

/// Clones init from this process, on a thread of its own.
///
/// Init's parent-death signal fires when the *thread* that cloned it ends,
/// not the process. Cloned from a caller's thread (a tokio blocking thread
/// ends after 10 s idle), a run or a function server would be killed when
/// that thread went; so every clone happens on one thread that lives as long
/// as the launcher (the sandbox), as the spawner's forking thread does.
#[derive(Debug)]
pub(crate) struct Direct {
    seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
    /// Where clones are done; started at the first.
    thread: Mutex<Option<mpsc::Sender<Job>>>,
}

/// A clone for the clone thread to do.
type Job = Box<dyn FnOnce() + Send>;

/// [`Place`] with raw descriptors, to cross to the clone thread: valid while
/// the caller, which owns them, waits for the clone's answer.
enum RawPlace {
    Into(RawFd),
    Move {
        enter: Vec<RawFd>,
        leave: Vec<RawFd>,
    },
    After,
}

impl RawPlace {
    fn of(place: &Place<'_>) -> RawPlace {
        let raw = |fds: &[BorrowedFd<'_>]| fds.iter().map(AsRawFd::as_raw_fd).collect();
        match place {
            Place::Into(fd) => RawPlace::Into(fd.as_raw_fd()),
            Place::Move { enter, leave } => RawPlace::Move {
                enter: raw(enter),
                leave: raw(leave),
            },
            Place::After => RawPlace::After,
        }
    }

    /// # Safety
    /// Every descriptor must stay open while the returned place is used.
    unsafe fn place(&self) -> Place<'_> {
        let borrow = |fds: &[RawFd]| {
            fds.iter()
                // SAFETY: the caller keeps the descriptors open (see above).
                .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
                .collect()
        };
        match self {
            // SAFETY: as above.
            RawPlace::Into(fd) => Place::Into(unsafe { BorrowedFd::borrow_raw(*fd) }),
            RawPlace::Move { enter, leave } => Place::Move {
                enter: borrow(enter),
                leave: borrow(leave),
            },
            RawPlace::After => Place::After,
        }
    }
}

impl Direct {
    pub fn new(seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>) -> Direct {
        Direct {
            seccomp,
            thread: Mutex::new(None),
        }
    }

    /// The seccomp program of every plan that wants one.
    pub fn seccomp(&self) -> Option<&fnrun_seccomp::BpfProgram> {
        self.seccomp.as_deref()
    }

    /// Runs `job` on the clone thread, starting it if needed; `false` if it
    /// cannot be started (the job is then not run).
    fn on_clone_thread(&self, job: Job) -> bool {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        let job = match thread.as_ref() {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return true,
                // The thread is gone (it panicked): start another.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("fnrun-clone".into())
            .spawn(move || {
                // Ends when the launcher is dropped; inits cloned here get
                // their parent-death signal then, with their sandbox.
                for job in queue {
                    job();
                }
            });
        if started.is_err() {
            return false;
        }
        let sent = jobs.send(job).is_ok();
        *thread = Some(jobs);
        sent
    }
}

impl Launcher for Direct {
    fn clone_init(&self, request: &Request<'_>) -> Result<Launched, Failure> {
        let plan = request.plan.clone();
        let fds = request.fds;
        // The kind's namespace, as a number, as the place's descriptors.
        let net = match request.net {
            Net::New => None,
            Net::Runner => Some(-1),
            Net::Join(fd) => Some(fd.as_raw_fd()),
        };
        let place = RawPlace::of(&request.place);
        let seccomp = self.seccomp.clone();
        let (answer, answered) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let init = Init::new(&plan, fds, seccomp.as_deref());
            // SAFETY: the caller of `clone_init` owns the place's descriptors
            // and holds them open until it has this answer.
            let place = unsafe { place.place() };
            let net = match net {
                None => Net::New,
                Some(-1) => Net::Runner,
                // SAFETY: as above.
                Some(fd) => Net::Join(unsafe { BorrowedFd::borrow_raw(fd) }),
            };
            let _ = answer.send(clone::clone_init(&init, net, false, &place));
        });
        if !self.on_clone_thread(job) {
            return Err(Failure::Init(CloneError::Clone(Errno::EAGAIN)));
        }
        // The job always answers, unless the clone thread died with it
        // (a panic there): then nothing was cloned that this could reap.
        match answered.recv() {
            Ok(cloned) => Ok(cloned?),
            Err(_) => Err(Failure::Init(CloneError::Clone(Errno::EAGAIN))),
        }
    }
}
