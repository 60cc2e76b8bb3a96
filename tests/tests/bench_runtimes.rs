//! fnrun's Kubernetes mode side by side with Crossplane's own Deployment
//! runtime (issue 39, item 4), `#[ignore]`d: the test suite does not run it,
//! `bench/runtimes.sh` does (as root) and docs/benchmarks.md records what it
//! gave.
//!
//! One real node ([`Node`], with the controller manager and the scheduler),
//! the real Crossplane core as a pod on it ([`Crossplane::install`]), a
//! registry on the node's address, and the same real Function packages for
//! both runtimes: function-patch-and-transform and function-auto-ready, built
//! from their releases' modules. More Functions are the same two packages
//! installed under more names (each pushed to a repository of its own, so
//! that Crossplane's package manager sees distinct packages of the same
//! content): the Functions are `function-patch-and-transform`,
//! `function-auto-ready`, `function-patch-and-transform-02`,
//! `function-auto-ready-02`, ..., the first `n` of them for a size of `n`.
//! The Composition pipelines the first two (patch-and-transform composes a
//! ConfigMap, auto-ready marks it ready), so XRs are measured at sizes of two
//! Functions or more.
//!
//! Each runtime in turn, on the same node (`BENCH_RUNTIMES`, by default
//! `Deployment,External`):
//! - **Deployment**: Crossplane with `--package-runtime=Function=Deployment`:
//!   a Deployment, a Service and a pod per Function, pulled by containerd
//!   from the registry;
//! - **External**: Crossplane with `--package-runtime=Function=External` and
//!   fnrun as `deploy/crossplane/` has it (applied as a user applies it: the
//!   default Deployment, unprivileged, with its seccomp profile installed;
//!   the image set to the one `scripts/build-image` makes, a release build,
//!   imported into containerd, and `--insecure-registry` for the plain-HTTP
//!   test registry), two replicas.
//!
//! For each size of `BENCH_SIZES` (by default `1,10,30`), growing:
//! 1. **install**: the Functions the size adds applied; the very first one
//!    alone (its `kubectl apply` to the Function Healthy), the rest at once
//!    (to all Healthy). Healthy holds Crossplane fetching the package, making
//!    the revision, the runtime starting it (a Deployment rolled out; fnrun's
//!    pull and trial start) and Crossplane seeing it healthy.
//! 2. **idle**: no XR exists; the runtime's pods (the Functions' pods, or
//!    fnrun's two) and their containerd shims sampled
//!    ([`PodSample::take`]), `BENCH_IDLE_SECONDS` (600) of nothing, sampled
//!    again: memory at the end (cgroups: usage, working set, RSS, cache;
//!    RSS and PSS of the pods' processes and of the shims), CPU over the
//!    window (the pods' `cpuacct.usage` and the shims' CPU time; beside them,
//!    Crossplane's pod, the node's agents — kubelet, containerd, kube-proxy —
//!    and the whole machine's busy share, which says under what load it ran).
//! 3. **compose** (2 Functions or more): `BENCH_COMPOSE_XRS` (5) XRs created
//!    one at a time, each from `kubectl apply` to Ready, composed as the
//!    Composition says.
//! 4. **upgrade**: function-patch-and-transform's `spec.package` set to a new
//!    version (the same binary in a package of another digest), to the
//!    Function Healthy on a revision of the new package with its runtime
//!    healthy; then a new XR to Ready through it.
//! 5. **throughput**: `BENCH_THROUGHPUT_XRS` (100) XRs created at once (one
//!    `kubectl apply`) to all Ready: XRs per second; then deleted.
//!
//! Every timed wait reads the objects with `kubectl` every [`POLL`]. The
//! result goes to `$BENCH_OUT` (JSON; written after each size too, with
//! `"partial": true`, so that a run that fails keeps what it measured) and
//! a markdown table to `$BENCH_TABLE` and stdout ([`table`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fnrun_tests::crossplane::pod::{Crossplane, Runtime};
use fnrun_tests::crossplane::xr::{COMPOSITION, XRD, condition};
use fnrun_tests::crossplane::{AUTO_READY, NAMESPACE, PATCH_AND_TRANSFORM};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::node::{NODE_IP, Node, Options};
use fnrun_tests::pod_metrics::{Pod, PodSample, process_cpu_ns};
use fnrun_tests::registry::Registry;
use fnrun_tests::user::require_root;
use serde_json::{Value, json};

/// How often a timed wait reads the objects it waits on.
const POLL: Duration = Duration::from_millis(250);
/// The XRs' namespace.
const XR_NAMESPACE: &str = "demo";
/// fnrun's image in containerd (a release build).
const FNRUN_IMAGE: &str = "fnrun.test/fnrun:bench";
/// fnrun's pods.
const FNRUN_PODS: &str = "app.kubernetes.io/name=fnrun,app.kubernetes.io/component=functions";
/// The pods of Crossplane's Deployment runtime (one per Function).
const FUNCTION_PODS: &str = "pkg.crossplane.io/function";
/// Crossplane's own pod.
const CROSSPLANE_POD: &str = "app=crossplane";

