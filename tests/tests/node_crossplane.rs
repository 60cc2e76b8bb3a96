//! Crossplane and fnrun's Kubernetes mode as pods on a real Kubernetes node
//! (`fnrun_tests::node`, with the controller manager and the scheduler),
//! everything real: Crossplane v2 installed as its Helm chart installs it
//! (`fnrun_tests::crossplane::pod`, `--package-runtime=Function=External`),
//! reaching the API server through the `kubernetes` Service with its
//! ServiceAccount's token; `deploy/crossplane/` applied as a user applies it
//! (docs/crossplane.md, "In Kubernetes, step by step"; only the image set to
//! the one `scripts/build-image` makes, imported into containerd, and the
//! tests' registry named insecure); the released function-patch-and-transform
//! installed from a registry on the node's address as a `kind: Function`;
//! Crossplane calling it through its Service and cluster DNS
//! (`dns:///function-patch-and-transform.crossplane-system:9443`, CoreDNS,
//! kube-proxy) with its client certificate (mTLS).
//!
//! - [`crossplane_composes_through_fnruns_replicas_on_the_node`]: the default
//!   (unprivileged) variant, two replicas: an XR composed and Ready; a
//!   Function with a DeploymentRuntimeConfig's memory limit is
//!   `RuntimeHealthy` False (the limit cannot be enforced: no writable
//!   cgroup on a cgroup v1 node) and its calls are refused; then 40 XRs
//!   created and updated while the replica that serves is deleted, and
//!   again during a rolling update of fnrun (`kubectl rollout restart`):
//!   every XR ends Ready with its composed ConfigMap as last asked, and the
//!   replicas' `/metrics` show which served.
//! - [`the_privileged_variant_composes_and_holds_a_function_to_its_memory_limit`]:
//!   `deploy/crossplane/privileged/deployment.yaml`: an XR composed through
//!   it, and a DeploymentRuntimeConfig's memory limit set on the function's
//!   cgroup.
//! - [`crossplanes_deployment_runtime_composes_on_the_node`]: Crossplane's
//!   own runtime (`--package-runtime=Function=Deployment`), as `bench/`
//!   compares fnrun with: the same package Healthy through the Deployment
//!   Crossplane makes (its image pulled by containerd from the registry on
//!   the node's address), an XR composed through it.
//! - [`crossplane_v1_13_composes_through_fnrun_as_its_sidecar`]:
//!   `deploy/sidecar/`: Crossplane v1.13 in a pod with fnrun merged in as its
//!   v1alpha1 runner; a Composition's container function composes an XR.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fnrun_tests::crossplane::pod::{Crossplane, Runtime};
use fnrun_tests::crossplane::xr::{
    XR, apply_xrd_and_composition, assert_composed, condition, wait_for,
};
use fnrun_tests::crossplane::{NAMESPACE, PATCH_AND_TRANSFORM};
use fnrun_tests::node::{FNRUN_IMAGE, NODE_IP, Node, Options, fnrun_image_archive};
use fnrun_tests::registry::{Registry, http_get_within};

/// One test at a time: each compares the host before and after its node.
static ONE_NODE: Mutex<()> = Mutex::new(());

/// The pods of fnrun's Deployment.
const FNRUN_PODS: &str = "app.kubernetes.io/name=fnrun,app.kubernetes.io/component=functions";

/// What a test has running: the node, Crossplane in it, fnrun's Deployment
/// from `deploy/crossplane/`, the Function installed and Healthy.
struct Bed {
    node: Node,
    crossplane: Crossplane,
    _registry: Registry,
    _build: tempfile::TempDir,
}

