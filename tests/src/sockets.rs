//! A process's TCP connections, seen from outside: each of its socket file
//! descriptors duplicated into the test with `pidfd_getfd(2)` (as root, or as
//! a user that may ptrace the process) and read as a [`std::net::TcpStream`].
//! This is how the tests check options the process set on sockets it
//! accepted, such as `TCP_NODELAY`; and which unix sockets it listens on.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{Context, Result};
use nix::libc;

/// One connected TCP socket of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConnection {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub nodelay: bool,
}

/// The connected TCP sockets of process `pid` (listening and non-TCP sockets
/// are left out).
pub fn tcp_connections(pid: u32) -> Result<Vec<TcpConnection>> {
    let pidfd = pidfd_open(pid)?;
    let dir = format!("/proc/{pid}/fd");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot list {dir}"))? {
        let entry = entry?;
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // The socket may be closed in between: not a connection any more.
        let Ok(dup) = pidfd_getfd(&pidfd, fd) else {
            continue;
        };
        let stream = TcpStream::from(dup);
        // Unix sockets have no TCP address; listeners have no peer.
        let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
            continue;
        };
        let nodelay = stream
            .nodelay()
            .with_context(|| format!("cannot read TCP_NODELAY of fd {fd} of {pid}"))?;
        found.push(TcpConnection {
            local,
            peer,
            nodelay,
        });
    }
    Ok(found)
}

/// The addresses of the unix sockets process `pid` holds that have one (a
/// listener's path, or `@NAME` for an abstract name), from `/proc/net/unix`.
pub fn unix_socket_addresses(pid: u32) -> Result<Vec<String>> {
    let dir = format!("/proc/{pid}/fd");
    let mut inodes = std::collections::HashSet::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot list {dir}"))? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.insert(inode.to_owned());
        }
    }
    // The table of the process's network namespace: Num RefCount Protocol
    // Flags Type St Inode [Path].
    let table = format!("/proc/{pid}/net/unix");
    let table = std::fs::read_to_string(&table).with_context(|| format!("cannot read {table}"))?;
    Ok(table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (inode, path) = (fields.get(6)?, fields.get(7)?);
            inodes.contains(*inode).then(|| (*path).to_owned())
        })
        .collect())
}

fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::pid_t::try_from(pid)?, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("pidfd_open({pid})"));
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd)?) })
}

fn pidfd_getfd(pidfd: &OwnedFd, fd: i32) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd(2) takes a pidfd, the target's fd number and flags,
    // and returns a new fd in this process or -1; no memory is passed.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("pidfd_getfd({fd})"));
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(dup)?) })
}
