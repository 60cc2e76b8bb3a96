//! The child side of a launch: everything between clone and exec, and what it
//! reports back.
//!
//! The parent prepares a [`Plan`] before it clones; the child only walks it
//! with raw system calls from [`crate::sys`]: it allocates nothing, takes no
//! locks and never returns into the parent's code, so it is safe to clone
//! from a multi-threaded process.
//!
//! Process model inside the new PID namespace:
//! - PID 1 is [`init_main`] ("init"). It waits for the parent to write the id
//!   maps, builds the root filesystem (the plan's [`crate::steps`]), forks
//!   the function and reaps every process until the function exits. It then
//!   kills and reaps every other process of the PID namespace, reports the
//!   function's wait status and exits: a run is over, all its processes
//!   dead, when its parent reads that report. In a service run it
//!   also serves the parent's requests for sockets in the run's network
//!   namespace (see [`sockets`]).
//! - PID 2 is the function ([`function_main`]): it takes its stdio, drops
//!   every privilege (empty capability sets including the bounding set,
//!   no_new_privs, locked securebits), sets its resource limits and installs
//!   the seccomp filter. It then reports that the sandbox is ready and waits
//!   for the call (a second byte on the sync pipe: a prepared sandbox waits
//!   here until a call takes it, a fresh run gets it at once), and execs. So
//!   everything but the exec is done before the call, in a sandbox made
//!   ahead of it; the function's code runs only after the call came.
//!
//! Each stage of both, in order, is a [`Stage`], with its description: a
//! failing stage is reported as a [`Report`] (stage and errno) on the report
//! pipe, and the parent turns it into an [`Error`]. A new stage is one
//! variant of [`Stage`] and one call in this file. `docs/sandbox.md` lists
//! the whole sequence and why each stage is there.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::plan::Plan;
use crate::sys;

/// The descriptors init starts with (its ends of the run's pipes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InitFds {
    /// Parent to init: one byte once the id maps are written; parent to the
    /// function: a second one when the call comes (see [`Stage::WaitForCall`]).
    pub sync: RawFd,
    /// Init and the function to the parent: [`Report`]s.
    pub report: RawFd,
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// Service runs: init's end of the [`sockets`] channel.
    pub sockets: Option<RawFd>,
}

impl InitFds {
    /// The descriptors in a fixed order, for `SCM_RIGHTS`.
    pub fn to_vec(self) -> Vec<RawFd> {
        let mut fds = vec![self.sync, self.report, self.stdin, self.stdout, self.stderr];
        fds.extend(self.sockets);
        fds
    }

    /// The descriptors [`Self::to_vec`] listed, as received.
    pub fn from_slice(fds: &[RawFd]) -> Option<InitFds> {
        let (sockets, rest) = match fds.len() {
            5 => (None, fds),
            6 => (Some(fds[5]), &fds[..5]),
            _ => return None,
        };
        Some(InitFds {
            sync: rest[0],
            report: rest[1],
            stdin: rest[2],
            stdout: rest[3],
            stderr: rest[4],
            sockets,
        })
    }
}

/// What the child runs, all prepared before the clone.
pub(crate) struct Init<'a> {
    pub plan: &'a Plan,
    pub fds: InitFds,
    /// Installed before exec when the plan asks for it.
    pub seccomp: Option<&'a fnrun_seccomp::BpfProgram>,
    /// NULL-terminated `argv` and `envp` arrays into the plan's strings.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl<'a> Init<'a> {
    pub fn new(
        plan: &'a Plan,
        fds: InitFds,
        seccomp: Option<&'a fnrun_seccomp::BpfProgram>,
    ) -> Init<'a> {
        let ptrs = |v: &[std::ffi::CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Init {
            plan,
            fds,
            seccomp: seccomp.filter(|_| plan.seccomp),
            argv: ptrs(&plan.argv),
            envp: ptrs(&plan.env),
        }
    }
}

