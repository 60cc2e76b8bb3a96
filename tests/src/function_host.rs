//! fnrun's function host under test: `fnrun serve --functions FILE` with its
//! functions listener on a loopback TCP port, as root or as the test user,
//! over h2c or mTLS, and what to look at afterwards (its log, the function
//! servers' processes and cgroups).
//!
//! ```no_run
//! use fnrun_tests::crossplane::{GoFunction, Variant, SAMPLE_REQUEST};
//! use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
//!
//! let image = GoFunction::new(Variant::Label).image().unwrap().build().unwrap();
//! let host = FunctionHost::start(
//!     HostOpts::insecure(vec![Entry::new("fn-a", &image.oci_ref()).set("idleTimeout", "2s")]),
//! )
//! .unwrap();
//! let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
//! assert!(outcome.is_ok(), "{outcome:?}");
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};
use tempfile::TempDir;

use crate::certs::{Certs, TlsFiles};
use crate::crossplane::Call;
use crate::daemon::{Daemon, DaemonOpts};
use crate::registry::free_port;
use crate::user::TestUser;

/// The namespace the tests' functions live in (fnrun's default).
pub const NAMESPACE: &str = "crossplane-system";

/// One function of a functions file.
#[derive(Debug, Clone)]
#[must_use]
pub struct Entry(Map<String, Value>);

impl Entry {
    pub fn new(name: &str, image: &str) -> Entry {
        let mut map = Map::new();
        map.insert("name".into(), name.into());
        map.insert("image".into(), image.into());
        Entry(map)
    }

    /// Sets a field of the function (`idleTimeout`, `resources`, ...).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Entry {
        self.0.insert(key.to_owned(), value.into());
        self
    }

    pub fn name(&self) -> &str {
        self.0["name"].as_str().unwrap_or_default()
    }
}

/// A functions file holding `entries`.
pub fn functions_yaml(entries: &[Entry]) -> String {
    let functions: Vec<Value> = entries.iter().map(|e| Value::Object(e.0.clone())).collect();
    serde_norway::to_string(&serde_json::json!({ "functions": functions }))
        .expect("a functions file serialises")
}

/// Transport security of the functions listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostTls {
    /// `--functions-insecure`.
    Insecure,
    /// Certificates minted from the test CA, clients verified against it.
    Mint,
    /// `--functions-certs-dir` with a certificate per function signed by the
    /// test CA.
    CertsDir,
}

/// How to start the host.
#[derive(Debug, Clone)]
pub struct HostOpts {
    pub entries: Vec<Entry>,
    pub tls: HostTls,
    pub user: Option<TestUser>,
    /// More `fnrun serve` arguments.
    pub args: Vec<String>,
}

impl HostOpts {
    pub fn insecure(entries: Vec<Entry>) -> HostOpts {
        HostOpts {
            entries,
            tls: HostTls::Insecure,
            user: None,
            args: Vec::new(),
        }
    }

    pub fn tls(mut self, tls: HostTls) -> HostOpts {
        self.tls = tls;
        self
    }

    pub fn user(mut self, user: Option<TestUser>) -> HostOpts {
        self.user = user;
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> HostOpts {
        self.args.push(arg.into());
        self
    }
}

/// A running `fnrun serve --functions FILE`; stopped on drop (with its log
/// printed, as [`Daemon`] does).
pub struct FunctionHost {
    // Dropped first: the daemon stops before its files go.
    daemon: Daemon,
    dir: TempDir,
    certs: Certs,
    addr: String,
    tls: HostTls,
    user: Option<TestUser>,
    /// Crossplane's client certificate, written once: calls made from
    /// several threads read the same files while others are made.
    client_cert: std::sync::OnceLock<TlsFiles>,
}

impl FunctionHost {
    /// Writes the functions file (and the certificates the TLS mode needs),
    /// starts the daemon and waits until the functions listener accepts.
    pub fn start(opts: HostOpts) -> Result<FunctionHost> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-host-")
            .tempdir()
            .context("cannot create the host's temp dir")?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let certs = Certs::new()?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let file = dir.path().join("functions.yaml");
        write_readable(&file, functions_yaml(&opts.entries).as_bytes())?;

