//! The child side of a spawn: everything between clone and exec.
//!
//! The parent builds a [`Plan`] (every path, option string, argv and envp as a
//! C string, and the mount sequence) before it clones. The child only walks the
//! plan with raw system calls from [`crate::sys`]: it allocates nothing, takes no
//! locks and never returns into the parent's code, so it is safe to clone from
//! the multi-threaded daemon.
//!
//! Process model inside the new PID namespace:
//! - PID 1 is this code ("init"). It waits for the parent to write the id maps,
//!   builds the root filesystem, pivots into it, forks the function and reaps
//!   every process until the function exits. It then reports the function's wait
//!   status and exits, which makes the kernel kill whatever else is left in the
//!   PID namespace (background and `setsid` children included).
//! - PID 2 is the function: it takes its stdio, drops every privilege (empty
//!   capability sets including the bounding set, no_new_privs, locked
//!   securebits), sets its resource limits, installs the seccomp filter last and
//!   execs.
//!
//! Init's [`Step`]s after pivot_root also hide what a function must not see or
//! change: masked `/proc` and `/sys` paths, read-only `/proc/sys` and friends, a
//! read-only `/sys` and `/dev`, and a new session without a controlling
//! terminal. `docs/sandbox.md` lists the whole sequence and why each step is
//! there.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::sync::Arc;

use nix::errno::Errno;

use crate::overlay::Overlay;
use crate::sys;

/// One step of building the root filesystem, run by init in order.
#[derive(Debug, Clone)]
pub enum Step {
    /// mount(2).
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// mkdir(2); an existing directory is fine.
    Mkdir { path: CString, mode: libc::mode_t },
    /// Creates an empty file (a bind mount target).
    Touch { path: CString, mode: libc::mode_t },
    /// symlink(2); an existing entry is fine.
    Symlink { target: CString, link: CString },
    /// chdir(2).
    Chdir { path: CString },
    /// `pivot_root(".", put_old)`, then chdir to the new "/".
    PivotRoot { put_old: CString },
    /// umount2(2) with MNT_DETACH.
    Detach { path: CString },
    /// rmdir(2).
    Rmdir { path: CString },
    /// Sets the UTS namespace's hostname.
    Hostname { name: CString },
    /// Brings up `lo` in a new network namespace.
    LoopbackUp,
    /// Hides a path: `/dev/null` bound over a file, an empty read-only tmpfs
    /// over a directory. A path that does not exist is skipped.
    Mask { path: CString },
    /// Bind-mounts a path onto itself and makes the bind read-only. A path
    /// that does not exist is skipped.
    BindReadOnly { path: CString },
    /// Makes the mount at `path` read-only, keeping its other flags.
    RemountReadOnly { path: CString },
    /// Starts a new session (and process group) without a controlling terminal.
    NewSession,
    /// Mounts the overlay root (see [`crate::overlay`]).
    Overlay(Box<Overlay>),
}

impl Step {
    /// What the step does, for error messages.
    pub fn describe(&self) -> String {
        let s = |c: &CString| c.to_string_lossy().into_owned();
        match self {
            Step::Mount {
                target,
                fstype,
                source,
                ..
            } => format!(
                "mount {} on {}",
                fstype
                    .as_ref()
                    .or(source.as_ref())
                    .map_or_else(String::new, s),
                s(target)
            ),
            Step::Mkdir { path, .. } => format!("mkdir {}", s(path)),
            Step::Touch { path, .. } => format!("create {}", s(path)),
            Step::Symlink { link, .. } => format!("symlink {}", s(link)),
            Step::Chdir { path } => format!("chdir {}", s(path)),
            Step::PivotRoot { .. } => "pivot_root into the new root".to_owned(),
            Step::Detach { path } => format!("detach {}", s(path)),
            Step::Rmdir { path } => format!("rmdir {}", s(path)),
            Step::Hostname { .. } => "set hostname".to_owned(),
            Step::LoopbackUp => "bring up the loopback interface".to_owned(),
            Step::Mask { path } => format!("mask {}", s(path)),
            Step::BindReadOnly { path } => format!("bind {} read-only", s(path)),
            Step::RemountReadOnly { path } => format!("remount {} read-only", s(path)),
            Step::NewSession => "start a new session".to_owned(),
            Step::Overlay(o) => format!("mount overlay on {}", s(&o.target)),
        }
    }

