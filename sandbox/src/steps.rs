//! How init builds the run's root: the steps, in order, each with what it
//! does (in init, raw system calls only) and how an error names it.
//!
//! [`rootfs`] plans the sequence (pure: unit-tested without root); init
//! walks it after it became root of the user namespace and before it forks
//! the function. The steps cross to the spawner inside the plan (serde), so
//! a new step is one variant here, with its `run`, its `describe`, and its
//! place in [`rootfs`]: this file only.
//!
//! The sequence: make every mount private; the sources of the caller's bind
//! mounts opened and cloned; a tmpfs for the writable layer; the overlay
//! root; `pivot_root` into it; `/proc`, `/tmp`, a minimal `/dev` and `/sys`
//! mounted inside it (so the image's symlinks resolve inside); masked and
//! read-only paths; the old root detached; the bind mounts attached; a new
//! session; the hostname and `lo`. `docs/sandbox.md` says why each step is
//! there.
//!
//! Steps hand each other one thing: the mount trees [`Step::BindSource`]
//! clones, held in [`Trees`] on init's stack until [`Step::BindTarget`]
//! attaches them.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::cstr::{cstring, path_str};
use crate::error::{Error, SpecError};
use crate::mounts::MAX_MOUNTS;
use crate::overlay::{self, Overlay};
use crate::{Network, RunSpec, SandboxConfig, sys};

/// One step of building the root filesystem, run by init in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Step {
    /// mount(2).
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// Mounts the overlay root (see [`crate::overlay`]).
    Overlay(Box<Overlay>),
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
    /// Opens the source of bind mount `index` by its canonical host path
    /// without following any symlink, checks that it is the file the runner
    /// identified (`dev`, `ino`; else ESTALE), clones its mount tree and makes
    /// the clone nosuid, nodev and, unless `writable`, read-only, all
    /// recursively. The clone waits in [`Trees`].
    BindSource {
        index: usize,
        source: CString,
        target: CString,
        dev: u64,
        ino: u64,
        writable: bool,
    },
    /// Creates the target of bind mount `index` inside the new root (missing
    /// directories, and an empty file for a file source), resolving each
    /// component inside it (`components`: name and path so far, relative to
    /// the root), and attaches the clone onto the opened target.
    BindTarget {
        index: usize,
        source: CString,
        target: CString,
        components: Vec<(CString, CString)>,
        file: bool,
    },
}

/// The mount trees cloned by [`Step::BindSource`], by mount index, until
/// [`Step::BindTarget`] attaches them. A fixed array on init's stack: no
/// allocation.
pub(crate) struct Trees {
    fds: [RawFd; MAX_MOUNTS],
}

impl Trees {
    pub(crate) const fn new() -> Self {
        Trees {
            fds: [-1; MAX_MOUNTS],
        }
    }
}

impl Drop for Trees {
    fn drop(&mut self) {
        for fd in self.fds {
            if fd >= 0 {
                sys::close(fd);
            }
        }
    }
}