/// What a run measures (from the environment).
#[derive(Debug, Clone, PartialEq)]
struct Knobs {
    runtimes: Vec<Runtime>,
    sizes: Vec<usize>,
    idle: Duration,
    compose_xrs: usize,
    throughput_xrs: usize,
}

impl Knobs {
    /// From `get` (the environment): see the module's documentation.
    fn from(get: impl Fn(&str) -> Option<String>) -> Result<Knobs, String> {
        let count = |name: &str, default: usize, most: usize| -> Result<usize, String> {
            let Some(v) = get(name) else {
                return Ok(default);
            };
            let n: usize = v
                .trim()
                .parse()
                .map_err(|_| format!("{name}={v}: not a count"))?;
            if !(1..=most).contains(&n) {
                return Err(format!("{name}={v}: must be 1 to {most}"));
            }
            Ok(n)
        };
        let sizes = match get("BENCH_SIZES") {
            None => vec![1, 10, 30],
            Some(v) => {
                let mut sizes = Vec::new();
                for s in v.split(',') {
                    let n: usize = s
                        .trim()
                        .parse()
                        .map_err(|_| format!("BENCH_SIZES={v}: {s:?} is not a count"))?;
                    if !(1..=60).contains(&n) {
                        return Err(format!("BENCH_SIZES={v}: each size must be 1 to 60"));
                    }
                    if sizes.last().is_some_and(|last| *last >= n) {
                        return Err(format!("BENCH_SIZES={v}: sizes must grow"));
                    }
                    sizes.push(n);
                }
                sizes
            }
        };
        let runtimes = match get("BENCH_RUNTIMES") {
            None => vec![Runtime::Deployment, Runtime::External],
            Some(v) => v
                .split(',')
                .map(|r| match r.trim() {
                    "Deployment" => Ok(Runtime::Deployment),
                    "External" => Ok(Runtime::External),
                    other => Err(format!(
                        "BENCH_RUNTIMES={v}: {other:?} is neither Deployment nor External"
                    )),
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Knobs {
            runtimes,
            sizes,
            idle: Duration::from_secs(count("BENCH_IDLE_SECONDS", 600, 3600)? as u64),
            compose_xrs: count("BENCH_COMPOSE_XRS", 5, 50)?,
            throughput_xrs: count("BENCH_THROUGHPUT_XRS", 100, 500)?,
        })
    }
}

/// The runtime's name in the results.
fn runtime_name(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Deployment => "Deployment",
        Runtime::External => "External (fnrun)",
    }
}

/// The Functions of the benchmark, in the order they are installed: the
/// pipeline's two, then both packages again under numbered names.
fn function_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let package = if i % 2 == 0 {
                PATCH_AND_TRANSFORM.name
            } else {
                AUTO_READY.name
            };
            match i / 2 {
                0 => package.to_owned(),
                copy => format!("{package}-{:02}", copy + 1),
            }
        })
        .collect()
}

/// The Composition: [`COMPOSITION`] (patch-and-transform composing a
/// ConfigMap) without its readiness check, then function-auto-ready, which
/// marks the ConfigMap ready once it exists.
fn composition() -> Value {
    let mut composition: Value = serde_norway::from_str(COMPOSITION).unwrap();
    let pipeline = composition["spec"]["pipeline"].as_array_mut().unwrap();
    pipeline[0]["input"]["resources"][0]
        .as_object_mut()
        .unwrap()
        .remove("readinessChecks");
    pipeline.push(json!({
        "step": "auto-ready",
        "functionRef": { "name": AUTO_READY.name },
    }));
    composition
}

fn xr(name: &str, color: &str) -> Value {
    json!({
        "apiVersion": "example.fnrun.dev/v1",
        "kind": "XApp",
        "metadata": { "name": name, "namespace": XR_NAMESPACE },
        "spec": { "color": color },
    })
}

fn function(name: &str, package: &str) -> Value {
    json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "Function",
        "metadata": { "name": name },
        "spec": { "package": package },
    })
}

