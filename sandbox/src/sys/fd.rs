//! Descriptor calls: read, write, close, dup.

use std::os::fd::RawFd;

use nix::errno::Errno;

use super::ret::{SysResult, check, check_int, to_len};

pub fn read(fd: RawFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes of writes.
        let ret = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match check(ret as libc::c_long) {
            Err(Errno::EINTR) => continue,
            other => return other.and_then(to_len),
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
            Ok(n) => buf = &buf[to_len(n)?..],
        }
    }
    Ok(())
}

/// Writes `data` to the existing file `path` (one open, write, close).
pub fn write_file(path: &std::ffi::CStr, data: &[u8]) -> SysResult<()> {
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = check_int(unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) })?;
    let written = write_all(fd, data);
    close(fd);
    written
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

/// Whether `fd` is readable now (or at EOF, or in error), without waiting.
pub fn readable_now(fd: RawFd) -> SysResult<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is one valid pollfd; a zero timeout does not block.
        match check_int(unsafe { libc::poll(&mut pfd, 1, 0) }) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(pfd.revents != 0),
        }
    }
}

/// Opens `path` read-only, close-on-exec.
pub fn open_cloexec(path: &std::ffi::CStr) -> SysResult<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = check_int(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
