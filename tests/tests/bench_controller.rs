//! The benchmarks of Kubernetes mode (issue 22), `#[ignore]`d: the test
//! suite does not run them, `bench/controller.sh` does (as root) and
//! docs/benchmarks.md records what they gave. One Kubernetes control plane
//! (`fnrun_tests::kube::ControlPlane`), the real Crossplane core out of
//! cluster with the External function runtime, fnrun as
//! `deploy/crossplane/deployment.yaml` runs it with its ServiceAccount's token
//! ([`start_fnrun`]), and a registry, all on loopback, as
//! `crossplane_controller.rs` runs them; every Function a package of the
//! released function-patch-and-transform.
//!
//! 1. **install**: from `kubectl apply` of a Function to the Function
//!    `Healthy`, for `BENCH_INSTALLS` (8) Functions applied one at a time,
//!    each a distinct image (an `ENV BENCH=i` of its own, so a distinct
//!    package: Crossplane fetches each and fnrun pulls each). That holds
//!    Crossplane fetching the package and creating and activating its
//!    revision, fnrun's pull from the registry, the function's start and
//!    first answer (fnrun's trial start, whose own time is read from its log),
//!    fnrun writing `RuntimeHealthy`, and Crossplane turning the Function
//!    Healthy. The Function is read every 100 ms with `kubectl`.
//! 2. **compose**: from an XR's creation (`kubectl apply`) to the XR `Ready`,
//!    for `BENCH_XRS` (10) XRs created one at a time, composed by
//!    function-patch-and-transform through fnrun (its instance warm, started
//!    by its trial: the Deployment's idle timeout is 5 minutes).
//! 3. **idle memory**: `BENCH_IDLE_FUNCTIONS` (50) Functions installed, none
//!    called, fnrun restarted with `--functions-idle-timeout=2s` so that the
//!    instances its trial starts make stop once idle. Once every Function is
//!    Healthy, every one trial-started and no function process is left
//!    (`fnrun_function_instances 0` and nothing but fnrun and its spawner in
//!    its process tree): RSS and PSS (`/proc/PID/smaps_rollup`) summed over
//!    fnrun's process tree, as `bench/crossplane.py` sums them; against as
//!    many copies of the same function binary run directly on the host
//!    (`--insecure --address 127.0.0.1:PORT`), each listening, none called.
//!
//! The result goes to the JSON file `$BENCH_OUT` (if set) and a table to
//! stdout.

use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fnrun_tests::crossplane::controller::{service_account_kubeconfig, start_fnrun};
use fnrun_tests::crossplane::xr::{COMPOSITION, XRD, assert_composed, condition, sh};
use fnrun_tests::crossplane::{Core, NAMESPACE, PATCH_AND_TRANSFORM, loopback_ip};
use fnrun_tests::daemon::Daemon;
use fnrun_tests::kube::ControlPlane;
use fnrun_tests::process::{die_with_parent, spawners_of, terminate};
use fnrun_tests::registry::{Registry, free_port, http_get};
use fnrun_tests::user::require_root;
use fnrun_tests::{fnrun_bin, workspace_root};
use serde_json::{Value, json};

/// How often a timed wait reads the object it waits on.
const POLL: Duration = Duration::from_millis(100);
/// fnrun's log line when a trial start's function answered.
const TRIAL: &str = "trial start: the function's server answered";
/// The XRs' namespace.
const XR_NAMESPACE: &str = "demo";

/// A `pkg.crossplane.io/v1` Function `name` of `package`, as JSON (which
/// `kubectl apply` takes as it takes YAML).
fn function(name: &str, package: &str) -> Value {
    json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "Function",
        "metadata": { "name": name },
        "spec": { "package": package },
    })
}

/// Whether the Function `function` (an object) is Healthy.
fn is_healthy(function: &Value) -> bool {
    condition(function, "Healthy").as_deref() == Some("True")
}

