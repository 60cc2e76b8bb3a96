//! A raw call's return value as a [`SysResult`]: what every wrapper of `sys`
//! checks its call with. A leaf.

use nix::errno::Errno;

/// The result of a raw call: the errno on failure.
pub type SysResult<T> = Result<T, Errno>;

pub(super) fn check(ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

/// A byte count a call returned (never negative once checked).
pub(super) fn to_len(ret: libc::c_long) -> SysResult<usize> {
    usize::try_from(ret).map_err(|_| Errno::EOVERFLOW)
}

/// A descriptor or pid a call returned (they fit in an int).
pub(super) fn to_int(ret: libc::c_long) -> SysResult<libc::c_int> {
    libc::c_int::try_from(ret).map_err(|_| Errno::EOVERFLOW)
}

pub(super) fn check_int(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}