    fn run(&self) -> sys::SysResult<()> {
        match self {
            Step::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => sys::mount(
                source.as_deref(),
                target,
                fstype.as_deref(),
                *flags,
                data.as_deref(),
            ),
            Step::Mkdir { path, mode } => sys::mkdir(path, *mode),
            Step::Touch { path, mode } => sys::touch(path, *mode),
            Step::Symlink { target, link } => sys::symlink(target, link),
            Step::Chdir { path } => sys::chdir(path),
            Step::PivotRoot { put_old } => {
                sys::pivot_root(c".", put_old)?;
                sys::chdir(c"/")
            }
            Step::Detach { path } => sys::umount2(path, libc::MNT_DETACH),
            Step::Rmdir { path } => sys::rmdir(path),
            Step::Hostname { name } => sys::sethostname(name),
            Step::LoopbackUp => sys::loopback_up(),
            Step::Mask { path } => {
                match sys::mount(Some(c"/dev/null"), path, None, libc::MS_BIND, None) {
                    Ok(()) | Err(Errno::ENOENT) => Ok(()),
                    // A directory: binding a file over it fails with ENOTDIR.
                    Err(Errno::ENOTDIR) => sys::mount(
                        Some(c"tmpfs"),
                        path,
                        Some(c"tmpfs"),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        Some(c"mode=0555"),
                    ),
                    Err(e) => Err(e),
                }
            }
            Step::BindReadOnly { path } => {
                match sys::mount(Some(path), path, None, libc::MS_BIND | libc::MS_REC, None) {
                    Ok(()) => remount_read_only(path),
                    Err(Errno::ENOENT) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Step::RemountReadOnly { path } => remount_read_only(path),
            Step::NewSession => sys::setsid(),
            Step::Overlay(o) => crate::overlay::mount(o),
        }
    }
}

/// A read-only bind remount. It must repeat the mount's nosuid, nodev, noexec
/// and atime flags: in a user namespace those are locked when they come from a
/// more privileged mount, and dropping one fails with EPERM.
fn remount_read_only(path: &CStr) -> sys::SysResult<()> {
    let flags = sys::mount_flags(path)?;
    sys::mount(
        None,
        path,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
        None,
    )
}

/// Stages of the function process after init forked it, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ExecStage {
    Stdio = 0,
    Signals,
    CloseFds,
    Workdir,
    NoNewPrivs,
    DropBounding,
    ClearAmbient,
    SecureBits,
    SetGroups,
    SetGid,
    SetUid,
    DropCaps,
    Rlimits,
    Seccomp,
    Exec,
}

impl ExecStage {
    pub fn from_u32(v: u32) -> Option<Self> {
        use ExecStage::*;
        [
            Stdio,
            Signals,
            CloseFds,
            Workdir,
            NoNewPrivs,
            DropBounding,
            ClearAmbient,
            SecureBits,
            SetGroups,
            SetGid,
            SetUid,
            DropCaps,
            Rlimits,
            Seccomp,
            Exec,
        ]
        .get(v as usize)
        .copied()
    }

    pub fn describe(self) -> &'static str {
        match self {
            ExecStage::Stdio => "set up stdio",
            ExecStage::Signals => "reset signal dispositions",
            ExecStage::CloseFds => "close inherited file descriptors",
            ExecStage::Workdir => "change to the working directory",
            ExecStage::NoNewPrivs => "set no_new_privs",
            ExecStage::DropBounding => "drop the capability bounding set",
            ExecStage::ClearAmbient => "clear ambient capabilities",
            ExecStage::SecureBits => "lock the securebits",
            ExecStage::SetGroups => "set supplementary groups",
            ExecStage::SetGid => "set the group id",
            ExecStage::SetUid => "set the user id",
            ExecStage::DropCaps => "drop capabilities",
            ExecStage::Rlimits => "set resource limits",
            ExecStage::Seccomp => "install the seccomp filter",
            ExecStage::Exec => "execute the entrypoint",
        }
    }
}

/// Record kinds on the report pipe (child to parent).
pub const REPORT_SETUP: u32 = 1;
pub const REPORT_EXEC: u32 = 2;
pub const REPORT_EXIT: u32 = 3;
/// Size of one report record: kind, step, value.
pub const REPORT_LEN: usize = 12;

/// Everything the child needs, prepared by the parent before clone.
#[derive(Debug)]
pub struct Plan {
    pub sync_read: RawFd,
    pub report_write: RawFd,
    pub stdin_read: RawFd,
    pub stdout_write: RawFd,
    pub stderr_write: RawFd,
    /// setgroups(2) is allowed (a full id map written by a privileged parent).
    pub can_setgroups: bool,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub steps: Vec<Step>,
    pub workdir: CString,
    /// `/a`, `/a/b`, ... of the working directory, to create it if missing.
    pub workdir_prefixes: Vec<CString>,
    /// Paths to try for the entrypoint, in order (a PATH search done ahead).
    pub exec_paths: Vec<CString>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// Highest capability number of the running kernel.
    pub last_cap: u32,
    /// The seccomp program installed last before exec; `None` runs unconfined.
    pub seccomp: Option<Arc<fnrun_seccomp::BpfProgram>>,
}

/// NULL-terminated pointer arrays into a [`Plan`]'s strings.
pub struct ExecPointers {
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
}