/// The stages of init and of the function, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Stage {
    // Init (PID 1).
    ParentDeathSignal,
    WaitForParent,
    BecomeRoot,
    CgroupNamespace,
    /// Step `n` of the plan's root filesystem steps.
    Step(u32),
    ServeSockets,
    ForkFunction,
    // The function (PID 2), up to its exec.
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
    /// Waiting for the call: the root is built and the function is at its
    /// exec, with every privilege dropped and the seccomp filter installed.
    WaitForCall,
    Exec,
}

impl Stage {
    /// The error a failure of this stage with `errno` is, for a run of `plan`.
    pub fn error(self, plan: &Plan, errno: Errno) -> Error {
        let setup = |what: &str| Error::Setup {
            what: what.to_owned(),
            errno,
        };
        let exec = |stage: &'static str| Error::Exec {
            stage,
            path: match self {
                Stage::Workdir => plan.workdir.to_string_lossy().into_owned(),
                _ => plan
                    .argv
                    .first()
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            },
            errno,
        };
        match self {
            Stage::ParentDeathSignal => setup("set the parent death signal"),
            Stage::WaitForParent => setup("wait for the parent"),
            Stage::BecomeRoot => setup("become root of the user namespace"),
            Stage::CgroupNamespace => setup("create the cgroup namespace"),
            Stage::Step(i) => match plan.steps.get(i as usize) {
                Some(step) => step.error(errno),
                None => setup(&format!("step {i}")),
            },
            Stage::WaitForCall => setup("wait for the call"),
            Stage::ServeSockets => setup("prepare to serve sockets"),
            Stage::ForkFunction => setup("fork the function"),
            Stage::Stdio => exec("set up stdio"),
            Stage::Signals => exec("reset signal dispositions"),
            Stage::CloseFds => exec("close inherited file descriptors"),
            Stage::Workdir => exec("change to the working directory"),
            Stage::NoNewPrivs => exec("set no_new_privs"),
            Stage::DropBounding => exec("drop the capability bounding set"),
            Stage::ClearAmbient => exec("clear ambient capabilities"),
            Stage::SecureBits => exec("lock the securebits"),
            Stage::SetGroups => exec("set supplementary groups"),
            Stage::SetGid => exec("set the group id"),
            Stage::SetUid => exec("set the user id"),
            Stage::DropCaps => exec("drop capabilities"),
            Stage::Rlimits => exec("set resource limits"),
            Stage::Seccomp => exec("install the seccomp filter"),
            Stage::Exec => exec("execute the entrypoint"),
        }
    }
}

/// A record on the report pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Report {
    /// A stage failed with this errno; the child then exits.
    Failed { stage: Stage, errno: i32 },
    /// The function exited: its raw wait status, as init saw it.
    Exited { status: i32 },
    /// The root is built and the function waits for the call at its exec
    /// (see [`Stage::WaitForCall`]). Not a result: [`Report::read_all`]
    /// leaves it out.
    Ready,
}

/// Every record takes this many bytes on the pipe (postcard's encoding of
/// the largest is 12), so records need no framing.
const REPORT_LEN: usize = 16;

impl Report {
    /// Writes the record (no allocation: safe in the child).
    fn send(self, fd: RawFd) {
        let mut record = [0u8; REPORT_LEN];
        if postcard::to_slice(&self, &mut record).is_ok() {
            // Nothing can be done if the parent is gone.
            let _ = sys::write_all(fd, &record);
        }
    }

    /// Every record on the pipe but [`Report::Ready`]; all writers must be
    /// gone (init reaped), so the read cannot block.
    pub fn read_all(fd: OwnedFd) -> Vec<Report> {
        use std::io::Read;
        let mut buf = Vec::new();
        let _ = std::fs::File::from(fd).read_to_end(&mut buf);
        buf.chunks_exact(REPORT_LEN)
            .filter_map(|r| postcard::from_bytes(r).ok())
            .filter(|r| *r != Report::Ready)
            .collect()
    }