impl Bed {
    /// Starts the node, installs Crossplane, applies `deploy/crossplane/`
    /// with `deployment` (a path under `deploy/crossplane/`) as its
    /// Deployment, installs function-patch-and-transform and waits until it
    /// is Healthy.
    fn start(deployment: &str) -> Bed {
        let t0 = Instant::now();
        let build = tempfile::tempdir().unwrap();
        let archive = fnrun_image_archive(build.path()).unwrap();
        let package = PATCH_AND_TRANSFORM
            .image()
            .expect("function-patch-and-transform builds and packages");
        eprintln!("[{:?}] images built", t0.elapsed());
        let node =
            Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
        eprintln!("[{:?}] node Ready", t0.elapsed());
        let (image_name, tag) = FNRUN_IMAGE.rsplit_once(':').unwrap();
        let image = node.import_archive(&archive, image_name, tag).unwrap();
        let registry = Registry::start_on(NODE_IP).unwrap();
        let package = package.push_to(
            &registry,
            &format!(
                "crossplane-contrib/{}:{}",
                PATCH_AND_TRANSFORM.name, PATCH_AND_TRANSFORM.version
            ),
        );
        let crossplane = Crossplane::install(&node, Runtime::External, &["--debug"])
            .unwrap_or_else(|e| panic!("Crossplane runs as a pod: {e:#}"));
        eprintln!("[{:?}] Crossplane rolled out", t0.elapsed());
        // fnrun's seccomp profile where the Deployment's Localhost profile
        // names it, as docs/deployment.md installs it: kubelet's
        // `seccomp/fnrun/fnrun.json`.
        let profile = node.dir().join("kubelet/seccomp/fnrun/fnrun.json");
        std::fs::create_dir_all(profile.parent().unwrap()).unwrap();
        std::fs::copy(
            fnrun_tests::workspace_root().join("deploy/seccomp/fnrun.json"),
            &profile,
        )
        .unwrap();

        // docs/crossplane.md, step 1: the namespace's label.
        node.kubectl(&[
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=privileged",
            "--overwrite",
        ])
        .unwrap();
        // Step 3: `kubectl apply -f deploy/crossplane/`, the Deployment
        // with fnrun's image and the tests' registry.
        let dir = fnrun_tests::workspace_root().join("deploy/crossplane");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let mut yaml = String::new();
        for file in files {
            if file.file_name().unwrap() == "deployment.yaml" {
                continue;
            }
            yaml.push_str(&std::fs::read_to_string(&file).unwrap());
            yaml.push_str("\n---\n");
        }
        let text = std::fs::read_to_string(dir.join(deployment)).unwrap();
        let mut object: serde_json::Value = serde_norway::from_str(&text).unwrap();
        let container = &mut object["spec"]["template"]["spec"]["containers"][0];
        container["image"] = image.into();
        container["args"]
            .as_array_mut()
            .unwrap()
            .push(format!("--insecure-registry={}", registry.addr()).into());
        yaml.push_str(&serde_json::to_string(&object).unwrap());
        node.cp().apply(&yaml).unwrap();
        let bed = Bed {
            node,
            crossplane,
            _registry: registry,
            _build: build,
        };
        let out = bed.node.kubectl(&[
            "rollout",
            "status",
            "deployment/fnrun-functions",
            "-n",
            NAMESPACE,
            "--timeout=180s",
        ]);
        assert!(out.is_ok(), "{out:?}\n{}", bed.describe());
        eprintln!("[{:?}] fnrun rolled out", t0.elapsed());

        // Step 4: the Function, Healthy with no other step.
        bed.node
            .cp()
            .apply(&format!(
                "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {}\nspec:\n  package: {package}\n",
                PATCH_AND_TRANSFORM.name
            ))
            .unwrap();
        let out = bed.node.kubectl(&[
            "wait",
            &format!("function/{}", PATCH_AND_TRANSFORM.name),
            "--for=condition=Healthy",
            "--timeout=180s",
        ]);
        assert!(out.is_ok(), "{out:?}\n{}", bed.describe());
        eprintln!("[{:?}] the Function Healthy", t0.elapsed());
        bed
    }

    fn describe(&self) -> String {
        let node = &self.node;
        format!(
            "--- fnrun's pods ---\n{}\n--- fnrun ---\n{}\n{}\n--- functions ---\n{}\n{}",
            node.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])
                .unwrap_or_default(),
            node.kubectl(&[
                "logs",
                "-n",
                NAMESPACE,
                "-l",
                FNRUN_PODS,
                "--tail=60",
                "--prefix"
            ])
            .unwrap_or_default(),
            self.crossplane.describe(node),
            node.kubectl(&["get", "functions,functionrevisions", "-o", "yaml"])
                .unwrap_or_default(),
            node.log_tails()
        )
    }

    /// fnrun's pods now: name → pod IP.
    fn pods(&self) -> BTreeMap<String, String> {
        let out = self
            .node
            .kubectl(&[
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                FNRUN_PODS,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
            ])
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, ip)| !ip.is_empty())
            .map(|(n, ip)| (n.to_owned(), ip.to_owned()))
            .collect()
    }

    fn stop(mut self) {
        let problems = self.node.stop();
        // What differs from the host as it was once the node's lock was
        // taken (a HostState taken before would hold another test's node
        // that ran meanwhile).
        assert!(problems.is_empty(), "left behind: {problems:#?}");
    }
}