impl ExecPointers {
    pub fn new(plan: &Plan) -> Self {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        ExecPointers {
            argv: ptrs(&plan.argv),
            envp: ptrs(&plan.env),
        }
    }
}

fn report(fd: RawFd, kind: u32, step: u32, value: i32) {
    let mut rec = [0u8; REPORT_LEN];
    rec[0..4].copy_from_slice(&kind.to_ne_bytes());
    rec[4..8].copy_from_slice(&step.to_ne_bytes());
    rec[8..12].copy_from_slice(&value.to_ne_bytes());
    // Nothing can be done if the parent is gone.
    let _ = sys::write_all(fd, &rec);
}

fn fail_setup(plan: &Plan, step: u32, err: Errno) -> ! {
    report(plan.report_write, REPORT_SETUP, step, err as i32);
    sys::exit(125)
}

/// Marker step numbers for init's own work around the plan.
pub const INIT_WAIT: u32 = u32::MAX;
pub const INIT_IDS: u32 = u32::MAX - 1;
pub const INIT_FORK: u32 = u32::MAX - 2;
pub const INIT_PDEATHSIG: u32 = u32::MAX - 3;
pub const INIT_CGROUPNS: u32 = u32::MAX - 4;

/// Closes every descriptor but `keep`. Init is a copy of the daemon, so it
/// holds every descriptor the daemon had at clone time, close-on-exec or not:
/// other runs' pipes among them, which would keep those runs from seeing EOF.
fn close_all_but(mut keep: [RawFd; 5]) {
    keep.sort_unstable();
    let mut first: u32 = 0;
    for fd in keep {
        let fd = fd as u32;
        if fd > first {
            sys::close_range(first, fd - 1);
        }
        first = fd + 1;
    }
    sys::close_range(first, u32::MAX);
}

/// PID 1 of the sandbox. Never returns.
pub fn init_main(plan: &Plan, ptrs: &ExecPointers) -> ! {
    close_all_but([
        plan.sync_read,
        plan.report_write,
        plan.stdin_read,
        plan.stdout_write,
        plan.stderr_write,
    ]);
    // Die with the thread that cloned us, so a crashed daemon leaves no run behind.
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) {
        fail_setup(plan, INIT_PDEATHSIG, e);
    }
    // Wait until the parent has written the id maps (and placed us in a cgroup).
    let mut byte = [0u8; 1];
    match sys::read(plan.sync_read, &mut byte) {
        Ok(1) => {}
        Ok(_) => sys::exit(125),
        Err(e) => fail_setup(plan, INIT_WAIT, e),
    }
    sys::close(plan.sync_read);

    // Become root of the new user namespace, so files we create are owned by a
    // mapped id.
    let ids = (|| {
        if plan.can_setgroups {
            sys::setgroups(&[])?;
        }
        sys::setresgid(0)?;
        sys::setresuid(0)
    })();
    if let Err(e) = ids {
        fail_setup(plan, INIT_IDS, e);
    }
    // A cgroup namespace rooted at the run's cgroup, now that we are in it.
    // SAFETY: plain unshare(2) with a flag; no memory is touched.
    if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } < 0 {
        fail_setup(plan, INIT_CGROUPNS, Errno::last());
    }

    for (i, step) in plan.steps.iter().enumerate() {
        if let Err(e) = step.run() {
            fail_setup(plan, i as u32, e);
        }
    }

    let function = match sys::raw_fork() {
        Ok(0) => function_main(plan, ptrs),
        Ok(pid) => pid,
        Err(e) => fail_setup(plan, INIT_FORK, e),
    };

    // Only the function holds the stdio pipes now, so the parent sees EOF
    // when the function and everything it started are gone.
    for fd in [plan.stdin_read, plan.stdout_write, plan.stderr_write] {
        sys::close(fd);
    }
    // SAFETY: ignoring signals a PID 1 does not want, with SIG_IGN (no handler
    // code runs). The kernel never delivers them to a namespace init from inside
    // anyway; this just makes it explicit for SIGHUP from a closed session.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };

    loop {
        match sys::wait_any() {
            Ok((pid, status)) if pid == function => {
                report(plan.report_write, REPORT_EXIT, 0, status);
                sys::exit(0);
            }
            Ok(_) => {}
            Err(_) => sys::exit(125),
        }
    }
}

/// SECBIT_NOROOT, SECBIT_NO_CAP_AMBIENT_RAISE, and the locks of those and of
/// SECBIT_NO_SETUID_FIXUP and SECBIT_KEEP_CAPS (both left off: a change of uid
/// away from 0 still clears every capability).
const SECUREBITS: libc::c_ulong = (libc::SECBIT_NOROOT
    | libc::SECBIT_NOROOT_LOCKED
    | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
    | libc::SECBIT_KEEP_CAPS_LOCKED
    | libc::SECBIT_NO_CAP_AMBIENT_RAISE
    | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED) as libc::c_ulong;

