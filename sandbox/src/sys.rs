//! Raw system calls for the child side of a spawn.
//!
//! Everything here may run in a process cloned from a multi-threaded parent, where
//! only async-signal-safe operations are allowed: no allocation, no locks, and no
//! glibc wrappers that coordinate with other threads (glibc's `setuid`/`setgroups`
//! broadcast to every thread of the process, which do not exist in the child and so
//! deadlock it). Each wrapper is a direct `syscall(2)` or a plain libc syscall
//! wrapper taking pointers prepared by the parent.

use std::ffi::CStr;
use std::os::fd::RawFd;

use nix::errno::Errno;

/// The result of a raw call: the errno on failure.
pub type SysResult<T> = Result<T, Errno>;

fn check(ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn check_int(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

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
    check(ret).map(|pid| pid as libc::pid_t)
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

pub fn read(fd: RawFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes of writes.
        let ret = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match check(ret as libc::c_long) {
            Err(Errno::EINTR) => continue,
            other => return other.map(|n| n as usize),
        }
    }
}

pub fn write_all(fd: RawFd, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes of reads.
        let ret = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        match check(ret as libc::c_long) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(n) => buf = &buf[n as usize..],
        }
    }
    Ok(())
}

pub fn close(fd: RawFd) {
    // SAFETY: closing a descriptor number has no memory effects; errors are moot.
    unsafe { libc::close(fd) };
}

pub fn dup2(old: RawFd, new: RawFd) -> SysResult<()> {
    // SAFETY: plain descriptor syscall.
    check_int(unsafe { libc::dup2(old, new) }).map(drop)
}

/// Closes descriptors `first..=last`.
pub fn close_range(first: u32, last: u32) {
    // SAFETY: plain syscall with integer arguments; failure leaves fds open,
    // which only matters for descriptors init does not use.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
}

/// Marks every descriptor from `first` up close-on-exec (Linux 5.11).
pub fn cloexec_from(first: u32) -> SysResult<()> {
    // SAFETY: plain syscall with integer arguments.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    })
    .map(drop)
}

pub fn setresuid(uid: u32) -> SysResult<()> {
    // SAFETY: raw syscall, deliberately bypassing glibc's all-thread broadcast.
    check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }).map(drop)
}

pub fn setresgid(gid: u32) -> SysResult<()> {
    // SAFETY: as for setresuid.
    check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) }).map(drop)
}

pub fn setgroups(groups: &[libc::gid_t]) -> SysResult<()> {
    // SAFETY: groups is a valid slice of gid_t; raw syscall for the same reason
    // as setresuid.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }).map(drop)
}

pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> SysResult<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // outlives the call.
    check_int(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
    .map(drop)
}

pub fn umount2(target: &CStr, flags: libc::c_int) -> SysResult<()> {
    // SAFETY: target is NUL-terminated.
    check_int(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

pub fn chdir(path: &CStr) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// mkdir that accepts an existing directory.
pub fn mkdir(path: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    match check_int(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Ok(_) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

pub fn rmdir(path: &CStr) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    check_int(unsafe { libc::rmdir(path.as_ptr()) }).map(drop)
}

/// Creates an empty file to bind-mount a device node onto.
pub fn touch(path: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: path is NUL-terminated.
    let fd = check_int(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode,
        )
    })?;
    close(fd);
    Ok(())
}

pub fn symlink(target: &CStr, link: &CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    match check_int(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) }) {
        Ok(_) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

pub fn sethostname(name: &CStr) -> SysResult<()> {
    let bytes = name.to_bytes();
    // SAFETY: the pointer and length describe `name` without its NUL.
    check_int(unsafe { libc::sethostname(bytes.as_ptr().cast(), bytes.len()) }).map(drop)
}

pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> SysResult<()> {
    // SAFETY: the prctl options used here take integer arguments only.
    check_int(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
    .map(drop)
}

/// Restores the default action of every signal and unblocks them all.
///
/// Ignored signals and the signal mask survive execve: without this the
/// function would inherit the runner's (a Rust program ignores SIGPIPE, so
/// `yes | head` would never end) or its parent's.
pub fn reset_signals() -> SysResult<()> {
    // The kernel's `struct sigaction` for SIG_DFL, no flags, an empty mask is
    // all zeros on every architecture (SIG_DFL is 0), whatever its layout.
    let dfl = [0u64; 4];
    const SIGSET_SIZE: usize = 8;
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `dfl` outlives the call and is at least as large as the
        // kernel's sigaction; no old action is requested.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<u64>(),
                SIGSET_SIZE,
            )
        };
        check(ret)?;
    }
    let empty: u64 = 0;
    // SAFETY: `empty` is a valid kernel sigset of SIGSET_SIZE bytes.
    check(unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            SIGSET_SIZE,
        )
    })
    .map(drop)
}

/// Clears the effective, permitted and inheritable capability sets.
pub fn capset_none() -> SysResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data have the kernel's v3 layout (two data elements).
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) })
        .map(drop)
}

/// Brings up the loopback interface of the current network namespace.
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: plain socket syscall.
    let sock = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags =
        (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq.
    let ret = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &req as *const libc::ifreq) };
    close(sock);
    check_int(ret).map(drop)
}

