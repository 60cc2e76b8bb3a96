//! A service run: a long-lived sandboxed process with no stdin/stdout
//! contract, such as a gRPC function server.
//!
//! It starts from the same [`RunSpec`] as a per-call run, in the same kind of
//! sandbox. Its stdin is at EOF, its stdout and stderr are kept as one bounded
//! rolling tail ([`Service::output_tail`]), and it runs until it exits
//! ([`Service::exited`]) or is stopped ([`Service::stop`], or dropping the
//! [`Service`]), which kills every process of the run and removes its cgroup.
//!
//! The runner reaches it through [`Service::connect`]: a TCP connection
//! opened inside the run's network namespace, to `127.0.0.1:PORT` of a run
//! that has only `lo`, with no host port and no route from the node's
//! network. The run's init creates each socket there and passes it back (see
//! `init::sockets`); a socket keeps the namespace it was created in, so the
//! runner connects it without entering the namespace, which a rootless
//! runner could not do.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};

use crate::error::Error;
use crate::init::{Report, sockets};
use crate::process::{self, Kind};
use crate::run::Prepared;
use crate::stdio::Tail;
use crate::{RunSpec, Sandbox, Status};

/// How a service run ended.
#[derive(Debug, Clone)]
pub struct ServiceExit {
    /// How the function ended, or why it could not start (its entrypoint
    /// could not be executed, the sandbox could not be built).
    pub status: Result<Status, Arc<Error>>,
    /// The run ended because it was stopped.
    pub stopped: bool,
    /// The last bytes of its stdout and stderr.
    pub output_tail: Vec<u8>,
    /// From the server's start (the go that lets it exec, once the sandbox
    /// is built) to the end of the run.
    pub elapsed: Duration,
}

/// A running service run. Dropping it stops it.
#[derive(Debug)]
pub struct Service {
    pid: libc::pid_t,
    /// This end of init's sockets channel; one request at a time.
    sockets: tokio::sync::Mutex<AsyncFd<OwnedFd>>,
    tail: Tail,
    /// Dropped or sent: the monitor kills the run.
    stop: Option<oneshot::Sender<()>>,
    /// The exit, once the monitor has reaped the run.
    exit: watch::Receiver<Option<ServiceExit>>,
}

/// What a [`PreparedService`] is for: a service run.
#[derive(Debug)]
pub enum ForService {}

/// A sandbox made ahead of a service run by [`Sandbox::prepare_service`]:
/// everything but the server's process, which
/// [`Sandbox::start_prepared_service`] starts.
pub type PreparedService = Prepared<ForService>;

impl Sandbox {
    /// Starts `spec` as a service run: [`Sandbox::prepare_service`] and
    /// [`Sandbox::start_prepared_service`] in a row. Call from a tokio
    /// runtime: the run's output and its end are followed by tasks of it.
    pub fn start_service(&self, spec: &RunSpec) -> Result<Service, Error> {
        self.start_prepared_service(self.prepare_service(spec)?)
    }

    /// Makes a sandbox for a service run of `spec` ahead of its start, as
    /// [`Sandbox::prepare`] does for a call: the server's namespaces, id
    /// maps, cgroup and root, with init waiting. Returns once init is
    /// released; [`Prepared::ready`] waits for the root.
    pub fn prepare_service(&self, spec: &RunSpec) -> Result<PreparedService, Error> {
        Ok(PreparedService::new(self.start(spec, Kind::Service)?))
    }

    /// [`Sandbox::prepare_service`] on the tokio runtime's blocking pool
    /// (see [`Sandbox::prepare_off_worker`]).
    pub async fn prepare_service_off_worker(
        self: &Arc<Self>,
        spec: Arc<RunSpec>,
    ) -> Result<PreparedService, Error> {
        let sandbox = self.clone();
        crate::run::off_worker(move || sandbox.prepare_service(&spec)).await
    }

    /// Starts the server of a prepared service run: it execs (it dropped
    /// every privilege and installed the seccomp filter when the sandbox was
    /// made, exactly as in any run). `prepared` must come from this sandbox. Call
    /// from a tokio runtime. If init died meanwhile, the returned service
    /// ends at once and says how ([`Service::exited`]).
    pub fn start_prepared_service(&self, prepared: PreparedService) -> Result<Service, Error> {
        let mut started = prepared.started;
        started.go();
        // The run's time counts from its start, not from its sandbox's.
        started.at = Instant::now();
        let process::Started {
            mut guard,
            ends,
            plan,
            at,
            ..
        } = started;
        // Stdin at EOF, as for a container started without `-i`.
        drop(ends.stdin);
        let (tail, tail_task) = Tail::follow(ends.stdout, self.config.stderr_tail_bytes)
            .map_err(Error::io("follow the service's output"))?;
        let channel = ends.sockets.expect("a service run has a sockets channel");
        nix::fcntl::fcntl(
            &channel,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(Error::errno("make the sockets channel non-blocking"))?;
        // SAFETY: the AsyncFd owns `channel` (an OwnedFd) for its whole life,
        // so the descriptor stays open and the same.
        let channel = unsafe { AsyncFd::register(channel) }
            .map_err(|e| Error::io("watch the sockets channel")(e.into_parts().1))?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = watch::channel(None);
        let pid = guard.pid();
        let exited = guard.exited();
        let report = ends.report;
        let follower = tail.clone();
        // The monitor owns init: if the runtime drops it unfinished, the
        // guard's drop kills and reaps the run all the same.
        tokio::spawn(async move {
            let stopped = tokio::select! {
                _ = exited => false,
                _ = stop_rx => true,
            };
            if stopped {
                guard.kill();
            }
            let status = match guard.reap().await {
                Ok(init_status) => {
                    let usage = guard.remove_cgroup();
                    let reports = Report::read_all(report);
                    let cut = stopped.then_some(Status::Signaled(libc::SIGKILL));
                    process::ended(&plan, cut, &reports, Some(init_status), &usage)
                        .map_err(Arc::new)
                }
                Err(e) => Err(Arc::new(e)),
            };
            drop(guard);
            // Every writer of the output pipe is gone with the run: the tail
            // reaches EOF at once.
            let _ = tokio::time::timeout(Duration::from_secs(1), tail_task).await;
            let _ = exit_tx.send(Some(ServiceExit {
                status,
                stopped,
                output_tail: follower.bytes(),
                elapsed: at.elapsed(),
            }));
        });
        Ok(Service {
            pid,
            sockets: tokio::sync::Mutex::new(channel),
            tail,
            stop: Some(stop_tx),
            exit: exit_rx,
        })
    }
}

impl Service {
    /// The pid of the run's init, in this process's PID namespace.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The last bytes of its stdout and stderr so far.
    pub fn output_tail(&self) -> Vec<u8> {
        self.tail.bytes()
    }

