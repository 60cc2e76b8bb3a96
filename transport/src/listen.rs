//! Listen addresses: `unix:PATH`, `unix-abstract:NAME` and `HOST:PORT`.
//!
//! `ListenAddr::from_str` (its `FromStr`) takes one address (an IP address and a port);
//! [`ListenAddr::resolve`] also takes what a user types for a daemon's
//! `--listen`: a host name (resolved at once, every address it has
//! listened on), `:PORT` (every address), and a `tcp://` prefix.

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;

use anyhow::{Context, bail};
use futures::{Stream, TryStreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;

/// A parsed listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Abstract(String),
    Tcp(SocketAddr),
}

impl std::str::FromStr for ListenAddr {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                bail!("{s:?}: the unix socket path is empty");
            }
            // Absolute once, at start, like every path the user gives: the
            // log, the socket's removal at exit and its checks all name one file.
            let path = std::path::absolute(path)
                .map_err(|e| anyhow::anyhow!("{s:?}: cannot make the path absolute: {e}"))?;
            return Ok(ListenAddr::Unix(path));
        }
        if let Some(name) = s.strip_prefix("unix-abstract:") {
            if name.is_empty() || name.len() > 107 {
                bail!("{s:?}: an abstract socket name has 1 to 107 bytes");
            }
            return Ok(ListenAddr::Abstract(name.to_owned()));
        }
        s.parse::<SocketAddr>()
            .map(ListenAddr::Tcp)
            .with_context(|| format!("{s:?} is not unix:PATH, unix-abstract:NAME or IP:PORT"))
    }
}

/// Why a listen address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ListenAddrError {
    #[error(
        "{0:?} is not unix:PATH, unix-abstract:NAME or [tcp://]HOST:PORT (HOST a name or an \
         address, or left out as in :PORT for every address)"
    )]
    Form(String),
    #[error("{given:?}: the port {port:?} is not a number from 0 to 65535")]
    Port { given: String, port: String },
    #[error("{given:?}: cannot resolve {host:?}: {err}")]
    Resolve {
        given: String,
        host: String,
        #[source]
        err: std::io::Error,
    },
    #[error("{given:?}: {host:?} has no address")]
    NoAddress { given: String, host: String },
}

impl ListenAddr {
    /// The addresses of a `--listen` value: as `ListenAddr::from_str` (its `FromStr`),
    /// and also `[tcp://]HOST:PORT` with HOST a name, resolved now (every
    /// address it resolves to, in order, without repeats), and `:PORT`:
    /// every address (`[::]`, which takes IPv4 too, or `0.0.0.0` on a host
    /// without IPv6).
    pub fn resolve(s: &str) -> Result<Vec<ListenAddr>, anyhow::Error> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
        if s.starts_with("unix:") || s.starts_with("unix-abstract:") {
            return s.parse().map(|a| vec![a]);
        }
        let tcp = s.strip_prefix("tcp://").unwrap_or(s);
        if let Ok(addr) = tcp.parse::<SocketAddr>() {
            return Ok(vec![ListenAddr::Tcp(addr)]);
        }
        let form = || ListenAddrError::Form(s.to_owned());
        let (host, port) = tcp.rsplit_once(':').ok_or_else(form)?;
        if host.contains(['/', ':', '[', ']']) || port.contains('/') || port.is_empty() {
            return Err(form().into());
        }
        let port: u16 = port.parse().map_err(|_| ListenAddrError::Port {
            given: s.to_owned(),
            port: port.to_owned(),
        })?;
        if host.is_empty() {
            let any = if std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0)).is_ok() {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            };
            return Ok(vec![ListenAddr::Tcp(SocketAddr::new(any, port))]);
        }
        let resolved = (host, port)
            .to_socket_addrs()
            .map_err(|err| ListenAddrError::Resolve {
                given: s.to_owned(),
                host: host.to_owned(),
                err,
            })?;
        let mut addrs = Vec::new();
        for addr in resolved {
            let addr = ListenAddr::Tcp(addr);
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if addrs.is_empty() {
            return Err(ListenAddrError::NoAddress {
                given: s.to_owned(),
                host: host.to_owned(),
            }
            .into());
        }
        Ok(addrs)
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Abstract(n) => write!(f, "unix-abstract:{n}"),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A bound listener.
pub enum Listener {
    Unix(tokio::net::UnixListener, Option<PathBuf>),
    Tcp(TcpListener),
}

/// Sets `TCP_NODELAY` on a TCP connection, accepted or dialled. A gRPC
/// answer ends in small writes (the last DATA frame, the trailers): with
/// Nagle's algorithm on, each waits for the ACK of the one before, which the
/// peer delays by up to 40 ms on Linux.
pub fn no_delay(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "cannot set TCP_NODELAY: this connection's answers may wait for the peer's delayed ACK");
    }
}

