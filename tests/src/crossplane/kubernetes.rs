//! The real Crossplane core, out of cluster, on the tests' control plane
//! ([`ControlPlane`]): the `crossplane` command built from
//! `github.com/crossplane/crossplane/v2` ([`CROSSPLANE_VERSION`],
//! `tests/go/upstream/crossplane-render-engine`) with its version stamped as its release
//! builds stamp it (packages' `spec.crossplane.version` constraints are
//! checked against it), then `crossplane core init` (its CRDs from the
//! module's `cluster/crds`, the CA `crossplane-root-ca` and the client
//! certificate `crossplane-tls-client` in `crossplane-system`) and `crossplane
//! core start` with `--package-runtime=Function=External` and webhooks off, as
//! the admin of the control plane.
//!
//! Out of cluster there is no cluster DNS: Crossplane dials a function at
//! `dns:///NAME.NAMESPACE:9443`. [`Core::start`] runs it in a mount namespace
//! of its own (`unshare --mount`) where a copy of the host's `/etc/hosts` with
//! the test's names is bind-mounted over `/etc/hosts`: only Crossplane sees
//! them. Needs root.

use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::go::Toolchain;
use crate::kube::ControlPlane;
use crate::process::{die_with_parent, run_capture, terminate};
use crate::registry::{free_port, http_status};

/// The Crossplane release the tests run.
pub const CROSSPLANE_VERSION: &str = "v2.3.4";

/// Crossplane's namespace.
pub const NAMESPACE: &str = "crossplane-system";

/// The Secret holding Crossplane's CA (`tls.crt`, `tls.key`), as its Helm
/// chart names it.
pub const ROOT_CA_SECRET: &str = "crossplane-root-ca";

/// The Secret holding Crossplane's client certificate (`ca.crt`,
/// `tls.crt`, `tls.key`).
pub const CLIENT_SECRET: &str = "crossplane-tls-client";

/// The `-X` flag that stamps Crossplane's version (its release builds set
/// the same variable).
const VERSION_LDFLAGS: &str = "-X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=";

/// How long `crossplane core init` and the start may take.
const STARTUP: Duration = Duration::from_secs(180);

/// The wrapper module that pins Crossplane's core (`tests/go/upstream/`),
/// shared with `crossplane render`'s engine ([`super::render`]).
const WRAPPER: &str = "crossplane-render-engine";

/// Crossplane's core binary (`crossplane core start`, `core init`, and the
/// `internal render` engine of `crossplane render`), built once,
/// version-stamped.
pub fn crossplane_binary() -> Result<PathBuf> {
    Toolchain::find()?.build_upstream_with(
        WRAPPER,
        "github.com/crossplane/crossplane/v2/cmd/crossplane",
        "crossplane-core",
        &format!("{VERSION_LDFLAGS}{CROSSPLANE_VERSION}"),
    )
}

/// Crossplane's own CRDs (the module's `cluster/crds`, which its image
/// ships as `/crds`).
pub fn crds_dir() -> Result<PathBuf> {
    let dir = Toolchain::find()?
        .module_dir(WRAPPER, "github.com/crossplane/crossplane/v2")?
        .join("cluster/crds");
    if !dir.is_dir() {
        bail!("{} is missing", dir.display());
    }
    Ok(dir)
}

/// A loopback address of its own for a test (in `127.0.0.0/8`, which `lo`
/// answers whole), so that a port such as Crossplane's fixed `9443` is free
/// on it whatever else runs on the machine.
pub fn loopback_ip() -> Ipv4Addr {
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let [a, b, c, _] = (pid ^ nanos).to_le_bytes();
    Ipv4Addr::new(127, 10 + a % 200, b, 2 + c % 250)
}

/// `crossplane core start`, killed on drop.
pub struct Core {
    child: Option<Child>,
    dir: TempDir,
}

