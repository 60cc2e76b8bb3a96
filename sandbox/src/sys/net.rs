//! Sockets inside a run's network namespace: its loopback interface, and
//! the sockets init creates there and hands to the parent.

use std::os::fd::RawFd;

use nix::errno::Errno;

use super::fd::close;
use super::ret::{SysResult, check, check_int, to_len};

/// Brings up the loopback interface of the current network namespace.
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: plain socket syscall.
    let sock = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    req.ifr_ifru.ifru_flags =
        libc::c_short::try_from(libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING)
            .map_err(|_| Errno::EINVAL)?;
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq.
    let ret = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &req as *const libc::ifreq) };
    close(sock);
    check_int(ret).map(drop)
}

/// A new TCP socket of `family` (`AF_INET` or `AF_INET6`), close-on-exec, in
/// this process's network namespace.
pub fn tcp_socket(family: libc::c_int) -> SysResult<RawFd> {
    // SAFETY: plain socket syscall with integer arguments.
    check_int(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })
}

/// Receives one datagram of at most `buf.len()` bytes from a
/// `SOCK_SEQPACKET` socket (no descriptors expected). 0: the peer closed.
pub fn recv(sock: RawFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes of writes.
        let ret = unsafe { libc::recv(sock, buf.as_mut_ptr().cast(), buf.len(), 0) };
        match check(ret as libc::c_long) {
            Err(Errno::EINTR) => continue,
            other => return other.and_then(to_len),
        }
    }
}

/// The size of one descriptor in a control message.
const FD_BYTES: u32 = 4;
const _: () = assert!(std::mem::size_of::<RawFd>() == FD_BYTES as usize);

/// Sends `data` with descriptor `fd` attached (`SCM_RIGHTS`), or none when
/// `fd` is negative. No allocation: the control message is on the stack.
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> SysResult<()> {
    // Room for one cmsghdr with one int, aligned as the kernel wants it.
    #[repr(C, align(8))]
    struct Control([u8; 24]);
    let mut control = Control([0; 24]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd >= 0 {
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(FD_BYTES) as usize,
                libc::CMSG_LEN(FD_BYTES) as usize,
            )
        };
        debug_assert!(space <= control.0.len());
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to `space` writable, aligned bytes, so
        // CMSG_FIRSTHDR is one valid cmsghdr with room for its data.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = len;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: msg and everything it points to outlive the call.
        let ret = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        match check(ret as libc::c_long) {
            Err(Errno::EINTR) => continue,
            other => return other.map(drop),
        }
    }
}