pub fn execve(path: &CStr, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> Errno {
    // SAFETY: argv and envp are NULL-terminated arrays of pointers to strings the
    // parent prepared and that outlive the call; execve returns only on failure.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// wait4(-1) for any child; returns (pid, raw status).
pub fn wait_any() -> SysResult<(libc::pid_t, libc::c_int)> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: status is a valid out pointer; rusage may be null.
        let ret = unsafe { libc::wait4(-1, &mut status, libc::__WALL, std::ptr::null_mut()) };
        match check_int(ret) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(pid) => return Ok((pid, status)),
        }
    }
}

pub fn exit(code: libc::c_int) -> ! {
    // SAFETY: _exit skips atexit handlers and stdio flushing, which belong to the
    // parent process image.
    unsafe { libc::_exit(code) }
}

pub fn setsid() -> SysResult<()> {
    // SAFETY: plain syscall without arguments.
    check(unsafe { libc::syscall(libc::SYS_setsid) }).map(drop)
}

/// The per-mount flags of the mount at `path`, as `MS_*` flags to pass back to
/// a remount. In a user namespace a remount must keep the flags that a more
/// privileged namespace locked (nosuid, nodev, noexec, atime), or it fails
/// with EPERM.
pub fn mount_flags(path: &CStr) -> SysResult<libc::c_ulong> {
    // SAFETY: statfs64 is plain old data; all-zero is a valid value.
    let mut st: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st a valid out pointer; on 64-bit
    // targets the kernel's statfs is statfs64. Raw syscall: glibc's statvfs
    // may read /proc/self/mountinfo and allocate.
    check(unsafe {
        libc::syscall(
            libc::SYS_statfs,
            path.as_ptr(),
            &mut st as *mut libc::statfs64,
        )
    })?;
    let st_flags = st.f_flags as libc::c_ulong;
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st_flags & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Reads a resource limit.
pub fn getrlimit(resource: libc::c_int) -> SysResult<libc::rlimit64> {
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 on ourselves (pid 0) with a null new limit and a valid
    // out pointer.
    check(unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            resource,
            std::ptr::null::<libc::rlimit64>(),
            &mut old as *mut libc::rlimit64,
        )
    })?;
    Ok(old)
}

/// Sets a resource limit (raw prlimit64: no glibc bookkeeping).
pub fn setrlimit(resource: libc::c_int, limit: libc::rlimit64) -> SysResult<()> {
    // SAFETY: prlimit64 on ourselves with a valid new limit and no old one.
    check(unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            resource,
            &limit as *const libc::rlimit64,
            std::ptr::null_mut::<libc::rlimit64>(),
        )
    })
    .map(drop)
}

/// Installs a seccomp filter on the calling thread (no_new_privs must be set).
/// The program was compiled and checked by the parent; the kernel copies it.
pub fn seccomp_filter(program: &[fnrun_seccomp::sock_filter]) -> SysResult<()> {
    const _: () = assert!(
        std::mem::size_of::<fnrun_seccomp::sock_filter>()
            == std::mem::size_of::<libc::sock_filter>()
    );
    let Ok(len) = u16::try_from(program.len()) else {
        return Err(Errno::EINVAL);
    };
    let prog = libc::sock_fprog {
        len,
        // seccompiler's sock_filter has the kernel's layout (repr(C) u16, u8,
        // u8, u32), as libc's does; the kernel only reads through it.
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prog points to `len` valid instructions that outlive the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    })
    .map(drop)
}

/// fsopen(2): a new file system context of type `fstype` (close-on-exec).
pub fn fsopen(fstype: &CStr) -> SysResult<RawFd> {
    // SAFETY: fstype is NUL-terminated; the flag is an integer.
    check(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) })
        .map(|fd| fd as RawFd)
}

/// fsconfig(2) `FSCONFIG_SET_STRING`: sets parameter `key` of context `fs`.
pub fn fsconfig_string(fs: RawFd, key: &CStr, value: &CStr) -> SysResult<()> {
    // SAFETY: key and value are NUL-terminated; aux is unused (0).
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs,
            libc::FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    })
    .map(drop)
}

/// fsconfig(2) `FSCONFIG_SET_FLAG`: sets the flag parameter `key`.
pub fn fsconfig_flag(fs: RawFd, key: &CStr) -> SysResult<()> {
    // SAFETY: key is NUL-terminated; value and aux are unused (null, 0).
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs,
            libc::FSCONFIG_SET_FLAG,
            key.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })
    .map(drop)
}

/// fsconfig(2) `FSCONFIG_CMD_CREATE`: creates the superblock.
pub fn fsconfig_create(fs: RawFd) -> SysResult<()> {
    // SAFETY: a command without key or value.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs,
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })
    .map(drop)
}

/// fsmount(2): a detached mount of the context's superblock with
/// `attributes` (`MOUNT_ATTR_*`), close-on-exec.
pub fn fsmount(fs: RawFd, attributes: u64) -> SysResult<RawFd> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::syscall(libc::SYS_fsmount, fs, libc::FSMOUNT_CLOEXEC, attributes) })
        .map(|fd| fd as RawFd)
}

/// move_mount(2) of the detached mount `mnt` onto `target`.
pub fn move_mount(mnt: RawFd, target: &CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated ("" with MOVE_MOUNT_F_EMPTY_PATH
    // names `mnt` itself).
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}