/// Resource limits of the function: soft and hard limit set to the smaller of
/// this value and the current hard limit. Enough descriptors for any server
/// (as container runtimes give), and no core dumps (they would fill the run's
/// writable layer).
const RLIMITS: [(libc::c_int, u64); 2] = [
    (libc::RLIMIT_NOFILE as libc::c_int, 1 << 20),
    (libc::RLIMIT_CORE as libc::c_int, 0),
];

fn fail_exec(plan: &Plan, stage: ExecStage, err: Errno) -> ! {
    report(plan.report_write, REPORT_EXEC, stage as u32, err as i32);
    sys::exit(127)
}

/// PID 2: the function. Never returns.
fn function_main(plan: &Plan, ptrs: &ExecPointers) -> ! {
    use ExecStage::*;
    let stdio = (|| {
        sys::dup2(plan.stdin_read, 0)?;
        sys::dup2(plan.stdout_write, 1)?;
        sys::dup2(plan.stderr_write, 2)
    })();
    if let Err(e) = stdio {
        fail_exec(plan, Stdio, e);
    }
    if let Err(e) = sys::reset_signals() {
        fail_exec(plan, Signals, e);
    }
    // Every other descriptor closes at exec; the report pipe stays usable until then.
    if let Err(e) = sys::cloexec_from(3) {
        fail_exec(plan, CloseFds, e);
    }
    // The working directory is created if the image lacks it, as container
    // runtimes do. This runs after pivot_root, so every path resolves inside
    // the new root.
    if sys::chdir(&plan.workdir).is_err() {
        for prefix in &plan.workdir_prefixes {
            if let Err(e) = sys::mkdir(prefix, 0o755) {
                fail_exec(plan, Workdir, e);
            }
        }
        if let Err(e) = sys::chdir(&plan.workdir) {
            fail_exec(plan, Workdir, e);
        }
    }
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) {
        fail_exec(plan, NoNewPrivs, e);
    }
    for cap in 0..=plan.last_cap {
        match sys::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            Ok(()) | Err(Errno::EINVAL) => {}
            Err(e) => fail_exec(plan, DropBounding, e),
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    } < 0
    {
        fail_exec(plan, ClearAmbient, Errno::last());
    }
    // Root gains no capability from exec (SECBIT_NOROOT) whatever the bounding
    // set, and none of these bits can be changed again. Belt and braces: the
    // bounding set is empty and no_new_privs is set already.
    if let Err(e) = sys::prctl(libc::PR_SET_SECUREBITS, SECUREBITS) {
        fail_exec(plan, SecureBits, e);
    }
    if plan.can_setgroups {
        if let Err(e) = sys::setgroups(&plan.groups) {
            fail_exec(plan, SetGroups, e);
        }
    }
    if let Err(e) = sys::setresgid(plan.gid) {
        fail_exec(plan, SetGid, e);
    }
    if let Err(e) = sys::setresuid(plan.uid) {
        fail_exec(plan, SetUid, e);
    }
    if let Err(e) = sys::capset_none() {
        fail_exec(plan, DropCaps, e);
    }
    for (resource, most) in RLIMITS {
        if let Err(e) = sys::getrlimit(resource).and_then(|old| {
            // Never above the hard limit: raising it needs CAP_SYS_RESOURCE
            // in the initial user namespace.
            let limit = most.min(old.rlim_max);
            sys::setrlimit(
                resource,
                libc::rlimit64 {
                    rlim_cur: limit,
                    rlim_max: limit,
                },
            )
        }) {
            fail_exec(plan, Rlimits, e);
        }
    }
    // Last, so that nothing above needs to be allowed by the filter: from here
    // on only execve (and, on failure, write and exit_group) run.
    if let Some(program) = &plan.seccomp {
        if let Err(e) = sys::seccomp_filter(program) {
            fail_exec(plan, Seccomp, e);
        }
    }
    let mut err = Errno::ENOENT;
    for path in &plan.exec_paths {
        err = sys::execve(path, &ptrs.argv, &ptrs.envp);
        // Keep searching PATH only past entries that are not there.
        if !matches!(err, Errno::ENOENT | Errno::ENOTDIR) {
            break;
        }
    }
    fail_exec(plan, Exec, err)
}

/// Turns a report record into (kind, step, value).
pub fn parse_report(rec: &[u8]) -> Option<(u32, u32, i32)> {
    let rec: &[u8; REPORT_LEN] = rec.try_into().ok()?;
    let word = |i: usize| [rec[i], rec[i + 1], rec[i + 2], rec[i + 3]];
    Some((
        u32::from_ne_bytes(word(0)),
        u32::from_ne_bytes(word(4)),
        i32::from_ne_bytes(word(8)),
    ))
}