/// The successful calls to function-patch-and-transform that the fnrun at
/// `ip` counted (`fnrun_function_calls_total`, code OK), if it answers.
fn calls_served(ip: &str) -> Option<u64> {
    let (code, body) =
        http_get_within(&format!("{ip}:9090"), "/metrics", Duration::from_secs(2)).ok()?;
    if code != 200 {
        return None;
    }
    let needle = format!(
        "fnrun_function_calls_total{{function=\"{}\",code=\"OK\"}} ",
        PATCH_AND_TRANSFORM.name
    );
    Some(
        body.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// The XRs `load-0` .. `load-{n-1}` in namespace `demo`, each of `color`.
fn xrs(n: usize, color: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "apiVersion: example.fnrun.dev/v1\nkind: XApp\nmetadata:\n  name: load-{i}\n  namespace: demo\nspec:\n  color: {color}\n---\n"
            )
        })
        .collect()
}

/// Waits (up to `bound`) until each of the `n` load XRs is Ready and Synced
/// with its composed ConfigMap of `color-{color}`; returns how long it took.
fn wait_all_composed(bed: &Bed, n: usize, color: &str, bound: Duration) -> Duration {
    let start = Instant::now();
    let want = format!("color-{color}");
    wait_for(
        &format!("{n} XRs Ready with {want}"),
        bound,
        || {
            let xrs = bed
                .node
                .cp()
                .get_json(&["xapps.example.fnrun.dev", "-n", "demo"])
                .ok()?;
            let ready = xrs["items"]
                .as_array()?
                .iter()
                .filter(|xr| {
                    xr["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("load-"))
                        && condition(xr, "Ready").as_deref() == Some("True")
                        && condition(xr, "Synced").as_deref() == Some("True")
                })
                .count();
            let cms = bed
                .node
                .cp()
                .get_json(&["configmaps", "-n", "demo", "-l", "crossplane.io/composite"])
                .ok()?;
            let mut composed = BTreeMap::new();
            for cm in cms["items"].as_array()? {
                let owner = cm["metadata"]["labels"]["crossplane.io/composite"]
                    .as_str()
                    .unwrap_or_default();
                if owner.starts_with("load-") {
                    *composed.entry(owner.to_owned()).or_insert(0) += 1;
                    if cm["data"]["color"] != want.as_str() {
                        return None;
                    }
                }
            }
            (ready == n && composed.len() == n && composed.values().all(|c| *c == 1)).then_some(())
        },
        &|| bed.describe(),
    );
    start.elapsed()
}

/// Scrapes every fnrun pod's call count every 500 ms while `during` runs;
/// returns the highest count each pod (by name) reached.
fn watching_calls(bed: &Bed, during: impl FnOnce()) -> BTreeMap<String, u64> {
    let seen = Mutex::new(BTreeMap::<String, u64>::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for (name, ip) in bed.pods() {
                    if let Some(n) = calls_served(&ip) {
                        let mut seen = seen.lock().unwrap();
                        let e = seen.entry(name).or_insert(0);
                        *e = (*e).max(n);
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        during();
        // A last look once the work is done.
        std::thread::sleep(Duration::from_secs(1));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    seen.into_inner().unwrap()
}

/// The default `deploy/crossplane/deployment.yaml` (unprivileged), two
/// replicas, Crossplane in a pod: see the module's documentation.
#[test]
fn crossplane_composes_through_fnruns_replicas_on_the_node() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let bed = Bed::start("deployment.yaml");
    let node = &bed.node;
    let pods = bed.pods();
    assert_eq!(pods.len(), 2, "two replicas: {}", bed.describe());

    // The Service fnrun wrote for the Function, its endpoints both pods, and
    // the revision's endpoint the name Crossplane resolves through CoreDNS.
    let svc = node
        .cp()
        .get_json(&["service", PATCH_AND_TRANSFORM.name, "-n", NAMESPACE])
        .unwrap();
    assert_eq!(svc["spec"]["type"], "ClusterIP", "{svc}");
    let slices = node
        .kubectl(&[
            "get",
            "endpointslices",
            "-n",
            NAMESPACE,
            "-l",
            &format!("kubernetes.io/service-name={}", PATCH_AND_TRANSFORM.name),
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ])
        .unwrap();
    let mut addresses: Vec<&str> = slices.split_whitespace().collect();
    addresses.sort_unstable();
    let mut ips: Vec<&str> = pods.values().map(String::as_str).collect();
    ips.sort_unstable();
    assert_eq!(addresses, ips, "{}", bed.describe());

    // A composite resource, composed through the Function and Ready.
    apply_xrd_and_composition(node.cp(), &|| bed.describe());
    node.cp().apply(XR).unwrap();
    assert_composed(node.cp(), "demo", "color-blue", &|| bed.describe());
    eprintln!("[{:?}] the first XR composed", t0.elapsed());

    // A DeploymentRuntimeConfig's memory limit, which this variant cannot
    // enforce on a cgroup v1 node: the revision and a call say so.
    let rev = install_limited(&bed);
    let runtime_healthy = rev["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RuntimeHealthy")
        .cloned()
        .unwrap();
    eprintln!("the limited revision's RuntimeHealthy: {runtime_healthy}");
    // The revision says the limit cannot be enforced here, not only the call.
    assert_eq!(runtime_healthy["status"], "False", "{runtime_healthy}");
    assert_eq!(
        runtime_healthy["reason"], "UnenforceableLimits",
        "{runtime_healthy}"
    );
    assert!(
        runtime_healthy["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot enforce: memory (")),
        "{runtime_healthy}"
    );
    let dir = tempfile::tempdir().unwrap();
    let ip = bed.pods().into_values().next().unwrap();
    let code = call_limited(&bed, &ip, dir.path());
    eprintln!(
        "a call to the limited Function: {code:?}; its servers: {:?}",
        limited_servers()
    );
    // Refused, not run without its limit.
    assert_eq!(code, tonic::Code::FailedPrecondition, "{}", bed.describe());
    assert_eq!(limited_servers(), Vec::new());

    // Load, and the replica that serves deleted meanwhile.
    const N: usize = 40;
    let mut timings = Vec::new();
    let deleted = Mutex::new(String::new());
    let seen = watching_calls(&bed, || {
        node.cp().apply(&xrs(N, "red")).unwrap();
        // Deleted once it serves the load.
        let serving = wait_for(
            "a replica serving the load",
            Duration::from_secs(60),
            || {
                bed.pods()
                    .into_iter()
                    .find(|(_, ip)| calls_served(ip).is_some_and(|n| n > 1))
            },
            &|| bed.describe(),
        );
        node.cp().apply(&xrs(N, "green")).unwrap();
        node.kubectl(&["delete", "pod", &serving.0, "-n", NAMESPACE, "--wait=false"])
            .unwrap();
        *deleted.lock().unwrap() = serving.0.clone();
        timings.push((
            "40 XRs, a replica deleted",
            wait_all_composed(&bed, N, "green", Duration::from_secs(240)),
        ));
        // The deleted replica drains what it has (--shutdown-delay, then
        // --shutdown-grace), which may be all of the load: once it is gone,
        // the next updates are served by another.
        node.kubectl(&[
            "wait",
            "--for=delete",
            &format!("pod/{}", serving.0),
            "-n",
            NAMESPACE,
            "--timeout=120s",
        ])
        .unwrap();
        node.cp().apply(&xrs(N, "blue")).unwrap();
        timings.push((
            "40 XRs, after the deleted replica is gone",
            wait_all_composed(&bed, N, "blue", Duration::from_secs(240)),
        ));
    });
    let deleted = deleted.into_inner().unwrap();
    eprintln!("calls served by each replica (a replica deleted): {seen:?}");
    assert!(seen.get(&deleted).is_some_and(|n| *n > 0), "{seen:?}");
    assert!(
        seen.iter().any(|(pod, n)| *pod != deleted && *n > 0),
        "another replica served after {deleted} was deleted: {seen:?}\n{}",
        bed.describe()
    );
    let out = node.kubectl(&[
        "rollout",
        "status",
        "deployment/fnrun-functions",
        "-n",
        NAMESPACE,
        "--timeout=120s",
    ]);
    assert!(out.is_ok(), "{out:?}\n{}", bed.describe());

    // A rolling update of fnrun under load.
    let before_rollout = bed.pods();
    let seen = watching_calls(&bed, || {
        node.cp().apply(&xrs(N, "yellow")).unwrap();
        node.kubectl(&[
            "rollout",
            "restart",
            "deployment/fnrun-functions",
            "-n",
            NAMESPACE,
        ])
        .unwrap();
        node.cp().apply(&xrs(N, "purple")).unwrap();
        let out = node.kubectl(&[
            "rollout",
            "status",
            "deployment/fnrun-functions",
            "-n",
            NAMESPACE,
            "--timeout=240s",
        ]);
        assert!(out.is_ok(), "{out:?}\n{}", bed.describe());
        timings.push((
            "40 XRs, a rolling update",
            wait_all_composed(&bed, N, "purple", Duration::from_secs(240)),
        ));
    });
    eprintln!("calls served by each replica (a rolling update): {seen:?}");
    // The rollout is complete once the new pods are ready; the old ones
    // drain meanwhile (--shutdown-delay, --shutdown-grace) and then go.
    for pod in before_rollout.keys() {
        let _ = node.kubectl(&[
            "wait",
            "--for=delete",
            &format!("pod/{pod}"),
            "-n",
            NAMESPACE,
            "--timeout=120s",
        ]);
    }
    let after_rollout = bed.pods();
    assert!(
        after_rollout
            .keys()
            .all(|p| !before_rollout.contains_key(p)),
        "every pod replaced: {before_rollout:?} -> {after_rollout:?}"
    );
    // After the update, a new XR is composed through the new pods.
    node.cp().apply(&xrs(N + 1, "purple")).unwrap();
    wait_all_composed(&bed, N + 1, "purple", Duration::from_secs(120));
    eprintln!("timings: {timings:?}; total {:?}", t0.elapsed());
    bed.stop();
}

/// The environment variable the DeploymentRuntimeConfig [`LIMITED`] sets.
const DRC_ENV: &str = "FNRUN_TEST_SETTING=from-drc";

use fnrun_tests::crossplane::LIMITED_RUNTIME_CONFIG as LIMITED;

/// The Function that uses [`LIMITED`]: the same package under another name.
const LIMITED_FN: &str = "function-limited";

/// Installs [`LIMITED`] and [`LIMITED_FN`]; returns its active revision once
/// fnrun has said whether it is `RuntimeHealthy` (True or False).
fn install_limited(bed: &Bed) -> serde_json::Value {
    let function = bed
        .node
        .cp()
        .get_json(&["function", PATCH_AND_TRANSFORM.name])
        .unwrap();
    let package = function["spec"]["package"].as_str().unwrap().to_owned();
    bed.node.cp().apply(LIMITED).unwrap();
    bed.node
        .cp()
        .apply(&format!(
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {LIMITED_FN}\n\
             spec:\n  package: {package}\n  runtimeConfigRef:\n    name: limited\n"
        ))
        .unwrap();
    wait_for(
        "the limited Function's revision with RuntimeHealthy",
        Duration::from_secs(180),
        || {
            let revs = bed
                .node
                .cp()
                .get_json(&[
                    "functionrevisions",
                    "-l",
                    &format!("pkg.crossplane.io/package={LIMITED_FN}"),
                ])
                .ok()?;
            revs["items"]
                .as_array()?
                .iter()
                .find(|r| {
                    r["spec"]["desiredState"] == "Active"
                        && condition(r, "RuntimeHealthy")
                            .is_some_and(|c| c == "True" || c == "False")
                })
                .cloned()
        },
        &|| bed.describe(),
    )
}

/// A call to [`LIMITED_FN`] as Crossplane makes it (its client certificate,
/// the Service's name) straight to the fnrun pod at `ip`.
fn call_limited(bed: &Bed, ip: &str, dir: &std::path::Path) -> tonic::Code {
    let tls = bed.crossplane.client_tls(&bed.node, dir).unwrap();
    let outcome = fnrun_tests::crossplane::Call::mtls(&format!("{ip}:9443"), &tls.ca)
        .client_cert(&tls)
        .server_name(&format!("{LIMITED_FN}.{NAMESPACE}"))
        .timeout(Duration::from_secs(60))
        .run()
        .unwrap_or_else(|e| panic!("{e:#}\n{}", bed.describe()));
    outcome.code
}

/// The host's processes whose environment has [`DRC_ENV`] (the function
/// servers run so), with the memory limit of their cgroup (v1
/// `memory.limit_in_bytes`).
fn limited_servers() -> Vec<(i32, Option<u64>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if !env.split(|b| *b == 0).any(|v| v == DRC_ENV.as_bytes()) {
            continue;
        }
        let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let limit = cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == "memory").then(|| {
                std::fs::read_to_string(format!(
                    "/sys/fs/cgroup/{controllers}{path}/memory.limit_in_bytes"
                ))
                .ok()
                .and_then(|v| v.trim().parse().ok())
            })?
        });
        out.push((pid, limit));
    }
    out
}

