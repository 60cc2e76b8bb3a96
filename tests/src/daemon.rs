//! `fnrun serve` as a child process, as root or as the unprivileged test user.

use std::fs;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fnrun_api::v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::client::{self, Client};
use crate::process::{die_with_parent, terminate};
use crate::user::TestUser;
use crate::{fnrun_bin, unique_name};

/// How long the daemon may take to accept connections.
const STARTUP: Duration = Duration::from_secs(30);
/// How long the daemon gets to exit after SIGTERM before SIGKILL.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Crossplane's default runner address (abstract socket name).
pub const DEFAULT_SOCKET: &str = "crossplane/fn/default.sock";

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// `unix:PATH` with PATH in the daemon's temp dir.
    UnixPath,
    /// `unix-abstract:NAME`.
    Abstract(String),
    /// No `--listen`: fnrun's default, Crossplane's
    /// `unix-abstract:crossplane/fn/default.sock`.
    Default,
    /// `--listen none`: no runner listener; the daemon is ready when the TCP
    /// address `ready` (its functions listener) accepts.
    Off { ready: String },
}

impl Listen {
    /// An abstract socket named like Crossplane's default
    /// (`crossplane/fn/default.sock`) but unique to this test.
    pub fn crossplane_style() -> Listen {
        Listen::Abstract(format!("crossplane/fn/{}.sock", unique_name("test")))
    }
}

/// How to start the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOpts {
    pub listen: Listen,
    /// Run as this user instead of root (rootless mode).
    pub user: Option<TestUser>,
    /// Extra arguments after `serve --listen ... --cache-dir ...`.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// The soft limit on open descriptors it starts with (the hard limit
    /// stays).
    pub open_files: Option<u64>,
    /// A cgroup (its `cgroup.procs` file) it starts in, as a pod's
    /// container starts in the pod's.
    pub cgroup_procs: Option<PathBuf>,
}

impl Default for DaemonOpts {
    fn default() -> Self {
        DaemonOpts {
            listen: Listen::UnixPath,
            user: None,
            args: Vec::new(),
            env: vec![("RUST_LOG".to_owned(), "info".to_owned())],
            open_files: None,
            cgroup_procs: None,
        }
    }
}

impl DaemonOpts {
    pub fn listen(mut self, listen: Listen) -> Self {
        self.listen = listen;
        self
    }

