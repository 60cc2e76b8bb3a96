//! The spawner: a small single-threaded process that clones every init.
//!
//! Cloning init from the runner itself copies the runner's page tables and
//! write-protects all its private memory. Every page a runner thread writes
//! afterwards takes a copy-on-write fault, with a TLB shootdown to each CPU
//! running another runner thread. Under load, that was about a fifth of all
//! CPU time (`docs/benchmarks.md`). The spawner is started once and is
//! single-threaded, and it writes almost nothing, so the runner no longer
//! takes those faults, and the spawner's own faults need no shootdowns.
//!
//! - **Started once, from a thread of its own.** The thread forks with
//!   glibc's `fork()`, which leaves malloc usable in the child of a threaded
//!   process. With a binary to exec ([`crate::SandboxConfig::spawner_exe`]),
//!   the child execs it and [`serve::run_if_asked`] in its `main` serves.
//!   Then the spawner's address space, which every clone copies, is its own
//!   small one. Without, the forked child serves as it is. The forking
//!   thread waits for the spawner, then stays until the [`Spawner`] is
//!   dropped, because init's parent-death signal is tied to it.
//! - **Init's parent is the runner.** The spawner clones init with
//!   `CLONE_PARENT` through the same routine as the runner
//!   ([`super::clone::clone_init`]), so the runner reaps init through its
//!   pidfd as with a direct clone.
//! - **One request at a time**, in the [`protocol`]'s typed messages.
//! - **Failures fall back.** If the spawner cannot be started, or dies, the
//!   next request starts a new one. If that fails too, or after
//!   [`MAX_RESTARTS`] deaths, or for a plan too large for one message (a huge
//!   environment), the run is cloned by the [`Direct`] launcher.

pub(crate) mod protocol;
mod serve;

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

use self::protocol::{
    FailedAt, Header, Hello, MAX_FDS, MAX_REPLY, MAX_REQUEST, Reply, SPAWNER_ARG,
};
pub use self::serve::run_if_asked;
use super::clone::{CloneError, Launched};
use super::seam::{Direct, Failure, Launcher, Request};
use crate::sys;

/// How long the runner waits for a reply before it gives the spawner up.
const REPLY_TIMEOUT_SECS: i64 = 30;
/// How many spawners may die before launches stop starting new ones (each
/// leaves its parked thread until the sandbox is dropped).
const MAX_RESTARTS: u32 = 16;

/// The runner's handle on its spawner; a [`Launcher`].
pub(crate) struct Spawner {
    state: Mutex<State>,
    /// Clones what the spawner cannot take; its seccomp program is the one
    /// the spawner is given.
    direct: Direct,
    /// The binary exec'd as the spawner; forked without exec when `None`.
    exe: Option<PathBuf>,
}

#[derive(Default)]
struct State {
    live: Option<Live>,
    /// The forking threads of spawners that died: inits they cloned may still
    /// run, and their parent-death signal is tied to that thread, so it stays
    /// until the sandbox is dropped.
    retired: Vec<mpsc::Sender<()>>,
    /// Spawners started.
    started: u32,
    /// Set once too many died.
    gave_up: bool,
}

impl State {
    fn retire(&mut self) {
        if let Some(mut live) = self.live.take() {
            self.retired.extend(live.release.take());
        }
    }
}

/// A running spawner.
struct Live {
    sock: OwnedFd,
    pid: libc::pid_t,
    /// For the kill on drop: the pid may be reaped (and reused) meanwhile.
    pidfd: OwnedFd,
    dead: Arc<AtomicBool>,
    /// Dropped with the sandbox: lets the forking thread end.
    release: Option<mpsc::Sender<()>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Closing the socket ends an idle spawner; this ends one that is
        // stuck. The forking thread reaps it.
        sys::pidfd_kill(self.pidfd.as_fd());
    }
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").finish_non_exhaustive()
    }
}

/// How an exchange with the spawner failed.
enum Lost {
    /// The request was not sent.
    Request(Errno),
    /// The request was sent; no reply came.
    Reply(Errno),
}