/// `deploy/crossplane/privileged/deployment.yaml`, two replicas, Crossplane
/// in a pod: an XR composed through it; a DeploymentRuntimeConfig's memory
/// limit is on the function server's cgroup, and the revision is
/// RuntimeHealthy.
#[test]
fn the_privileged_variant_composes_and_holds_a_function_to_its_memory_limit() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let bed = Bed::start("privileged/deployment.yaml");
    let node = &bed.node;
    assert_eq!(bed.pods().len(), 2, "two replicas: {}", bed.describe());
    apply_xrd_and_composition(node.cp(), &|| bed.describe());
    node.cp().apply(XR).unwrap();
    assert_composed(node.cp(), "demo", "color-blue", &|| bed.describe());
    eprintln!("[{:?}] an XR composed", t0.elapsed());

    let rev = install_limited(&bed);
    assert_eq!(
        condition(&rev, "RuntimeHealthy").as_deref(),
        Some("True"),
        "{rev}"
    );
    let dir = tempfile::tempdir().unwrap();
    let ip = bed.pods().into_values().next().unwrap();
    assert_eq!(call_limited(&bed, &ip, dir.path()), tonic::Code::Ok);
    let servers = limited_servers();
    assert!(!servers.is_empty(), "no function server with {DRC_ENV}");
    assert!(
        servers.iter().any(|(_, limit)| *limit == Some(200 << 20)),
        "the runtime config's memory limit on the server's cgroup: {servers:?}"
    );
    eprintln!("total {:?}", t0.elapsed());
    bed.stop();
}

