//! A Kubernetes control plane for the tests, started and stopped as
//! controller-runtime's envtest does: the real `etcd` and `kube-apiserver`,
//! built from their Go modules (`tests/go/upstream/etcd`,
//! `tests/go/upstream/kube-apiserver`), on loopback ports that were free, with
//! their data, certificates and logs in a temp dir; both killed on drop.
//!
//! The API server runs with RBAC (`--authorization-mode=RBAC`), a serving
//! certificate for `127.0.0.1` (and the in-cluster names of the `kubernetes`
//! Service) signed by a CA of the test's own, a
//! service-account token issuer with its own signing key (so that
//! `kubectl create token` and the TokenRequest API work), and a static token
//! for the tests' admin (`system:masters`), which the kubeconfig it writes
//! ([`ControlPlane::kubeconfig`]) uses. There is no controller manager and no
//! scheduler: objects are stored and served, Deployments make no Pods.
//! It listens on loopback only, except for a test node's control plane
//! ([`ControlPlane::start_on`]), which listens on the node's address only,
//! so that its pods reach it through the `kubernetes` Service.
//!
//! ```no_run
//! use fnrun_tests::kube::ControlPlane;
//!
//! let cp = ControlPlane::start().unwrap();
//! cp.kubectl(&["create", "namespace", "demo"]).unwrap();
//! let can = cp.can_i("system:serviceaccount:demo:default", &["get", "secrets", "-n", "demo"]);
//! assert!(!can.unwrap());
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rcgen::KeyPair;
use tempfile::TempDir;

use crate::certs::Ca;
use crate::go::Toolchain;
use crate::process::{check_output, die_with_parent, run_capture, terminate};
use crate::registry::{free_port, http_get};

/// `kubectl`, preinstalled on the machines.
pub const KUBECTL: &str = "/usr/bin/kubectl";

/// The service-account token issuer (as a cluster's default).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The `kubernetes` Service's address (the first of the service range).
pub const SERVICE_IP: &str = "10.96.0.1";

/// The names pods reach the API server by, which its serving certificate
/// holds.
pub const IN_CLUSTER_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// How long etcd and the API server may take to become ready.
const STARTUP: Duration = Duration::from_secs(120);

/// etcd, built from `tests/go/upstream/etcd`.
pub fn etcd_binary() -> Result<PathBuf> {
    Toolchain::find()?.build_upstream("etcd", "go.etcd.io/etcd/server/v3", "etcd")
}

/// kube-apiserver, built from `tests/go/upstream/kube-apiserver`.
pub fn apiserver_binary() -> Result<PathBuf> {
    Toolchain::find()?.build_upstream(
        "kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-apiserver",
    )
}

/// A running etcd and kube-apiserver; both killed on drop.
pub struct ControlPlane {
    // Stopped in this order: the API server, then its store.
    apiserver: Option<Child>,
    etcd: Option<Child>,
    dir: TempDir,
    url: String,
    token: String,
}

impl ControlPlane {
    /// Builds (once) and starts etcd and the API server; returns when the
    /// API server's `/readyz` answers `ok` (RBAC's bootstrap roles are then
    /// in place).
    pub fn start() -> Result<ControlPlane> {
        ControlPlane::start_at("127.0.0.1")
    }

    /// [`ControlPlane::start`] with the API server bound to, and advertising,
    /// `address` (an address of the host, such as a test node's, on its own
    /// bridge: [`crate::node::NODE_IP`]) instead of loopback, so that the
    /// `kubernetes` Service's endpoint is that address and pods reach the API
    /// through the Service. Its serving certificate names `address`,
    /// loopback, the Service's address ([`SERVICE_IP`]) and its in-cluster
    /// names (`kubernetes`, `kubernetes.default`, ...), as a cluster's does.
    /// The interface that holds `address` must be up before this.
    pub fn start_on(address: &str) -> Result<ControlPlane> {
        ControlPlane::start_at(address)
    }

