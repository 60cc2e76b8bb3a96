//! The spawner: a small single-threaded process that clones every init.
//!
//! Cloning init from the daemon itself copies the daemon's page tables and
//! write-protects all its private memory. Every page a daemon thread writes
//! afterwards takes a copy-on-write fault, with a TLB shootdown to each CPU
//! running another daemon thread. Under load, that was about a fifth of all CPU
//! time (`docs/benchmarks.md`). The spawner is started once and is
//! single-threaded, and it writes almost nothing, so the daemon no longer takes
//! those faults, and the spawner's own faults need no shootdowns.
//!
//! - **Started once, from a thread of its own.** The thread forks with glibc's
//!   `fork()`, which leaves malloc usable in the child of a threaded process.
//!   With a binary to exec ([`crate::SandboxConfig::spawner_exe`]), the child
//!   execs it, and [`run_if_asked`] in its `main` serves. Then the spawner's
//!   address space, which every clone copies, is its own small one. Without,
//!   the forked child serves as it is, doing only system calls, plus allocation
//!   to decode requests. The forking thread waits for the spawner, then stays
//!   until the [`Spawner`] is dropped, because init's parent-death signal is
//!   tied to it (next point).
//! - **Init's parent is the daemon.** The spawner clones init with `CLONE_PARENT`,
//!   so the daemon reaps init through its pidfd as before. Init's parent-death
//!   signal fires when that forking thread ends, when the sandbox is dropped or the
//!   daemon dies. The spawner itself exits when the daemon's end of its socket
//!   closes, and it is killed when that thread ends.
//! - **One request at a time.** The first message carries the seccomp program of
//!   every plan. Then a request is one `SOCK_SEQPACKET` message: the encoded
//!   [`Plan`] with, by `SCM_RIGHTS`, init's five pipe ends and the cgroup
//!   descriptors. The spawner moves itself into a pooled v1 cgroup by its `tasks`
//!   files and back, or gives a v2 cgroup to `CLONE_INTO_CGROUP`. The reply
//!   carries the pid, whether init was placed, and the pidfd.
//! - **Failures fall back.** If the spawner cannot be started, or dies, the next
//!   request starts a new one. If that fails too, the run clones from the daemon
//!   as before. A plan too large for one message (a huge environment) is also
//!   cloned from the daemon.

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

use crate::child::{self, ExecPointers, Plan, Step};
use crate::overlay::{Legacy, Overlay};
use crate::{Network, sys};

/// The largest encoded plan sent to the spawner; larger ones are cloned from the
/// daemon. Below the default socket buffer (`net.core.wmem_default`, 208 KiB),
/// which bounds one `SOCK_SEQPACKET` message.
const MAX_REQUEST: usize = 192 << 10;
/// Most descriptors in one request: five pipe ends, a v2 cgroup, and the `tasks`
/// files of a v1 slot and of home (five hierarchies each, with room to spare).
const MAX_FDS: usize = 32;
/// How long the daemon waits for a reply before it gives the spawner up.
const REPLY_TIMEOUT_SECS: i64 = 30;

/// Where a spawn failed, in a reply.
const STAGE_ENTER: u8 = 1;
const STAGE_CLONE: u8 = 2;
const STAGE_LEAVE: u8 = 3;
const STAGE_DECODE: u8 = 4;

/// How the spawner moves itself into a run's cgroup to clone init there: `"0"` to
/// each `enter` file (the writer's own thread, here its only one), then to each
/// `leave` file after the clone. From [`crate::cgroup::RunCgroup::thread_move`].
pub struct ThreadMove {
    pub enter: Vec<std::fs::File>,
    pub leave: Vec<RawFd>,
}

/// What the daemon sends with a request (besides the plan).
pub(crate) struct Placement<'a> {
    /// A v2 cgroup directory for `CLONE_INTO_CGROUP`.
    pub into: Option<BorrowedFd<'a>>,
    /// A v1 slot to clone from inside.
    pub moves: Option<ThreadMove>,
}