impl Spawner {
    /// A spawner exec'd from `exe` (or forked), started at the first launch,
    /// falling back to `direct`.
    pub(crate) fn new(direct: Direct, exe: Option<PathBuf>) -> Self {
        Spawner {
            state: Mutex::new(State::default()),
            direct,
            exe,
        }
    }

    /// Sends `request` to a live spawner (starting one if needed) and returns
    /// its answer; `Ok(None)`: no spawner can take it.
    fn exchange(&self, body: &[u8], fds: &[RawFd]) -> Result<Option<Launched>, Failure> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A dead spawner is replaced once per request; a second failure
        // clones directly.
        for _ in 0..2 {
            if state
                .live
                .as_ref()
                .is_none_or(|l| l.dead.load(Ordering::SeqCst))
            {
                state.retire();
                if state.started > MAX_RESTARTS {
                    if !state.gave_up {
                        state.gave_up = true;
                        tracing::error!(
                            "{} spawners died; runs clone from the runner from now on",
                            state.started
                        );
                    }
                    return Ok(None);
                }
                state.started += 1;
                match start(self.direct.seccomp(), self.exe.as_deref()) {
                    Ok(l) => {
                        tracing::debug!(pid = l.pid, "started the spawner");
                        state.live = Some(l);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the spawner; cloning from the runner");
                        return Ok(None);
                    }
                }
            }
            let sock = state.live.as_ref().map_or(-1, |l| l.sock.as_raw_fd());
            match send_and_receive(sock, body, fds) {
                Ok((reply, pidfd)) => return answer(reply, pidfd).map(Some),
                // Not received: a new spawner may take it.
                Err(Lost::Request(e)) => {
                    tracing::warn!(error = %e, "the spawner is gone; starting a new one");
                    state.retire();
                }
                // Received, maybe acted on: not sent again, since an init may
                // have been cloned with these pipes. Such an init gets no id
                // maps and ends at EOF on its sync pipe.
                Err(Lost::Reply(e)) => {
                    tracing::warn!(error = %e, "the spawner died during a request");
                    state.retire();
                    return Err(Failure::SpawnerDied(e));
                }
            }
        }
        Ok(None)
    }
}

impl Launcher for Spawner {
    fn clone_init(&self, request: &Request<'_>) -> Result<Launched, Failure> {
        let taken =
            Header::of(request.net, request.fds, &request.place).and_then(|(header, fds)| {
                let body = protocol::encode_request(&header, request.plan);
                (body.len() <= MAX_REQUEST && fds.len() <= MAX_FDS).then_some((body, fds))
            });
        if let Some((body, fds)) = taken
            && let Some(launched) = self.exchange(&body, &fds)?
        {
            return Ok(launched);
        }
        self.direct.clone_init(request)
    }

    #[cfg(test)]
    fn spawner_pid(&self) -> Option<libc::pid_t> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .live
            .as_ref()
            .filter(|l| !l.dead.load(Ordering::SeqCst))
            .map(|l| l.pid)
    }
}

/// The launch a reply reports.
fn answer(reply: Reply, pidfd: Option<OwnedFd>) -> Result<Launched, Failure> {
    let errno = |e: i32| Errno::from_raw(e);
    match (reply, pidfd) {
        (Reply::Cloned { pid, placed }, Some(pidfd)) => Ok(Launched { pid, pidfd, placed }),
        (Reply::Cloned { .. }, None) => Err(Failure::SpawnerDied(Errno::EPROTO)),
        (Reply::Failed { at, errno: e }, pidfd) => Err(Failure::Init(match at {
            FailedAt::Enter => CloneError::Enter(errno(e)),
            FailedAt::Request | FailedAt::Clone => CloneError::Clone(errno(e)),
            FailedAt::Leave => CloneError::Leave(errno(e), pidfd),
        })),
    }
}

/// Sends one request and reads its reply.
fn send_and_receive(
    sock: RawFd,
    body: &[u8],
    fds: &[RawFd],
) -> Result<(Reply, Option<OwnedFd>), Lost> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let iov = [IoSlice::new(body)];
    loop {
        match sendmsg::<()>(sock, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(Lost::Request(e)),
        }
    }
    receive(sock).map_err(Lost::Reply)
}

