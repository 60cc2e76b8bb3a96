//! fnrun's manifests (`deploy/`) applied to a real API server
//! (`fnrun_tests::kube::ControlPlane`: etcd and kube-apiserver built from
//! their modules, RBAC on): they are valid, and fnrun's service accounts can
//! do what the manifests grant, which is nothing beyond what every
//! authenticated user may, and no more.

use std::path::Path;

use fnrun_tests::kube::ControlPlane;
use fnrun_tests::workspace_root;

/// fnrun's service accounts, as their manifests name them.
const ACCOUNTS: [(&str, &str); 2] = [
    ("fnrun-system", "fnrun"),
    ("crossplane-system", "fnrun-functions"),
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
    let mut crossplane = manifests("deploy/crossplane");
    crossplane.extend(manifests("deploy/crossplane/services"));
    apply_files(&cp, &crossplane);
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
    let out = fnrun_tests::process::run_capture(
        cp.kubectl_command().args([
            "--token",
            token.trim(),
            "get",
            "configmap",
            "fnrun-functions",
            "-n",
            "crossplane-system",
        ]),
        None,
        std::time::Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "the Role's grant: {out:?}");
}
