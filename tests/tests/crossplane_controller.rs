//! Kubernetes mode against the real peers: docs/crossplane.md's "In
//! Kubernetes, step by step" followed to the letter on a Kubernetes control
//! plane (`fnrun_tests::kube::ControlPlane`, RBAC on) with the real Crossplane
//! core out of cluster (`--package-runtime=Function=External`), and `fnrun
//! serve` run with the arguments of `deploy/crossplane/deployment.yaml` and
//! the token of the ServiceAccount `deploy/crossplane/rbac.yaml` makes (never
//! an admin's). The released function-patch-and-transform, installed as a
//! `kind: Function`, becomes Healthy with no other step, and a namespaced XR
//! composed by it becomes Ready. Then, each against the same control plane:
//!
//! - an upgrade to a new package: the new revision becomes Active and
//!   served, the endpoint stays, the old instance stops, the old revision is
//!   marked inactive, and an XR created after it is composed;
//! - a Function whose package needs credentials (`spec.packagePullSecrets`)
//!   and whose DeploymentRuntimeConfig sets an environment variable and a
//!   memory limit: fnrun pulls with the Secret and runs the function so; and
//!   one whose credentials come from a matching ImageConfig;
//! - an Operation (`--enable-operations`) whose function (the tests' Go
//!   function, packaged with the `operation` capability) runs through fnrun
//!   succeeds;
//! - a restart of fnrun while a Function's image cannot be pulled for running
//!   (its repository gone from the registry after Crossplane read the
//!   package): fnrun converges (the served Function stays Healthy),
//!   `RuntimeHealthy` is False with the registry's error, and turns True
//!   once the repository is back;
//! - the API server frozen (as behind a partition) for longer than the
//!   Lease: calls made as Crossplane makes them are served throughout, and
//!   once it is back fnrun follows a deletion again;
//! - the CA Secret deleted: active revisions say `RuntimeHealthy` False with
//!   why, the certificates minted before keep serving; a new CA in the
//!   Secret: fnrun mints from it and verifies clients against it (a client
//!   of the new CA is served, Crossplane's of the old one refused); then
//!   Crossplane's CA back;
//! - two replicas: one leader, both serve; the leader is killed, the other
//!   takes the Lease once it expires and writes what changed, and a deleted
//!   Function's instance goes;
//! - fnrun run by an unprivileged user (rootless) takes over, and an XR is
//!   composed through it; where it cannot enforce the limited Function's
//!   memory limit (no cgroup of its own), that revision's `RuntimeHealthy`
//!   is False with reason `UnenforceableLimits`, naming the limit and why.
//!
//! What differs from a cluster, and why: as in `crossplane_kubernetes.rs`,
//! fnrun and Crossplane run on the host (no kubelet), and Crossplane resolves
//! `NAME.crossplane-system` through a hosts file of its own to the loopback
//! address fnrun listens on. Without a kube-controller-manager there is no
//! garbage collector: a deleted Function's Service, owned by it, stays (in a
//! cluster the garbage collector deletes it; fnrun deletes no Service), and
//! what is checked is that fnrun stops serving the Function.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use fnrun_tests::certs::{Ca, TlsFiles};
use fnrun_tests::crossplane::Call;

use fnrun_tests::crossplane::controller::{
    service_account_kubeconfig, start_fnrun, start_fnrun_as,
};
use fnrun_tests::crossplane::xr::{
    XR, apply_steps_2_and_3, apply_xrd_and_composition, assert_composed, condition, docs_step, sh,
    wait_for,
};
use fnrun_tests::crossplane::{
    CROSSPLANE_CONSTRAINT, Core, FUNCTION_PATH, NAMESPACE, PATCH_AND_TRANSFORM, ROOT_CA_SECRET,
    function_binary, loopback_ip, package_image,
};
use fnrun_tests::daemon::Daemon;
use fnrun_tests::function_host::descendants_named;
use fnrun_tests::kube::ControlPlane;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{require_root, rootless_user};
use fnrun_tests::workspace_root;