/// A spawn the spawner could not do.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Moving into the run's cgroup failed (the spawner is back home).
    Enter(Errno),
    /// clone3 failed.
    Clone(Errno),
    /// Init was cloned but the spawner could not leave the run's cgroup; init was
    /// killed (the caller reaps it through `pidfd`) and the spawner exits.
    Leave(Errno, OwnedFd),
    /// The spawner died with the request.
    Died(Errno),
}

/// How many spawners may die before the sandbox stops starting new ones (each
/// leaves its parked thread until the sandbox is dropped).
const MAX_RESTARTS: u32 = 16;

/// The daemon's handle on its spawner.
pub(crate) struct Spawner {
    state: Mutex<State>,
    seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
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

struct Live {
    sock: OwnedFd,
    pid: libc::pid_t,
    /// For the kill on drop: the pid may be reaped (and reused) meanwhile.
    pidfd: OwnedFd,
    dead: Arc<AtomicBool>,
    /// Dropped with the sandbox: lets the forking thread end.
    release: Option<mpsc::Sender<()>>,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").finish_non_exhaustive()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Closing the socket ends an idle spawner; this ends one that is stuck.
        // The forking thread reaps it.
        crate::kill_pidfd(&self.pidfd);
    }
}

impl Spawner {
    /// A spawner for plans whose seccomp program is `seccomp` (every plan of a
    /// sandbox has the same: it is sent once, not with each plan), exec'd from
    /// `exe` or forked. Started at the first spawn.
    pub(crate) fn new(
        seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
        exe: Option<PathBuf>,
    ) -> Self {
        Spawner {
            state: Mutex::new(State::default()),
            seccomp,
            exe,
        }
    }

    /// The spawner's pid, if one runs (for tests).
    pub(crate) fn pid(&self) -> Option<libc::pid_t> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .live
            .as_ref()
            .filter(|l| !l.dead.load(Ordering::SeqCst))
            .map(|l| l.pid)
    }

    /// Clones init for `plan` in the spawner. `Ok(None)`: the spawner could not
    /// take it (too large, or no spawner could be started); clone from here.
    pub(crate) fn spawn(
        &self,
        plan: &Plan,
        network: Network,
        placement: Placement<'_>,
    ) -> Result<Option<(libc::pid_t, OwnedFd, bool)>, Failed> {
        let mut body = Vec::with_capacity(4096);
        body.push(u8::from(network == Network::Isolated));
        body.push(u8::from(placement.into.is_some()));
        let moves = placement.moves.as_ref();
        let (n_enter, n_leave) = moves.map_or((0, 0), |m| (m.enter.len(), m.leave.len()));
        body.push(n_enter as u8);
        body.push(n_leave as u8);
        encode_plan(plan, &mut body);
        if body.len() > MAX_REQUEST {
            return Ok(None);
        }
        let mut fds = vec![
            plan.sync_read,
            plan.report_write,
            plan.stdin_read,
            plan.stdout_write,
            plan.stderr_write,
        ];
        fds.extend(placement.into.map(|fd| fd.as_raw_fd()));
        if let Some(m) = moves {
            fds.extend(m.enter.iter().map(AsRawFd::as_raw_fd));
            fds.extend(&m.leave);
        }
        if fds.len() > MAX_FDS {
            return Ok(None);
        }

        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A dead spawner is replaced once per request; a second failure clones
        // from the daemon.
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
                            "{} spawners died; runs clone from the daemon from now on",
                            state.started
                        );
                    }
                    return Ok(None);
                }
                state.started += 1;
                match start(self.seccomp.as_deref(), self.exe.as_deref()) {
                    Ok(l) => state.live = Some(l),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the spawner; cloning from the daemon");
                        return Ok(None);
                    }
                }
            }
            let sock = state.live.as_ref().map_or(-1, |l| l.sock.as_raw_fd());
            match exchange(sock, &body, &fds) {
                Ok(reply) => return reply.map(Some),
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
                    return Err(Failed::Died(e));
                }
            }
        }
        Ok(None)
    }
}

