//! Mounts, directories and files: the calls that build a run's root.

use std::ffi::CStr;
use std::os::fd::RawFd;

use nix::errno::Errno;

use super::fd::close;
use super::ret::{SysResult, check, check_int, to_int};

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
    let st_flags = libc::c_ulong::try_from(st.f_flags).map_err(|_| Errno::EOVERFLOW)?;
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

/// fsopen(2): a new file system context of type `fstype` (close-on-exec).
pub fn fsopen(fstype: &CStr) -> SysResult<RawFd> {
    // SAFETY: fstype is NUL-terminated; the flag is an integer.
    check(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) })
        .and_then(to_int)
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
        .and_then(to_int)
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

/// A descriptor closed when dropped (no allocation: usable in init).
pub struct Fd(pub RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        close(self.0);
    }
}

/// openat2(2): opens `path` relative to `dir` with `flags` (`O_*`) and the
/// path resolution restrictions `resolve` (`RESOLVE_*`).
pub fn openat2(dir: RawFd, path: &CStr, flags: libc::c_int, resolve: u64) -> SysResult<Fd> {
    // SAFETY: open_how is plain old data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::try_from(flags).map_err(|_| Errno::EINVAL)?;
    how.resolve = resolve;
    loop {
        // SAFETY: path is NUL-terminated and `how` a valid open_how of the
        // size passed; the kernel only reads both.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        match check(ret) {
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(e) => return Err(e),
            Ok(fd) => return to_int(fd).map(Fd),
        }
    }
}

/// The device and inode number of the file open at `fd`.
pub fn file_id(fd: RawFd) -> SysResult<(u64, u64)> {
    // SAFETY: stat64 is plain old data; all-zero is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out pointer; raw syscall (on 64-bit targets the
    // kernel's stat is stat64).
    check(unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st as *mut libc::stat64) })?;
    Ok((st.st_dev, st.st_ino))
}

/// The type of the file at `path` (the `S_IFMT` bits of its mode),
/// following symlinks as mount(2) follows its target.
pub fn file_type(path: &CStr) -> SysResult<libc::mode_t> {
    // SAFETY: stat64 is plain old data; all-zero is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st a valid out pointer.
    check_int(unsafe { libc::fstatat64(libc::AT_FDCWD, path.as_ptr(), &mut st, 0) })?;
    Ok(st.st_mode & libc::S_IFMT)
}

/// open_tree(2) with `OPEN_TREE_CLONE | AT_RECURSIVE`: a detached copy of
/// the mount tree at the file open at `fd` (close-on-exec).
pub fn clone_tree(fd: RawFd) -> SysResult<Fd> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_EMPTY_PATH as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: "" is NUL-terminated (AT_EMPTY_PATH names `fd` itself).
    check(unsafe { libc::syscall(libc::SYS_open_tree, fd, c"".as_ptr(), flags) })
        .and_then(to_int)
        .map(Fd)
}

/// mount_setattr(2) with `AT_RECURSIVE`: sets `attributes` (`MOUNT_ATTR_*`) on
/// every mount of the tree open at `fd`.
pub fn set_tree_attributes(fd: RawFd, attributes: u64) -> SysResult<()> {
    let attr = libc::mount_attr {
        attr_set: attributes,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: "" is NUL-terminated (AT_EMPTY_PATH names `fd`); `attr` is a
    // valid mount_attr of the size passed, only read by the kernel.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    })
    .map(drop)
}

/// move_mount(2) of the detached tree `tree` onto the file open at `target`:
/// no path is resolved again.
pub fn attach_tree(tree: RawFd, target: RawFd) -> SysResult<()> {
    // SAFETY: both paths are "" (NUL-terminated), naming the descriptors
    // themselves.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// mkdirat(2) that accepts an existing entry (the caller opens it next and
/// finds out what it is).
pub fn mkdirat(dir: RawFd, name: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: name is NUL-terminated.
    match check_int(unsafe { libc::mkdirat(dir, name.as_ptr(), mode) }) {
        Ok(_) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the empty file `name` in `dir` unless something is there already
/// (never following a symlink).
pub fn touchat(dir: RawFd, name: &CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: name is NUL-terminated.
    let fd = check_int(unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode,
        )
    });
    match fd {
        Ok(fd) => {
            close(fd);
            Ok(())
        }
        Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}