/// The docs' section this test follows.
const STEPS: &str = "## In Kubernetes, step by step";
/// The package the docs install, which the test replaces with its own.
const DOCS_PACKAGE: &str = "registry.example.org/fns/function-patch-and-transform:v0.10.7";
/// A second Function, whose repository goes missing.
const BROKEN: &str = "function-broken";
/// A Function in a registry that needs credentials, with a runtime config.
const PRIVATE: &str = "function-private";
/// A Function in the same registry whose credentials come from an
/// ImageConfig that matches its package.
const PRIVATE_IC: &str = "function-private-ic";
/// The environment variable its DeploymentRuntimeConfig sets.
const DRC_ENV: &str = "FNRUN_TEST_SETTING";
use fnrun_tests::crossplane::LIMITED_RUNTIME_CONFIG as LIMITED;
/// A Function that declares the `operation` capability: the tests' Go
/// function (`tests/go/crossplanefn`, which answers with a Normal result).
const OPS: &str = "function-ops";

fn revisions(cp: &ControlPlane, function: &str) -> Vec<serde_json::Value> {
    cp.get_json(&[
        "functionrevisions",
        "-l",
        &format!("pkg.crossplane.io/package={function}"),
    ])
    .ok()
    .and_then(|r| r["items"].as_array().cloned())
    .unwrap_or_default()
}

fn active_revision(cp: &ControlPlane, function: &str) -> Option<serde_json::Value> {
    revisions(cp, function)
        .into_iter()
        .find(|r| r["spec"]["desiredState"] == "Active")
}

fn healthy(cp: &ControlPlane, function: &str) -> Option<serde_json::Value> {
    let f = cp.get_json(&["function", function]).ok()?;
    (condition(&f, "Installed").as_deref() == Some("True")
        && condition(&f, "Healthy").as_deref() == Some("True"))
    .then_some(f)
}

fn lease_holder(cp: &ControlPlane) -> Option<String> {
    let lease = cp
        .get_json(&["lease", "fnrun-functions", "-n", NAMESPACE])
        .ok()?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// The memory limit of `pid`'s cgroup (v1 `memory.limit_in_bytes`, else v2
/// `memory.max`), if it has one.
fn memory_limit(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let file = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            Some(format!(
                "/sys/fs/cgroup/{controllers}{path}/memory.limit_in_bytes"
            ))
        } else if controllers.is_empty()
            && std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        {
            Some(format!("/sys/fs/cgroup{path}/memory.max"))
        } else {
            None
        }
    })?;
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The `FNRUN_TEST_PACKAGE` of each function server of the daemon `pid`
/// (`None` for the released package, which sets none).
fn servers_by_package(pid: u32) -> Vec<Option<String>> {
    descendants_named(pid, FUNCTION_PATH)
        .into_iter()
        .filter_map(|server| std::fs::read(format!("/proc/{server}/environ")).ok())
        .map(|env| {
            env.split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"FNRUN_TEST_PACKAGE="))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
        .collect()
}

/// The uid of the Function `name`.
fn function_uid(cp: &ControlPlane, name: &str) -> serde_json::Value {
    cp.get_json(&["function", name]).unwrap()["metadata"]["uid"].clone()
}

/// Waits until fnrun no longer serves the deleted Function `name` (its log
/// says so), and checks that its Service is owned by that Function (of uid
/// `uid`): a cluster's garbage collector deletes it. There is none here, so
/// the Service stays: fnrun does not delete it.
fn wait_function_gone(
    cp: &ControlPlane,
    name: &str,
    uid: &serde_json::Value,
    logs: &dyn Fn() -> String,
) {
    wait_for(
        &format!("fnrun no longer serving the deleted Function {name}"),
        Duration::from_secs(120),
        || {
            logs()
                .lines()
                .any(|l| {
                    l.contains("the Function was deleted: no longer served")
                        && l.contains(&format!("\"function\":\"{name}\""))
                })
                .then_some(())
        },
        logs,
    );
    let service = cp
        .get_json(&["service", name, "-n", NAMESPACE])
        .unwrap_or_else(|e| panic!("{name}'s Service: {e}\n{}", logs()));
    assert!(
        service["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|owners| owners
                .iter()
                .any(|o| o["kind"] == "Function" && o["name"] == name && o["uid"] == *uid)),
        "{service}"
    );
}