/// How an exchange with the spawner failed.
enum Lost {
    /// The request was not sent.
    Request(Errno),
    /// The request was sent; no reply came.
    Reply(Errno),
}

/// Sends one request and reads its reply.
fn exchange(
    sock: RawFd,
    body: &[u8],
    fds: &[RawFd],
) -> Result<Result<(libc::pid_t, OwnedFd, bool), Failed>, Lost> {
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
fn receive(sock: RawFd) -> Result<Result<(libc::pid_t, OwnedFd, bool), Failed>, Errno> {
    let mut buf = [0u8; 10];
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
    if n != buf.len() {
        // EOF (the spawner died) or a reply we did not send.
        return Err(Errno::EPIPE);
    }
    let value = i32::from_ne_bytes(buf[1..5].try_into().expect("4 bytes"));
    let pid = i32::from_ne_bytes(buf[5..9].try_into().expect("4 bytes"));
    let placed = buf[9] != 0;
    let errno = Errno::from_raw(value);
    Ok(match (buf[0], pidfd) {
        (0, Some(pidfd)) => Ok((pid, pidfd, placed)),
        (STAGE_ENTER, _) => Err(Failed::Enter(errno)),
        (STAGE_CLONE | STAGE_DECODE, _) => Err(Failed::Clone(errno)),
        (STAGE_LEAVE, Some(pidfd)) => Err(Failed::Leave(errno, pidfd)),
        _ => return Err(Errno::EPROTO),
    })
}

/// Forks the spawner from a new thread, which then waits for it and stays until
/// the returned [`Live`] is dropped.
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
    let parent = std::process::id() as libc::pid_t;
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
            // SAFETY: glibc's fork(2): its at-fork handlers leave malloc usable in
            // the child, which execs the spawner, or if that fails (or there is
            // no binary to exec) runs `serve` (system calls and allocation), and
            // never returns.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                if let Some((path, args)) = &exec {
                    exec_spawner(sock, path, args);
                }
                serve(sock, parent);
            }
            drop(theirs);
            if pid < 0 {
                let _ = pid_tx.send(Err(std::io::Error::last_os_error()));
                return;
            }
            // Opened before this thread can reap it: the pid is still ours.
            // SAFETY: pidfd_open(2) of our own unreaped child.
            let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if pidfd < 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: kill(2) of our own unreaped child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let _ = pid_tx.send(Err(e));
            } else {
                // SAFETY: pidfd_open returned a new descriptor we own.
                let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
                let _ = pid_tx.send(Ok((pid, pidfd)));
            }
            loop {
                let mut status = 0;
                // SAFETY: waitpid(2) for our own child.
                let r = unsafe { libc::waitpid(pid, &mut status, 0) };
                if r == pid || Errno::last() != Errno::EINTR {
                    break;
                }
            }
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
    let hello = encode_hello(seccomp);
    sendmsg::<()>(
        live.sock.as_raw_fd(),
        &[IoSlice::new(&hello)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(live)
}

/// In the forked child: the spawner binary, with the socket at descriptor 3. Returns
/// only if the exec failed (the child then serves as it is).
fn exec_spawner(sock: RawFd, path: &CString, args: &[CString; 3]) {
    let argv = [
        args[0].as_ptr(),
        args[1].as_ptr(),
        args[2].as_ptr(),
        std::ptr::null(),
    ];
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: dup2(2)/fcntl(2) on our descriptors and execve(2) with
    // NULL-terminated arrays of C strings made before the fork.
    unsafe {
        if sock == 3 {
            libc::fcntl(3, libc::F_SETFD, 0);
        } else if libc::dup2(sock, 3) < 0 {
            return;
        }
        libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
}

/// The argument that makes a binary the spawner (see [`run_if_asked`]).
pub const SPAWNER_ARG: &str = "__fnrun-spawner";

/// Serves as the spawner if this process was exec'd as one; returns otherwise.
/// A binary named in [`crate::SandboxConfig::spawner_exe`] calls it first thing in
/// `main`, before any thread starts.
pub fn run_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SPAWNER_ARG)) {
        return;
    }
    let parent = args
        .next()
        .and_then(|a| a.to_str()?.parse().ok())
        .unwrap_or(-1);
    serve(3, parent);
}