fn list(items: Vec<Value>) -> String {
    json!({ "apiVersion": "v1", "kind": "List", "items": items }).to_string()
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The machine's CPU time, busy and all (clock ticks), from `/proc/stat`.
fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// Median, least and most of `values`.
fn stats(values: &[f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    json!({
        "median": (median * 10.0).round() / 10.0,
        "min": sorted[0],
        "max": sorted[n - 1],
    })
}

/// Calls `check` every [`POLL`] until it gives a value: the value and the
/// time from `start`.
fn poll<T>(
    what: &str,
    start: Instant,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    log: &dyn Fn() -> String,
) -> (T, Duration) {
    loop {
        let round = Instant::now();
        if let Some(value) = check() {
            return (value, start.elapsed());
        }
        if start.elapsed() >= timeout {
            panic!("{what}: not within {timeout:?}\n{}", log());
        }
        std::thread::sleep(POLL.saturating_sub(round.elapsed()));
    }
}

/// The pods in Crossplane's namespace with `selector`, once every one of
/// them is Running with all its containers ready (`None` until then).
fn running_pods(node: &Node, selector: &str) -> Option<Vec<Pod>> {
    let list = node
        .cp()
        .get_json(&["pods", "-n", NAMESPACE, "-l", selector])
        .ok()?;
    let items = list["items"].as_array()?;
    let ready = items.iter().all(|p| {
        p["status"]["phase"] == "Running"
            && p["metadata"]["deletionTimestamp"].is_null()
            && p["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true))
    });
    ready.then(|| Pod::from_list(&list))
}

/// The node's agents (kubelet, containerd, kube-proxy): the processes whose
/// command line names the node's directory, not the shims.
fn node_agents(node: &Node) -> Vec<u32> {
    let dir = node.dir().display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline);
            let program = text.split('\0').next().unwrap_or_default();
            let name = Path::new(program)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            ["kubelet", "containerd", "kube-proxy"].contains(&name.as_str()) && text.contains(&dir)
        })
        .collect()
}

/// fnrun's image, as `scripts/build-image` makes it (a release build, as
/// a user gets it), written as an OCI archive into `dir`.
fn fnrun_release_archive(dir: &Path) -> PathBuf {
    let repo = fnrun_tests::workspace_root();
    let archive = dir.join("fnrun.tar");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"))
        .join("image");
    let out = fnrun_tests::process::run_capture(
        std::process::Command::new(repo.join("scripts/build-image"))
            .arg(FNRUN_IMAGE)
            .env("CARGO_TARGET_DIR", &target)
            .env("FNRUN_BUILDAH_ROOT", dir.join("root"))
            .env("FNRUN_BUILDAH_RUNROOT", dir.join("runroot"))
            .env("FNRUN_IMAGE_ARCHIVE", &archive)
            .env("BUILDAH_ISOLATION", "chroot")
            .env("CARGO_NET_OFFLINE", "true")
            .env("FNRUN_CARGO_PROFILE", "release")
            .env_remove("RUSTFLAGS"),
        None,
        Duration::from_secs(3600),
    );
    assert_eq!(out.code, Some(0), "scripts/build-image: {out:?}");
    archive
}

/// `deploy/crossplane/` applied as a user applies it (the default,
/// unprivileged Deployment; fnrun's seccomp profile installed where it
/// names it, kubelet's `seccomp/fnrun/fnrun.json`, as docs/deployment.md
/// says), fnrun's image and the test registry set; returns once both
/// replicas are rolled out.
fn install_fnrun(node: &Node, image: &str, registry: &str) {
    let deploy = fnrun_tests::workspace_root().join("deploy/crossplane");
    let profile = node.dir().join("kubelet/seccomp/fnrun/fnrun.json");
    std::fs::create_dir_all(profile.parent().unwrap()).unwrap();
    std::fs::copy(
        fnrun_tests::workspace_root().join("deploy/seccomp/fnrun.json"),
        &profile,
    )
    .unwrap();
    node.kubectl(&[
        "label",
        "namespace",
        NAMESPACE,
        "pod-security.kubernetes.io/enforce=privileged",
        "--overwrite",
    ])
    .unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&deploy)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in text.split("\n---") {
            let Ok(mut object) = serde_norway::from_str::<Value>(doc) else {
                continue;
            };
            if object.is_null() {
                continue;
            }
            if object["kind"] == "Deployment" && object["metadata"]["name"] == "fnrun-functions" {
                let container = &mut object["spec"]["template"]["spec"]["containers"][0];
                container["image"] = image.into();
                container["args"]
                    .as_array_mut()
                    .unwrap()
                    .push(format!("--insecure-registry={registry}").into());
            }
            node.cp()
                .apply(&serde_json::to_string(&object).unwrap())
                .unwrap();
        }
    }
    let out = node.kubectl(&[
        "rollout",
        "status",
        "deployment/fnrun-functions",
        "-n",
        NAMESPACE,
        "--timeout=300s",
    ]);
    assert!(
        out.is_ok(),
        "{out:?}\n{}\n{}",
        node.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "yaml"])
            .unwrap_or_default(),
        node.log_tails()
    );
}

/// The package images, built before the node starts: patch-and-transform
/// and auto-ready, and `upgrades` new versions of patch-and-transform (the
/// same binary, another digest).
struct Images {
    pt: BuiltImage,
    ar: BuiltImage,
    upgrades: Vec<(String, BuiltImage)>,
}

fn build_images(upgrades: usize) -> Images {
    let pt = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages");
    let ar = AUTO_READY
        .image()
        .expect("function-auto-ready builds and packages");
    Images {
        pt: pt.clone().tag("v1").build().unwrap(),
        ar: ar.tag("v1").build().unwrap(),
        upgrades: (0..upgrades)
            .map(|i| {
                let version = format!("v{}", i + 2);
                let image = pt
                    .clone()
                    .tag(&version)
                    .env("FNRUN_BENCH_RELEASE", &version)
                    .build()
                    .unwrap();
                (version, image)
            })
            .collect(),
    }
}