/// Crossplane's own function runtime, as `bench/` compares fnrun with:
/// Crossplane in a pod with `--package-runtime=Function=Deployment`, the
/// same package installed from the registry on the node's address (which
/// containerd is told of, plain HTTP), becomes Healthy through the
/// Deployment and Service Crossplane makes for it, and an XR is composed
/// through it.
#[test]
fn crossplanes_deployment_runtime_composes_on_the_node() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let package = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages");
    let mut node =
        Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
    let registry = Registry::start_on(NODE_IP).unwrap();
    node.trust_registry(registry.addr()).unwrap();
    let package = package.push_to(
        &registry,
        &format!(
            "crossplane-contrib/{}:{}",
            PATCH_AND_TRANSFORM.name, PATCH_AND_TRANSFORM.version
        ),
    );
    let crossplane = Crossplane::install(&node, Runtime::Deployment, &["--debug"])
        .unwrap_or_else(|e| panic!("Crossplane runs as a pod: {e:#}"));
    eprintln!("[{:?}] Crossplane rolled out", t0.elapsed());
    let describe = || {
        format!(
            "{}\n{}\n{}\n{}",
            node.kubectl(&[
                "get",
                "pods,deployments,services",
                "-n",
                NAMESPACE,
                "-o",
                "wide"
            ])
            .unwrap_or_default(),
            node.kubectl(&["get", "functions,functionrevisions", "-o", "yaml"])
                .unwrap_or_default(),
            crossplane.describe(&node),
            node.log_tails()
        )
    };
    node.cp()
        .apply(&format!(
            "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {}\nspec:\n  package: {package}\n",
            PATCH_AND_TRANSFORM.name
        ))
        .unwrap();
    let out = node.kubectl(&[
        "wait",
        &format!("function/{}", PATCH_AND_TRANSFORM.name),
        "--for=condition=Healthy",
        "--timeout=180s",
    ]);
    assert!(out.is_ok(), "{out:?}\n{}", describe());
    eprintln!("[{:?}] the Function Healthy", t0.elapsed());
    // Crossplane's Deployment for it, its pod running the package's image.
    let images = node
        .kubectl(&[
            "get",
            "deployments",
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.items[*].spec.template.spec.containers[0].image}",
        ])
        .unwrap();
    assert!(images.contains(&package), "{images}\n{}", describe());
    apply_xrd_and_composition(node.cp(), &describe);
    node.cp().apply(XR).unwrap();
    assert_composed(node.cp(), "demo", "color-blue", &describe);
    eprintln!("total {:?}", t0.elapsed());
    drop(registry);
    let problems = node.stop();
    assert!(problems.is_empty(), "left behind: {problems:#?}");
}

