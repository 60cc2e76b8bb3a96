//! A throwaway `docker-registry` (distribution v2) on a loopback port.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::process::{check_output, die_with_parent, terminate};

/// The registry binary of Debian's `docker-registry` package.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// How long a registry may take to answer `GET /v2/`.
const STARTUP: Duration = Duration::from_secs(20);

/// A running registry with filesystem storage in a temp dir; killed on drop.
pub struct Registry {
    child: Option<Child>,
    addr: String,
    credentials: Option<(String, String)>,
    dir: TempDir,
}

impl Registry {
    /// Starts a registry without authentication.
    pub fn start() -> Result<Registry> {
        Self::start_inner(None, "127.0.0.1")
    }

    /// Starts a registry without authentication on `ip` (an address of the
    /// host that its clients reach, such as a test node's bridge).
    pub fn start_on(ip: &str) -> Result<Registry> {
        Self::start_inner(None, ip)
    }

    /// Starts a registry that requires HTTP basic auth with these credentials
    /// (htpasswd with a bcrypt hash, the only kind the registry accepts).
    pub fn start_with_htpasswd(user: &str, password: &str) -> Result<Registry> {
        Self::start_inner(Some((user.to_owned(), password.to_owned())), "127.0.0.1")
    }

    fn start_inner(credentials: Option<(String, String)>, ip: &str) -> Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-registry-")
            .tempdir()
            .context("cannot create the registry's temp dir")?;
        let storage = dir.path().join("storage");
        fs::create_dir(&storage)?;
        let auth = match &credentials {
            Some((user, password)) => {
                let hash = bcrypt::hash(password, 5).context("cannot hash the password")?;
                let htpasswd = dir.path().join("htpasswd");
                fs::write(&htpasswd, format!("{user}:{hash}\n"))?;
                format!(
                    "auth:\n  htpasswd:\n    realm: fnrun-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
            None => String::new(),
        };
        // The chosen port can be taken between probing and binding: retry.
        let mut last_error = None;
        for _ in 0..5 {
            let port = free_port()?;
            let addr = format!("{ip}:{port}");
            let config = dir.path().join("config.yml");
            fs::write(
                &config,
                format!(
                    "version: 0.1\n\
                     log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: {addr}\n\
                     {auth}",
                    storage.display()
                ),
            )?;
            let log = fs::File::create(dir.path().join("registry.log"))?;
            let mut child = die_with_parent(
                Command::new(REGISTRY_BIN)
                    .arg("serve")
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log),
            )
            .spawn()
            .with_context(|| {
                format!("cannot start {REGISTRY_BIN} (install the docker-registry package)")
            })?;
            match wait_ready(&mut child, &addr, &dir.path().join("registry.log")) {
                Ok(()) => {
                    return Ok(Registry {
                        child: Some(child),
                        addr,
                        credentials,
                        dir,
                    });
                }
                Err(e) => {
                    terminate(&mut child, Duration::from_secs(5));
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("the registry did not start")))
    }

    /// `127.0.0.1:PORT` (or the address it was started on)
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A reference to `repo` (`name:tag` or `name@digest`) in this registry.
    pub fn reference(&self, repo: &str) -> String {
        format!("{}/{repo}", self.addr)
    }

    /// The user and password, if the registry requires auth.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// Where the registry keeps its blobs and manifests.
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// The registry's log (warnings and errors).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Whether the registry process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the registry now (to simulate an unreachable registry); the port
    /// then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(5));
        }
    }

    /// `skopeo inspect` of `repo` (`name:tag`) in this registry, as JSON.
    pub fn inspect(&self, repo: &str) -> Result<serde_json::Value> {
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "inspect", "--tls-verify=false"]);
        if let Some((user, password)) = self.credentials() {
            cmd.arg(format!("--creds={user}:{password}"));
        }
        cmd.arg(format!("docker://{}", self.reference(repo)));
        let out = check_output(&mut cmd)?;
        serde_json::from_str(&out).context("skopeo inspect printed no JSON")
    }

    /// The manifest digest of `repo` (`name:tag`) in this registry.
    pub fn digest(&self, repo: &str) -> Result<String> {
        self.inspect(repo)?["Digest"]
            .as_str()
            .map(str::to_owned)
            .context("skopeo inspect printed no Digest")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The status code of `GET path` over plain HTTP/1.0.
pub fn http_status(addr: &str, path: &str) -> Result<u16> {
    Ok(http_get(addr, path)?.0)
}

/// `GET path` over plain HTTP/1.0: the status code and the body (10 s to
/// connect, 10 s per read).
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    http_get_within(addr, path, Duration::from_secs(10))
}

/// [`http_get`] with `timeout` to connect and per read: an address nothing
/// answers at (a deleted pod's) fails within it.
pub fn http_get_within(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let socket = std::net::ToSocketAddrs::to_socket_addrs(addr)?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP answer: {head:?}"))?;
    Ok((code, body.to_owned()))
}

/// Waits until the registry answers `GET /v2/` (200, or 401 with auth).
fn wait_ready(child: &mut Child, addr: &str, log: &Path) -> Result<()> {
    let log = || fs::read_to_string(log).unwrap_or_default();
    let deadline = std::time::Instant::now() + STARTUP;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the registry exited ({status}):\n{}", log());
        }
        match http_status(addr, "/v2/") {
            Ok(200 | 401) => return Ok(()),
            Ok(_) | Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(code) => bail!("GET /v2/ answered {code}:\n{}", log()),
            Err(e) => bail!("GET /v2/ failed: {e}:\n{}", log()),
        }
    }
}

/// A loopback TCP proxy to a registry that passes requests on as they come and
/// answers at most `chunk` bytes every `pause`: a slow registry. It stops (and
/// drops its connections) when dropped.
pub struct TrickleProxy {
    addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TrickleProxy {
    /// A proxy to `upstream` (`HOST:PORT`) on a free port of 127.0.0.1.
    pub fn start(upstream: &str, chunk: usize, pause: Duration) -> Result<TrickleProxy> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?.to_string();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (upstream, stopped) = (upstream.to_owned(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let conn = match listener.accept() {
                    Ok((conn, _)) => conn,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let (upstream, stopped) = (upstream.clone(), stopped.clone());
                std::thread::spawn(move || {
                    let _ = trickle(conn, &upstream, chunk, pause, &stopped);
                });
            }
        });
        Ok(TrickleProxy { addr, stop })
    }

    /// `HOST:PORT` to use as the registry.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for TrickleProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// One connection of a [`TrickleProxy`].
fn trickle(
    mut conn: TcpStream,
    upstream: &str,
    chunk: usize,
    pause: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let mut up = TcpStream::connect(upstream)?;
    let (mut conn_in, mut up_out) = (conn.try_clone()?, up.try_clone()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut conn_in, &mut up_out);
        let _ = up_out.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = vec![0u8; chunk];
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let n = up.read(&mut buf)?;
        if n == 0 {
            break;
        }
        conn.write_all(&buf[..n])?;
        std::thread::sleep(pause);
    }
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let _ = up.shutdown(std::net::Shutdown::Both);
    Ok(())
}