/// The first message to a spawner: the seccomp program of every plan.
fn encode_hello(seccomp: Option<&fnrun_seccomp::BpfProgram>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.u8(u8::from(seccomp.is_some()));
    let program = seccomp.map_or(&[][..], Vec::as_slice);
    w.u32(program.len() as u32);
    for f in program {
        w.0.extend_from_slice(&f.code.to_ne_bytes());
        w.u8(f.jt);
        w.u8(f.jf);
        w.u32(f.k);
    }
    out
}

fn decode_hello(bytes: &[u8]) -> Option<Option<fnrun_seccomp::BpfProgram>> {
    let mut r = Reader(bytes);
    let has = r.u8()? != 0;
    let n = r.u32()? as usize;
    if n > bytes.len() / 8 {
        return None;
    }
    let mut program = Vec::with_capacity(n);
    for _ in 0..n {
        let code = u16::from_ne_bytes(r.take(2)?.try_into().ok()?);
        let (jt, jf) = (r.u8()?, r.u8()?);
        let k = r.u32()?;
        program.push(fnrun_seccomp::sock_filter { code, jt, jf, k });
    }
    (r.0.is_empty() && (has || n == 0)).then(|| has.then_some(program))
}

/// The spawner's main loop. Never returns.
fn serve(sock: RawFd, parent: libc::pid_t) -> ! {
    // Killed when the forking thread ends; it may already have.
    if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).is_err()
        // SAFETY: getppid(2) has no preconditions.
        || unsafe { libc::getppid() } != parent
    {
        sys::exit(1);
    }
    // The daemon's signal handlers (the runtime's, which write to a descriptor
    // of the daemon) must never run here, where that number may be a run's pipe;
    // and the spawner leaves the daemon's process group (no terminal's Ctrl-C).
    for sig in 1..=libc::SIGRTMAX() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: installing the default disposition runs no code.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // SAFETY: setpgid(2) of this process.
    unsafe { libc::setpgid(0, 0) };
    // Only the socket (at 3) and stdio stay open: the daemon's other descriptors
    // (listening sockets, locks, other runs' pipes) are not the spawner's.
    // SAFETY: dup2(2)/fcntl(2) on descriptors this process holds.
    if sock != 3 && unsafe { libc::dup2(sock, 3) } < 0 {
        sys::exit(1);
    }
    sys::close_range(4, u32::MAX);
    // SAFETY: clearing FD_CLOEXEC of our own descriptor.
    unsafe { libc::fcntl(3, libc::F_SETFD, 0) };
    // Stdio on /dev/null: the daemon's may be a log pipe its reader waits on,
    // and 0-2 stay taken, so no received descriptor lands there (init's plan
    // descriptors must not be 0-2, which the function's stdio replaces).
    // SAFETY: open(2)/dup2(2)/close(2) of our own descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null < 0 {
            sys::exit(1);
        }
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if null > 3 {
            libc::close(null);
        }
    }
    // The name the inits it clones carry too, exec'd or forked.
    // SAFETY: PR_SET_NAME with a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"fnrun-spawner".as_ptr()) };
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    // First the hello: the seccomp program of every plan.
    let seccomp = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(3, &mut iov, None, MsgFlags::empty()) {
            Ok(msg) if msg.bytes > 0 => {
                let n = msg.bytes;
                match decode_hello(&buf[..n]) {
                    Some(program) => break program.map(Arc::new),
                    None => sys::exit(1),
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
            match recvmsg::<()>(3, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
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
        let (stage, value, pid, placed, pidfd) = handle(&buf[..n], &fds, seccomp.as_ref());
        let mut reply = [0u8; 10];
        reply[0] = stage;
        reply[1..5].copy_from_slice(&value.to_ne_bytes());
        reply[5..9].copy_from_slice(&pid.to_ne_bytes());
        reply[9] = u8::from(placed);
        let pidfd_raw = pidfd.as_ref().map(AsRawFd::as_raw_fd);
        let passed: Vec<RawFd> = pidfd_raw.into_iter().collect();
        let cmsg = [ControlMessage::ScmRights(&passed)];
        let cmsgs: &[ControlMessage] = if passed.is_empty() { &[] } else { &cmsg };
        let sent = sendmsg::<()>(
            3,
            &[IoSlice::new(&reply)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        );
        drop(fds);
        drop(pidfd);
        if sent.is_err() || stage == STAGE_LEAVE {
            // The daemon is gone, or this process is stuck in a run's cgroup.
            sys::exit(1);
        }
    }
}

/// Handles one request: `(stage, errno, pid, placed, pidfd)`, stage 0 on success.
fn handle(
    body: &[u8],
    fds: &[OwnedFd],
    seccomp: Option<&Arc<fnrun_seccomp::BpfProgram>>,
) -> (u8, i32, libc::pid_t, bool, Option<OwnedFd>) {
    let fail = |stage, e: Errno| (stage, e as i32, 0, false, None);
    let Some((&[isolated, has_into, n_enter, n_leave], rest)) = body.split_first_chunk::<4>()
    else {
        return fail(STAGE_DECODE, Errno::EPROTO);
    };
    let (n_enter, n_leave) = (usize::from(n_enter), usize::from(n_leave));
    let into = usize::from(has_into != 0);
    if fds.len() != 5 + into + n_enter + n_leave {
        return fail(STAGE_DECODE, Errno::EPROTO);
    }
    let raw = |i: usize| fds[i].as_raw_fd();
    let Some(plan) = decode_plan(rest, [raw(0), raw(1), raw(2), raw(3), raw(4)], seccomp) else {
        return fail(STAGE_DECODE, Errno::EPROTO);
    };
    let ptrs = ExecPointers::new(&plan);
    let enter = &fds[5 + into..5 + into + n_enter];
    let leave = &fds[5 + into + n_enter..];
    let go_home = || {
        leave
            .iter()
            .try_for_each(|f| sys::write_all(f.as_raw_fd(), b"0"))
    };
    for f in enter {
        if let Err(e) = sys::write_all(f.as_raw_fd(), b"0") {
            return match go_home() {
                Ok(()) => fail(STAGE_ENTER, e),
                Err(e) => fail(STAGE_LEAVE, e),
            };
        }
    }

    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_PIDFD
        | libc::CLONE_PARENT;
    if isolated != 0 {
        flags |= libc::CLONE_NEWNET;
    }
    let mut pidfd: RawFd = -1;
    let mut args = sys::CloneArgs {
        flags: flags as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        // With CLONE_PARENT the kernel uses this process's own exit signal.
        exit_signal: 0,
        ..sys::CloneArgs::default()
    };
    if into == 1 {
        args.flags |= crate::CLONE_INTO_CGROUP;
        args.cgroup = raw(5) as u64;
    }
    let cloned = loop {
        // SAFETY: the child runs only `init_main`, which keeps to raw system
        // calls on the plan decoded before the clone and never returns.
        match unsafe { sys::clone3(&mut args) } {
            Err(Errno::EINVAL | Errno::E2BIG) if args.flags & crate::CLONE_INTO_CGROUP != 0 => {
                args.flags &= !crate::CLONE_INTO_CGROUP;
                args.cgroup = 0;
            }
            result => break result,
        }
    };
    if let Ok(0) = cloned {
        child::init_main(&plan, &ptrs);
    }
    let left = go_home();
    let pid = match cloned {
        Ok(pid) => pid,
        Err(e) => {
            return match left {
                Ok(()) => fail(STAGE_CLONE, e),
                Err(e) => fail(STAGE_LEAVE, e),
            };
        }
    };
    // SAFETY: clone3 with CLONE_PIDFD stored a new descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let placed = n_enter > 0 || args.flags & crate::CLONE_INTO_CGROUP != 0;
    match left {
        Ok(()) => (0, 0, pid, placed, Some(pidfd)),
        Err(e) => {
            crate::kill_pidfd(&pidfd);
            (STAGE_LEAVE, e as i32, pid, placed, Some(pidfd))
        }
    }
}

// ------------------------------------------------------------------ plan codec

/// Appends `plan` (all but its descriptors and seccomp program) to `out`.
fn encode_plan(plan: &Plan, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u8(u8::from(plan.can_setgroups));
    w.u32(plan.uid);
    w.u32(plan.gid);
    w.u32(plan.groups.len() as u32);
    for g in &plan.groups {
        w.u32(*g);
    }
    w.u32(plan.steps.len() as u32);
    for step in &plan.steps {
        encode_step(step, &mut w);
    }
    w.cstr(&plan.workdir);
    w.cstrs(&plan.workdir_prefixes);
    w.cstrs(&plan.exec_paths);
    w.cstrs(&plan.argv);
    w.cstrs(&plan.env);
    w.u32(plan.last_cap);
    w.u8(u8::from(plan.seccomp.is_some()));
}

fn encode_step(step: &Step, w: &mut Writer<'_>) {
    match step {
        Step::Mount {
            source,
            target,
            fstype,
            flags,
            data,
        } => {
            w.u8(0);
            w.opt_cstr(source.as_ref());
            w.cstr(target);
            w.opt_cstr(fstype.as_ref());
            // c_ulong is u64 or u32, depending on the target.
            #[allow(clippy::useless_conversion)]
            w.u64(u64::from(*flags));
            w.opt_cstr(data.as_ref());
        }
        Step::Mkdir { path, mode } => {
            w.u8(1);
            w.cstr(path);
            w.u32(*mode);
        }
        Step::Touch { path, mode } => {
            w.u8(2);
            w.cstr(path);
            w.u32(*mode);
        }
        Step::Symlink { target, link } => {
            w.u8(3);
            w.cstr(target);
            w.cstr(link);
        }
        Step::Chdir { path } => {
            w.u8(4);
            w.cstr(path);
        }
        Step::PivotRoot { put_old } => {
            w.u8(5);
            w.cstr(put_old);
        }
        Step::Detach { path } => {
            w.u8(6);
            w.cstr(path);
        }
        Step::Rmdir { path } => {
            w.u8(7);
            w.cstr(path);
        }
        Step::Hostname { name } => {
            w.u8(8);
            w.cstr(name);
        }
        Step::LoopbackUp => w.u8(9),
        Step::Mask { path } => {
            w.u8(10);
            w.cstr(path);
        }
        Step::BindReadOnly { path } => {
            w.u8(11);
            w.cstr(path);
        }
        Step::RemountReadOnly { path } => {
            w.u8(12);
            w.cstr(path);
        }
        Step::NewSession => w.u8(13),
        Step::Overlay(o) => {
            w.u8(14);
            w.cstr(&o.target);
            w.cstr(&o.upper);
            w.cstr(&o.work);
            w.opt_cstr(o.dir.as_ref());
            w.cstrs(&o.lowers);
            w.u8(u8::from(o.api));
            w.u32(o.legacy.links.len() as u32);
            for (link, layer) in &o.legacy.links {
                w.cstr(link);
                w.cstr(layer);
            }
            w.opt_cstr(o.legacy.dir.as_ref());
            w.cstr(&o.legacy.data);
        }
    }
}

/// The plan [`encode_plan`] wrote, with init's pipe ends `fds` (sync, report,
/// stdin, stdout, stderr) and `seccomp` if the plan had a program.
fn decode_plan(
    bytes: &[u8],
    fds: [RawFd; 5],
    seccomp: Option<&Arc<fnrun_seccomp::BpfProgram>>,
) -> Option<Plan> {
    let mut r = Reader(bytes);
    let can_setgroups = r.u8()? != 0;
    let uid = r.u32()?;
    let gid = r.u32()?;
    let n = r.len()?;
    let groups = (0..n).map(|_| r.u32()).collect::<Option<_>>()?;
    let n = r.len()?;
    let steps = (0..n).map(|_| decode_step(&mut r)).collect::<Option<_>>()?;
    let plan = Plan {
        sync_read: fds[0],
        report_write: fds[1],
        stdin_read: fds[2],
        stdout_write: fds[3],
        stderr_write: fds[4],
        can_setgroups,
        uid,
        gid,
        groups,
        steps,
        workdir: r.cstr()?,
        workdir_prefixes: r.cstrs()?,
        exec_paths: r.cstrs()?,
        argv: r.cstrs()?,
        env: r.cstrs()?,
        last_cap: r.u32()?,
        seccomp: match r.u8()? {
            0 => None,
            _ => Some(seccomp?.clone()),
        },
    };
    r.0.is_empty().then_some(plan)
}

fn decode_step(r: &mut Reader<'_>) -> Option<Step> {
    Some(match r.u8()? {
        0 => Step::Mount {
            source: r.opt_cstr()?,
            target: r.cstr()?,
            fstype: r.opt_cstr()?,
            flags: libc::c_ulong::try_from(r.u64()?).ok()?,
            data: r.opt_cstr()?,
        },
        1 => Step::Mkdir {
            path: r.cstr()?,
            mode: r.u32()?,
        },
        2 => Step::Touch {
            path: r.cstr()?,
            mode: r.u32()?,
        },
        3 => Step::Symlink {
            target: r.cstr()?,
            link: r.cstr()?,
        },
        4 => Step::Chdir { path: r.cstr()? },
        5 => Step::PivotRoot { put_old: r.cstr()? },
        6 => Step::Detach { path: r.cstr()? },
        7 => Step::Rmdir { path: r.cstr()? },
        8 => Step::Hostname { name: r.cstr()? },
        9 => Step::LoopbackUp,
        10 => Step::Mask { path: r.cstr()? },
        11 => Step::BindReadOnly { path: r.cstr()? },
        12 => Step::RemountReadOnly { path: r.cstr()? },
        13 => Step::NewSession,
        14 => Step::Overlay(Box::new(Overlay {
            target: r.cstr()?,
            upper: r.cstr()?,
            work: r.cstr()?,
            dir: r.opt_cstr()?,
            lowers: r.cstrs()?,
            api: r.u8()? != 0,
            legacy: Legacy {
                links: {
                    let n = r.len()?;
                    (0..n)
                        .map(|_| Some((r.cstr()?, r.cstr()?)))
                        .collect::<Option<_>>()?
                },
                dir: r.opt_cstr()?,
                data: r.cstr()?,
            },
        })),
        _ => return None,
    })
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_ne_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_ne_bytes());
    }
    fn cstr(&mut self, s: &CString) {
        let b = s.as_bytes();
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn opt_cstr(&mut self, s: Option<&CString>) {
        self.u8(u8::from(s.is_some()));
        if let Some(s) = s {
            self.cstr(s);
        }
    }
    fn cstrs(&mut self, v: &[CString]) {
        self.u32(v.len() as u32);
        for s in v {
            self.cstr(s);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A count, bounded by what is left (each item takes at least a byte).
    fn len(&mut self) -> Option<usize> {
        let n = self.u32()? as usize;
        (n <= self.0.len()).then_some(n)
    }
    fn cstr(&mut self) -> Option<CString> {
        let n = self.u32()? as usize;
        CString::new(self.take(n)?).ok()
    }
    fn opt_cstr(&mut self) -> Option<Option<CString>> {
        match self.u8()? {
            0 => Some(None),
            _ => Some(Some(self.cstr()?)),
        }
    }
    fn cstrs(&mut self) -> Option<Vec<CString>> {
        let n = self.len()?;
        (0..n).map(|_| self.cstr()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    #[test]
    fn the_hello_carries_the_seccomp_program() {
        let program = fnrun_seccomp::default_program().unwrap();
        let bytes = encode_hello(Some(&program));
        let back = decode_hello(&bytes).unwrap().unwrap();
        assert_eq!(back.len(), program.len());
        for (a, b) in back.iter().zip(&program) {
            assert_eq!((a.code, a.jt, a.jf, a.k), (b.code, b.jt, b.jf, b.k));
        }
        assert!(decode_hello(&encode_hello(None)).unwrap().is_none());
        for n in 0..bytes.len() {
            assert!(decode_hello(&bytes[..n]).is_none(), "{n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_hello(&longer).is_none());
    }

    #[test]
    fn plans_cross_the_socket_unchanged() {
        let seccomp = Arc::new(fnrun_seccomp::default_program().unwrap());
        let plan = Plan {
            sync_read: 10,
            report_write: 11,
            stdin_read: 12,
            stdout_write: 13,
            stderr_write: 14,
            can_setgroups: true,
            uid: 1000,
            gid: 1001,
            groups: vec![1, 2, 3],
            steps: vec![
                Step::Mount {
                    source: Some(c("overlay")),
                    target: c("/r"),
                    fstype: None,
                    flags: libc::MS_RDONLY | libc::MS_NOSUID,
                    data: Some(c("lowerdir=/a:/b")),
                },
                Step::Mkdir {
                    path: c("/r/x"),
                    mode: 0o755,
                },
                Step::Touch {
                    path: c("/r/f"),
                    mode: 0o644,
                },
                Step::Symlink {
                    target: c("/proc/self/fd"),
                    link: c("/dev/fd"),
                },
                Step::Chdir { path: c("/r") },
                Step::PivotRoot { put_old: c("old") },
                Step::Detach { path: c("/old") },
                Step::Rmdir { path: c("/old") },
                Step::Hostname {
                    name: c("function"),
                },
                Step::LoopbackUp,
                Step::Mask {
                    path: c("/proc/kcore"),
                },
                Step::BindReadOnly {
                    path: c("/proc/sys"),
                },
                Step::RemountReadOnly { path: c("/") },
                Step::NewSession,
                Step::Overlay(Box::new(Overlay {
                    target: c("/s/root"),
                    upper: c("/s/upper"),
                    work: c("/s/work"),
                    dir: Some(c("/layers")),
                    lowers: vec![c("b"), c("a")],
                    api: true,
                    legacy: Legacy {
                        links: vec![(c("/s/l/0"), c("/layers/b")), (c("/s/l/1"), c("/layers/a"))],
                        dir: None,
                        data: c("lowerdir=0:1,upperdir=/s/upper,workdir=/s/work,userxattr"),
                    },
                })),
            ],
            workdir: c("/w"),
            workdir_prefixes: vec![c("/w")],
            exec_paths: vec![c("/bin/cat"), c("/usr/bin/cat")],
            argv: vec![c("cat"), c("")],
            env: vec![c("PATH=/bin"), c("A=b c")],
            last_cap: 40,
            seccomp: Some(seccomp.clone()),
        };
        let mut bytes = Vec::new();
        encode_plan(&plan, &mut bytes);
        let fds = [20, 21, 22, 23, 24];
        let back = decode_plan(&bytes, fds, Some(&seccomp)).unwrap();
        let debug = |p: &Plan| {
            format!(
                "{} {} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {}",
                p.can_setgroups,
                p.uid,
                p.gid,
                p.groups,
                p.steps,
                p.workdir,
                p.workdir_prefixes,
                p.exec_paths,
                p.argv,
                p.env,
                p.last_cap,
                p.seccomp.is_some()
            )
        };
        assert_eq!(debug(&back), debug(&plan));
        assert_eq!(
            [
                back.sync_read,
                back.report_write,
                back.stdin_read,
                back.stdout_write,
                back.stderr_write
            ],
            fds
        );
        // Without a program at hand, a plan that wants one does not decode.
        assert!(decode_plan(&bytes, fds, None).is_none());
        // Every truncation, and trailing bytes, are refused.
        for n in 0..bytes.len() {
            assert!(
                decode_plan(&bytes[..n], fds, Some(&seccomp)).is_none(),
                "{n}"
            );
        }
        bytes.push(0);
        assert!(decode_plan(&bytes, fds, Some(&seccomp)).is_none());
    }
}