/// A count from the environment, `default` if unset, at most `most`.
fn knob(name: &str, default: usize, most: usize) -> usize {
    let n = std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a count"))
        })
        .unwrap_or(default);
    assert!((1..=most).contains(&n), "{name} must be 1 to {most}");
    n
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Calls `check` every [`POLL`] until it gives a value: the value, and the
/// time from `start` to the end of the call that gave it.
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

/// Median, least and most of `values` (ms).
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

/// RSS and PSS (KiB) summed over `pids`, from `/proc/PID/smaps_rollup`.
fn memory(pids: &[u32]) -> Value {
    let (mut rss, mut pss) = (0u64, 0u64);
    for pid in pids {
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        for line in rollup.lines() {
            let kib = |l: &str| -> u64 {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("Rss:") {
                rss += kib(line);
            } else if line.starts_with("Pss:") {
                pss += kib(line);
            }
        }
    }
    json!({ "processes": pids.len(), "rss_kib": rss, "pss_kib": pss })
}

/// The metrics address `start_fnrun` gave the daemon `pid`.
fn metrics_addr(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    cmdline
        .split(|b| *b == 0)
        .find_map(|a| {
            std::str::from_utf8(a)
                .ok()?
                .strip_prefix("--metrics-listen=")
                .map(str::to_owned)
        })
        .expect("fnrun runs with --metrics-listen=ADDR")
}

/// `fnrun_function_instances` at the daemon's metrics address.
fn instances(addr: &str) -> Option<f64> {
    let (status, body) = http_get(addr, "/metrics").ok()?;
    (status == 200).then_some(())?;
    body.lines()
        .find_map(|l| l.strip_prefix("fnrun_function_instances "))?
        .trim()
        .parse()
        .ok()
}

/// fnrun's JSON log lines with message `message`, their `fields`.
fn events(log: &str, message: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| e["fields"].clone())
        .filter(|f| f["message"] == message)
        .collect()
}

/// The `duration_ms` of `function`'s last answered trial start.
fn trial_ms(log: &str, function: &str) -> Option<f64> {
    let d = events(log, TRIAL)
        .into_iter()
        .rfind(|f| f["function"] == function)?["duration_ms"]
        .clone();
    d.as_f64().or_else(|| d.as_str()?.parse().ok())
}

/// Function processes run directly on the host; stopped on drop.
struct Direct(Vec<Child>);

impl Drop for Direct {
    fn drop(&mut self) {
        for child in &mut self.0 {
            terminate(child, Duration::from_secs(5));
        }
    }
}