/// The packages pushed to the registry: every Function's `v1` (the same
/// two images under each name), and the upgrades of patch-and-transform.
struct Packages {
    v1: BTreeMap<String, String>,
    upgrades: Vec<String>,
}

fn push_packages(registry: &Registry, images: &Images, most: usize) -> Packages {
    let v1 = function_names(most)
        .into_iter()
        .map(|name| {
            let image = if name.starts_with(PATCH_AND_TRANSFORM.name) {
                &images.pt
            } else {
                &images.ar
            };
            let reference = image.push(registry, &format!("fns/{name}:v1")).unwrap();
            (name, reference)
        })
        .collect();
    let upgrades = images
        .upgrades
        .iter()
        .map(|(version, image)| {
            image
                .push(
                    registry,
                    &format!("fns/{}:{version}", PATCH_AND_TRANSFORM.name),
                )
                .unwrap()
        })
        .collect();
    Packages { v1, upgrades }
}

/// Whether every Function of `wanted` (name, package) is Healthy on an
/// active revision of its package whose runtime is healthy: two `kubectl
/// get`s however many Functions.
fn serving(node: &Node, wanted: &[(&str, &str)]) -> bool {
    let (Ok(functions), Ok(revisions)) = (
        node.cp().get_json(&["functions"]),
        node.cp().get_json(&["functionrevisions"]),
    ) else {
        return false;
    };
    let items = |list: &Value| list["items"].as_array().cloned().unwrap_or_default();
    let (functions, revisions) = (items(&functions), items(&revisions));
    wanted.iter().all(|(name, package)| {
        let Some(f) = functions.iter().find(|f| f["metadata"]["name"] == *name) else {
            return false;
        };
        if condition(f, "Healthy").as_deref() != Some("True")
            || f["status"]["currentIdentifier"] != *package
        {
            return false;
        }
        let current = &f["status"]["currentRevision"];
        revisions.iter().any(|r| {
            r["metadata"]["name"] == *current
                && r["spec"]["desiredState"] == "Active"
                && condition(r, "RuntimeHealthy").as_deref() == Some("True")
        })
    })
}

/// The XRs in [`XR_NAMESPACE`] that are Ready, of those named.
fn ready_xrs(node: &Node) -> Option<usize> {
    let list = node
        .cp()
        .get_json(&["xapps.example.fnrun.dev", "-n", XR_NAMESPACE])
        .ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .filter(|x| condition(x, "Ready").as_deref() == Some("True"))
            .count(),
    )
}

/// Creates the XR `name` and waits until it is Ready and its ConfigMap
/// holds `color-<color>`: the time from the apply.
fn compose_one(node: &Node, name: &str, color: &str, log: &dyn Fn() -> String) -> Duration {
    let start = Instant::now();
    node.cp().apply(&xr(name, color).to_string()).unwrap();
    let (_, ready) = poll(
        &format!("the XR {name} Ready"),
        start,
        Duration::from_secs(300),
        || {
            let x = node
                .cp()
                .get_json(&["xapps.example.fnrun.dev", name, "-n", XR_NAMESPACE])
                .ok()?;
            (condition(&x, "Ready").as_deref() == Some("True")).then_some(())
        },
        log,
    );
    let composed = node
        .cp()
        .get_json(&[
            "configmaps",
            "-n",
            XR_NAMESPACE,
            "-l",
            &format!("crossplane.io/composite={name}"),
        ])
        .unwrap();
    assert_eq!(
        composed["items"][0]["data"]["color"],
        format!("color-{color}"),
        "{composed}"
    );
    ready
}

/// Deletes every XR and waits until they are gone.
fn delete_xrs(node: &Node) {
    node.kubectl(&[
        "delete",
        "xapps.example.fnrun.dev",
        "--all",
        "-n",
        XR_NAMESPACE,
        "--timeout=300s",
    ])
    .unwrap();
}