    fn start_at(address: &str) -> Result<ControlPlane> {
        let etcd_bin = etcd_binary()?;
        let apiserver_bin = apiserver_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("fnrun-kube-")
            .tempdir()
            .context("cannot create the control plane's temp dir")?;
        let root = dir.path().to_path_buf();
        let path = |name: &str| root.join(name);
        let token = format!("admin-{}", crate::unique_name("token"));
        let mut cp = ControlPlane {
            apiserver: None,
            etcd: None,
            url: String::new(),
            token,
            dir,
        };

        // etcd on two loopback ports, without fsync (test data only).
        let client = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let etcd = spawn(
            Command::new(&etcd_bin)
                .arg("--name=default")
                .arg(format!("--data-dir={}", path("etcd").display()))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster=default={peer}"))
                .arg("--unsafe-no-fsync=true")
                .arg("--log-level=warn"),
            &path("etcd.log"),
        )?;
        cp.etcd = Some(etcd);
        let etcd_addr = client.trim_start_matches("http://").to_owned();
        cp.wait("etcd", "etcd.log", |_| {
            Ok(http_get(&etcd_addr, "/health")
                .is_ok_and(|(code, body)| code == 200 && body.contains("\"health\":\"true\"")))
        })?;

        // The API server's PKI: a CA, its serving certificate, the
        // service-account signing key, the admin's token.
        let ca = Ca::new("fnrun-test-kubernetes-ca")?;
        let mut names = vec!["127.0.0.1", "localhost"];
        if address != "127.0.0.1" {
            names.push(address);
        }
        names.extend([SERVICE_IP].iter().chain(&IN_CLUSTER_NAMES));
        let serving = ca.server(&names)?;
        let sa_key = KeyPair::generate()?;
        fs::write(path("ca.crt"), ca.cert_pem())?;
        fs::write(path("apiserver.crt"), &serving.cert_pem)?;
        fs::write(path("apiserver.key"), &serving.key_pem)?;
        fs::write(path("sa.key"), sa_key.serialize_pem())?;
        fs::write(path("sa.pub"), sa_key.public_key_pem())?;
        fs::write(
            path("tokens.csv"),
            format!("{},admin,admin,\"system:masters\"\n", cp.token),
        )?;

        let port = free_port()?;
        cp.url = format!("https://{address}:{port}");
        let apiserver = spawn(
            Command::new(&apiserver_bin)
                .arg(format!("--etcd-servers={client}"))
                .arg(format!("--bind-address={address}"))
                .arg(format!("--advertise-address={address}"))
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", path("apiserver-certs").display()))
                .arg(format!(
                    "--tls-cert-file={}",
                    path("apiserver.crt").display()
                ))
                .arg(format!(
                    "--tls-private-key-file={}",
                    path("apiserver.key").display()
                ))
                .arg(format!("--client-ca-file={}", path("ca.crt").display()))
                .arg(format!(
                    "--token-auth-file={}",
                    path("tokens.csv").display()
                ))
                .arg("--authorization-mode=RBAC")
                .arg(format!("--service-account-issuer={ISSUER}"))
                .arg(format!(
                    "--service-account-key-file={}",
                    path("sa.pub").display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    path("sa.key").display()
                ))
                .arg("--service-cluster-ip-range=10.96.0.0/16")
                .arg("--allow-privileged=true")
                // Kubelets (tests/src/node.rs) by their address: their
                // names are in no DNS.
                .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
                .arg("--v=1"),
            &path("apiserver.log"),
        )?;
        cp.apiserver = Some(apiserver);
        fs::write(path("kubeconfig"), cp.kubeconfig_yaml())?;
        cp.wait("kube-apiserver", "apiserver.log", |cp| {
            let out = run_capture(
                cp.kubectl_command().args(["get", "--raw", "/readyz"]),
                None,
                Duration::from_secs(10),
            );
            Ok(out.code == Some(0) && out.stdout.trim() == "ok")
        })?;
        Ok(cp)
    }