/// The connections a TCP listener accepts, each with [`no_delay`].
pub fn tcp_incoming(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    TcpListenerStream::new(listener).inspect_ok(no_delay)
}

impl ListenAddr {
    /// Binds the address. A stale socket file at a unix path is replaced; any
    /// other file there is an error.
    pub fn bind(&self, socket_mode: u32) -> anyhow::Result<Listener> {
        match self {
            ListenAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        bail!("{} exists and is not a socket", path.display());
                    }
                    std::fs::remove_file(path)
                        .with_context(|| format!("remove stale socket {}", path.display()))?;
                }
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("create {}", dir.display()))?;
                }
                let l = tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("listen on {self}"))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(socket_mode))
                    .with_context(|| format!("chmod {}", path.display()))?;
                Ok(Listener::Unix(l, Some(path.clone())))
            }
            ListenAddr::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                let l = std::os::unix::net::UnixListener::bind_addr(&addr)
                    .with_context(|| format!("listen on {self}"))?;
                l.set_nonblocking(true)?;
                Ok(Listener::Unix(tokio::net::UnixListener::from_std(l)?, None))
            }
            ListenAddr::Tcp(addr) => {
                let l = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("listen on {self}"))?;
                l.set_nonblocking(true)?;
                Ok(Listener::Tcp(TcpListener::from_std(l)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_socket_path_is_made_absolute() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            "unix:run/fn.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix(cwd.join("run/fn.sock"))
        );
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            "unix:/run/fn.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/run/fn.sock".into())
        );
        assert_eq!(
            "unix-abstract:crossplane/fn/default.sock"
                .parse::<ListenAddr>()
                .unwrap(),
            ListenAddr::Abstract("crossplane/fn/default.sock".into())
        );
        assert_eq!(
            "127.0.0.1:9443".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp("127.0.0.1:9443".parse().unwrap())
        );
        assert!("[::1]:1".parse::<ListenAddr>().is_ok());
        for bad in ["unix:", "unix-abstract:", "localhost", "tcp://x:1"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn resolves_host_names_and_any_host() {
        let tcp = |s: &str| ListenAddr::Tcp(s.parse().unwrap());
        let localhost = ListenAddr::resolve("localhost:9443").unwrap();
        assert!(localhost.contains(&tcp("127.0.0.1:9443")), "{localhost:?}");
        assert!(
            localhost.iter().all(
                |a| matches!(a, ListenAddr::Tcp(a) if a.ip().is_loopback() && a.port() == 9443)
            ),
            "{localhost:?}"
        );
        assert_eq!(
            ListenAddr::resolve("tcp://127.0.0.1:1").unwrap(),
            [tcp("127.0.0.1:1")]
        );
        assert_eq!(
            ListenAddr::resolve("tcp://localhost:2").unwrap(),
            ListenAddr::resolve("localhost:2").unwrap()
        );
        let any = ListenAddr::resolve(":9443").unwrap();
        assert!(
            any == [tcp("[::]:9443")] || any == [tcp("0.0.0.0:9443")],
            "{any:?}"
        );
        assert_eq!(
            ListenAddr::resolve("unix:/run/a.sock").unwrap(),
            [ListenAddr::Unix("/run/a.sock".into())]
        );
        let e = ListenAddr::resolve("127.0.0.1:80000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the port \"80000\" is not a number from 0 to 65535"),
            "{e}"
        );
        for bad in ["localhost", "tcp://", ":", "tcp://h:1/x", "a:b:1", "unix:"] {
            assert!(ListenAddr::resolve(bad).is_err(), "{bad}");
        }
        let e = ListenAddr::resolve("no-such-host.invalid:1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot resolve \"no-such-host.invalid\""), "{e}");
    }

    #[tokio::test]
    async fn accepted_tcp_connections_have_no_delay() {
        use futures::StreamExt;
        let Listener::Tcp(l) = ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())
            .bind(0o660)
            .unwrap()
        else {
            unreachable!("a TCP address binds a TCP listener")
        };
        let addr = l.local_addr().unwrap();
        let mut incoming = std::pin::pin!(tcp_incoming(l));
        for _ in 0..2 {
            let client = TcpStream::connect(addr).await.unwrap();
            let accepted = incoming.next().await.unwrap().unwrap();
            assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
            assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is not set");
        }
    }

    #[tokio::test]
    async fn unix_socket_gets_its_mode_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s/fn.sock");
        let addr = ListenAddr::Unix(path.clone());
        drop(addr.bind(0o660).unwrap());
        // The file stays behind after the listener is dropped: a stale socket.
        let l = addr.bind(0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(l);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "not a socket").unwrap();
        assert!(addr.bind(0o660).is_err());
    }
}