/// The idle window: samples, `idle` of nothing, samples again.
fn idle_window(node: &Node, selector: &str, idle: Duration, log: &dyn Fn() -> String) -> Value {
    let (pods, _) = poll(
        "the runtime's pods running",
        Instant::now(),
        Duration::from_secs(300),
        || running_pods(node, selector).filter(|p| !p.is_empty()),
        log,
    );
    let (crossplane, _) = poll(
        "Crossplane's pod running",
        Instant::now(),
        Duration::from_secs(120),
        || running_pods(node, CROSSPLANE_POD).filter(|p| p.len() == 1),
        log,
    );
    let agents = node_agents(node);
    let agents_cpu = || agents.iter().map(|p| process_cpu_ns(*p)).sum::<u64>();
    let load_start = loadavg();
    let before = PodSample::take(&pods).unwrap();
    let crossplane_before = PodSample::take(&crossplane).unwrap();
    let agents_before = agents_cpu();
    let machine_before = machine_cpu();
    let start = Instant::now();
    std::thread::sleep(idle);
    let elapsed = start.elapsed();
    let after = PodSample::take(&pods).unwrap();
    let crossplane_after = PodSample::take(&crossplane).unwrap();
    let agents_after = agents_cpu();
    let machine_after = machine_cpu();
    let (pods_cpu, shims_cpu) = after.cpu_since(&before).unwrap();
    let (crossplane_cpu, _) = crossplane_after.cpu_since(&crossplane_before).unwrap();
    let busy = machine_after.0.saturating_sub(machine_before.0) as f64;
    let all = machine_after.1.saturating_sub(machine_before.1).max(1) as f64;
    let minutes = elapsed.as_secs_f64() / 60.0;
    let per_minute = |ns: u64| ((ns as f64 / 1e6 / minutes) * 10.0).round() / 10.0;
    json!({
        "seconds": elapsed.as_secs(),
        "pods": after.pods.len(),
        "at_end": after,
        "at_start": before,
        "cpu_ms_per_minute": {
            "pods": per_minute(pods_cpu),
            "shims": per_minute(shims_cpu),
            "crossplane": per_minute(crossplane_cpu),
            "node_agents": per_minute(agents_after.saturating_sub(agents_before)),
        },
        "machine_busy_percent": (busy / all * 1000.0).round() / 10.0,
        "loadavg": [load_start, loadavg()],
    })
}

/// One runtime through every size.
fn run_runtime(
    node: &Node,
    runtime: Runtime,
    knobs: &Knobs,
    packages: &Packages,
    fnrun_image: &str,
    registry: &Registry,
    progress: &mut dyn FnMut(Value),
) -> Value {
    let label = runtime_name(runtime);
    eprintln!("\n== {label} ({})", loadavg());
    let crossplane = Crossplane::install(node, runtime, &[]).expect("Crossplane installs");
    let log = || {
        format!(
            "{}\n{}\n{}",
            node.kubectl(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_default(),
            crossplane.logs(node),
            node.log_tails()
        )
    };
    let selector = match runtime {
        Runtime::Deployment => FUNCTION_PODS,
        Runtime::External => {
            install_fnrun(node, fnrun_image, registry.addr());
            FNRUN_PODS
        }
    };
    node.cp().apply(XRD).unwrap();
    poll(
        "the XRD established",
        Instant::now(),
        Duration::from_secs(120),
        || {
            let xrd = node
                .cp()
                .get_json(&["xrd", "xapps.example.fnrun.dev"])
                .ok()?;
            (condition(&xrd, "Established").as_deref() == Some("True")).then_some(())
        },
        &log,
    );
    node.cp()
        .apply(&serde_json::to_string(&composition()).unwrap())
        .unwrap();
    node.cp()
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {XR_NAMESPACE}\n"
        ))
        .unwrap();

    let names = function_names(*knobs.sizes.last().unwrap());
    let mut installed = 0;
    let mut upgrades = packages.upgrades.iter();
    let mut sizes = Vec::new();
    for &size in &knobs.sizes {
        eprintln!("-- {label}: {size} Functions ({})", loadavg());
        let mut result = json!({ "functions": size });
        // 1. Install.
        let mut to_install: Vec<&String> = names[installed..size].iter().collect();
        if installed == 0 {
            let first = to_install.remove(0);
            let start = Instant::now();
            node.cp()
                .apply(&function(first, &packages.v1[first]).to_string())
                .unwrap();
            let (_, healthy) = poll(
                &format!("the Function {first} Healthy"),
                start,
                Duration::from_secs(600),
                || serving(node, &[(first, &packages.v1[first])]).then_some(()),
                &log,
            );
            eprintln!("install {first}: Healthy after {healthy:?}");
            result["install"]["first_healthy_ms"] = ms(healthy).into();
        }
        if !to_install.is_empty() {
            let wanted: Vec<(&str, &str)> = to_install
                .iter()
                .map(|n| (n.as_str(), packages.v1[*n].as_str()))
                .collect();
            let start = Instant::now();
            node.cp()
                .apply(&list(
                    to_install
                        .iter()
                        .map(|n| function(n, &packages.v1[*n]))
                        .collect(),
                ))
                .unwrap();
            let (_, healthy) = poll(
                &format!("{} Functions Healthy", to_install.len()),
                start,
                Duration::from_secs(1200),
                || serving(node, &wanted).then_some(()),
                &log,
            );
            eprintln!(
                "install {} more: all Healthy after {healthy:?}",
                to_install.len()
            );
            result["install"]["batch"] = json!({
                "functions": to_install.len(),
                "all_healthy_ms": ms(healthy),
            });
        }
        installed = size;

        // 2. Idle.
        eprintln!("idle for {:?} ({})", knobs.idle, loadavg());
        result["idle"] = idle_window(node, selector, knobs.idle, &log);
        eprintln!("idle: {}", result["idle"]["cpu_ms_per_minute"]);

        if size >= 2 {
            // 3. Compose, one at a time.
            let mut ready = Vec::new();
            for i in 0..knobs.compose_xrs {
                let name = format!("xr-{size}-{i}");
                let took = compose_one(node, &name, &format!("c{i}"), &log);
                eprintln!("compose {name}: Ready after {took:?}");
                ready.push(ms(took));
            }
            // The first after the idle window: fnrun's instances have
            // stopped by then (the Deployment's idle timeout), so it holds
            // the functions' cold starts.
            result["compose"] = json!({
                "xrs": knobs.compose_xrs,
                "first_ready_ms": ready[0],
                "ready_ms": stats(&ready),
            });

            // 4. Upgrade patch-and-transform.
            if let Some(package) = upgrades.next() {
                let pt = PATCH_AND_TRANSFORM.name;
                let start = Instant::now();
                node.cp().apply(&function(pt, package).to_string()).unwrap();
                let (_, serving_after) = poll(
                    &format!("{pt} serving {package}"),
                    start,
                    Duration::from_secs(600),
                    || serving(node, &[(pt, package)]).then_some(()),
                    &log,
                );
                let first_xr = compose_one(node, &format!("xr-{size}-upgraded"), "up", &log);
                eprintln!("upgrade: serving after {serving_after:?}; an XR Ready in {first_xr:?}");
                result["upgrade"] = json!({
                    "to": package,
                    "serving_ms": ms(serving_after),
                    "then_xr_ready_ms": ms(first_xr),
                });
            }
            delete_xrs(node);

            // 5. Throughput.
            let n = knobs.throughput_xrs;
            let start = Instant::now();
            node.cp()
                .apply(&list(
                    (0..n)
                        .map(|i| xr(&format!("load-{size}-{i:03}"), &format!("l{i}")))
                        .collect(),
                ))
                .unwrap();
            let (_, all_ready) = poll(
                &format!("{n} XRs Ready"),
                start,
                Duration::from_secs(1200),
                || (ready_xrs(node)? >= n).then_some(()),
                &log,
            );
            let per_s = n as f64 / all_ready.as_secs_f64();
            eprintln!("throughput: {n} XRs Ready in {all_ready:?} ({per_s:.2}/s)");
            result["throughput"] = json!({
                "xrs": n,
                "all_ready_ms": ms(all_ready),
                "xrs_per_second": (per_s * 100.0).round() / 100.0,
            });
            delete_xrs(node);
        }
        sizes.push(result);
        progress(json!({ "runtime": label, "sizes": sizes }));
    }

    // Leave the node as this runtime found it: no Function, no XR; fnrun
    // and its objects deleted.
    let _ = node.kubectl(&["delete", "functions", "--all", "--timeout=300s"]);
    if runtime == Runtime::External {
        let deploy = fnrun_tests::workspace_root().join("deploy/crossplane");
        let _ = node.kubectl(&[
            "delete",
            "-f",
            &deploy.display().to_string(),
            "--timeout=120s",
        ]);
    }
    poll(
        "the runtime's pods gone",
        Instant::now(),
        Duration::from_secs(300),
        || {
            let list = node
                .cp()
                .get_json(&["pods", "-n", NAMESPACE, "-l", selector])
                .ok()?;
            list["items"].as_array()?.is_empty().then_some(())
        },
        &log,
    );
    json!({ "runtime": label, "sizes": sizes })
}

