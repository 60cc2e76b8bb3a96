//! The spawner process: decodes each request, clones init with the one
//! clone routine, and answers.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use super::protocol::{self, FailedAt, Hello, MAX_FDS, MAX_REQUEST, Reply, SPAWNER_ARG};
use crate::init::Init;
use crate::launch::clone::{self, CloneError};
use crate::sys;

/// The spawner's socket, once it is set up.
const SOCK: RawFd = 3;

/// Serves as the spawner if this process was exec'd as one; returns otherwise.
/// A binary named in [`crate::SandboxConfig::spawner_exe`] calls it first
/// thing in `main`, before any thread starts.
pub fn run_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SPAWNER_ARG)) {
        return;
    }
    let parent = args
        .next()
        .and_then(|a| a.to_str()?.parse().ok())
        .unwrap_or(-1);
    serve(SOCK, parent);
}

/// The spawner's main loop, on socket `sock`, for the runner `parent`.
/// Never returns.
pub(super) fn serve(sock: RawFd, parent: libc::pid_t) -> ! {
    // Killed when the forking thread ends; it may already have.
    if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).is_err()
        || sys::parent_pid() != parent
    {
        sys::exit(1);
    }
    // The runner's signal handlers (the runtime's, which write to a
    // descriptor of the runner) must never run here, where that number may be
    // a run's pipe; and the spawner leaves the runner's process group (no
    // terminal's Ctrl-C).
    if sys::reset_signals().is_err() || sys::own_process_group().is_err() {
        sys::exit(1);
    }
    // Only the socket (at 3) and stdio stay open: the runner's other
    // descriptors (listening sockets, locks, other runs' pipes) are not the
    // spawner's. Stdio goes to /dev/null: the runner's may be a log pipe its
    // reader waits on, and 0-2 stay taken, so no received descriptor lands
    // there (init's descriptors must not be 0-2, which the function's stdio
    // replaces).
    if (sock != SOCK && sys::dup2(sock, SOCK).is_err())
        || sys::keep_on_exec(SOCK).is_err()
        || sys::stdio_to_null().is_err()
    {
        sys::exit(1);
    }
    sys::close_range(4, u32::MAX);
    // The name the inits it clones carry too, exec'd or forked.
    sys::set_name(c"fnrun-spawner");

    let mut buf = vec![0u8; MAX_REQUEST];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    // First the hello: the seccomp program of every plan.
    let seccomp = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(SOCK, &mut iov, None, MsgFlags::empty()) {
            Ok(msg) if msg.bytes > 0 => {
                let n = msg.bytes;
                match postcard::from_bytes::<Hello>(&buf[..n]) {
                    Ok(hello) => break hello.program(),
                    Err(_) => sys::exit(1),
                }
            }
            Ok(_) => sys::exit(0),
            Err(Errno::EINTR) => continue,
            Err(_) => sys::exit(1),
        }
    };
    loop {
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            match recvmsg::<()>(SOCK, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(msg) if msg.bytes == 0 => sys::exit(0),
                Ok(msg) => {
                    let mut fds = Vec::new();
                    for c in msg.cmsgs().into_iter().flatten() {
                        if let ControlMessageOwned::ScmRights(received) = c {
                            // SAFETY: SCM_RIGHTS installed new descriptors we own.
                            fds.extend(
                                received
                                    .into_iter()
                                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                            );
                        }
                    }
                    (msg.bytes, fds)
                }
                Err(Errno::EINTR) => continue,
                Err(_) => sys::exit(1),
            }
        };
        let (reply, pidfd) = handle(&buf[..n], &fds, seccomp.as_ref());
        drop(fds);
        let Ok(bytes) = postcard::to_allocvec(&reply) else {
            sys::exit(1)
        };
        let passed: Vec<RawFd> = pidfd.iter().map(AsRawFd::as_raw_fd).collect();
        let cmsg = [ControlMessage::ScmRights(&passed)];
        let cmsgs: &[ControlMessage] = if passed.is_empty() { &[] } else { &cmsg };
        let sent = sendmsg::<()>(
            SOCK,
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        );
        drop(pidfd);
        let stuck = matches!(
            reply,
            Reply::Failed {
                at: FailedAt::Leave,
                ..
            }
        );
        if sent.is_err() || stuck {
            // The runner is gone, or this process is stuck in a run's cgroup.
            sys::exit(1);
        }
    }
}

/// Handles one request: the reply and, when init was cloned, its pidfd.
fn handle(
    body: &[u8],
    fds: &[OwnedFd],
    seccomp: Option<&fnrun_seccomp::BpfProgram>,
) -> (Reply, Option<OwnedFd>) {
    let failed = |at, e: Errno| Reply::Failed {
        at,
        errno: e as i32,
    };
    let Some((header, plan)) = protocol::decode_request(body) else {
        return (failed(FailedAt::Request, Errno::EPROTO), None);
    };
    let Some((init_fds, net, place)) = header.split(fds) else {
        return (failed(FailedAt::Request, Errno::EPROTO), None);
    };
    let init = Init::new(&plan, init_fds, seccomp);
    match clone::clone_init(&init, net, true, &place) {
        Ok(l) => (
            Reply::Cloned {
                pid: l.pid,
                placed: l.placed,
            },
            Some(l.pidfd),
        ),
        Err(CloneError::Enter(e)) => (failed(FailedAt::Enter, e), None),
        Err(CloneError::Clone(e)) => (failed(FailedAt::Clone, e), None),
        Err(CloneError::Leave(e, pidfd)) => (failed(FailedAt::Leave, e), pidfd),
    }
}
