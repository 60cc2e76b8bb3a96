//! Every raw system call of the sandbox, in one place.
//!
//! Most of them run in a process cloned from a multi-threaded parent (init,
//! the function before its exec, the spawner):
//! Everything here may run in a process cloned from a multi-threaded parent, where
//! only async-signal-safe operations are allowed: no allocation, no locks, and no
//! glibc wrappers that coordinate with other threads (glibc's `setuid`/`setgroups`
//! broadcast to every thread of the process, which do not exist in the child and so
//! deadlock it). Each wrapper is a direct `syscall(2)` or a plain libc syscall
//! wrapper taking pointers prepared by the parent.

use std::ffi::CStr;

use nix::errno::Errno;

mod fd;
mod mount;
mod net;
mod process;
mod ret;

pub use fd::*;
pub use mount::*;
pub use net::*;
pub use process::*;
pub use ret::SysResult;
use ret::{check, check_int};

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