impl Core {
    /// Creates Crossplane's namespace, runs `crossplane core init`, writes
    /// the client certificate it made to files (as the chart mounts its
    /// Secret), and starts `crossplane core start` with `args` after the
    /// External function runtime and webhooks off, resolving each of
    /// `hosts` (`NAME`, address) for Crossplane only; returns once its
    /// readiness probe answers.
    pub fn start(cp: &ControlPlane, hosts: &[(&str, Ipv4Addr)], args: &[&str]) -> Result<Core> {
        let bin = crossplane_binary()?;
        let crds = crds_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("fnrun-crossplane-")
            .tempdir()
            .context("cannot create Crossplane's temp dir")?;
        cp.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"
        ))?;

        let env = [
            ("KUBECONFIG", cp.kubeconfig().display().to_string()),
            ("POD_NAMESPACE", NAMESPACE.to_owned()),
            ("POD_SERVICE_ACCOUNT", "crossplane".to_owned()),
            ("TLS_CA_SECRET_NAME", ROOT_CA_SECRET.to_owned()),
            ("TLS_CLIENT_SECRET_NAME", CLIENT_SECRET.to_owned()),
        ];
        // Run again on failure, as the kubelet restarts an init container:
        // right after it creates its CRDs, init may find their kinds not yet
        // served ("no matches for kind \"Lock\"").
        let mut attempts = Vec::new();
        loop {
            let init = run_capture(
                Command::new(&bin)
                    .args(["core", "init", "--enable-webhooks=false"])
                    .env("CRDS_PATH", &crds)
                    .envs(env.iter().map(|(k, v)| (k, v))),
                None,
                STARTUP,
            );
            if init.code == Some(0) {
                break;
            }
            attempts.push(init);
            if attempts.len() == 5 {
                bail!("crossplane core init failed 5 times: {attempts:?}");
            }
            std::thread::sleep(Duration::from_secs(2));
        }

        // The client certificate, as the chart mounts crossplane-tls-client.
        let client = dir.path().join("tls-client");
        fs::create_dir(&client)?;
        for key in ["ca.crt", "tls.crt", "tls.key"] {
            let pem = cp.kubectl(&[
                "get",
                "secret",
                CLIENT_SECRET,
                "-n",
                NAMESPACE,
                "-o",
                &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
            ])?;
            if !pem.contains("-----BEGIN") {
                bail!("{CLIENT_SECRET} has no {key}: {pem:?}");
            }
            fs::write(client.join(key), pem)?;
        }

        // The host's names and the test's.
        let mut etc_hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
        if !etc_hosts.ends_with('\n') && !etc_hosts.is_empty() {
            etc_hosts.push('\n');
        }
        for (name, ip) in hosts {
            etc_hosts.push_str(&format!("{ip} {name}\n"));
        }
        let hosts_file = dir.path().join("hosts");
        fs::write(&hosts_file, etc_hosts)?;
        let cache = dir.path().join("xpkg-cache");
        fs::create_dir(&cache)?;

        let health = free_port()?;
        let log = fs::File::create(dir.path().join("crossplane.log"))?;
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
            .arg(&hosts_file)
            .arg(&bin)
            .args(["--debug", "core", "start"])
            .arg("--package-runtime=Function=External")
            .arg("--enable-webhooks=false")
            .arg(format!("--xpkg-cache-dir={}", cache.display()))
            .arg(format!("--tls-client-certs-dir={}", client.display()))
            .arg(format!("--metrics-port={}", free_port()?))
            .arg(format!("--health-probe-port={health}"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = die_with_parent(&mut cmd)
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let mut core = Core {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = core
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("crossplane core start exited ({status}):\n{}", core.log());
            }
            if http_status(&format!("127.0.0.1:{health}"), "/readyz").is_ok_and(|c| c == 200) {
                return Ok(core);
            }
            if Instant::now() >= deadline {
                bail!(
                    "crossplane was not ready within {STARTUP:?}:\n{}",
                    core.log()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Crossplane's log so far (`--debug`: controller-runtime's too).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("crossplane.log")).unwrap_or_default()
    }

    /// Crossplane's client certificate (the Secret `crossplane-tls-client`
    /// as `core init` made it, read at the start): what it calls functions
    /// with.
    pub fn client_tls(&self) -> crate::certs::TlsFiles {
        let dir = self.dir.path().join("tls-client");
        crate::certs::TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
            dir,
        }
    }

    /// The last `lines` lines of [`Core::log`].
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
    }
}