/// An xfn-era FunctionIO function: adds a Namespace (cluster-scoped: a v1
/// XR's references to what it composes carry no namespace; named: Crossplane
/// v1.13 names no resource a function adds; never waited on) to the desired
/// resources, unless they hold it already, and says so in a result.
/// The FunctionIO Crossplane v1.13 sends has no `apiVersion` or `kind`, its
/// keys sorted (`desired`, then `observed`), its lists not indented: the new
/// entry (or the `resources` key and it) goes right before `observed:`.
const XFN_NAMESPACE: &str = r#"#!/bin/sh
section=
listed=no
has=no
added=no
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    desired:*) section=desired ;;
    "  resources:") [ "$section" = desired ] && listed=yes ;;
    "  - name: settings") [ "$section" = desired ] && has=yes ;;
  esac
  if [ "$line" = "observed:" ]; then
    section=observed
    if [ "$has" = no ]; then
      added=yes
      [ "$listed" = no ] && printf '%s\n' '  resources:'
      printf '%s\n' '  - name: settings' '    resource:' \
        '      apiVersion: v1' '      kind: Namespace' '      metadata:' \
        '        name: fnrun-sidecar-settings' '        labels:' \
        '          fnrun.dev/owner: fnrun-sidecar' \
        '    readinessChecks:' '    - type: None'
    fi
  fi
  printf '%s\n' "$line"