    /// `https://ADDRESS:PORT` (`127.0.0.1` unless [`ControlPlane::start_on`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig for the admin (`system:masters`, a static token),
    /// trusting the API server's CA.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The API server's CA certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// `kubectl --kubeconfig KUBECONFIG` (the admin's).
    pub fn kubectl_command(&self) -> Command {
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig").arg(self.kubeconfig());
        cmd
    }

    /// Runs `kubectl ARGS` as the admin; its stdout, or an error with its
    /// stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        check_output(self.kubectl_command().args(args))
    }

    /// `kubectl apply -f -` of `yaml`, as the admin.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        let out = run_capture(
            self.kubectl_command().args(["apply", "-f", "-"]),
            Some(yaml.as_bytes()),
            Duration::from_secs(60),
        );
        if out.code != Some(0) {
            bail!(
                "kubectl apply failed ({out:?}) for:\n{}",
                yaml.chars().take(4000).collect::<String>()
            );
        }
        Ok(out.stdout)
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let out = check_output(
            self.kubectl_command()
                .arg("get")
                .args(args)
                .args(["-o", "json"]),
        )?;
        serde_json::from_str(&out).with_context(|| format!("kubectl get printed no JSON: {out}"))
    }

    /// Whether `user` (impersonated by the admin) may do `args` (`VERB
    /// RESOURCE [-n NS]`), as `kubectl auth can-i --as USER` answers.
    pub fn can_i(&self, user: &str, args: &[&str]) -> Result<bool> {
        let out = run_capture(
            self.kubectl_command()
                .args(["auth", "can-i", "--as", user])
                .args(args),
            None,
            Duration::from_secs(30),
        );
        match (out.code, out.stdout.trim()) {
            (Some(0), "yes") => Ok(true),
            (Some(1), "no") => Ok(false),
            _ => bail!("kubectl auth can-i --as {user} {args:?}: {out:?}"),
        }
    }

    /// The API server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// Freezes the API server (SIGSTOP), as a network partition would: its
    /// connections stay open and nothing answers, until the guard is dropped
    /// (SIGCONT).
    pub fn pause_apiserver(&self) -> Paused<'_> {
        let pid = self.apiserver.as_ref().expect("the API server runs").id();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid is an i32"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
            .expect("the API server stops");
        Paused { pid, _cp: self }
    }

    /// The end of the API server's and etcd's logs, for a failure message.
    pub fn log_tails(&self) -> String {
        let tail = |name: &str| {
            let text = fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        format!(
            "--- kube-apiserver ---\n{}\n--- etcd ---\n{}",
            tail("apiserver.log"),
            tail("etcd.log")
        )
    }

    /// Waits until `ready` holds, failing if the process `what` exits first.
    fn wait(
        &mut self,
        what: &str,
        log: &str,
        ready: impl Fn(&ControlPlane) -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            let child = if what == "etcd" {
                self.etcd.as_mut()
            } else {
                self.apiserver.as_mut()
            };
            if let Some(status) = child.and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "{what} exited ({status}); its log:\n{}",
                    fs::read_to_string(self.dir.path().join(log)).unwrap_or_default()
                );
            }
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{what} was not ready within {STARTUP:?}:\n{}",
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn kubeconfig_yaml(&self) -> String {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url,
                "certificate-authority": self.ca_cert(),
            }}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        });
        serde_norway::to_string(&config).expect("a kubeconfig serialises")
    }
}

/// The API server frozen by [`ControlPlane::pause_apiserver`]; dropping it
/// lets it run again.
#[must_use]
pub struct Paused<'a> {
    pid: nix::unistd::Pid,
    _cp: &'a ControlPlane,
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for mut child in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            terminate(&mut child, Duration::from_secs(10));
        }
    }
}

/// Starts `cmd` with its output in `log`, killed if the test's thread dies.
fn spawn(cmd: &mut Command, log: &Path) -> Result<Child> {
    let file = fs::File::create(log)?;
    die_with_parent(cmd)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))
}