impl Step {
    /// What the step does, for error messages.
    pub(crate) fn describe(&self) -> String {
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
            Step::Overlay(o) => format!("mount overlay on {}", s(&o.target)),
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
            Step::BindSource { source, .. } => format!("open the mount source {}", s(source)),
            Step::BindTarget { source, target, .. } => {
                format!("mount {} on {}", s(source), s(target))
            }
        }
    }

    /// The error of this step failing with `errno`.
    pub(crate) fn error(&self, errno: Errno) -> Error {
        let s = |c: &CString| c.to_string_lossy().into_owned();
        match self {
            Step::BindSource { source, target, .. } => Error::Mount {
                host: s(source),
                target: s(target),
                what: match errno {
                    Errno::ESTALE => "the source is no longer the file fnrun resolved",
                    Errno::ELOOP => "a component of the source path became a symlink",
                    Errno::EACCES => {
                        "the sandbox's root, a host id without privileges, cannot reach \
                         the source (every directory above it must be searchable by it)"
                    }
                    _ => "cannot open the source inside the sandbox",
                },
                errno,
            },
            Step::BindTarget { source, target, .. } => Error::Mount {
                host: s(source),
                target: s(target),
                what: match errno {
                    Errno::ELOOP => {
                        "a component of the target is a symlink that cannot be followed \
                         inside the run (dangling, or through /proc)"
                    }
                    _ => "cannot create the target or mount onto it",
                },
                errno,
            },
            _ => Error::Setup {
                what: self.describe(),
                errno,
            },
        }
    }

    /// Runs the step (in init: raw system calls only).
    pub(crate) fn run(&self, trees: &mut Trees) -> sys::SysResult<()> {
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
            Step::Overlay(o) => overlay::mount(o),
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
            // The type first, not a bind of /dev/null tried and refused
            // over a directory: the kernel refuses that bind (ENOTDIR)
            // only after cloning the mount, and dropping the clone waits
            // out an expedited RCU grace period, which interrupts every CPU
            // of the host (two per run, with /proc/acpi and /sys/firmware).
            Step::Mask { path } => match sys::file_type(path) {
                // Not in this kernel: nothing to hide.
                Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e),
                Ok(libc::S_IFDIR) => sys::mount(
                    Some(c"tmpfs"),
                    path,
                    Some(c"tmpfs"),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    Some(c"mode=0555"),
                ),
                Ok(_) => sys::mount(Some(c"/dev/null"), path, None, libc::MS_BIND, None),
            },
            Step::BindReadOnly { path } => {
                match sys::mount(Some(path), path, None, libc::MS_BIND | libc::MS_REC, None) {
                    Ok(()) => remount_read_only(path),
                    Err(Errno::ENOENT) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Step::RemountReadOnly { path } => remount_read_only(path),
            Step::NewSession => sys::setsid(),
            Step::BindSource {
                index,
                source,
                dev,
                ino,
                writable,
                ..
            } => {
                let slot = trees.fds.get_mut(*index).ok_or(Errno::EINVAL)?;
                let file = sys::openat2(
                    libc::AT_FDCWD,
                    source,
                    libc::O_PATH | libc::O_CLOEXEC,
                    libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
                )?;
                if sys::file_id(file.0)? != (*dev, *ino) {
                    return Err(Errno::ESTALE);
                }
                let tree = sys::clone_tree(file.0)?;
                let mut attributes = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
                if !writable {
                    attributes |= libc::MOUNT_ATTR_RDONLY;
                }
                sys::set_tree_attributes(tree.0, attributes)?;
                *slot = tree.0;
                std::mem::forget(tree);
                Ok(())
            }
            Step::BindTarget {
                index,
                components,
                file,
                ..
            } => {
                let slot = trees.fds.get_mut(*index).ok_or(Errno::EINVAL)?;
                if *slot < 0 {
                    return Err(Errno::EBADF);
                }
                let tree = sys::Fd(std::mem::replace(slot, -1));
                let target = create_target(components, *file)?;
                sys::attach_tree(tree.0, target.0)
            }
        }
    }
}