done
printf 'results:\n- severity: Normal\n  message: "xfn-namespace added the Namespace: %s"\n' "$added"
"#;

/// `deploy/sidecar/`: Crossplane v1.13 (composition functions, alpha) as its
/// chart installs it with `--enable-composition-functions` and no runner of
/// its own, then `deploy/sidecar/crossplane-patch.yaml` merged into its
/// Deployment as docs/deployment.md says (`kubectl patch --type strategic`;
/// the image set to `scripts/build-image`'s, `--insecure-registry` added, its
/// seccomp profile installed): Crossplane calls fnrun at the default abstract
/// socket, fnrun pulls the Composition's container function from the
/// registry on the node's address and runs it, and the XR is Ready with the
/// Namespace the function composed.
#[test]
fn crossplane_v1_13_composes_through_fnrun_as_its_sidecar() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let build = tempfile::tempdir().unwrap();
    let archive = fnrun_image_archive(build.path()).unwrap();
    let function = fnrun_tests::image::TestImage::script(XFN_NAMESPACE);
    let mut node =
        Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
    let (image_name, tag) = FNRUN_IMAGE.rsplit_once(':').unwrap();
    let image = node.import_archive(&archive, image_name, tag).unwrap();
    let registry = Registry::start_on(NODE_IP).unwrap();
    let function = function.push_to(&registry, "fns/xfn-namespace:v1");
    let profile = node.dir().join("kubelet/seccomp/fnrun/fnrun.json");
    std::fs::create_dir_all(profile.parent().unwrap()).unwrap();
    std::fs::copy(
        fnrun_tests::workspace_root().join("deploy/seccomp/fnrun.json"),
        &profile,
    )
    .unwrap();
    let crossplane = Crossplane::install_v1(&node, &["--enable-composition-functions", "--debug"])
        .unwrap_or_else(|e| panic!("Crossplane v1.13 runs as a pod: {e:#}"));
    eprintln!("[{:?}] Crossplane v1.13 rolled out", t0.elapsed());

    // The sidecar, merged in as the docs say.
    let text = std::fs::read_to_string(
        fnrun_tests::workspace_root().join("deploy/sidecar/crossplane-patch.yaml"),
    )
    .unwrap();
    let mut patch: serde_json::Value = serde_norway::from_str(&text).unwrap();
    let container = &mut patch["spec"]["template"]["spec"]["containers"][0];
    container["image"] = image.into();
    container["args"]
        .as_array_mut()
        .unwrap()
        .push(format!("--insecure-registry={}", registry.addr()).into());
    let patch_file = build.path().join("crossplane-patch.json");
    std::fs::write(&patch_file, serde_json::to_string(&patch).unwrap()).unwrap();
    node.kubectl(&[
        "-n",
        NAMESPACE,
        "patch",
        "deployment",
        "crossplane",
        "--type",
        "strategic",
        "--patch-file",
        &patch_file.display().to_string(),
    ])
    .unwrap();
    let describe = || {
        format!(
            "{}\n{}\n{}",
            crossplane.describe(&node),
            node.kubectl(&["get", "xsides,compositions", "-o", "yaml"])
                .unwrap_or_default(),
            node.log_tails()
        )
    };
    crossplane
        .rolled_out(&node)
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("[{:?}] the sidecar rolled out", t0.elapsed());

    node.cp()
        .apply(
            r#"apiVersion: apiextensions.crossplane.io/v1
kind: CompositeResourceDefinition
metadata: {name: xsides.example.fnrun.dev}
spec:
  group: example.fnrun.dev
  names: {kind: XSide, plural: xsides}
  versions:
  - name: v1
    served: true
    referenceable: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              color: {type: string}
"#,
        )
        .unwrap();
    wait_for(
        "the XRD established",
        Duration::from_secs(120),
        || {
            let xrd = node
                .cp()
                .get_json(&["xrd", "xsides.example.fnrun.dev"])
                .ok()?;
            (condition(&xrd, "Established").as_deref() == Some("True")).then_some(())
        },
        &describe,
    );
    node.cp()
        .apply(&format!(
            r#"apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata: {{name: xsides.example.fnrun.dev}}
spec:
  compositeTypeRef: {{apiVersion: example.fnrun.dev/v1, kind: XSide}}
  functions:
  - name: namespace
    type: Container
    container:
      image: {function}
      timeout: 20s
---
apiVersion: example.fnrun.dev/v1
kind: XSide
metadata: {{name: side}}
spec: {{color: blue}}
"#
        ))
        .unwrap();
    let xr = wait_for(
        "the XR Ready",
        Duration::from_secs(180),
        || {
            let xr = node.cp().get_json(&["xside", "side"]).ok()?;
            (condition(&xr, "Ready").as_deref() == Some("True")).then_some(xr)
        },
        &describe,
    );
    assert_eq!(condition(&xr, "Synced").as_deref(), Some("True"), "{xr}");
    let composed = node
        .cp()
        .get_json(&["namespaces", "-l", "crossplane.io/composite=side"])
        .unwrap();
    let items = composed["items"].as_array().unwrap();
    let all = || {
        format!(
            "{xr}\n{}\n{}\n{}",
            node.kubectl(&["get", "namespaces", "--show-labels"])
                .unwrap_or_default(),
            node.kubectl(&["get", "events", "-A"]).unwrap_or_default(),
            crossplane.logs(&node)
        )
    };
    assert_eq!(items.len(), 1, "{composed}\n{}", all());
    assert_eq!(
        items[0]["metadata"]["labels"]["fnrun.dev/owner"], "fnrun-sidecar",
        "{composed}"
    );
    eprintln!("total {:?}", t0.elapsed());
    drop(registry);
    let problems = node.stop();
    assert!(problems.is_empty(), "left behind: {problems:#?}");
}
