//! Listen addresses: `unix:PATH`, `unix-abstract:NAME` and `HOST:PORT`.

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
            .with_context(|| format!("{s:?} is not unix:PATH, unix-abstract:NAME or HOST:PORT"))
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