/// Opens (creating what is missing) the target `components` inside the root
/// of the calling process: every component is resolved inside it, with no
/// magic links, so an image's symlink cannot lead out of it. The last
/// component is a directory unless `file`.
fn create_target(components: &[(CString, CString)], file: bool) -> sys::SysResult<sys::Fd> {
    let root = sys::openat2(
        libc::AT_FDCWD,
        c"/",
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )?;
    let in_root = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    let mut parent: Option<sys::Fd> = None;
    for (i, (name, path)) in components.iter().enumerate() {
        let dir = i + 1 < components.len() || !file;
        let flags = libc::O_PATH | libc::O_CLOEXEC | if dir { libc::O_DIRECTORY } else { 0 };
        let opened = match sys::openat2(root.0, path, flags, in_root) {
            Err(Errno::ENOENT) => {
                let at = parent.as_ref().map_or(root.0, |p| p.0);
                if dir {
                    sys::mkdirat(at, name, 0o755)?;
                } else {
                    sys::touchat(at, name, 0o644)?;
                }
                // Just made here: opened where it was made, following nothing.
                sys::openat2(
                    at,
                    name,
                    flags,
                    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
                )?
            }
            other => other?,
        };
        parent = Some(opened);
    }
    parent.ok_or(Errno::EINVAL)
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

/// The device nodes a run's `/dev` gets, bound from the host's.
pub(crate) const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Hidden from the function (runc's and Docker's defaults): kernel memory,
/// keys, timer and scheduler internals, hardware and firmware interfaces;
/// and the host's lock table (`/proc/locks` lists every file lock of the
/// host, other sandboxes' too, by host device and inode; no function needs
/// it).
pub(crate) const MASKED_PATHS: [&str; 12] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/locks",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Read-only for the function (runc's and Docker's defaults): the kernel
/// tunables, and files that act on the whole host.
pub(crate) const READ_ONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The bind mounts of `spec`, parents before what they hold (by the number
/// of components of their targets, stably), checked together: at most
/// [`MAX_MOUNTS`], no two on one target.
fn bind_mounts(spec: &RunSpec) -> Result<Vec<&crate::BindMount>, Error> {
    if spec.mounts.len() > MAX_MOUNTS {
        return Err(SpecError::TooManyMounts(spec.mounts.len()).into());
    }
    let mut binds: Vec<&crate::BindMount> = spec.mounts.iter().collect();
    binds.sort_by_key(|b| b.target().matches('/').count());
    for (i, bind) in binds.iter().enumerate() {
        if binds[..i].iter().any(|b| b.target() == bind.target()) {
            return Err(
                SpecError::DuplicateMountTarget(bind.target().chars().take(256).collect()).into(),
            );
        }
    }
    Ok(binds)
}

/// Plans the steps that build the root of a run of `spec`. Pure: no system
/// calls. `run_tag` makes the old root's directory name unique. `joined`:
/// the run starts in its kind's network namespace (see `netns`), which its
/// user namespace does not own, rather than in a new one.
pub(crate) fn rootfs(
    config: &SandboxConfig,
    spec: &RunSpec,
    run_tag: &str,
    joined: bool,
) -> Result<Vec<Step>, Error> {
    let c = |s: &str| cstring("path", s.as_bytes());
    let scratch = path_str(&config.scratch_dir)?;
    let root = format!("{scratch}/root");
    let old_root = format!(".fnrun-old-root-{run_tag}");
    let mut steps = Vec::with_capacity(48);
    let mount = |source: Option<&str>,
                 target: &str,
                 fstype: Option<&str>,
                 flags: libc::c_ulong,
                 data: Option<&str>|
     -> Result<Step, Error> {
        Ok(Step::Mount {
            source: source.map(c).transpose()?,
            target: c(target)?,
            fstype: fstype.map(c).transpose()?,
            flags,
            data: data.map(c).transpose()?,
        })
    };
    let mkdir = |path: &str, mode| {
        Ok::<_, Error>(Step::Mkdir {
            path: c(path)?,
            mode,
        })
    };

    // 1. Nothing we mount may propagate back to the host.
    steps.push(mount(
        None,
        "/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?);
    // The caller's bind mounts, parents first: their sources opened and
    // cloned while the host's tree is "/", their targets attached once it
    // is gone (after step 8).
    let binds = bind_mounts(spec)?;
    for (index, bind) in binds.iter().enumerate() {
        let (dev, ino) = bind.id();
        steps.push(Step::BindSource {
            index,
            source: cstring("mount source", bind.source().as_os_str().as_encoded_bytes())?,
            target: c(bind.target())?,
            dev,
            ino,
            writable: bind.writable(),
        });
    }
    // 2. A private tmpfs for the writable layer: it vanishes with the run.
    let tmpfs_opts = format!("mode=0755,size={}", config.writable_bytes);
    steps.push(mount(
        Some("fnrun"),
        &scratch,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&tmpfs_opts),
    )?);
    for dir in ["upper", "work", "root", "empty"] {
        steps.push(mkdir(&format!("{scratch}/{dir}"), 0o755)?);
    }
    // 3. The root filesystem: the read-only layers under an overlay whose
    //    upper layer lives in the scratch tmpfs.
    steps.push(Step::Overlay(Box::new(overlay::plan(
        &spec.layers,
        &scratch,
        config.overlay,
    )?)));
    // 4. Pivot into it, keeping the old root reachable for the device binds.
    steps.push(mkdir(&format!("{root}/{old_root}"), 0o700)?);
    steps.push(Step::Chdir { path: c(&root)? });
    steps.push(Step::PivotRoot {
        put_old: c(&old_root)?,
    });
    // 5. API filesystems, mounted after the pivot so that symlinks in the
    //    image resolve inside the new root.
    steps.push(mkdir("/proc", 0o555)?);
    steps.push(mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?);
    steps.push(mkdir("/tmp", 0o1777)?);
    steps.push(mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!("mode=1777,size={}", config.writable_bytes)),
    )?);
    steps.push(mkdir("/dev", 0o755)?);
    steps.push(mount(
        Some("tmpfs"),
        "/dev",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )?);
    for node in DEV_NODES {
        let target = format!("/dev/{node}");
        steps.push(Step::Touch {
            path: c(&target)?,
            mode: 0o666,
        });
        steps.push(mount(
            Some(&format!("/{old_root}/dev/{node}")),
            &target,
            None,
            libc::MS_BIND,
            None,
        )?);
        // The host's own device nodes: reads and writes still reach the
        // device, but their owner (a host id that may be mapped into the
        // run, see `HostUser`) cannot chmod or touch them.
        steps.push(Step::RemountReadOnly { path: c(&target)? });
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        steps.push(Step::Symlink {
            target: c(target)?,
            link: c(link)?,
        });
    }
    steps.push(mkdir("/dev/shm", 0o1777)?);
    steps.push(mount(
        Some("shm"),
        "/dev/shm",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=1777,size=64m"),
    )?);
    // 6. /sys, never writable. A new network namespace belongs to the
    //    run's user namespace, so a fresh sysfs (showing its own `lo`)
    //    may be mounted, read-only. In the runner's network namespace, or
    //    a kind's (owned by the runner's user namespace), the kernel
    //    refuses a fresh sysfs and the host's would show the host's
    //    devices and cgroups: an empty read-only tmpfs stands in.
    steps.push(mkdir("/sys", 0o555)?);
    let read_only = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    steps.push(match spec.network {
        Network::Isolated if !joined => {
            mount(Some("sysfs"), "/sys", Some("sysfs"), read_only, None)?
        }
        Network::Isolated | Network::Runner => mount(
            Some("tmpfs"),
            "/sys",
            Some("tmpfs"),
            read_only,
            Some("mode=0555"),
        )?,
    });
    // 7. Masked and read-only paths of /proc and /sys, then /dev itself
    //    read-only (its device binds and /dev/shm stay writable).
    for path in MASKED_PATHS {
        steps.push(Step::Mask { path: c(path)? });
    }
    for path in READ_ONLY_PATHS {
        steps.push(Step::BindReadOnly { path: c(path)? });
    }
    steps.push(Step::RemountReadOnly { path: c("/dev")? });
    // 8. Drop the host's root for good (only now: mounting a fresh proc
    //    or sysfs in a user namespace needs a fully visible one around).
    steps.push(Step::Detach {
        path: c(&format!("/{old_root}"))?,
    });
    steps.push(Step::Rmdir {
        path: c(&format!("/{old_root}"))?,
    });
    // The bind mounts' targets, now that only the new root is left to
    // resolve them in.
    for (index, bind) in binds.iter().enumerate() {
        steps.push(Step::BindTarget {
            index,
            source: cstring("mount source", bind.source().as_os_str().as_encoded_bytes())?,
            target: c(bind.target())?,
            components: bind.target_components().map_err(|_| SpecError::NulByte {
                what: "mount target",
                start: bind.target().chars().take(64).collect(),
            })?,
            file: !bind.is_dir(),
        });
    }
    // 9. Leave the runner's session and process group: no controlling
    //    terminal to open through /dev/tty, and no terminal signals
    //    (Ctrl-C) reach the function.
    steps.push(Step::NewSession);
    steps.push(Step::Hostname {
        name: c(&config.hostname)?,
    });
    // A kind's namespace has `lo` up already, and the run could not.
    if spec.network == Network::Isolated && !joined {
        steps.push(Step::LoopbackUp);
    }
    Ok(steps)
}
