//! docs/crossplane.md's "With a functions file, step by step" (fnrun without
//! the Kubernetes controller), followed to the letter against the real peers: a
//! Kubernetes control plane
//! (`fnrun_tests::kube::ControlPlane`: etcd and kube-apiserver, RBAC on), the
//! real Crossplane core out of cluster with the External function runtime
//! (`fnrun_tests::crossplane::Core`), the released
//! function-patch-and-transform as a Function package in the tests'
//! registry, and `fnrun serve --functions` on the host run with the
//! arguments of `deploy/crossplane-file/deployment.yaml`, its functions file and CA
//! read from the ConfigMap and the Secret that Deployment mounts. The docs'
//! shell blocks are run as they are written. A namespaced XR of a v2 XRD,
//! composed by a pipeline of the real function, becomes Ready with its
//! ConfigMap in the API server. Then the same daemon run by an unprivileged
//! user (rootless) takes over the address, and a second XR is composed
//! through it.
//!
//! What differs from a cluster, and why: fnrun and Crossplane run on the
//! host, not in Pods (there is no kubelet); the Helm upgrade of step 2 is
//! Crossplane's `--package-runtime=Function=External` flag given directly;
//! Crossplane resolves `NAME.crossplane-system` through a hosts file of its
//! own (there is no cluster DNS) to a loopback address where fnrun listens on
//! the Deployment's port 9443.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use fnrun_tests::crossplane::xr::{
    XR, apply_steps_2_and_3, apply_xrd_and_composition, assert_composed, condition, docs_step, sh,
    wait_for,
};
use fnrun_tests::crossplane::{Core, NAMESPACE, PATCH_AND_TRANSFORM, ROOT_CA_SECRET, loopback_ip};
use fnrun_tests::daemon::{Daemon, DaemonOpts, Listen};
use fnrun_tests::kube::ControlPlane;
use fnrun_tests::registry::{Registry, free_port, http_get};
use fnrun_tests::user::{TestUser, require_root, rootless_user};
use fnrun_tests::workspace_root;

/// `fnrun serve` as `deploy/crossplane-file/deployment.yaml` runs it: its args,
/// with the files it mounts (the ConfigMap's functions file, the Secret's CA)
/// read from the API server into `dir`, listening on `ip` instead of every
/// address, its metrics on a free port of 127.0.0.1 (returned with it).
fn start_fnrun(
    cp: &ControlPlane,
    dir: &Path,
    ip: Ipv4Addr,
    user: Option<&TestUser>,
) -> (Daemon, String) {
    let deployment = cp
        .get_json(&["deployment", "fnrun-functions", "-n", NAMESPACE])
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mounts: Vec<(String, String)> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["mountPath"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("no volume {name} mounted: {container}"))
    };
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap().clone();
    // The ConfigMap's and the Secret's keys, as the kubelet writes them.
    let functions_dir = dir.join("functions");
    let ca_dir = dir.join("ca");
    std::fs::create_dir_all(&functions_dir).unwrap();
    std::fs::create_dir_all(&ca_dir).unwrap();
    let configmap = cp
        .get_json(&[
            "configmap",
            volume("functions")["configMap"]["name"].as_str().unwrap(),
            "-n",
            NAMESPACE,
        ])
        .unwrap();
    for (key, value) in configmap["data"].as_object().unwrap() {
        std::fs::write(functions_dir.join(key), value.as_str().unwrap()).unwrap();
    }
    let secret = volume("ca")["secret"]["secretName"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(secret, ROOT_CA_SECRET);
    for key in ["tls.crt", "tls.key"] {
        let pem = cp
            .kubectl(&[
                "get",
                "secret",
                &secret,
                "-n",
                NAMESPACE,
                "-o",
                &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
            ])
            .unwrap();
        std::fs::write(ca_dir.join(key), pem).unwrap();
    }
    let functions_mount = mount("functions");
    let ca_mount = mount("ca");
    let listen = format!("{ip}:9443");
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let mut opts = DaemonOpts::default().listen(Listen::Off {
        ready: listen.clone(),
    });
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    for arg in &args[1..] {
        // What the Daemon harness sets itself: the subcommand, the runner's
        // listener (none) and the cache.
        if *arg == "--listen=none" || arg.starts_with("--cache-dir=") {
            continue;
        }
        let arg = arg
            .replace(&functions_mount, &functions_dir.display().to_string())
            .replace(&ca_mount, &ca_dir.display().to_string())
            .replace("0.0.0.0:9443", &listen)
            .replace("0.0.0.0:9090", &metrics);
        opts = opts.arg(arg);
    }
    assert!(args.contains(&"--listen=none"), "{args:?}");
    assert!(args.contains(&"--metrics-listen=0.0.0.0:9090"), "{args:?}");
    if let Some(user) = user {
        // The mounted files, the user's as a rootless pod's would be. Without
        // a delegated cgroup the functions file's limits cannot be enforced:
        // fnrun refuses to start the function (FAILED_PRECONDITION, which
        // Crossplane reports on the XR) unless told to run it without them.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        user.chown_recursive(dir).unwrap();
        opts = opts.user(user.clone()).arg("--best-effort-limits");
    }
    let daemon = Daemon::start(opts).expect("fnrun serve starts as the Deployment runs it");
    (daemon, metrics)
}