fn function_yaml(name: &str, package: &str) -> String {
    format!(
        "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {name}\nspec:\n  package: {package}\n"
    )
}

#[test]
fn kubernetes_mode_serves_every_installed_function_with_no_manual_step() {
    if !require_root("kubernetes_mode_serves_every_installed_function_with_no_manual_step") {
        return;
    }
    let fn_name = PATCH_AND_TRANSFORM.name;
    let registry = Registry::start().expect("registry starts");
    let repo = format!("crossplane-contrib/{fn_name}");
    let package = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            &registry,
            &format!("{repo}:{}", PATCH_AND_TRANSFORM.version),
        );
    // The upgrade: the same function, another image (another digest).
    let upgraded = PATCH_AND_TRANSFORM
        .image()
        .unwrap()
        .env("FNRUN_TEST_PACKAGE", "2")
        .push_to(&registry, &format!("{repo}:v0.10.8-fnrun.2"));
    let broken_tag = PATCH_AND_TRANSFORM
        .image()
        .unwrap()
        .env("FNRUN_TEST_PACKAGE", "broken")
        .push_to(&registry, &format!("fns/{BROKEN}:v1"));
    // By digest: Crossplane need not resolve the tag again once the
    // repository is gone.
    let broken = format!(
        "{}@{}",
        broken_tag.rsplit_once(':').unwrap().0,
        registry.digest(&format!("fns/{BROKEN}:v1")).unwrap()
    );

    let ops_package = package_image(
        &function_binary().expect("the tests' Go function builds"),
        &format!(
            "apiVersion: meta.pkg.crossplane.io/v1beta1\nkind: Function\nmetadata:\n  name: {OPS}\n\
             spec:\n  crossplane:\n    version: \"{CROSSPLANE_CONSTRAINT}\"\n  capabilities: [operation]\n"
        ),
    )
    .push_to(&registry, &format!("fns/{OPS}:v1"));

    let private_registry = Registry::start_with_htpasswd("fnrun", "s3cret")
        .expect("a registry with credentials starts");
    let private = PATCH_AND_TRANSFORM
        .image()
        .unwrap()
        .env("FNRUN_TEST_PACKAGE", "private")
        .push_to(&private_registry, &format!("fns/{PRIVATE}:v1"));
    let private_ic = PATCH_AND_TRANSFORM
        .image()
        .unwrap()
        .env("FNRUN_TEST_PACKAGE", "private-ic")
        .push_to(&private_registry, &format!("fns/{PRIVATE_IC}:v1"));

    let cp = ControlPlane::start().expect("etcd and kube-apiserver start");
    let ip = loopback_ip();
    let service = format!("{fn_name}.{NAMESPACE}");
    let ops_service = format!("{OPS}.{NAMESPACE}");
    let core = Core::start(
        &cp,
        &[(&service, ip), (&ops_service, ip)],
        &["--enable-operations"],
    )
    .expect("crossplane starts");
    let root = workspace_root();

    // Step 1: the namespace's label.
    for block in docs_step(STEPS, 1) {
        sh(&cp, &root, &block);
    }
    // Steps 2 and 3: Crossplane's flag, and fnrun's manifests applied.
    apply_steps_2_and_3(&cp, &root, STEPS);
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&cp, work.path());
    let mut fnrun = start_fnrun(&cp, &kubeconfig, ip, "fnrun-a", &[]);
    let logs = |fnrun: &Daemon| {
        format!(
            "--- crossplane ---\n{}\n{}\n--- fnrun ---\n{}",
            core.log_tail(60),
            cp.log_tails(),
            fnrun.log()
        )
    };

    // Step 4: install the Function as the docs do; it becomes Healthy with no
    // other step.
    let step4 = docs_step(STEPS, 4).concat();
    assert!(step4.contains(DOCS_PACKAGE), "{step4}");
    let (install, wait) = step4
        .split_once("kubectl wait")
        .expect("step 4 waits for the Function");
    sh(&cp, &root, &install.replace(DOCS_PACKAGE, &package));
    wait_for(
        "the Function Installed and Healthy",
        Duration::from_secs(180),
        || healthy(&cp, fn_name),
        &|| logs(&fnrun),
    );
    sh(&cp, &root, &format!("kubectl wait{wait}"));
    let rev = active_revision(&cp, fn_name).expect("an active revision");
    let endpoint = format!("dns:///{fn_name}.{NAMESPACE}:9443");
    assert_eq!(rev["status"]["endpoint"], endpoint.as_str(), "{rev}");
    assert_eq!(rev["status"]["tlsServerSecretName"], "crossplane-root-ca");
    assert_eq!(
        condition(&rev, "RuntimeHealthy").as_deref(),
        Some("True"),
        "{rev}"
    );
    assert_eq!(
        condition(&rev, "RuntimeActive").as_deref(),
        Some("True"),
        "{rev}"
    );
    let svc = cp.get_json(&["service", fn_name, "-n", NAMESPACE]).unwrap();
    assert_eq!(svc["spec"]["ports"][0]["port"], 9443);
    assert_eq!(svc["spec"]["selector"]["app.kubernetes.io/name"], "fnrun");
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["kind"], "Function",
        "{svc}"
    );
    let function = cp.get_json(&["function", fn_name]).unwrap();
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["uid"],
        function["metadata"]["uid"]
    );
    assert_eq!(lease_holder(&cp).as_deref(), Some("fnrun-a"));
    let events = cp
        .kubectl(&["get", "events", "-n", "default", "-o", "json"])
        .unwrap();
    assert!(events.contains("\"reason\": \"Started\""), "{events}");
    assert!(
        fnrun
            .log()
            .contains("trial start: the function's server answered"),
        "{}",
        fnrun.log()
    );

    // A composite resource that uses the function reconciles.
    apply_xrd_and_composition(&cp, &|| logs(&fnrun));
    cp.apply(XR).unwrap();
    assert_composed(&cp, "demo", "color-blue", &|| logs(&fnrun));

    // An upgrade: the new revision is Active and served, the endpoint the
    // same, the old revision no longer active; an XR made after it composes.
    let old = rev["metadata"]["name"].as_str().unwrap().to_owned();
    cp.apply(&function_yaml(fn_name, &upgraded)).unwrap();
    let new = wait_for(
        "the upgraded revision active and healthy",
        Duration::from_secs(180),
        || {
            let rev = active_revision(&cp, fn_name)?;
            (rev["metadata"]["name"] != old.as_str()
                && condition(&rev, "RuntimeHealthy").as_deref() == Some("True"))
            .then_some(rev)
        },
        &|| logs(&fnrun),
    );
    assert_eq!(new["status"]["endpoint"], endpoint.as_str(), "{new}");
    assert!(
        fnrun.log().lines().any(
            |l| l.contains("trial start: the function's server answered") && l.contains(&upgraded)
        ),
        "the upgraded image is served: {}",
        fnrun.log()
    );
    // The old instance stops: the one server left is the new package's.
    wait_for(
        "the old instance stopped",
        Duration::from_secs(60),
        || (servers_by_package(fnrun.pid()?) == [Some("2".to_owned())]).then_some(()),
        &|| {
            format!(
                "{:?}\n{}",
                servers_by_package(fnrun.pid().unwrap()),
                logs(&fnrun)
            )
        },
    );
    wait_for(
        "the old revision marked inactive",
        Duration::from_secs(60),
        || {
            let old = revisions(&cp, fn_name)
                .into_iter()
                .find(|r| r["metadata"]["name"] == old.as_str())?;
            (condition(&old, "RuntimeActive").as_deref() == Some("False")).then_some(())
        },
        &|| logs(&fnrun),
    );
    assert!(
        fnrun
            .log()
            .lines()
            .any(|l| l.contains("functions from the Kubernetes API applied")
                && l.contains("replaced")
                && l.contains(fn_name)),
        "{}",
        fnrun.log()
    );
    cp.apply(
        &XR.replace(
            "name: demo\n  namespace: demo",
            "name: upgraded\n  namespace: demo",
        )
        .replace("color: blue", "color: red"),
    )
    .unwrap();
    assert_composed(&cp, "upgraded", "color-red", &|| logs(&fnrun));

    // An Operation (Crossplane's --enable-operations) whose function declares
    // the operation capability runs through fnrun.
    cp.apply(&function_yaml(OPS, &ops_package)).unwrap();
    wait_for(
        "the operation Function Healthy",
        Duration::from_secs(180),
        || healthy(&cp, OPS),
        &|| logs(&fnrun),
    );
    let ops_rev = active_revision(&cp, OPS).unwrap();
    assert!(
        ops_rev["status"]["capabilities"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "operation")),
        "{ops_rev}"
    );
    cp.apply(&format!(
        "apiVersion: ops.crossplane.io/v1alpha1\nkind: Operation\nmetadata:\n  name: fnrun-operation\n\
         spec:\n  mode: Pipeline\n  pipeline:\n  - step: label\n    functionRef:\n      name: {OPS}\n"
    ))
    .unwrap();
    let operation = wait_for(
        "the Operation Succeeded",
        Duration::from_secs(120),
        || {
            let op = cp.get_json(&["operation", "fnrun-operation"]).ok()?;
            (condition(&op, "Succeeded").as_deref() == Some("True")).then_some(op)
        },
        &|| {
            format!(
                "{}\n{}",
                cp.get_json(&["operation", "fnrun-operation"])
                    .map(|o| o.to_string())
                    .unwrap_or_default(),
                logs(&fnrun)
            )
        },
    );
    eprintln!("{operation}");

    // A Function whose package needs credentials (spec.packagePullSecrets,
    // read through the API) and whose DeploymentRuntimeConfig sets an
    // environment variable and a memory limit for the package-runtime
    // container: fnrun pulls with the Secret, and runs the function so.
    cp.kubectl(&[
        "create",
        "secret",
        "docker-registry",
        "private-pull",
        "-n",
        NAMESPACE,
        &format!("--docker-server={}", private_registry.addr()),
        "--docker-username=fnrun",
        "--docker-password=s3cret",
    ])
    .unwrap();
    cp.apply(LIMITED).unwrap();
    cp.apply(&format!(
        "{}  packagePullSecrets:\n  - name: private-pull\n  runtimeConfigRef:\n    name: limited\n",
        function_yaml(PRIVATE, &private)
    ))
    .unwrap();
    wait_for(
        "the private Function Healthy",
        Duration::from_secs(180),
        || healthy(&cp, PRIVATE),
        &|| logs(&fnrun),
    );
    // The same registry through an ImageConfig's pull secret: Crossplane
    // lists it in the revision's appliedImageConfigRefs, and fnrun reads it.
    cp.apply(&format!(
        "apiVersion: pkg.crossplane.io/v1beta1\nkind: ImageConfig\nmetadata:\n  name: private\n\
         spec:\n  matchImages:\n  - prefix: {}/fns/{PRIVATE_IC}\n  registry:\n    authentication:\n\
         \x20     pullSecretRef:\n        name: private-pull\n",
        private_registry.addr()
    ))
    .unwrap();
    cp.apply(&function_yaml(PRIVATE_IC, &private_ic)).unwrap();
    wait_for(
        "the Function whose credentials an ImageConfig gives Healthy",
        Duration::from_secs(180),
        || healthy(&cp, PRIVATE_IC),
        &|| logs(&fnrun),
    );
    let rev = active_revision(&cp, PRIVATE_IC).unwrap();
    assert!(
        rev["status"]["appliedImageConfigRefs"]
            .as_array()
            .is_some_and(|refs| refs
                .iter()
                .any(|r| r["name"] == "private" && r["reason"] == "SetImagePullSecret")),
        "{rev}"
    );
    let daemon_pid = fnrun.pid().unwrap();
    let server = descendants_named(daemon_pid, FUNCTION_PATH)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|v| v == format!("{DRC_ENV}=from-drc").as_bytes())
            })
        })
        .unwrap_or_else(|| {
            let seen: Vec<String> = descendants_named(daemon_pid, FUNCTION_PATH)
                .into_iter()
                .map(|pid| {
                    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                    format!(
                        "{pid}: {}",
                        String::from_utf8_lossy(&env).replace('\0', " ")
                    )
                })
                .collect();
            panic!(
                "no function server with {DRC_ENV} set: {seen:#?}\n{}",
                fnrun.log()
            )
        });
    assert_eq!(
        memory_limit(server),
        Some(200 << 20),
        "the runtime config's memory limit"
    );

    // Calls as Crossplane makes them, straight to fnrun's listener with
    // Crossplane's client certificate: what "keeps serving" means below.
    let crossplane_tls = core.client_tls();
    let call = |client: &TlsFiles, ca: &Path| {
        Call::mtls(&format!("{ip}:9443"), ca)
            .client_cert(client)
            .server_name(&service)
            .timeout(Duration::from_secs(20))
            .run()
    };
    let served = |client: &TlsFiles, ca: &Path| {
        call(client, ca).is_ok_and(|outcome| outcome.code == tonic::Code::Ok)
    };
    let outcome = call(&crossplane_tls, &crossplane_tls.ca).unwrap();
    assert_eq!(outcome.code, tonic::Code::Ok, "{outcome:?}");

    // The API server lost (frozen, as behind a partition) for longer than
    // the Lease lasts: fnrun keeps serving what it knows.
    let paused = cp.pause_apiserver();
    for _ in 0..2 {
        let outcome = call(&crossplane_tls, &crossplane_tls.ca).unwrap();
        assert_eq!(
            outcome.code,
            tonic::Code::Ok,
            "{outcome:?}\n{}",
            fnrun.log()
        );
        std::thread::sleep(Duration::from_secs(10));
    }
    assert_eq!(fnrun.try_wait(), None, "{}", fnrun.log());
    drop(paused);
    // Back, fnrun follows Crossplane again and writes as the leader: a
    // deleted Function is no longer served.
    let uid = function_uid(&cp, OPS);
    cp.kubectl(&["delete", "function", OPS, "--wait=false"])
        .unwrap();
    wait_function_gone(&cp, OPS, &uid, &|| logs(&fnrun));
    assert!(served(&crossplane_tls, &crossplane_tls.ca));

    // The CA Secret deleted: every active revision says why fnrun cannot
    // serve TLS, while the certificates already minted keep serving.
    let ca_pem = |key: &str| {
        cp.kubectl(&[
            "get",
            "secret",
            ROOT_CA_SECRET,
            "-n",
            NAMESPACE,
            "-o",
            &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
        ])
        .unwrap()
    };
    let original = work.path().join("original-ca");
    std::fs::create_dir(&original).unwrap();
    for key in ["tls.crt", "tls.key"] {
        std::fs::write(original.join(key), ca_pem(key)).unwrap();
    }
    let create_ca = |dir: &Path| {
        cp.kubectl(&[
            "create",
            "secret",
            "generic",
            ROOT_CA_SECRET,
            "-n",
            NAMESPACE,
            &format!("--from-file=tls.crt={}", dir.join("tls.crt").display()),
            &format!("--from-file=tls.key={}", dir.join("tls.key").display()),
        ])
        .unwrap();
    };
    let runtime_healthy = |status: &str, message: &str| {
        let rev = active_revision(&cp, fn_name)?;
        let c = rev["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "RuntimeHealthy")?
            .clone();
        (c["status"] == status && c["message"].as_str().unwrap_or_default().contains(message))
            .then_some(c)
    };
    cp.kubectl(&["delete", "secret", ROOT_CA_SECRET, "-n", NAMESPACE])
        .unwrap();
    wait_for(
        "RuntimeHealthy False without the CA",
        Duration::from_secs(60),
        || {
            runtime_healthy(
                "False",
                &format!(
                    "fnrun cannot serve TLS: the CA Secret {NAMESPACE}/{ROOT_CA_SECRET}: does not exist"
                ),
            )
        },
        &|| logs(&fnrun),
    );
    assert!(served(&crossplane_tls, &crossplane_tls.ca));
    // A new CA in the Secret: fnrun mints from it and verifies clients
    // against it. A client of the new CA is served; Crossplane's
    // certificate, of the old one, is refused.
    let rotated = Ca::new("fnrun-test-rotated-ca").unwrap();
    let rotated_dir = work.path().join("rotated-ca");
    std::fs::create_dir(&rotated_dir).unwrap();
    std::fs::write(rotated_dir.join("tls.crt"), rotated.cert_pem()).unwrap();
    std::fs::write(rotated_dir.join("tls.key"), rotated.key_pem()).unwrap();
    create_ca(&rotated_dir);
    let rotated_client = TlsFiles::write(
        &rotated_dir.join("client"),
        &rotated.client("crossplane").unwrap(),
        &rotated.cert_pem(),
    )
    .unwrap();
    wait_for(
        "a client of the new CA served",
        Duration::from_secs(60),
        || served(&rotated_client, &rotated_client.ca).then_some(()),
        &|| logs(&fnrun),
    );
    wait_for(
        "RuntimeHealthy True with the new CA",
        Duration::from_secs(60),
        || runtime_healthy("True", ""),
        &|| logs(&fnrun),
    );
    // The server's certificate is trusted here: what fails is the client's.
    assert!(!served(&crossplane_tls, &rotated_client.ca));
    // Crossplane's CA back, as it was.
    cp.kubectl(&["delete", "secret", ROOT_CA_SECRET, "-n", NAMESPACE])
        .unwrap();
    create_ca(&original);
    wait_for(
        "Crossplane's client served again with its CA back",
        Duration::from_secs(60),
        || served(&crossplane_tls, &crossplane_tls.ca).then_some(()),
        &|| logs(&fnrun),
    );

    // A restart while a Function's image cannot be pulled for running.
    assert!(fnrun.stop().is_some_and(|s| s.success()), "{}", fnrun.log());
    cp.apply(&function_yaml(BROKEN, &broken)).unwrap();
    wait_for(
        "Crossplane activating the broken Function's revision",
        Duration::from_secs(120),
        || active_revision(&cp, BROKEN),
        &|| logs(&fnrun),
    );
    let repositories = registry
        .storage_dir()
        .join("docker/registry/v2/repositories/fns");
    let hidden = work.path().join("hidden-repository");
    std::fs::rename(repositories.join(BROKEN), &hidden).unwrap();
    let mut fnrun = start_fnrun(&cp, &kubeconfig, ip, "fnrun-a", &[]);
    let unhealthy = wait_for(
        "RuntimeHealthy False with the registry's error",
        Duration::from_secs(120),
        || {
            let rev = active_revision(&cp, BROKEN)?;
            let c = rev["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "RuntimeHealthy")?
                .clone();
            (c["status"] == "False").then_some(c)
        },
        &|| logs(&fnrun),
    );
    let message = unhealthy["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("MANIFEST_UNKNOWN")
            || message.contains("manifest unknown")
            || message.contains("404"),
        "{unhealthy}"
    );
    // The served Function stayed healthy through the restart, its Service
    // the same one.
    assert!(
        healthy(&cp, fn_name).is_some(),
        "{}\n{:#?}",
        cp.get_json(&["function", fn_name]).unwrap(),
        revisions(&cp, fn_name)
    );
    let svc_after = cp.get_json(&["service", fn_name, "-n", NAMESPACE]).unwrap();
    assert_eq!(svc_after["metadata"]["uid"], svc["metadata"]["uid"]);
    std::fs::rename(&hidden, repositories.join(BROKEN)).unwrap();
    wait_for(
        "the broken Function Healthy once its repository is back",
        Duration::from_secs(180),
        || healthy(&cp, BROKEN),
        &|| logs(&fnrun),
    );

    // Two replicas: one leader, both serve; the leader stops, the other
    // takes over and writes what changed.
    let second_ip = loopback_ip();
    let mut second = start_fnrun(&cp, &kubeconfig, second_ip, "fnrun-b", &[]);
    assert_eq!(lease_holder(&cp).as_deref(), Some("fnrun-a"));
    wait_for(
        "the second replica serving both functions",
        Duration::from_secs(120),
        || {
            let log = second.log();
            (log.contains("trial start: the function's server answered")
                && log
                    .matches("trial start: the function's server answered")
                    .count()
                    >= 2)
                .then_some(())
        },
        &|| second.log(),
    );
    // Killed, not stopped: the Lease is not given back, and the second
    // replica takes it once it has expired.
    fnrun.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(fnrun.wait_exit(Duration::from_secs(10)).is_some());
    wait_for(
        "the second replica leading",
        Duration::from_secs(60),
        || (lease_holder(&cp).as_deref() == Some("fnrun-b")).then_some(()),
        &|| second.log(),
    );
    wait_for(
        "the second replica's instance of the Function to delete",
        Duration::from_secs(120),
        || {
            servers_by_package(second.pid()?)
                .contains(&Some("broken".to_owned()))
                .then_some(())
        },
        &|| second.log(),
    );
    let uid = function_uid(&cp, BROKEN);
    cp.kubectl(&["delete", "function", BROKEN, "--wait=false"])
        .unwrap();
    wait_function_gone(&cp, BROKEN, &uid, &|| second.log());
    // Its instance went too.
    wait_for(
        "the deleted Function's instance stopped",
        Duration::from_secs(60),
        || (!servers_by_package(second.pid()?).contains(&Some("broken".to_owned()))).then_some(()),
        &|| {
            format!(
                "{:?}\n{}",
                servers_by_package(second.pid().unwrap()),
                second.log()
            )
        },
    );
    assert!(
        second.stop().is_some_and(|s| s.success()),
        "{}",
        second.log()
    );

    // Rootless: fnrun run by an unprivileged user takes the address Crossplane
    // dials and the Lease, and an XR is composed through it.
    let Some(user) = rootless_user(
        "kubernetes_mode_serves_every_installed_function_with_no_manual_step rootless",
    ) else {
        return;
    };
    let user_dir = tempfile::tempdir().unwrap();
    let user_kubeconfig = user_dir.path().join("kubeconfig");
    std::fs::copy(&kubeconfig, &user_kubeconfig).unwrap();
    std::fs::set_permissions(user_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    user.chown_recursive(user_dir.path()).unwrap();
    let rootless = start_fnrun_as(
        &cp,
        &user_kubeconfig,
        ip,
        "fnrun-rootless",
        &[],
        Some(&user),
    );
    wait_for(
        "the rootless replica leading",
        Duration::from_secs(60),
        || (lease_holder(&cp).as_deref() == Some("fnrun-rootless")).then_some(()),
        &|| rootless.log(),
    );
    cp.apply(
        &XR.replace(
            "name: demo\n  namespace: demo",
            "name: rootless\n  namespace: demo",
        )
        .replace("color: blue", "color: green"),
    )
    .unwrap();
    assert_composed(&cp, "rootless", "color-green", &|| logs(&rootless));
    // The limited Function's memory limit is one a rootless fnrun cannot
    // enforce on a host that gives it no cgroup of its own (cgroup v1): its
    // revision says so, with a reason of its own (its calls are refused).
    if rootless.log().contains("memory: unavailable") {
        let rev = wait_for(
            "the limited Function's revision saying its limit cannot be enforced",
            Duration::from_secs(120),
            || {
                let rev = active_revision(&cp, PRIVATE)?;
                let says = rev["status"]["conditions"].as_array()?.iter().any(|c| {
                    c["type"] == "RuntimeHealthy"
                        && c["status"] == "False"
                        && c["reason"] == "UnenforceableLimits"
                });
                says.then_some(rev)
            },
            &|| logs(&rootless),
        );
        let text = rev["status"]["conditions"].to_string();
        assert!(
            text.contains("memory (") && text.contains("--best-effort-limits"),
            "{text}"
        );
    } else {
        eprintln!("the rootless replica can enforce a memory limit here: nothing to refuse");
    }
    let pid = rootless.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:")
                && l.split_whitespace().nth(1) == Some(&user.uid.to_string())),
        "{status}"
    );
}