    /// Its exit, if it has ended.
    pub fn try_exit(&self) -> Option<ServiceExit> {
        self.exit.borrow().clone()
    }

    /// Resolves when the run has ended (and is cleaned up).
    pub async fn exited(&self) -> ServiceExit {
        self.exit_watch().exited().await
    }

    /// A handle on the run's end that outlives the `Service`: drop the
    /// service (which stops the run) and still learn how and when it ended.
    pub fn exit_watch(&self) -> ExitWatch {
        ExitWatch {
            exit: self.exit.clone(),
            tail: self.tail.clone(),
        }
    }

    /// Stops the run: kills every process of it, removes its cgroup, and
    /// returns how it ended.
    pub async fn stop(mut self) -> ServiceExit {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.exited().await
    }

    /// Opens a TCP connection to `addr` from inside the run's network
    /// namespace (`127.0.0.1:PORT` is the run's own loopback).
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let socket = self.socket(addr.is_ipv6()).await?;
        let stream = std::net::TcpStream::from(socket);
        stream.set_nonblocking(true)?;
        tokio::net::TcpSocket::from_std_stream(stream)
            .connect(addr)
            .await
    }

    /// A new, unconnected TCP socket of the run's network namespace.
    async fn socket(&self, v6: bool) -> std::io::Result<OwnedFd> {
        let gone = || {
            std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the service run has ended",
            )
        };
        let channel = self.sockets.lock().await;
        let want = [if v6 { sockets::TCP_V6 } else { sockets::TCP_V4 }];
        channel
            .async_io(Interest::WRITABLE, |fd| {
                sendmsg::<()>(
                    fd.as_raw_fd(),
                    &[IoSlice::new(&want)],
                    &[],
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(std::io::Error::from)
            })
            .await
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EPIPE | libc::ECONNRESET) => gone(),
                _ => e,
            })?;
        let (errno, socket) = channel
            .async_io(Interest::READABLE, |fd| receive_socket(fd.as_raw_fd()))
            .await?;
        match (errno, socket) {
            (0, Some(socket)) => Ok(socket),
            (0, None) => Err(gone()),
            (errno, _) => Err(std::io::Error::from_raw_os_error(errno)),
        }
    }
}

/// How a service run ended, once it has: see [`Service::exit_watch`].
#[derive(Debug, Clone)]
pub struct ExitWatch {
    exit: watch::Receiver<Option<ServiceExit>>,
    tail: Tail,
}

impl ExitWatch {
    /// Its exit, if it has ended.
    pub fn try_exit(&self) -> Option<ServiceExit> {
        self.exit.borrow().clone()
    }

    /// Resolves when the run has ended (and is cleaned up).
    pub async fn exited(mut self) -> ServiceExit {
        match self.exit.wait_for(Option::is_some).await {
            Ok(exit) => exit.clone().expect("waited for"),
            // The monitor is gone without a word: only when the runtime
            // shut down, and its guard killed the run.
            Err(_) => ServiceExit {
                status: Ok(Status::Signaled(libc::SIGKILL)),
                stopped: true,
                output_tail: self.tail.bytes(),
                elapsed: Duration::ZERO,
            },
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Dropping the sender is the stop signal too; said explicitly.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Reads init's answer: its errno and, on success, the socket.
fn receive_socket(sock: RawFd) -> std::io::Result<(i32, Option<OwnedFd>)> {
    let mut reply = [0u8; sockets::REPLY_LEN];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut reply)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(std::io::Error::from)?;
    let mut socket = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: SCM_RIGHTS installed a new descriptor we own.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                socket.get_or_insert(fd);
            }
        }
    }
    match msg.bytes {
        // EOF: init is gone.
        0 => Ok((0, None)),
        sockets::REPLY_LEN => Ok((i32::from_ne_bytes(reply), socket)),
        _ => Err(std::io::Error::from(Errno::EPROTO)),
    }
}