#[test]
#[ignore = "a benchmark: bench/runtimes.sh runs it, as root"]
fn deployment_runtime_against_fnrun_on_a_node() {
    if !require_root("deployment_runtime_against_fnrun_on_a_node") {
        return;
    }
    let knobs = Knobs::from(|name| std::env::var(name).ok()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{knobs:?}");
    let started = Instant::now();
    let most = *knobs.sizes.last().unwrap();
    let upgrades = knobs.sizes.iter().filter(|s| **s >= 2).count();

    // Everything built before the node takes the machine's node lock.
    let build = tempfile::tempdir().unwrap();
    let archive = knobs
        .runtimes
        .contains(&Runtime::External)
        .then(|| fnrun_release_archive(build.path()));
    let images = build_images(upgrades);
    let mut node =
        Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
    let fnrun_image = match &archive {
        Some(archive) => {
            let (name, tag) = FNRUN_IMAGE.rsplit_once(':').unwrap();
            node.import_archive(archive, name, tag).unwrap()
        }
        None => String::new(),
    };
    let registry = Registry::start_on(NODE_IP).expect("the registry starts");
    node.trust_registry(registry.addr()).unwrap();
    let packages = push_packages(&registry, &images, most);
    eprintln!("packages pushed after {:?}", started.elapsed());

    let result = |runtimes: &[Value], partial: bool| {
        json!({
            "knobs": {
                "sizes": knobs.sizes,
                "idle_seconds": knobs.idle.as_secs(),
                "compose_xrs": knobs.compose_xrs,
                "throughput_xrs": knobs.throughput_xrs,
            },
            "functions": {
                PATCH_AND_TRANSFORM.name: PATCH_AND_TRANSFORM.version,
                AUTO_READY.name: AUTO_READY.version,
            },
            "fnrun_image": "scripts/build-image, release profile",
            "poll_ms": ms(POLL),
            "runtimes": runtimes,
            "partial": partial,
            "total_s": started.elapsed().as_secs(),
        })
    };
    // What is measured so far, written after each size: a run that fails
    // later keeps it.
    let write = |result: &Value| {
        if let Some(path) = std::env::var_os("BENCH_OUT") {
            std::fs::write(&path, serde_json::to_string_pretty(result).unwrap() + "\n").unwrap();
        }
    };
    let mut runtimes: Vec<Value> = Vec::new();
    for &runtime in &knobs.runtimes {
        let done = runtimes.clone();
        let mut progress = |so_far: Value| {
            let mut all = done.clone();
            all.push(so_far);
            write(&result(&all, true));
        };
        runtimes.push(run_runtime(
            &node,
            runtime,
            &knobs,
            &packages,
            &fnrun_image,
            &registry,
            &mut progress,
        ));
    }
    // What the stop reports as gone was there before this node started
    // (another node's leftovers, which this one's stop cleaned up): only
    // what is left is this node's failure.
    let problems = node.stop();
    let (gone, left): (Vec<String>, Vec<String>) =
        problems.into_iter().partition(|p| p.contains(" gone: "));
    if !gone.is_empty() {
        eprintln!("there before the node and gone after it: {gone:#?}");
    }

    let result = result(&runtimes, false);
    write(&result);
    assert!(left.is_empty(), "left behind: {left:#?}");
    let table = table(&result);
    if let Some(path) = std::env::var_os("BENCH_TABLE") {
        std::fs::write(&path, &table).unwrap();
    }
    println!("{table}");
}

/// MiB, one decimal, of `bytes`.
fn mib(bytes: &Value) -> String {
    bytes
        .as_f64()
        .map_or("–".into(), |b| format!("{:.1}", b / 1048576.0))
}

/// MiB, one decimal, of `kib`.
fn mib_of_kib(kib: &Value) -> String {
    kib.as_f64()
        .map_or("–".into(), |k| format!("{:.1}", k / 1024.0))
}

/// Seconds, one decimal (two under 10), of `ms`.
fn secs(ms: &Value) -> String {
    match ms.as_f64() {
        None => "–".into(),
        Some(ms) if ms < 10_000.0 => format!("{:.2}", ms / 1000.0),
        Some(ms) => format!("{:.1}", ms / 1000.0),
    }
}

/// The markdown table of a result: a row per size and runtime.
fn table(result: &Value) -> String {
    let idle_min = result["knobs"]["idle_seconds"].as_f64().unwrap_or(0.0) / 60.0;
    let mut out = format!(
        "| Functions | runtime | pods | pods' working set (MiB) | PSS: pods + shims (MiB) | \
         idle CPU, pods + shims (ms/min over {idle_min:.0} min) | install → Healthy (s) | \
         XR → Ready: first after idle; median (s) | upgrade → serving (s) | {} XRs → Ready (s; XR/s) |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        result["knobs"]["throughput_xrs"]
    );
    let runtimes = result["runtimes"].as_array().cloned().unwrap_or_default();
    let sizes: Vec<u64> = runtimes
        .iter()
        .flat_map(|r| r["sizes"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["functions"].as_u64())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for size in sizes {
        for runtime in &runtimes {
            let Some(s) = runtime["sizes"]
                .as_array()
                .and_then(|ss| ss.iter().find(|s| s["functions"] == size))
            else {
                continue;
            };
            let idle = &s["idle"];
            let end = &idle["at_end"];
            let pss = end["processes"]["pss_kib"]
                .as_u64()
                .zip(end["shims"]["pss_kib"].as_u64())
                .map(|(a, b)| Value::from(a + b))
                .unwrap_or(Value::Null);
            let cpu = &idle["cpu_ms_per_minute"];
            let cpu = cpu["pods"]
                .as_f64()
                .zip(cpu["shims"].as_f64())
                .map_or("–".into(), |(a, b)| format!("{:.0}", a + b));
            let install = match (
                s["install"]["first_healthy_ms"].as_f64(),
                s["install"]["batch"]["all_healthy_ms"].as_f64(),
            ) {
                (Some(first), None) => format!("{} (1)", secs(&first.into())),
                (None, Some(batch)) => format!(
                    "{} ({} at once)",
                    secs(&batch.into()),
                    s["install"]["batch"]["functions"]
                ),
                (Some(first), Some(batch)) => format!(
                    "{} (1); {} ({} more at once)",
                    secs(&first.into()),
                    secs(&batch.into()),
                    s["install"]["batch"]["functions"]
                ),
                (None, None) => "–".into(),
            };
            let throughput = match s["throughput"]["all_ready_ms"].as_f64() {
                Some(ms) => format!(
                    "{}; {}",
                    secs(&ms.into()),
                    s["throughput"]["xrs_per_second"]
                ),
                None => "–".into(),
            };
            out.push_str(&format!(
                "| {size} | {} | {} | {} | {} | {cpu} | {install} | {} | {} | {throughput} |\n",
                runtime["runtime"].as_str().unwrap_or("?"),
                idle["pods"],
                mib(&end["cgroup_memory"]["working_set"]),
                mib_of_kib(&pss),
                match s["compose"]["first_ready_ms"].as_f64() {
                    Some(first) => format!(
                        "{}; {}",
                        secs(&first.into()),
                        secs(&s["compose"]["ready_ms"]["median"])
                    ),
                    None => "–".into(),
                },
                secs(&s["upgrade"]["serving_ms"]),
            ));
        }
    }
    out
}

#[test]
fn knobs_default_to_the_issues_comparison_and_refuse_nonsense() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let knobs = Knobs::from(env(&[])).unwrap();
    assert_eq!(
        knobs,
        Knobs {
            runtimes: vec![Runtime::Deployment, Runtime::External],
            sizes: vec![1, 10, 30],
            idle: Duration::from_secs(600),
            compose_xrs: 5,
            throughput_xrs: 100,
        }
    );
    let quick = Knobs::from(env(&[
        ("BENCH_SIZES", "1, 10"),
        ("BENCH_IDLE_SECONDS", "60"),
        ("BENCH_RUNTIMES", "External"),
    ]))
    .unwrap();
    assert_eq!(quick.sizes, [1, 10]);
    assert_eq!(quick.idle, Duration::from_secs(60));
    assert_eq!(quick.runtimes, [Runtime::External]);
    for (bad, says) in [
        (&[("BENCH_SIZES", "10,1")][..], "sizes must grow"),
        (&[("BENCH_SIZES", "1,x")][..], "\"x\" is not a count"),
        (&[("BENCH_SIZES", "0")][..], "each size must be 1 to 60"),
        (&[("BENCH_IDLE_SECONDS", "0")][..], "must be 1 to 3600"),
        (
            &[("BENCH_RUNTIMES", "Docker")][..],
            "neither Deployment nor External",
        ),
    ] {
        let err = Knobs::from(env(bad)).unwrap_err();
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

#[test]
fn functions_alternate_the_two_packages_and_the_composition_pipelines_both() {
    assert_eq!(
        function_names(5),
        [
            "function-patch-and-transform",
            "function-auto-ready",
            "function-patch-and-transform-02",
            "function-auto-ready-02",
            "function-patch-and-transform-03",
        ]
    );
    let composition = composition();
    let steps = composition["spec"]["pipeline"].as_array().unwrap();
    let refs: Vec<&str> = steps
        .iter()
        .map(|s| s["functionRef"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(refs, [PATCH_AND_TRANSFORM.name, AUTO_READY.name]);
    // Readiness is auto-ready's to decide.
    assert!(steps[0]["input"]["resources"][0]["readinessChecks"].is_null());
    assert_eq!(
        steps[0]["input"]["resources"][0]["base"]["kind"],
        "ConfigMap"
    );
}

#[test]
fn the_table_has_a_row_per_size_and_runtime() {
    let size = |n: u64, ws: u64, pss: (u64, u64), xr: Option<f64>| {
        let mut s = json!({
            "functions": n,
            "install": { "first_healthy_ms": 2500.0 },
            "idle": {
                "pods": n,
                "at_end": {
                    "cgroup_memory": { "working_set": ws },
                    "processes": { "pss_kib": pss.0 },
                    "shims": { "pss_kib": pss.1 },
                },
                "cpu_ms_per_minute": { "pods": 100.4, "shims": 20.0 },
            },
        });
        if let Some(xr) = xr {
            s["install"] = json!({ "batch": { "functions": 8, "all_healthy_ms": 30500.0 } });
            s["compose"] = json!({ "first_ready_ms": 4000.0, "ready_ms": { "median": xr } });
            s["upgrade"] = json!({ "serving_ms": 12000.0 });
            s["throughput"] = json!({ "all_ready_ms": 50000.0, "xrs_per_second": 2.0 });
        }
        s
    };
    let result = json!({
        "knobs": { "idle_seconds": 600, "throughput_xrs": 100 },
        "runtimes": [
            { "runtime": "Deployment", "sizes": [
                size(1, 10 * 1048576, (5120, 1024), None),
                size(10, 100 * 1048576, (51200, 10240), Some(1500.0)),
            ]},
            { "runtime": "External (fnrun)", "sizes": [
                size(1, 30 * 1048576, (20480, 2048), None),
            ]},
        ],
    });
    let table = table(&result);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 5, "{table}");
    assert!(
        rows[0].contains("over 10 min") && rows[0].contains("100 XRs"),
        "{table}"
    );
    assert_eq!(
        rows[2],
        "| 1 | Deployment | 1 | 10.0 | 6.0 | 120 | 2.50 (1) | – | – | – |"
    );
    assert_eq!(
        rows[3],
        "| 1 | External (fnrun) | 1 | 30.0 | 22.0 | 120 | 2.50 (1) | – | – | – |"
    );
    assert_eq!(
        rows[4],
        "| 10 | Deployment | 10 | 100.0 | 60.0 | 120 | 30.5 (8 at once) | 4.00; 1.50 | 12.0 | 50.0; 2.0 |"
    );
}
