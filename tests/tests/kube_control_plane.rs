//! fnrun's manifests (`deploy/`) applied to a real API server
//! (`fnrun_tests::kube::ControlPlane`: etcd and kube-apiserver built from
//! their modules, RBAC on): they are valid, and fnrun's service accounts can
//! do what the manifests grant and no more: the node daemon nothing beyond
//! what every authenticated user may; Kubernetes mode's controller
//! (`deploy/crossplane/rbac.yaml`) what it reads and writes, and nothing
//! else.

use std::path::Path;
use std::time::Duration;

use fnrun_tests::crossplane::controller::{service_account_kubeconfig, start_fnrun};
use fnrun_tests::crossplane::loopback_ip;
use fnrun_tests::kube::ControlPlane;
use fnrun_tests::workspace_root;

/// fnrun's service accounts that are granted nothing, as their manifests
/// name them.
const ACCOUNTS: [(&str, &str); 1] = [("fnrun-system", "fnrun")];

/// Kubernetes mode's service account.
const CONTROLLER: &str = "system:serviceaccount:crossplane-system:fnrun-functions";

/// What Kubernetes mode's controller does: `(namespace, request)`.
const CONTROLLER_ALLOWED: &[(&str, &[&str])] = &[
    ("crossplane-system", &["get", "functions.pkg.crossplane.io"]),
    (
        "crossplane-system",
        &["list", "functions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["watch", "functions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["list", "functionrevisions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["watch", "functionrevisions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["watch", "deploymentruntimeconfigs.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["watch", "imageconfigs.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &[
            "patch",
            "functionrevisions.pkg.crossplane.io",
            "--subresource=status",
        ],
    ),
    ("crossplane-system", &["watch", "services"]),
    ("crossplane-system", &["patch", "services"]),
    ("crossplane-system", &["delete", "services"]),
    (
        "crossplane-system",
        &["watch", "secrets/crossplane-root-ca"],
    ),
    ("crossplane-system", &["get", "secrets/pull"]),
    (
        "crossplane-system",
        &["create", "leases.coordination.k8s.io"],
    ),
    (
        "crossplane-system",
        &["patch", "leases.coordination.k8s.io/fnrun-functions"],
    ),
    ("default", &["create", "events.events.k8s.io"]),
];

/// What it must not be allowed: `(namespace, request)`.
const CONTROLLER_REFUSED: &[(&str, &[&str])] = &[
    (
        "crossplane-system",
        &["patch", "functionrevisions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["update", "functions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &["delete", "functions.pkg.crossplane.io"],
    ),
    (
        "crossplane-system",
        &[
            "patch",
            "functions.pkg.crossplane.io",
            "--subresource=status",
        ],
    ),
    ("crossplane-system", &["list", "secrets"]),
    ("crossplane-system", &["watch", "secrets/pull"]),
    (
        "crossplane-system",
        &["patch", "secrets/crossplane-root-ca"],
    ),
    (
        "crossplane-system",
        &["patch", "leases.coordination.k8s.io/crossplane"],
    ),
    ("crossplane-system", &["get", "configmaps"]),
    ("crossplane-system", &["get", "pods"]),
    ("crossplane-system", &["create", "deployments.apps"]),
    (
        "crossplane-system",
        &["create", "serviceaccounts", "--subresource=token"],
    ),
    ("default", &["get", "secrets/pull"]),
    ("default", &["patch", "services"]),
    ("kube-system", &["create", "events.events.k8s.io"]),
    ("crossplane-system", &["list", "nodes"]),
];

/// Requests a service account of fnrun must not be allowed.
const REFUSED: [&[&str]; 8] = [
    &["get", "pods"],
    &["list", "secrets"],
    &["get", "secrets/crossplane-root-ca"],
    &["get", "configmaps"],
    &["watch", "functionrevisions.pkg.crossplane.io"],
    &["create", "serviceaccounts", "--subresource=token"],
    &["patch", "services"],
    &["list", "nodes"],
];

fn manifests(dir: &str) -> Vec<String> {
    let dir = workspace_root().join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files.iter().map(|p| path(p)).collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn apply_files(cp: &ControlPlane, files: &[String]) {
    let mut args = vec!["apply"];
    for file in files {
        args.extend(["-f", file.as_str()]);
    }
    let out = cp
        .kubectl(&args)
        .unwrap_or_else(|e| panic!("{e}\n{}", cp.log_tails()));
    eprintln!("{out}");
}

/// What `kubectl auth can-i --list` says `user` may do in `namespace`.
fn rules(cp: &ControlPlane, user: &str, namespace: &str) -> String {
    cp.kubectl(&["auth", "can-i", "--list", "--as", user, "-n", namespace])
        .unwrap()
}

#[test]
fn fnruns_service_accounts_get_what_the_manifests_grant_and_no_more() {
    let cp = ControlPlane::start().expect("etcd and kube-apiserver start");
    // The node daemon's manifests (its namespace first), then the function
    // host's in Crossplane's namespace, as docs/crossplane.md applies them.
    apply_files(
        &cp,
        &[path(&workspace_root().join("deploy/namespace.yaml"))],
    );
    apply_files(&cp, &manifests("deploy"));
    // The rootless variant: since Kubernetes v1.33 the API server refuses
    // its `procMount: Unmasked` without `hostUsers: false`.
    apply_files(
        &cp,
        &[path(
            &workspace_root().join("deploy/rootless/daemonset.yaml"),
        )],
    );
    cp.kubectl(&["create", "namespace", "crossplane-system"])
        .unwrap();
    // Kubernetes mode (deploy/crossplane-file/, the variant without API
    // access, names the same objects and is applied by crossplane_kubernetes).
    // With Crossplane's package CRDs, so that kubectl knows their kinds.
    let crds = fnrun_tests::crossplane::crds_dir().expect("Crossplane's CRDs");
    let package_crds: Vec<String> = [
        "functions",
        "functionrevisions",
        "deploymentruntimeconfigs",
        "imageconfigs",
    ]
    .iter()
    .map(|kind| path(&crds.join(format!("pkg.crossplane.io_{kind}.yaml"))))
    .collect();
    let mut args = vec!["apply", "--server-side"];
    for file in &package_crds {
        args.extend(["-f", file.as_str()]);
    }
    cp.kubectl(&args).unwrap();
    apply_files(&cp, &manifests("deploy/crossplane"));
    let deployment = cp
        .get_json(&["deployment", "fnrun-functions", "-n", "crossplane-system"])
        .unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "fnrun-functions"
    );

    // A service account the manifests bind nothing to: what every
    // authenticated user may do.
    cp.kubectl(&[
        "create",
        "serviceaccount",
        "nobody",
        "-n",
        "crossplane-system",
    ])
    .unwrap();
    let baseline = rules(
        &cp,
        "system:serviceaccount:crossplane-system:nobody",
        "crossplane-system",
    );
    for (namespace, name) in ACCOUNTS {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        cp.get_json(&["serviceaccount", name, "-n", namespace])
            .unwrap_or_else(|e| panic!("{user}: {e}"));
        for ns in [namespace, "crossplane-system", "default"] {
            assert_eq!(
                rules(&cp, &user, ns),
                rules(&cp, "system:serviceaccount:crossplane-system:nobody", ns),
                "{user} in {ns}"
            );
        }
        for request in REFUSED {
            let mut args = request.to_vec();
            args.extend(["-n", namespace]);
            assert!(!cp.can_i(&user, &args).unwrap(), "{user} may {args:?}");
        }
    }
    for (ns, request) in CONTROLLER_ALLOWED {
        let mut args = request.to_vec();
        args.extend(["-n", ns]);
        assert!(
            cp.can_i(CONTROLLER, &args).unwrap(),
            "{CONTROLLER} may not {args:?}"
        );
    }
    for (ns, request) in CONTROLLER_REFUSED {
        let mut args = request.to_vec();
        args.extend(["-n", ns]);
        assert!(
            !cp.can_i(CONTROLLER, &args).unwrap(),
            "{CONTROLLER} may {args:?}"
        );
    }
    assert!(
        baseline.contains("selfsubjectreviews"),
        "the baseline is what RBAC's bootstrap roles grant every user: {baseline}"
    );

    // RBAC is what says no: a Role bound to the function host's account
    // turns one answer into yes, and only that one.
    let user = "system:serviceaccount:crossplane-system:fnrun-functions";
    cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: read-configmaps, namespace: crossplane-system}\n\
         rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: read-configmaps, namespace: crossplane-system}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-configmaps}\n\
         subjects: [{kind: ServiceAccount, name: fnrun-functions, namespace: crossplane-system}]\n",
    )
    .unwrap();
    assert!(
        cp.can_i(user, &["get", "configmaps", "-n", "crossplane-system"])
            .unwrap()
    );
    assert!(
        !cp.can_i(user, &["list", "configmaps", "-n", "crossplane-system"])
            .unwrap()
    );

    // The service-account token issuer: a token for fnrun's account
    // authenticates as that account, which RBAC then refuses.
    let token = cp
        .kubectl(&[
            "create",
            "token",
            "fnrun-functions",
            "-n",
            "crossplane-system",
        ])
        .unwrap();
    let out = fnrun_tests::process::run_capture(
        cp.kubectl_command().args([
            "--token",
            token.trim(),
            "get",
            "secrets",
            "-n",
            "crossplane-system",
        ]),
        None,
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("\"system:serviceaccount:crossplane-system:fnrun-functions\" cannot list resource \"secrets\""),
        "{out:?}"
    );
    cp.kubectl(&["create", "configmap", "probe", "-n", "crossplane-system"])
        .unwrap();
    let out = fnrun_tests::process::run_capture(
        cp.kubectl_command().args([
            "--token",
            token.trim(),
            "get",
            "configmap",
            "probe",
            "-n",
            "crossplane-system",
        ]),
        None,
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "the Role's grant: {out:?}");

    // fnrun itself with its account's token. With the defaults it reads
    // everything it watches and stays up, electing a leader.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&cp, dir.path());
    let args = ["--functions-start-timeout=3s"];
    let mut fnrun = start_fnrun(&cp, &kubeconfig, loopback_ip(), "fnrun-0", &args);
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(fnrun.try_wait(), None, "{}", fnrun.log());
    assert!(fnrun.log().contains("leader election"), "{}", fnrun.log());
    fnrun.stop();
    // A CA Secret renamed without the same name in rbac.yaml's
    // resourceNames cannot be watched: the start fails after
    // --functions-start-timeout, naming it and the API server's answer.
    let args = [
        "--functions-ca-secret=renamed-ca",
        "--functions-start-timeout=3s",
    ];
    let mut fnrun = start_fnrun(&cp, &kubeconfig, loopback_ip(), "fnrun-0", &args);
    let status = fnrun
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("fnrun waits forever: {}", fnrun.log()));
    assert!(!status.success(), "{status:?}: {}", fnrun.log());
    let log = fnrun.log();
    // The JSON log's line, its quotes unescaped.
    let error = log
        .lines()
        .find(|l| l.contains("cannot read what it serves from"))
        .unwrap_or_else(|| panic!("no start error in:\n{log}"))
        .replace("\\\"", "\"");
    assert!(
        error.contains("(--functions-start-timeout 3s)")
            && error.contains("the CA Secret crossplane-system/renamed-ca (--functions-ca-secret)")
            && error.contains("cannot list resource \"secrets\""),
        "{error}"
    );
    // Only the Secret: everything else was read.
    assert!(!error.contains("Functions:"), "{error}");
}