/// The docs' section this test follows.
const FILE_STEPS: &str = "## With a functions file, step by step";

#[test]
fn the_kubernetes_steps_of_the_docs_compose_with_the_real_crossplane() {
    if !require_root("the_kubernetes_steps_of_the_docs_compose_with_the_real_crossplane") {
        return;
    }
    let fn_name = PATCH_AND_TRANSFORM.name;
    let registry = Registry::start().expect("registry starts");
    let package = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            &registry,
            &format!(
                "crossplane-contrib/{fn_name}:{}",
                PATCH_AND_TRANSFORM.version
            ),
        );
    let cp = ControlPlane::start().expect("etcd and kube-apiserver start");
    let ip = loopback_ip();
    let service = format!("{fn_name}.{NAMESPACE}");
    let core = Core::start(&cp, &[(&service, ip)], &[]).expect("crossplane starts");
    let logs = || {
        format!(
            "--- crossplane ---\n{}\n{}",
            core.log_tail(60),
            cp.log_tails()
        )
    };

    // A copy of the repository's deploy/crossplane-file, where step 3 lists the
    // function: its name, its Function's spec.package as image.
    let work = tempfile::tempdir().unwrap();
    let deploy = work.path().join("deploy/crossplane-file");
    std::fs::create_dir_all(deploy.join("services")).unwrap();
    let source = workspace_root().join("deploy/crossplane-file");
    for sub in ["", "services"] {
        for entry in std::fs::read_dir(source.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, deploy.join(sub).join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let functions = std::fs::read_to_string(deploy.join("functions.yaml")).unwrap();
    let (head, _) = functions
        .split_once("    functions:\n")
        .expect("the ConfigMap holds a functions list");
    std::fs::write(
        deploy.join("functions.yaml"),
        format!(
            "{head}    functions:\n    - name: {fn_name}\n      image: {package}\n      \
             resources: {{memory: 256Mi, cpu: 500m}}\n"
        ),
    )
    .unwrap();
    // Only this function's Service, as step 3 has one written per function.
    for entry in std::fs::read_dir(deploy.join("services")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_stem().is_some_and(|s| s != fn_name) {
            std::fs::remove_file(path).unwrap();
        }
    }

    // Step 1: the namespace's label.
    for block in docs_step(FILE_STEPS, 1) {
        sh(&cp, work.path(), &block);
    }
    let ns = cp.get_json(&["namespace", NAMESPACE]).unwrap();
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    // Steps 2 and 3: Crossplane's flag, and fnrun's manifests applied.
    apply_steps_2_and_3(&cp, work.path(), FILE_STEPS);
    let svc = cp.get_json(&["service", fn_name, "-n", NAMESPACE]).unwrap();
    assert_eq!(svc["spec"]["ports"][0]["port"], 9443);
    let fnrun_dir = tempfile::tempdir().unwrap();
    let (mut fnrun, metrics) = start_fnrun(&cp, fnrun_dir.path(), ip, None);

    // Step 4: install the Function.
    cp.apply(&format!(
        "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {fn_name}\nspec:\n  package: {package}\n"
    ))
    .unwrap();
    wait_for(
        "an active FunctionRevision",
        Duration::from_secs(120),
        || {
            let revs = cp
                .get_json(&[
                    "functionrevisions",
                    "-l",
                    &format!("pkg.crossplane.io/package={fn_name}"),
                ])
                .ok()?;
            revs["items"]
                .as_array()?
                .iter()
                .find(|r| r["spec"]["desiredState"] == "Active")
                .cloned()
        },
        &logs,
    );

    // Step 5: the endpoint and the runtime's health, by the docs' commands.
    for block in docs_step(FILE_STEPS, 5) {
        sh(&cp, work.path(), &block);
    }
    let function = wait_for(
        "the Function installed and healthy",
        Duration::from_secs(120),
        || {
            let f = cp.get_json(&["function", fn_name]).ok()?;
            (condition(&f, "Installed").as_deref() == Some("True")
                && condition(&f, "Healthy").as_deref() == Some("True"))
            .then_some(f)
        },
        &logs,
    );
    eprintln!("{function}");

    // Step 6: a composite resource that uses the function reconciles.
    apply_xrd_and_composition(&cp, &logs);
    cp.apply(XR).unwrap();
    assert_composed(&cp, "demo", "color-blue", &|| {
        format!("{}\n--- fnrun ---\n{}", logs(), fnrun.log())
    });
    // Step 6's checks: the daemon's log line (JSON, as the Deployment's
    // --log-format=json writes it) and the calls counted.
    let log = fnrun.log();
    assert!(
        log.lines()
            .any(|l| l.contains("\"message\":\"function server ready\"")
                && l.contains(&format!("\"function\":\"{fn_name}\""))),
        "fnrun served the calls: {log}"
    );
    let (code, body) = http_get(&metrics, "/metrics").unwrap();
    assert_eq!(code, 200, "{body}");
    let ok_calls: f64 = body
        .lines()
        .find(|l| {
            l.starts_with("fnrun_function_calls_total{")
                && l.contains(&format!("function=\"{fn_name}\""))
                && l.contains("code=\"OK\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no OK calls of {fn_name} counted:\n{body}"));
    assert!(ok_calls >= 1.0, "{body}");
    assert!(fnrun.stop().is_some_and(|s| s.success()), "{}", fnrun.log());

    // The same daemon run by an unprivileged user (rootless): Crossplane
    // reconnects to it, and a second XR is composed through it.
    let Some(user) =
        rootless_user("the_kubernetes_steps_of_the_docs_compose_with_the_real_crossplane rootless")
    else {
        return;
    };
    let rootless_dir = tempfile::tempdir().unwrap();
    let (fnrun, _) = start_fnrun(&cp, rootless_dir.path(), ip, Some(&user));
    cp.apply(
        &XR.replace(
            "name: demo\n  namespace: demo",
            "name: rootless\n  namespace: demo",
        )
        .replace("color: blue", "color: green"),
    )
    .unwrap();
    assert_composed(&cp, "rootless", "color-green", &|| {
        format!("{}\n--- fnrun (rootless) ---\n{}", logs(), fnrun.log())
    });
    let pid = fnrun.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:")
                && l.split_whitespace().nth(1) == Some(&user.uid.to_string())),
        "{status}"
    );
}
