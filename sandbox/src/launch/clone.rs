//! The one routine that clones a run's init, used by this process (the
//! direct launcher) and by the spawner alike.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

use crate::init::{self, Init};
use crate::sys;

/// Init, cloned.
#[derive(Debug)]
pub(crate) struct Launched {
    pub pid: libc::pid_t,
    /// How the parent waits for and kills init without pid reuse races.
    pub pidfd: OwnedFd,
    /// Init started in the run's cgroup (no need to move it there).
    pub placed: bool,
}

/// Where init starts, as descriptors: a cgroup's [`crate::cgroup::Placement`]
/// in this process, or what the spawner received for it.
#[derive(Debug)]
pub(crate) enum Place<'a> {
    /// `clone3(CLONE_INTO_CGROUP)` into this cgroup directory.
    Into(BorrowedFd<'a>),
    /// The cloning thread writes `"0"` to each `enter` file (moving itself,
    /// alone, into the run's cgroups), clones, and writes `"0"` to each
    /// `leave` file (back home).
    Move {
        enter: Vec<BorrowedFd<'a>>,
        leave: Vec<BorrowedFd<'a>>,
    },
    /// Wherever the cloning thread is; the parent moves init afterwards.
    After,
}

/// Which network namespace init starts in.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Net<'a> {
    /// A new one (`CLONE_NEWNET`), owned by init's new user namespace.
    New,
    /// The cloning process's own.
    Runner,
    /// An existing one, a kind's (see `netns`): the cloning thread enters it
    /// for the clone and goes back to its own right after, so that init
    /// starts there without `CLONE_NEWNET` and its new user namespace owns
    /// nothing of it.
    Join(BorrowedFd<'a>),
}

/// Why [`clone_init`] did not clone init.
#[derive(Debug)]
pub(crate) enum CloneError {
    /// Moving the cloning thread into the run's cgroup failed; it is back
    /// where it was.
    Enter(Errno),
    /// clone3 failed.
    Clone(Errno),
    /// The cloning thread could not leave the run's cgroup; init, if it was
    /// cloned, was killed (the caller reaps it through this pidfd).
    Leave(Errno, Option<OwnedFd>),
}

/// clone3's flag to start the child in the cgroup `clone_args.cgroup` refers
/// to (Linux 5.7; libc's constant is a truncated `c_int`).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Clones init for `init` into new namespaces (and the network namespace
/// `net` says), as this process's sibling when `sibling` (the spawner: its
/// parent stays init's parent), placed as `place` says.
///
/// Not async, and nothing else runs on the calling thread meanwhile: a thread
/// that moved itself into a run's cgroup leaves it before it returns.
pub(crate) fn clone_init(
    init: &Init<'_>,
    net: Net<'_>,
    sibling: bool,
    place: &Place<'_>,
) -> Result<Launched, CloneError> {
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_PIDFD;
    if let Net::New = net {
        flags |= libc::CLONE_NEWNET;
    }
    if sibling {
        flags |= libc::CLONE_PARENT;
    }
    let mut pidfd: RawFd = -1;
    let mut args = sys::CloneArgs {
        flags: u64::try_from(flags).expect("clone flags are positive"),
        pidfd: &mut pidfd as *mut RawFd as u64,
        // With CLONE_PARENT the kernel uses the caller's own exit signal.
        exit_signal: if sibling {
            0
        } else {
            libc::SIGCHLD.unsigned_abs().into()
        },
        ..sys::CloneArgs::default()
    };
    let (enter, leave): (&[BorrowedFd<'_>], &[BorrowedFd<'_>]) = match place {
        Place::Into(fd) => {
            args.flags |= CLONE_INTO_CGROUP;
            args.cgroup = u64::try_from(fd.as_raw_fd()).expect("descriptors are positive");
            (&[], &[])
        }
        Place::Move { enter, leave } => (enter, leave),
        Place::After => (&[], &[]),
    };
    let go_home = || {
        leave
            .iter()
            .try_for_each(|f| sys::write_all(f.as_raw_fd(), b"0"))
    };
    // The way back to this thread's own network namespace, taken before
    // it leaves it.
    let home = match net {
        Net::Join(ns) => {
            let home = sys::open_cloexec(c"/proc/thread-self/ns/net").map_err(CloneError::Clone)?;
            sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET).map_err(CloneError::Clone)?;
            Some(home)
        }
        Net::New | Net::Runner => None,
    };
    let net_home = || match &home {
        Some(home) => sys::setns(home.as_raw_fd(), libc::CLONE_NEWNET),
        None => Ok(()),
    };
    for f in enter {
        if let Err(e) = sys::write_all(f.as_raw_fd(), b"0") {
            let _ = net_home();
            return Err(match go_home() {
                Ok(()) => CloneError::Enter(e),
                Err(e) => CloneError::Leave(e, None),
            });
        }
    }
    let cloned = loop {
        // SAFETY: the child runs only `init_main`, which keeps to raw system
        // calls on the plan prepared before the clone and never returns.
        match unsafe { sys::clone3(&mut args) } {
            // A kernel without CLONE_INTO_CGROUP: init is moved in by the
            // parent instead.
            Err(Errno::EINVAL | Errno::E2BIG) if args.flags & CLONE_INTO_CGROUP != 0 => {
                args.flags &= !CLONE_INTO_CGROUP;
                args.cgroup = 0;
            }
            result => break result,
        }
    };
    if let Ok(0) = cloned {
        init::init_main(init);
    }
    // Back in this thread's own network namespace, then its own cgroups.
    let net_back = net_home();
    let left = go_home().and(net_back);
    let pid = match cloned {
        Ok(pid) => pid,
        Err(e) => {
            return Err(match left {
                Ok(()) => CloneError::Clone(e),
                Err(e) => CloneError::Leave(e, None),
            });
        }
    };
    // SAFETY: clone3 with CLONE_PIDFD stored a new descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let placed = !enter.is_empty() || args.flags & CLONE_INTO_CGROUP != 0;
    match left {
        Ok(()) => Ok(Launched { pid, pidfd, placed }),
        Err(e) => {
            // Init is still held on its sync pipe: end it rather than run
            // with this thread stuck in the run's cgroup.
            sys::pidfd_kill(pidfd.as_fd());
            Err(CloneError::Leave(e, Some(pidfd)))
        }
    }
}
