//! Processes: clone, pidfds, waiting and signals across processes.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;

use super::fd::{close, dup2};
use super::ret::{SysResult, check, check_int, to_int};

/// `clone_args` for clone3(2); declared here because libc does not have it on
/// every architecture.
#[repr(C)]
#[derive(Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

/// clone3(2) with fork semantics (no new stack, no shared memory).
///
/// Returns 0 in the child and the child's pid in the parent.
///
/// # Safety
/// In the child only async-signal-safe code may run until exec or exit.
pub unsafe fn clone3(args: &mut CloneArgs) -> SysResult<libc::pid_t> {
    // SAFETY: `args` is a valid, live clone_args of the size given; with a zero
    // stack the child continues on a copy of this stack, like fork(2).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    check(ret).and_then(to_int)
}

/// fork(2) as a raw clone: no atfork handlers, no glibc bookkeeping.
pub fn raw_fork() -> SysResult<libc::pid_t> {
    let mut args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // SAFETY: the callers of raw_fork are themselves in the async-signal-safe
    // child and keep to it in the grandchild.
    unsafe { clone3(&mut args) }
}

/// SIGKILL through a pidfd: never a pid that was reused.
pub fn pidfd_kill(pidfd: BorrowedFd<'_>) {
    // SAFETY: pidfd_send_signal with a live pidfd and no siginfo; a process
    // that is gone already is no error worth reporting.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// pidfd_open(2) of `pid` (close-on-exec by default).
pub fn pidfd_open(pid: libc::pid_t) -> SysResult<RawFd> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) }).and_then(to_int)
}

/// glibc's fork(2), whose at-fork handlers leave malloc usable in the child
/// of a multi-threaded process.
///
/// # Safety
/// The child of a multi-threaded parent may only allocate (glibc's handlers
/// allow it) and make system calls until it execs or exits.
pub unsafe fn fork() -> SysResult<libc::pid_t> {
    // SAFETY: the caller keeps the child to what is allowed.
    check_int(unsafe { libc::fork() })
}

/// waitpid(2) for the child `pid`, until it is gone.
pub fn wait_child(pid: libc::pid_t) {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret == pid || Errno::last() != Errno::EINTR {
            return;
        }
    }
}

/// SIGKILL to `pid`, a child of this process not yet reaped.
pub fn kill_child(pid: libc::pid_t) {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// SIGKILL to every process of the caller's PID namespace but itself and
/// its init (`kill(-1, SIGKILL)`); a namespace's init kills all the others.
/// `ESRCH` (no other process) is no error worth reporting.
pub fn kill_all() {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(-1, libc::SIGKILL) };
}

/// Whether the pipe whose write end is `fd` has lost every reader: its
/// `poll` says `POLLERR` then. Nothing is written.
pub fn no_reader(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd; a zero timeout never blocks.
    let ret = unsafe { libc::poll(&mut p, 1, 0) };
    ret > 0 && p.revents & libc::POLLERR != 0
}

/// getppid(2).
pub fn parent_pid() -> libc::pid_t {
    // SAFETY: no preconditions.
    unsafe { libc::getppid() }
}

/// setpgid(0, 0): a process group of its own.
pub fn own_process_group() -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::setpgid(0, 0) }).map(drop)
}

/// unshare(2) with `flags`.
pub fn unshare(flags: libc::c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::unshare(flags) }).map(drop)
}

/// Ignores `signal` (SIG_IGN: no handler code ever runs).
pub fn ignore_signal(signal: libc::c_int) {
    // SAFETY: installing SIG_IGN runs no code.
    unsafe { libc::signal(signal, libc::SIG_IGN) };
}