    /// The run's results (what [`Report::read_all`] would give) up to and
    /// with init's [`Report::Exited`], once init has sent it: every process
    /// of the run is dead then (see `exited`). `Err` with the results read
    /// when the pipe ends or fails first (init died or failed).
    pub async fn until_exit(fd: &OwnedFd) -> Result<Vec<Report>, Vec<Report>> {
        let mut results = Vec::new();
        loop {
            match Report::read_next(fd).await {
                Ok(Some(Report::Ready)) => {}
                Ok(Some(exit @ Report::Exited { .. })) => {
                    results.push(exit);
                    return Ok(results);
                }
                Ok(Some(failed)) => results.push(failed),
                Ok(None) | Err(_) => return Err(results),
            }
        }
    }

    /// The next record on the pipe, once one is there; `None` at EOF (every
    /// writer gone) or on a record that does not decode. A writer's record
    /// is one `write` of fewer than `PIPE_BUF` bytes, so it arrives whole.
    pub async fn read_next(fd: &OwnedFd) -> std::io::Result<Option<Report>> {
        let watched = fd.try_clone()?;
        // SAFETY: the AsyncFd owns `watched` (an OwnedFd, a duplicate of
        // `fd`) for its whole life, so the descriptor stays open and the same.
        let afd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(watched, tokio::io::Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        let _ready = afd.readable().await?;
        let mut record = [0u8; REPORT_LEN];
        let n = sys::read(afd.get_ref().as_raw_fd(), &mut record)?;
        if n < REPORT_LEN {
            return Ok(None);
        }
        Ok(postcard::from_bytes(&record).ok())
    }
}

/// The channel over which a service run's init hands out sockets of the
/// run's network namespace: the parent sends one byte, the address family
/// it wants; init answers with a 4-byte errno (0 on success) and, on
/// success, the new socket (`SCM_RIGHTS`). A socket keeps the network
/// namespace it was created in, so the parent can connect to the run's
/// `127.0.0.1` without entering the namespace (which a rootless parent
/// could not).
pub(crate) mod sockets {
    /// Asks for a TCP socket over IPv4.
    pub const TCP_V4: u8 = 4;
    /// Asks for a TCP socket over IPv6.
    pub const TCP_V6: u8 = 6;
    /// The reply's length (an errno).
    pub const REPLY_LEN: usize = 4;
}

fn fail(init: &Init<'_>, stage: Stage, errno: Errno, code: libc::c_int) -> ! {
    Report::Failed {
        stage,
        errno: errno as i32,
    }
    .send(init.fds.report);
    sys::exit(code)
}

/// Closes every descriptor but `keep`. Init is a copy of its parent, so it
/// holds every descriptor the parent had at clone time, close-on-exec or
/// not: other runs' pipes among them, which would keep those runs from
/// seeing EOF.
fn close_all_but(fds: &InitFds) {
    let mut keep = [
        fds.sync,
        fds.report,
        fds.stdin,
        fds.stdout,
        fds.stderr,
        fds.sockets.unwrap_or(fds.stderr),
    ];
    keep.sort_unstable();
    let mut first: u32 = 0;
    for fd in keep {
        let Ok(fd) = u32::try_from(fd) else { continue };
        if fd > first {
            sys::close_range(first, fd - 1);
        }
        first = first.max(fd + 1);
    }
    sys::close_range(first, u32::MAX);
}

/// PID 1 of the sandbox. Never returns.
pub(crate) fn init_main(init: &Init<'_>) -> ! {
    let plan = init.plan;
    close_all_but(&init.fds);
    // Die with the thread that cloned us, so a crashed parent leaves no run:
    // set here for the wait below, and again once our ids have changed
    // (which clears it).
    parent_death_signal(init);
    // The OOM killer's first pick, before the runner and anything else of
    // the host (or pod): every process of the run inherits it. Raising it
    // needs no privilege; where /proc cannot say so, the run goes on.
    let _ = sys::write_file(c"/proc/self/oom_score_adj", OOM_SCORE_ADJ);
    // Wait until the parent has written the id maps (and placed us in a cgroup).
    let mut byte = [0u8; 1];
    match sys::read(init.fds.sync, &mut byte) {
        Ok(1) => {}
        Ok(_) => sys::exit(125),
        Err(e) => fail(init, Stage::WaitForParent, e, 125),
    }

    // Root of the new user namespace, so files we create are owned by a
    // mapped id.
    let ids = (|| {
        if plan.can_setgroups {
            sys::setgroups(&[])?;
        }
        sys::setresgid(0)?;
        sys::setresuid(0)
    })();
    if let Err(e) = ids {
        fail(init, Stage::BecomeRoot, e, 125);
    }
    // The kernel clears the parent-death signal when a process's effective
    // ids change, as they just did when the parent maps a range of ids (as
    // root): set it again. A parent that died between the two is seen by
    // its end of the report pipe, closed with it.
    parent_death_signal(init);
    if sys::no_reader(init.fds.report) {
        sys::exit(125);
    }
    // Not dumpable: the function, whatever its ids, cannot open init's
    // descriptors or memory through /proc/1 (the kernel does this itself
    // when the ids change, but not in a rootless run, whose ids stay).
    if let Err(e) = sys::prctl(libc::PR_SET_DUMPABLE, 0) {
        fail(init, Stage::BecomeRoot, e, 125);
    }
    // A cgroup namespace rooted at the run's cgroup, now that we are in it.
    if let Err(e) = sys::unshare(libc::CLONE_NEWCGROUP) {
        fail(init, Stage::CgroupNamespace, e, 125);
    }
    // The bind mounts' trees between the steps that clone and attach them.
    let mut trees = crate::steps::Trees::new();
    for (i, step) in plan.steps.iter().enumerate() {
        if let Err(e) = step.run(&mut trees) {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            fail(init, Stage::Step(i), e, 125);
        }
    }
    // Before the fork, so that the function's exit cannot be missed; the
    // function clears the signal mask it inherits.
    let sigchld = match init.fds.sockets {
        Some(_) => match sys::sigchld_fd() {
            Ok(fd) => Some(fd),
            Err(e) => fail(init, Stage::ServeSockets, e, 125),
        },
        None => None,
    };

    let function = match sys::raw_fork() {
        Ok(0) => function_main(init),
        Ok(pid) => pid,
        Err(e) => fail(init, Stage::ForkFunction, e, 125),
    };

    // Only the function holds the stdio pipes now, so the parent sees EOF
    // when the function and everything it started are gone; and only it
    // reads the sync pipe, so a parent that drops the sandbox unused ends
    // it (the function reads EOF and exits, and init with it).
    for fd in [
        init.fds.stdin,
        init.fds.stdout,
        init.fds.stderr,
        init.fds.sync,
    ] {
        sys::close(fd);
    }
    // The kernel never delivers SIGHUP to a namespace init from inside
    // anyway; this makes it explicit for a closed session.
    sys::ignore_signal(libc::SIGHUP);

    if let (Some(sock), Some(sigchld)) = (init.fds.sockets, sigchld) {
        serve_sockets(init, function, sock, sigchld);
    }
    reap_until(init, function)
}

/// Every run's `oom_score_adj`: the highest, as Kubernetes gives a
/// best-effort pod, so that an out-of-memory kill in a cgroup that holds
/// both (the daemon's pod on cgroup v1 and v2) takes a run, never the
/// daemon.
const OOM_SCORE_ADJ: &[u8] = b"1000";

/// SIGKILL on the death of the thread that cloned init.
fn parent_death_signal(init: &Init<'_>) {
    if let Err(e) = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) {
        fail(init, Stage::ParentDeathSignal, e, 125);
    }
}