        let mut daemon_opts = DaemonOpts::default()
            .arg("--functions")
            .arg(file.display().to_string())
            .arg("--functions-listen")
            .arg(&addr);
        match opts.tls {
            HostTls::Insecure => daemon_opts = daemon_opts.arg("--functions-insecure"),
            HostTls::Mint => {
                // Copies the daemon (maybe not root) can read.
                let ca_cert = dir.path().join("ca.crt");
                let ca_key = dir.path().join("ca.key");
                write_readable(&ca_cert, &std::fs::read(certs.ca_cert())?)?;
                write_readable(&ca_key, &std::fs::read(certs.ca_key())?)?;
                daemon_opts = daemon_opts
                    .arg("--functions-ca-cert")
                    .arg(ca_cert.display().to_string())
                    .arg("--functions-ca-key")
                    .arg(ca_key.display().to_string())
                    .arg("--functions-client-ca")
                    .arg(ca_cert.display().to_string());
            }
            HostTls::CertsDir => {
                let certs_dir = dir.path().join("certs");
                for entry in &opts.entries {
                    write_server_pair(&certs, &certs_dir, entry.name())?;
                }
                let ca_cert = dir.path().join("ca.crt");
                write_readable(&ca_cert, &std::fs::read(certs.ca_cert())?)?;
                daemon_opts = daemon_opts
                    .arg("--functions-certs-dir")
                    .arg(certs_dir.display().to_string())
                    .arg("--functions-client-ca")
                    .arg(ca_cert.display().to_string());
            }
        }
        for arg in &opts.args {
            daemon_opts = daemon_opts.arg(arg);
        }
        if let Some(user) = &opts.user {
            daemon_opts = daemon_opts.user(user.clone());
        }
        let mut daemon = Daemon::start(daemon_opts)?;
        daemon.wait_tcp(&addr)?;
        Ok(FunctionHost {
            daemon,
            dir,
            certs,
            addr,
            tls: opts.tls,
            user: opts.user,
            client_cert: std::sync::OnceLock::new(),
        })
    }

    /// `127.0.0.1:PORT` of the functions listener.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    pub fn daemon_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }

    /// The test CA and the unrelated one.
    pub fn certs(&self) -> &Certs {
        &self.certs
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        self.daemon.log()
    }

    /// The functions file.
    pub fn functions_file(&self) -> PathBuf {
        self.dir.path().join("functions.yaml")
    }

    /// Writes a new functions file and sends SIGHUP; returns once the
    /// daemon logged the reload (or its refusal) that many times in all.
    pub fn reload(&self, entries: &[Entry]) -> Result<()> {
        self.reload_raw(functions_yaml(entries).as_bytes())
    }