/// Clears `PR_CAP_AMBIENT`'s set.
pub fn clear_ambient_caps() -> SysResult<()> {
    // SAFETY: prctl with integer arguments only.
    check_int(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
    .map(drop)
}

/// Names the calling thread (`PR_SET_NAME`, at most 15 bytes shown).
pub fn set_name(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// Makes `fd` survive exec (clears `FD_CLOEXEC`).
pub fn keep_on_exec(fd: RawFd) -> SysResult<()> {
    // SAFETY: fcntl on a descriptor number with an integer argument.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// Points descriptors 0, 1 and 2 at `/dev/null`.
pub fn stdio_to_null() -> SysResult<()> {
    // SAFETY: open(2) of a NUL-terminated path.
    let null = check_int(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) })?;
    for fd in 0..3 {
        if fd != null {
            dup2(null, fd)?;
        }
    }
    if null > 2 {
        close(null);
    }
    Ok(())
}

/// `RLIMIT_NPROC` of process `pid`, lowered (soft and hard) to `limit` as far
/// as its hard limit allows.
pub fn lower_nproc(pid: libc::pid_t, limit: u64) -> SysResult<()> {
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 with no new limit only fills `old`, a valid rlimit64.
    check_int(unsafe { libc::prlimit64(pid, libc::RLIMIT_NPROC, std::ptr::null(), &mut old) })?;
    let limit = limit.min(old.rlim_max);
    let new = libc::rlimit64 {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: `new` is a valid rlimit64 that prlimit64 only reads.
    check_int(unsafe { libc::prlimit64(pid, libc::RLIMIT_NPROC, &new, std::ptr::null_mut()) })
        .map(drop)
}

/// A non-blocking signalfd for SIGCHLD, which is blocked first so that it is
/// only ever read from there.
pub fn sigchld_fd() -> SysResult<RawFd> {
    let mask: u64 = 1 << (libc::SIGCHLD - 1);
    const SIGSET_SIZE: usize = 8;
    // SAFETY: `mask` is a valid kernel sigset of SIGSET_SIZE bytes.
    check(unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &mask as *const u64,
            std::ptr::null_mut::<u64>(),
            SIGSET_SIZE,
        )
    })?;
    // SAFETY: as above; -1 creates a new signalfd.
    check(unsafe {
        libc::syscall(
            libc::SYS_signalfd4,
            -1,
            &mask as *const u64,
            SIGSET_SIZE,
            libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
        )
    })
    .and_then(to_int)
}

/// Waits until `a` or `b` is readable (or hung up); returns which.
pub fn poll2(a: RawFd, b: RawFd) -> SysResult<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: fds is a valid array of two pollfd; no timeout, no mask.
        let ret = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, std::ptr::null(), std::ptr::null()) };
        match check_int(ret) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => {
                let ready = |p: &libc::pollfd| p.revents != 0;
                return Ok((ready(&fds[0]), ready(&fds[1])));
            }
        }
    }
}

/// wait4(-1, WNOHANG) for any child: `None` when none has exited.
pub fn try_wait_any() -> SysResult<Option<(libc::pid_t, libc::c_int)>> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: status is a valid out pointer; rusage may be null.
        let ret = unsafe {
            libc::wait4(
                -1,
                &mut status,
                libc::__WALL | libc::WNOHANG,
                std::ptr::null_mut(),
            )
        };
        match check_int(ret) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(0) => return Ok(None),
            Ok(pid) => return Ok(Some((pid, status))),
        }
    }
}

/// Replaces this process with `path` (`argv`, empty environment), its
/// descriptor `fd` moved to 3 and kept open. Returns only on failure.
pub fn exec_with_fd3(fd: RawFd, path: &CStr, argv: &[*const libc::c_char]) -> Errno {
    let envp = [std::ptr::null::<libc::c_char>()];
    let moved = if fd == 3 {
        keep_on_exec(3)
    } else {
        // dup2's copy does not have FD_CLOEXEC.
        dup2(fd, 3)
    };
    if let Err(e) = moved {
        return e;
    }
    // SAFETY: argv is a NULL-terminated array of C strings that outlive the
    // call, envp an empty one; execve returns only on failure.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// setns(2): moves the calling thread into the namespace `fd` refers to
/// (`nstype`: which kind it must be).
pub fn setns(fd: RawFd, nstype: libc::c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::setns(fd, nstype) }).map(drop)
}
