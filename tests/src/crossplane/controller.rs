//! Kubernetes mode's fnrun as the tests and benchmarks run it: with the
//! arguments of `deploy/crossplane/deployment.yaml` and the token of the
//! ServiceAccount of `deploy/crossplane/rbac.yaml`.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::crossplane::NAMESPACE;
use crate::daemon::{Daemon, DaemonOpts, Listen};
use crate::kube::ControlPlane;
use crate::registry::free_port;
use crate::user::TestUser;

/// A kubeconfig for the ServiceAccount `fnrun-functions`: a token the API
/// server's issuer signs, as a pod's projected token.
pub fn service_account_kubeconfig(cp: &ControlPlane, dir: &Path) -> std::path::PathBuf {
    let token = cp
        .kubectl(&[
            "create",
            "token",
            "fnrun-functions",
            "-n",
            NAMESPACE,
            "--duration=2h",
        ])
        .expect("a token for fnrun's ServiceAccount");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: fnrun\n  user:\n    token: {}\ncontexts:\n- name: fnrun\n  context: {{cluster: test, user: fnrun}}\n\
             current-context: fnrun\n",
            cp.url(),
            cp.ca_cert().display(),
            token.trim()
        ),
    )
    .unwrap();
    path
}

/// `fnrun serve` as `deploy/crossplane/deployment.yaml` runs it (applied to
/// `cp` before), as the pod `identity` with `kubeconfig`: its args, its
/// functions listener on `ip` instead of every address, its metrics on a
/// free port of 127.0.0.1, and `extra` args after them (each replacing the
/// Deployment's of the same flag).
pub fn start_fnrun(
    cp: &ControlPlane,
    kubeconfig: &Path,
    ip: Ipv4Addr,
    identity: &str,
    extra: &[&str],
) -> Daemon {
    start_fnrun_as(cp, kubeconfig, ip, identity, extra, None)
}

/// [`start_fnrun`] run by `user` (rootless) if given; `kubeconfig` must be
/// readable by it.
pub fn start_fnrun_as(
    cp: &ControlPlane,
    kubeconfig: &Path,
    ip: Ipv4Addr,
    identity: &str,
    extra: &[&str],
    user: Option<&TestUser>,
) -> Daemon {
    let (opts, _) = fnrun_opts(cp, kubeconfig, ip, identity, extra, user);
    Daemon::start(opts).expect("fnrun serve starts as the Deployment runs it")
}

/// What [`start_fnrun_as`] starts, read from the Deployment now (so that
/// the API server need not answer when it starts), and the address of its
/// metrics listener (`/metrics`, `/readyz`, `/livez`).
pub fn fnrun_opts(
    cp: &ControlPlane,
    kubeconfig: &Path,
    ip: Ipv4Addr,
    identity: &str,
    extra: &[&str],
    user: Option<&TestUser>,
) -> (DaemonOpts, String) {
    let deployment = cp
        .get_json(&["deployment", "fnrun-functions", "-n", NAMESPACE])
        .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "fnrun-functions");
    let container = &pod["containers"][0];
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name",
        "POD_NAME is the pod's name: {container}"
    );
    let listen = format!("{ip}:9443");
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let mut opts = DaemonOpts::default()
        .listen(Listen::Off {
            ready: listen.clone(),
        })
        .env("KUBECONFIG", &kubeconfig.display().to_string())
        .env("POD_NAME", identity);
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    assert!(args.contains(&"--functions-kubernetes"), "{args:?}");
    // A flag of `extra` replaces the Deployment's.
    let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
    let replaced: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    for arg in &args[1..] {
        if *arg == "--listen=none"
            || arg.starts_with("--cache-dir=")
            || replaced.contains(&flag(arg))
        {
            continue;
        }
        let arg = arg
            .replace("0.0.0.0:9443", &listen)
            .replace("0.0.0.0:9090", &metrics);
        opts = opts.arg(arg);
    }
    for arg in extra {
        opts = opts.arg(*arg);
    }
    if let Some(user) = user {
        opts = opts.user(user.clone());
    }
    (opts, metrics)
}