    /// [`FunctionHost::reload`] with the file's bytes as given.
    pub fn reload_raw(&self, contents: &[u8]) -> Result<()> {
        let reloads = |log: &str| {
            log.matches("functions reloaded").count()
                + log.matches("functions not reloaded").count()
        };
        let before = reloads(&self.log());
        let tmp = self.dir.path().join("functions.yaml.new");
        write_readable(&tmp, contents)?;
        std::fs::rename(&tmp, self.functions_file())?;
        if self.tls == HostTls::CertsDir {
            // New functions need their certificates before the reload.
            let text = String::from_utf8_lossy(contents);
            if let Ok(doc) = serde_norway::from_str::<Value>(&text) {
                for f in doc["functions"].as_array().into_iter().flatten() {
                    if let Some(name) = f["name"].as_str() {
                        let dir = self.dir.path().join("certs");
                        if !dir.join(name).exists() {
                            write_server_pair(&self.certs, &dir, name)?;
                        }
                    }
                }
            }
        }
        self.daemon.signal(nix::sys::signal::Signal::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(20);
        while reloads(&self.log()) <= before {
            if Instant::now() >= deadline {
                bail!("the daemon did not reload within 20s; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// A call to function `name` as Crossplane makes it: over mTLS with SNI
    /// `NAME.NAMESPACE` and `:authority` `NAME.NAMESPACE:9443` and its
    /// client certificate; over h2c with that `:authority`.
    pub fn call(&self, name: &str) -> Call {
        let authority = format!("{name}.{NAMESPACE}:9443");
        match self.tls {
            HostTls::Insecure => Call::insecure(&self.addr).authority(&authority),
            HostTls::Mint | HostTls::CertsDir => Call::mtls(&self.addr, &self.certs.ca_cert())
                .client_cert(&self.client_cert())
                .server_name(&format!("{name}.{NAMESPACE}"))
                .authority(&authority),
        }
    }

    /// Crossplane's client certificate, signed by the test CA.
    pub fn client_cert(&self) -> TlsFiles {
        self.client_cert
            .get_or_init(|| {
                self.certs
                    .client("crossplane")
                    .expect("the client certificate is written")
            })
            .clone()
    }

    /// The user the daemon runs as, if not root.
    pub fn user(&self) -> Option<&TestUser> {
        self.user.as_ref()
    }

    /// The init pids of the function servers the daemon said were ready,
    /// for `function`, in order.
    pub fn server_pids(&self, function: &str) -> Vec<i32> {
        self.log()
            .lines()
            .filter(|l| l.contains("function server ready"))
            .filter(|l| field(l, "function").is_some_and(|f| f.trim_matches('"') == function))
            .filter_map(|l| field(l, "pid")?.parse().ok())
            .collect()
    }

    /// The `init=` pids of the log lines about spares (the sandboxes made
    /// ahead for a function's next server) that contain `message`, oldest
    /// first, once there are at least `count` of them.
    pub fn spare_inits(&self, message: &str, count: usize, timeout: Duration) -> Vec<i32> {
        let log = self.wait_log(message, count, timeout).unwrap();
        log.lines()
            .filter(|l| l.contains(message))
            .filter_map(|l| field(l, "init")?.parse().ok())
            .collect()
    }

    /// Waits until the daemon's log has `count` lines containing `needle`.
    pub fn wait_log(&self, needle: &str, count: usize, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.matches(needle).count() >= count {
                return Ok(log);
            }
            if Instant::now() >= deadline {
                bail!("{count}x {needle:?} not logged within {timeout:?}; log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The value of `name=VALUE` in a text log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    let rest = &line[start..];
    Some(rest.split(' ').next().unwrap_or(rest))
}

/// `DIR/NAME/tls.crt` and `tls.key`: a server certificate for the function's
/// names signed by the test CA.
fn write_server_pair(certs: &Certs, dir: &Path, name: &str) -> Result<()> {
    let names = [
        name.to_owned(),
        format!("{name}.{NAMESPACE}"),
        format!("{name}.{NAMESPACE}.svc"),
    ];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let pair = certs.ca().server(&names)?;
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755))?;
    write_readable(&sub.join("tls.crt"), pair.cert_pem.as_bytes())?;
    write_readable(&sub.join("tls.key"), pair.key_pem.as_bytes())?;
    Ok(())
}

/// Writes a file any user can read (test secrets only).
fn write_readable(path: &Path, contents: &[u8]) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// Run cgroups of daemon `daemon_pid` (named `<pidns>-<daemon pid>-...`
/// under [`crate::cgroups::run_parents`]) that hold a process.
pub fn busy_cgroups(daemon_pid: u32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for parent in crate::cgroups::run_parents() {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let parts: Vec<&str> = name.split('-').collect();
            let ours = parts.len() == 5 && parts[1] == daemon_pid.to_string();
            let busy = std::fs::read_to_string(e.path().join("cgroup.procs"))
                .is_ok_and(|p| !p.trim().is_empty());
            if ours && busy {
                out.push(e.path());
            }
        }
    }
    out
}

/// Whether process `pid` exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// The parent pid of `pid`.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `argv[0]` of `pid`.
fn program(pid: i32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|b| *b == 0).next()?;
    Some(String::from_utf8_lossy(first).into_owned())
}

/// Live processes descended from `ancestor` whose `argv[0]` is `program`:
/// a daemon's function servers (they run in PID namespaces of their own,
/// but their host pids descend from the daemon).
pub fn descendants_named(ancestor: u32, name: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let Ok(ancestor) = i32::try_from(ancestor) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| alive(*pid) && program(*pid).as_deref() == Some(name))
        .filter(|pid| {
            let mut p = *pid;
            for _ in 0..64 {
                match parent(p) {
                    Some(q) if q == ancestor => return true,
                    Some(q) if q > 1 => p = q,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// Waits up to `timeout` until [`descendants_named`] is empty; returns what
/// is left.
pub fn leftover_servers(ancestor: u32, name: &str, timeout: Duration) -> Vec<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let pids = descendants_named(ancestor, name);
        if pids.is_empty() || Instant::now() >= deadline {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