    pub fn user(mut self, user: TestUser) -> Self {
        self.user = Some(user);
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// `--listen ADDR` with TLS from `server`'s certificate and key.
    pub fn tls_listen(self, addr: &str, server: &crate::certs::TlsFiles) -> Self {
        self.arg("--listen")
            .arg(addr)
            .arg("--tls-cert")
            .arg(server.cert.display().to_string())
            .arg("--tls-key")
            .arg(server.key.display().to_string())
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts it in the cgroup whose `cgroup.procs` file is `procs`.
    pub fn in_cgroup(mut self, procs: PathBuf) -> Self {
        self.cgroup_procs = Some(procs);
        self
    }

    /// Starts it with a soft limit of `n` open descriptors.
    pub fn open_files(mut self, n: u64) -> Self {
        self.open_files = Some(n);
        self
    }
}

/// The socket a daemon listens on.
#[derive(Debug, Clone)]
pub enum Socket {
    Path(PathBuf),
    Abstract(String),
    /// `HOST:PORT`.
    Tcp(String),
}

impl Socket {
    /// The `--listen` value.
    pub fn listen_arg(&self) -> String {
        match self {
            Socket::Path(path) => format!("unix:{}", path.display()),
            Socket::Abstract(name) => format!("unix-abstract:{name}"),
            Socket::Tcp(addr) => addr.clone(),
        }
    }

    /// Connects synchronously, to probe whether the daemon accepts.
    pub fn probe(&self) -> std::io::Result<()> {
        match self {
            Socket::Path(path) => UnixStream::connect(path).map(drop),
            Socket::Abstract(name) => {
                UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)
                    .map(drop)
            }
            Socket::Tcp(addr) => std::net::TcpStream::connect(addr).map(drop),
        }
    }
}

/// A running `fnrun serve`; SIGTERM then SIGKILL on drop, and its log is
/// printed (the test harness shows it only for failing tests).
pub struct Daemon {
    child: Option<Child>,
    socket: Socket,
    dir: TempDir,
    cache_dir: PathBuf,
    log: PathBuf,
    user: Option<TestUser>,
    exit: Option<ExitStatus>,
}

impl Daemon {
    /// Starts `fnrun serve --listen ADDR --cache-dir DIR [args]` and waits
    /// until the socket accepts connections.
    pub fn start(opts: DaemonOpts) -> Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-daemon-")
            .tempdir()
            .context("cannot create the daemon's temp dir")?;
        let cache_dir = dir.path().join("cache");
        let run_dir = dir.path().join("run");
        fs::create_dir(&cache_dir)?;
        fs::create_dir(&run_dir)?;
        if let Some(user) = &opts.user {
            // The temp dir stays root's but lets the user through to the dirs
            // it owns.
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711))?;
            user.chown(&cache_dir)?;
            user.chown(&run_dir)?;
        }
        let socket = match &opts.listen {
            Listen::UnixPath => Socket::Path(run_dir.join("fnrun.sock")),
            Listen::Abstract(name) => Socket::Abstract(name.clone()),
            Listen::Default => Socket::Abstract(DEFAULT_SOCKET.to_owned()),
            Listen::Off { ready } => Socket::Tcp(ready.clone()),
        };
        let log = dir.path().join("daemon.log");
        let log_file = fs::File::create(&log)?;

        let bin = fnrun_bin();
        let mut cmd = match &opts.user {
            Some(user) => user.command(&bin),
            None => {
                let mut cmd = Command::new(&bin);
                die_with_parent(&mut cmd);
                cmd
            }
        };
        if let Some(n) = opts.open_files {
            use nix::sys::resource::{Resource, getrlimit, setrlimit};
            use std::os::unix::process::CommandExt;
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
            // SAFETY: only setrlimit, which is async-signal-safe, between
            // fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    setrlimit(Resource::RLIMIT_NOFILE, n, hard).map_err(std::io::Error::from)
                });
            }
        }
        if let Some(procs) = &opts.cgroup_procs {
            use std::os::unix::process::CommandExt;
            let path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes())?;
            // SAFETY: only open, write and close, which are
            // async-signal-safe, on memory made before the fork, between
            // fork and exec. "0" moves the writer itself.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n == 1 { Ok(()) } else { Err(err) }
                });
            }
        }
        cmd.arg("serve");
        match &opts.listen {
            Listen::Default => {}
            Listen::Off { .. } => {
                cmd.arg("--listen").arg("none");
            }
            _ => {
                cmd.arg("--listen").arg(socket.listen_arg());
            }
        }
        // Tests stop many daemons: unless a test asks for one, no shutdown
        // delay (health NOT_SERVING while still serving) before the
        // listeners close.
        if !opts.args.iter().any(|a| a.starts_with("--shutdown-delay")) {
            cmd.arg("--shutdown-delay=0s");
        }
        cmd.arg("--cache-dir")
            .arg(&cache_dir)
            .args(&opts.args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&run_dir)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let mut daemon = Daemon {
            child: Some(child),
            socket,
            dir,
            cache_dir,
            log,
            user: opts.user,
            exit: None,
        };
        daemon.wait_ready()?;
        Ok(daemon)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.try_wait() {
                bail!(
                    "fnrun serve exited during startup ({status}); its log:\n{}",
                    self.log()
                );
            }
            match self.socket.probe() {
                Ok(_) => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => bail!(
                    "fnrun serve did not accept on {} within {STARTUP:?} ({e}); its log:\n{}",
                    self.socket.listen_arg(),
                    self.log()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Waits until the daemon's TCP listener at `addr` accepts (the daemon
    /// is ready when its first listener is).
    pub fn wait_tcp(&mut self, addr: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + STARTUP;
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = self.try_wait() {
                bail!("fnrun serve exited ({status}); its log:\n{}", self.log());
            }
            if std::time::Instant::now() >= deadline {
                bail!(
                    "{addr} did not accept within {STARTUP:?}; the daemon's log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The socket the daemon listens on.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The daemon's `--cache-dir`.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// The daemon's temp dir (holds `cache/`, `run/` and `daemon.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The user the daemon runs as, if not root.
    pub fn user(&self) -> Option<&TestUser> {
        self.user.as_ref()
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status, if the daemon has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// A gRPC channel to the daemon.
    pub async fn channel(&self) -> Result<Channel> {
        match &self.socket {
            Socket::Path(path) => client::channel_unix(path).await,
            Socket::Abstract(name) => client::channel_abstract(name).await,
            Socket::Tcp(addr) => client::channel_tcp(addr, None).await,
        }
    }

    /// A RunFunction client connected to the daemon that leaves each call's
    /// deadline to the daemon ([`client::client_without_timer`]).
    pub async fn client_without_timer(
        &self,
    ) -> Result<ContainerizedFunctionRunnerServiceClient<client::BareConnection>> {
        let io = match &self.socket {
            Socket::Path(path) => client::connect_unix(path).await?,
            Socket::Abstract(name) => client::connect_abstract(name)?,
            Socket::Tcp(addr) => bail!("{addr}: a client without a timer speaks over unix sockets"),
        };
        client::client_without_timer(io).await
    }

    /// A RunFunction client connected to the daemon.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::new(self.channel().await?))
    }

    /// Sends SIGTERM and waits (up to [`SHUTDOWN_GRACE`], then SIGKILL) for
    /// the daemon to exit.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if let Some(mut child) = self.child.take() {
            self.exit = terminate(&mut child, SHUTDOWN_GRACE);
        }
        self.exit
    }

    /// Sends `signal` to the daemon without waiting.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = &self.child {
            crate::process::signal(child, signal);
        }
    }

    /// Waits up to `timeout` for the daemon to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(child) = self.child.as_mut() {
            self.exit = Some(crate::process::wait_timeout(child, timeout)?);
            self.child = None;
        }
        self.exit
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let status = self.stop();
        eprintln!(
            "----- fnrun serve ({}) log, exit {status:?} -----\n{}\n----- end of fnrun serve log -----",
            self.socket.listen_arg(),
            self.log()
        );
        // A rootless daemon's cache may hold read-only directories; root can
        // remove them anyway, an unprivileged test runner may need help.
        if self.user.is_some() || !crate::user::is_root() {
            let _ = Command::new("chmod")
                .arg("-R")
                .arg("u+rwX")
                .arg(self.dir.path())
                .status();
        }
    }
}