/// Reaps every process of the namespace (PID 1 inherits every orphan) until
/// the function exits, then reports its status and exits.
fn reap_until(init: &Init<'_>, function: libc::pid_t) -> ! {
    loop {
        match sys::wait_any() {
            Ok((pid, status)) if pid == function => exited(init, status),
            Ok(_) => {}
            Err(_) => sys::exit(125),
        }
    }
}

/// The function exited with `status`: kills and reaps every other process
/// of the namespace, then reports the status and exits. So a run is over,
/// every process of it dead, by the time its parent reads the report: what
/// the function left running (a listener, a lock, memory) is gone before
/// the call is answered, pool or not. Cheap when nothing is left: init then
/// has no child, and nothing is signalled.
fn exited(init: &Init<'_>, status: libc::c_int) -> ! {
    loop {
        match sys::try_wait_any() {
            Ok(Some(_)) => {}
            Ok(None) => {
                // Every process of the namespace descends from init, so one
                // still runs. kill(-1) again after each reap: a fork that
                // raced the last one made a process it did not reach.
                sys::kill_all();
                let _ = sys::wait_any();
            }
            // ECHILD: none left.
            Err(_) => break,
        }
    }
    Report::Exited { status }.send(init.fds.report);
    sys::exit(0)
}

/// A service run's init: reaps as [`reap_until`] does, and meanwhile hands
/// out sockets of the run's network namespace (see [`sockets`]). Returns when
/// the parent closed its end of the channel.
fn serve_sockets(init: &Init<'_>, function: libc::pid_t, sock: RawFd, sigchld: RawFd) {
    loop {
        let Ok((child, request)) = sys::poll2(sigchld, sock) else {
            sys::exit(125)
        };
        if child {
            let mut info = [0u8; 128];
            while sys::read(sigchld, &mut info).is_ok_and(|n| n > 0) {}
            loop {
                match sys::try_wait_any() {
                    Ok(Some((pid, status))) if pid == function => exited(init, status),
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => sys::exit(125),
                }
            }
        }
        if request {
            let mut want = [0u8; 8];
            match sys::recv(sock, &mut want) {
                Ok(0) | Err(_) => {
                    sys::close(sock);
                    return;
                }
                Ok(_) => {
                    let family = match want[0] {
                        sockets::TCP_V6 => libc::AF_INET6,
                        _ => libc::AF_INET,
                    };
                    let sent = match sys::tcp_socket(family) {
                        Ok(fd) => {
                            let sent = sys::send_with_fd(sock, &0i32.to_ne_bytes(), fd);
                            sys::close(fd);
                            sent
                        }
                        Err(e) => sys::send_with_fd(sock, &(e as i32).to_ne_bytes(), -1),
                    };
                    if sent.is_err() {
                        sys::close(sock);
                        return;
                    }
                }
            }
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
// The RLIMIT_* numbers are small (4, 7): the cast to the raw call's int
// cannot wrap.
#[allow(clippy::cast_possible_wrap)]
const RLIMITS: [(libc::c_int, u64); 2] = [
    (libc::RLIMIT_NOFILE as libc::c_int, 1 << 20),
    (libc::RLIMIT_CORE as libc::c_int, 0),
];

/// PID 2: the function. Never returns.
fn function_main(init: &Init<'_>) -> ! {
    let plan = init.plan;
    let fail = |stage, e| -> ! { fail(init, stage, e, 127) };
    let stdio = (|| {
        sys::dup2(init.fds.stdin, 0)?;
        sys::dup2(init.fds.stdout, 1)?;
        sys::dup2(init.fds.stderr, 2)
    })();
    if let Err(e) = stdio {
        fail(Stage::Stdio, e);
    }
    if let Err(e) = sys::reset_signals() {
        fail(Stage::Signals, e);
    }
    // Every other descriptor closes at exec; the report pipe stays usable
    // until then.
    if let Err(e) = sys::cloexec_from(3) {
        fail(Stage::CloseFds, e);
    }
    // The working directory is created if the image lacks it, as container
    // runtimes do. This runs after pivot_root, so every path resolves inside
    // the new root.
    if sys::chdir(&plan.workdir).is_err() {
        for prefix in &plan.workdir_prefixes {
            if let Err(e) = sys::mkdir(prefix, 0o755) {
                fail(Stage::Workdir, e);
            }
        }
        if let Err(e) = sys::chdir(&plan.workdir) {
            fail(Stage::Workdir, e);
        }
    }
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) {
        fail(Stage::NoNewPrivs, e);
    }
    for cap in 0..=plan.last_cap {
        match sys::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap)) {
            Ok(()) | Err(Errno::EINVAL) => {}
            Err(e) => fail(Stage::DropBounding, e),
        }
    }
    if let Err(e) = sys::clear_ambient_caps() {
        fail(Stage::ClearAmbient, e);
    }
    // Root gains no capability from exec (SECBIT_NOROOT) whatever the bounding
    // set, and none of these bits can be changed again. Belt and braces: the
    // bounding set is empty and no_new_privs is set already.
    if let Err(e) = sys::prctl(libc::PR_SET_SECUREBITS, SECUREBITS) {
        fail(Stage::SecureBits, e);
    }
    if plan.can_setgroups
        && let Err(e) = sys::setgroups(&plan.groups)
    {
        fail(Stage::SetGroups, e);
    }
    if let Err(e) = sys::setresgid(plan.gid) {
        fail(Stage::SetGid, e);
    }
    if let Err(e) = sys::setresuid(plan.uid) {
        fail(Stage::SetUid, e);
    }
    if let Err(e) = sys::capset_none() {
        fail(Stage::DropCaps, e);
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
            fail(Stage::Rlimits, e);
        }
    }
    // Last, so that nothing above needs to be allowed by the filter: from here
    // on only write, read and execve (and, on failure, exit_group) run,
    // which every profile must allow (see `fnrun_seccomp::NEEDED`).
    if let Some(program) = init.seccomp
        && let Err(e) = sys::seccomp_filter(program)
    {
        fail(Stage::Seccomp, e);
    }
    // Ready: everything that does not depend on the call is done. A prepared
    // sandbox waits here until a call takes it; a parent that drops it
    // closes the pipe instead, and the function exits, and init with it.
    Report::Ready.send(init.fds.report);
    let mut byte = [0u8; 1];
    match sys::read(init.fds.sync, &mut byte) {
        Ok(1) => {}
        Ok(_) => sys::exit(125),
        Err(e) => fail(Stage::WaitForCall, e),
    }
    let mut err = Errno::ENOENT;
    for path in &plan.exec_paths {
        err = sys::execve(path, &init.argv, &init.envp);
        // Keep searching PATH only past entries that are not there.
        if !matches!(err, Errno::ENOENT | Errno::ENOTDIR) {
            break;
        }
    }
    fail(Stage::Exec, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_report_fits_its_record_and_reads_back() {
        let reports = [
            Report::Failed {
                stage: Stage::Step(u32::MAX),
                errno: i32::MIN,
            },
            Report::Failed {
                stage: Stage::Exec,
                errno: libc::ENOENT,
            },
            Report::Exited { status: i32::MAX },
            Report::Exited { status: 0 },
        ];
        let mut pipe = Vec::new();
        for r in reports {
            let mut record = [0u8; REPORT_LEN];
            postcard::to_slice(&r, &mut record).unwrap();
            pipe.extend_from_slice(&record);
        }
        let back: Vec<Report> = pipe
            .chunks_exact(REPORT_LEN)
            .map(|r| postcard::from_bytes(r).unwrap())
            .collect();
        assert_eq!(back, reports);
    }

    #[test]
    fn descriptors_cross_in_a_fixed_order() {
        let fds = InitFds {
            sync: 10,
            report: 11,
            stdin: 12,
            stdout: 13,
            stderr: 13,
            sockets: Some(14),
        };
        assert_eq!(InitFds::from_slice(&fds.to_vec()), Some(fds));
        let plain = InitFds {
            sockets: None,
            ..fds
        };
        assert_eq!(plain.to_vec().len(), 5);
        assert_eq!(InitFds::from_slice(&plain.to_vec()), Some(plain));
        assert_eq!(InitFds::from_slice(&[1, 2, 3]), None);
    }
}