/// Reads the reply to a request.
fn receive(sock: RawFd) -> Result<(Reply, Option<OwnedFd>), Errno> {
    let mut buf = [0u8; MAX_REPLY];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (n, pidfd) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut pidfd = None;
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(received) = c {
                        for fd in received {
                            // SAFETY: SCM_RIGHTS installed a new descriptor we own.
                            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                            pidfd.get_or_insert(fd);
                        }
                    }
                }
                break (msg.bytes, pidfd);
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    };
    if n == 0 {
        // EOF: the spawner died.
        return Err(Errno::EPIPE);
    }
    let reply = postcard::from_bytes(&buf[..n]).map_err(|_| Errno::EPROTO)?;
    Ok((reply, pidfd))
}

/// Forks the spawner from a new thread, which then waits for it and stays
/// until the returned [`Live`] is dropped.
fn start(seccomp: Option<&fnrun_seccomp::BpfProgram>, exe: Option<&Path>) -> std::io::Result<Live> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    // A spawner that does not answer within this is killed and replaced.
    nix::sys::socket::setsockopt(
        &ours,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_TIMEOUT_SECS, 0),
    )?;
    let (pid_tx, pid_rx) = mpsc::channel::<std::io::Result<(libc::pid_t, OwnedFd)>>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let dead = Arc::new(AtomicBool::new(false));
    let dead_thread = dead.clone();
    let parent = libc::pid_t::try_from(std::process::id()).expect("pids fit in pid_t");
    // The exec's arguments, made before the fork.
    let exec = match exe {
        Some(exe) => Some((
            CString::new(exe.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other("the spawner's path has a NUL byte"))?,
            [
                c"fnrun-spawner".to_owned(),
                CString::new(SPAWNER_ARG).expect("no NUL"),
                CString::new(parent.to_string()).expect("no NUL"),
            ],
        )),
        None => None,
    };
    std::thread::Builder::new()
        .name("fnrun-spawner".into())
        .spawn(move || {
            let sock = theirs.as_raw_fd();
            // SAFETY: the child execs the spawner, or if that fails (or there
            // is no binary to exec) runs `serve` (system calls and
            // allocation), and never returns.
            let pid = match unsafe { sys::fork() } {
                Ok(0) => {
                    if let Some((path, args)) = &exec {
                        let argv = [
                            args[0].as_ptr(),
                            args[1].as_ptr(),
                            args[2].as_ptr(),
                            std::ptr::null(),
                        ];
                        // Returns only if the exec failed.
                        let _ = sys::exec_with_fd3(sock, path, &argv);
                    }
                    serve::serve(sock, parent)
                }
                Ok(pid) => pid,
                Err(e) => {
                    let _ = pid_tx.send(Err(e.into()));
                    return;
                }
            };
            drop(theirs);
            // Opened before this thread can reap it: the pid is still ours.
            match sys::pidfd_open(pid) {
                Ok(fd) => {
                    // SAFETY: pidfd_open returned a new descriptor we own.
                    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
                    let _ = pid_tx.send(Ok((pid, pidfd)));
                }
                Err(e) => {
                    sys::kill_child(pid);
                    let _ = pid_tx.send(Err(e.into()));
                }
            }
            sys::wait_child(pid);
            dead_thread.store(true, Ordering::SeqCst);
            // The parent-death signal of the inits it cloned is tied to this
            // thread: it stays until the sandbox is dropped.
            let _ = release_rx.recv();
        })?;
    let (pid, pidfd) = pid_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread ended"))??;
    let live = Live {
        sock: ours,
        pid,
        pidfd,
        dead,
        release: Some(release_tx),
    };
    let hello = postcard::to_allocvec(&Hello::new(seccomp)).map_err(std::io::Error::other)?;
    sendmsg::<()>(
        live.sock.as_raw_fd(),
        &[IoSlice::new(&hello)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(live)
}