#[test]
#[ignore = "a benchmark: bench/controller.sh runs it, as root"]
fn kubernetes_mode_benchmarks() {
    if !require_root("kubernetes_mode_benchmarks") {
        return;
    }
    let installs = knob("BENCH_INSTALLS", 8, 20);
    let xrs = knob("BENCH_XRS", 10, 50);
    let idle = knob("BENCH_IDLE_FUNCTIONS", 50, 100);
    assert!(
        installs <= idle,
        "BENCH_INSTALLS must not exceed BENCH_IDLE_FUNCTIONS"
    );
    let mut load = vec![json!({ "at": "start", "loadavg": loadavg() })];
    let started = Instant::now();
    let pt = PATCH_AND_TRANSFORM.name;
    let names: Vec<String> = (0..idle).map(|i| format!("bench-fn-{i:02}")).collect();

    // The packages: function-patch-and-transform, and one distinct image per
    // bench Function (the same binary layer, another config).
    let registry = Registry::start().expect("registry starts");
    let pt_package = PATCH_AND_TRANSFORM
        .image()
        .expect("function-patch-and-transform builds and packages")
        .push_to(
            &registry,
            &format!("crossplane-contrib/{pt}:{}", PATCH_AND_TRANSFORM.version),
        );
    let packages: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            PATCH_AND_TRANSFORM
                .image()
                .unwrap()
                .env("BENCH", &i.to_string())
                .push_to(&registry, &format!("fns/{name}:v1"))
        })
        .collect();
    eprintln!("{} packages pushed in {:?}", idle + 1, started.elapsed());

    let cp = ControlPlane::start().expect("etcd and kube-apiserver start");
    let ip = loopback_ip();
    let services: Vec<String> = names
        .iter()
        .map(String::as_str)
        .chain([pt])
        .map(|n| format!("{n}.{NAMESPACE}"))
        .collect();
    let hosts: Vec<(&str, Ipv4Addr)> = services.iter().map(|s| (s.as_str(), ip)).collect();
    let core = Core::start(&cp, &hosts, &[]).expect("crossplane starts");
    let root = workspace_root();
    sh(
        &cp,
        &root,
        "kubectl label namespace crossplane-system pod-security.kubernetes.io/enforce=privileged --overwrite",
    );
    sh(&cp, &root, "kubectl apply -f deploy/crossplane/");
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&cp, work.path());
    let logs = |fnrun: &Daemon| {
        format!(
            "--- crossplane ---\n{}\n{}\n--- fnrun ---\n{}",
            core.log_tail(60),
            cp.log_tails(),
            fnrun.log()
        )
    };
    let mut fnrun = start_fnrun(&cp, &kubeconfig, ip, "fnrun-bench", &[]);

    // 1. kubectl apply of a Function to the Function Healthy, one at a time.
    load.push(json!({ "at": "install", "loadavg": loadavg() }));
    let mut install = Vec::new();
    for (name, package) in names.iter().zip(&packages).take(installs) {
        let start = Instant::now();
        cp.apply(&function(name, package).to_string()).unwrap();
        let applied = start.elapsed();
        let mut installed = None;
        let (_, healthy_after) = poll(
            &format!("the Function {name} Healthy"),
            start,
            Duration::from_secs(300),
            || {
                let f = cp.get_json(&["function", name]).ok()?;
                if installed.is_none() && condition(&f, "Installed").as_deref() == Some("True") {
                    installed = Some(start.elapsed());
                }
                is_healthy(&f).then_some(())
            },
            &|| logs(&fnrun),
        );
        let trial = trial_ms(&fnrun.log(), name);
        eprintln!(
            "install {name}: applied {applied:?}, Installed {installed:?}, Healthy {healthy_after:?}, fnrun's trial {trial:?} ms"
        );
        install.push(json!({
            "function": name,
            "apply_returned_ms": ms(applied),
            "installed_ms": installed.map(ms),
            "healthy_ms": ms(healthy_after),
            "fnrun_trial_start_ms": trial,
        }));
    }
    let column = |rows: &[Value], key: &str| -> Vec<f64> {
        rows.iter().filter_map(|r| r[key].as_f64()).collect()
    };

    // 2. An XR's creation to Ready, one at a time, through the Healthy
    // function-patch-and-transform.
    cp.apply(&function(pt, &pt_package).to_string()).unwrap();
    poll(
        "function-patch-and-transform Healthy",
        Instant::now(),
        Duration::from_secs(300),
        || is_healthy(&cp.get_json(&["function", pt]).ok()?).then_some(()),
        &|| logs(&fnrun),
    );
    cp.apply(XRD).unwrap();
    poll(
        "the XRD established",
        Instant::now(),
        Duration::from_secs(120),
        || {
            let xrd = cp.get_json(&["xrd", "xapps.example.fnrun.dev"]).ok()?;
            (condition(&xrd, "Established").as_deref() == Some("True")).then_some(())
        },
        &|| logs(&fnrun),
    );
    cp.apply(COMPOSITION).unwrap();
    cp.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {XR_NAMESPACE}\n"
    ))
    .unwrap();
    load.push(json!({ "at": "compose", "loadavg": loadavg() }));
    let mut compose = Vec::new();
    for i in 0..xrs {
        let name = format!("bench-xr-{i:02}");
        let start = Instant::now();
        cp.apply(&format!(
            "apiVersion: example.fnrun.dev/v1\nkind: XApp\nmetadata:\n  name: {name}\n  namespace: {XR_NAMESPACE}\nspec:\n  color: c{i}\n"
        ))
        .unwrap();
        let applied = start.elapsed();
        let (_, ready) = poll(
            &format!("the XR {name} Ready"),
            start,
            Duration::from_secs(180),
            || {
                let xr = cp
                    .get_json(&["xapps.example.fnrun.dev", &name, "-n", XR_NAMESPACE])
                    .ok()?;
                (condition(&xr, "Ready").as_deref() == Some("True")).then_some(())
            },
            &|| logs(&fnrun),
        );
        // Composed as the Composition says, by the function.
        assert_composed(&cp, &name, &format!("color-c{i}"), &|| logs(&fnrun));
        eprintln!("compose {name}: applied {applied:?}, Ready {ready:?}");
        compose.push(json!({
            "xr": name,
            "apply_returned_ms": ms(applied),
            "ready_ms": ms(ready),
        }));
    }

    // 3. Every bench Function installed, none called; fnrun restarted with a
    // 2 s idle timeout. function-patch-and-transform and the XRs go first.
    let _ = cp.kubectl(&[
        "delete",
        "xapps.example.fnrun.dev",
        "--all",
        "-n",
        XR_NAMESPACE,
        "--timeout=60s",
    ]);
    cp.kubectl(&["delete", "function", pt, "--wait=false"])
        .unwrap();
    assert!(fnrun.stop().is_some_and(|s| s.success()), "{}", fnrun.log());
    let rest: Vec<Value> = names
        .iter()
        .zip(&packages)
        .skip(installs)
        .map(|(name, package)| function(name, package))
        .collect();
    if !rest.is_empty() {
        cp.apply(&json!({ "apiVersion": "v1", "kind": "List", "items": rest }).to_string())
            .unwrap();
    }
    load.push(json!({ "at": "idle_memory", "loadavg": loadavg() }));
    let start = Instant::now();
    let mut fnrun = start_fnrun(
        &cp,
        &kubeconfig,
        ip,
        "fnrun-bench",
        &["--functions-idle-timeout=2s"],
    );
    let pid = fnrun.pid().unwrap();
    let metrics = metrics_addr(pid);
    let (_, all_healthy) = poll(
        &format!("all {idle} Functions Healthy and trial-started"),
        start,
        Duration::from_secs(600),
        || {
            let list = cp.get_json(&["functions"]).ok()?;
            let items = list["items"].as_array()?;
            let ready = names.iter().all(|name| {
                items
                    .iter()
                    .any(|f| f["metadata"]["name"] == name.as_str() && is_healthy(f))
            });
            let log = fnrun.log();
            let trials = events(&log, TRIAL);
            let tried = names
                .iter()
                .all(|name| trials.iter().any(|f| f["function"] == name.as_str()));
            (ready && tried).then_some(())
        },
        &|| logs(&fnrun),
    );
    let served: std::collections::BTreeSet<String> = events(&fnrun.log(), TRIAL)
        .iter()
        .filter_map(|f| f["function"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        served,
        names
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<String>>(),
        "fnrun trial-started the bench Functions and no other"
    );
    let function_processes = |pid: u32| {
        let spawners = spawners_of(pid);
        fnrun_tests::process::tree(pid)
            .into_iter()
            .filter(|p| *p != pid && !spawners.contains(p))
            .count()
    };
    let (_, scaled) = poll(
        "every instance stopped",
        start,
        Duration::from_secs(120),
        || (instances(&metrics) == Some(0.0) && function_processes(pid) == 0).then_some(()),
        &|| logs(&fnrun),
    );
    // Settled, then three samples a second apart; the last is reported.
    std::thread::sleep(Duration::from_secs(2));
    let mut samples = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(function_processes(pid), 0, "an instance started");
        samples.push(memory(&fnrun_tests::process::tree(pid)));
    }
    let fnrun_idle = samples.last().unwrap().clone();
    assert!(fnrun.stop().is_some_and(|s| s.success()), "{}", fnrun.log());

    // The same function binary, run directly `idle` times, each listening.
    let bin = PATCH_AND_TRANSFORM.binary().unwrap();
    let mut direct = Direct(Vec::new());
    let mut ports = Vec::new();
    for _ in 0..idle {
        let port = free_port().unwrap();
        let mut cmd = Command::new(&bin);
        cmd.arg("--insecure")
            .arg(format!("--address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        direct.0.push(
            die_with_parent(&mut cmd)
                .spawn()
                .expect("the function starts"),
        );
        ports.push(port);
    }
    for port in &ports {
        poll(
            &format!("a direct function on port {port}"),
            Instant::now(),
            Duration::from_secs(60),
            || TcpStream::connect(("127.0.0.1", *port)).ok(),
            &String::new,
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let pids: Vec<u32> = direct
        .0
        .iter()
        .flat_map(|c| fnrun_tests::process::tree(c.id()))
        .collect();
    let direct_mem = memory(&pids);
    drop(direct);
    load.push(json!({ "at": "end", "loadavg": loadavg() }));

    let install_healthy = column(&install, "healthy_ms");
    let install_installed = column(&install, "installed_ms");
    let install_trial = column(&install, "fnrun_trial_start_ms");
    let ready = column(&compose, "ready_ms");
    let result = json!({
        "fnrun_bin": fnrun_bin().display().to_string(),
        "poll_ms": ms(POLL),
        "load": load,
        "install": {
            "functions": installs,
            "runs": install,
            "healthy_ms": stats(&install_healthy),
            "installed_ms": stats(&install_installed),
            "fnrun_trial_start_ms": stats(&install_trial),
        },
        "compose": {
            "xrs": xrs,
            "runs": compose,
            "ready_ms": stats(&ready),
        },
        "idle_memory": {
            "functions": idle,
            "fnrun_idle_timeout": "2s",
            "fnrun_start_to_all_healthy_ms": ms(all_healthy),
            "fnrun_start_to_all_stopped_ms": ms(scaled),
            "fnrun_samples": samples,
            "fnrun_scaled_to_zero": fnrun_idle,
            "direct_processes_listening": direct_mem,
        },
        "total_s": started.elapsed().as_secs(),
    });
    if let Some(path) = std::env::var_os("BENCH_OUT") {
        std::fs::write(&path, serde_json::to_string_pretty(&result).unwrap() + "\n").unwrap();
        eprintln!("written to {}", path.to_string_lossy());
    }

    let row = |label: &str, s: &Value| {
        println!(
            "  {label:44}{:>10}{:>10}{:>10}",
            s["median"].to_string(),
            s["min"].to_string(),
            s["max"].to_string()
        );
    };
    println!("\nKubernetes mode ({})", fnrun_bin().display());
    println!("  {:44}{:>10}{:>10}{:>10}", "ms", "median", "min", "max");
    row(
        &format!("apply -> Function Healthy ({installs})"),
        &result["install"]["healthy_ms"],
    );
    row(
        "  apply -> Function Installed",
        &result["install"]["installed_ms"],
    );
    row(
        "  fnrun's trial start (pull, start, answer)",
        &result["install"]["fnrun_trial_start_ms"],
    );
    row(
        &format!("XR created -> Ready ({xrs})"),
        &result["compose"]["ready_ms"],
    );
    println!("\n  {idle} Functions, none called (KiB)        processes       RSS       PSS");
    for (label, m) in [
        ("fnrun, all scaled to zero", &fnrun_idle),
        ("function processes run directly", &direct_mem),
    ] {
        println!(
            "  {label:36}{:>10}{:>10}{:>10}",
            m["processes"].to_string(),
            m["rss_kib"].to_string(),
            m["pss_kib"].to_string()
        );
    }
    println!(
        "  fnrun start -> all {idle} Healthy: {:.1} s; all stopped: {:.1} s",
        all_healthy.as_secs_f64(),
        scaled.as_secs_f64()
    );
    println!("  load average (1, 5, 15 min) at each part:");
    for l in result["load"].as_array().unwrap() {
        println!(
            "    {:12}{}",
            l["at"].as_str().unwrap(),
            l["loadavg"].as_str().unwrap()
        );
    }
}
