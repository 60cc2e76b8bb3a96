//! Prepared sandboxes on real namespaces: made ahead of their call, each
//! serving one call confined exactly as a fresh run, and dropped unused
//! without a trace.

use super::*;
use crate::PreparedRun;

/// The `ns` namespace of `pid` (`mnt:[4026532..]`), while it lives.
fn namespace(pid: libc::pid_t, ns: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Whether any process on the host is in the namespace `id` (as
/// [`namespace`] names it).
fn namespace_in_use(ns: &str, id: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                .is_ok_and(|l| l.to_string_lossy() == id)
        })
}

/// The run cgroups of `fx` that hold `pid`.
fn cgroups_holding(fx: &Fixture, pid: libc::pid_t) -> Vec<PathBuf> {
    cgroups_left(&fx.sandbox)
        .into_iter()
        .filter(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .any(|l| l == pid.to_string())
        })
        .collect()
}

/// A sandbox's namespaces, by kind, each held open: while a namespace is
/// held, its number is not given to a new one (the kernel reuses the lowest
/// free number at once, and other tests make namespaces all the time).
type Held = Vec<(String, std::fs::File)>;

const KINDS: [&str; 6] = ["mnt", "pid_for_children", "net", "user", "ipc", "uts"];

/// A prepared sandbox whose root is built: its init, its namespaces and
/// cgroups, and its mounts seen from inside.
async fn ready(fx: &Fixture, spec: &RunSpec) -> (PreparedRun, Held, Vec<PathBuf>) {
    let mut prepared = fx.sandbox.prepare(spec).unwrap();
    prepared.ready().await.unwrap();
    assert!(prepared.is_usable());
    // What it holds is known, and small: one waiting init and its root.
    let bytes = prepared.memory_bytes().expect("its memory can be read");
    assert!((4096..(64 << 20)).contains(&bytes), "{bytes} bytes");
    let pid = prepared.pid();
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    // Pivoted into its overlay root, with its own /proc.
    assert!(
        mountinfo
            .lines()
            .any(|l| l.contains(" / / ") && l.contains(" - overlay ")),
        "{mountinfo}"
    );
    assert!(
        mountinfo.lines().any(|l| l.contains(" /proc ")),
        "{mountinfo}"
    );
    let namespaces = KINDS
        .iter()
        .map(|ns| {
            let held = std::fs::File::open(format!("/proc/{pid}/ns/{ns}")).unwrap();
            (namespace(pid, ns), held)
        })
        .collect::<Held>();
    // The host is in none of them.
    let me = i32::try_from(std::process::id()).unwrap();
    for (ns, (id, _)) in KINDS.iter().zip(&namespaces) {
        assert_ne!(&namespace(me, ns), id, "{ns}");
    }
    let cgroups = cgroups_holding(fx, pid);
    if fx.sandbox.limiter.driver().is_some() {
        assert!(!cgroups.is_empty(), "init is in no run cgroup");
    }
    (prepared, namespaces, cgroups)
}

/// After the prepared sandbox of init `pid` is gone: no process is left in
/// any of its namespaces (which this then lets go, and with them the last
/// reference to its mounts), and its cgroups hold nothing.
fn assert_gone(pid: libc::pid_t, namespaces: Held, cgroups: &[PathBuf]) {
    assert!(
        proc_status(pid, "State").is_none_or(|s| !s.starts_with('S')),
        "init {pid} still runs"
    );
    for (ns, (id, _)) in KINDS.iter().zip(&namespaces) {
        let ns = if *ns == "pid_for_children" { "pid" } else { ns };
        assert!(!namespace_in_use(ns, id), "a process is still in {id}");
    }
    for dir in cgroups {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        assert!(procs.is_empty(), "{} still holds {procs:?}", dir.display());
    }
}

/// Kills a prepared sandbox's init and waits until it no longer counts as
/// usable.
pub(super) async fn kill_init<K>(prepared: &crate::Prepared<K>) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(prepared.pid()),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while prepared.is_usable() {
        assert!(
            Instant::now() < deadline,
            "a killed init still counts as usable"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A prepared sandbox and its futures can move between a runtime's threads
/// (the runner's pool makes them in tasks of their own).
#[allow(dead_code)]
fn prepared_runs_are_send(fx: &Fixture, mut prepared: PreparedRun) {
    fn send<T: Send>(_: &T) {}
    send(&prepared.ready());
    send(&fx.sandbox.run_prepared(prepared, b"", TIMEOUT));
}

#[tokio::test]
async fn a_prepared_sandbox_dropped_unused_leaves_nothing_behind() {
    let fx = Fixture::new();
    let spec = fx.spec("echo never");
    let (prepared, namespaces, cgroups) = ready(&fx, &spec).await;
    let pid = prepared.pid();
    drop(prepared);
    assert_gone(pid, namespaces, &cgroups);

    // discard() does the same without blocking the thread.
    let (prepared, namespaces, cgroups) = ready(&fx, &spec).await;
    let pid = prepared.pid();
    prepared.discard().await;
    assert_gone(pid, namespaces, &cgroups);

    // Nothing of the function's code runs before its call: init, alive, has
    // one child, the function, waiting at its exec without privileges.
    let (prepared, namespaces, cgroups) = ready(&fx, &fx.spec("sleep 60")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = prepared.pid();
    assert!(proc_status(pid, "State").is_some_and(|s| !s.starts_with('Z')));
    function_at_its_exec(pid);
    // Dropped, it ends with its function.
    drop(prepared);
    assert_gone(pid, namespaces, &cgroups);

    // One whose init was killed meanwhile is not to be used.
    let (prepared, namespaces, cgroups) = ready(&fx, &spec).await;
    let pid = prepared.pid();
    kill_init(&prepared).await;
    prepared.discard().await;
    assert_gone(pid, namespaces, &cgroups);

    // One dropped before its root is built, too.
    let prepared = fx.sandbox.prepare(&spec).unwrap();
    let pid = prepared.pid();
    drop(prepared);
    assert!(proc_status(pid, "State").is_none_or(|s| !s.starts_with('S')));
    // The Fixture's drop checks that every run cgroup is empty, then gone.
}

/// Leaves what a call can leave behind (files in /tmp and in the root, a
/// process in a session of its own, a listening socket), shows that it did,
/// and shows what it found of earlier calls first.
const TRACES: &str = "read marker; \
    procs() { for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p; echo; done | grep -c '^sleep 86'; }; \
    listening() { cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -vc local_address; }; \
    echo found-tmp=$(cat /tmp/left 2>/dev/null); \
    echo found-root=$(cat /left 2>/dev/null); \
    echo found-procs=$(procs); \
    echo found-listening=$(listening); \
    echo pids=$(ls /proc | grep -c '^[0-9]'); \
    echo $marker > /tmp/left; echo $marker > /left; \
    setsid sleep 86$marker & \
    nc -l -p 4$marker & \
    sleep 0.5; \
    echo left-tmp=$(cat /tmp/left); echo left-root=$(cat /left); \
    echo left-procs=$(procs); \
    echo left-listening=$(listening)";

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("{key} missing from {out}"))
}

/// Runs [`TRACES`] on `prepared` with `marker` and checks that it found
/// nothing and left everything.
async fn call_leaving_traces(fx: &Fixture, prepared: PreparedRun, marker: &str) {
    let out = fx
        .sandbox
        .run_prepared(prepared, format!("{marker}\n").as_bytes(), TIMEOUT)
        .await
        .unwrap();
    let s = text(&out.stdout);
    assert_eq!(
        out.status,
        Status::Exited(0),
        "{s} {}",
        text(&out.stderr_tail)
    );
    // Nothing of an earlier call.
    assert_eq!(field(&s, "found-tmp="), "", "{s}");
    assert_eq!(field(&s, "found-root="), "", "{s}");
    assert_eq!(field(&s, "found-procs="), "0", "{s}");
    assert_eq!(field(&s, "found-listening="), "0", "{s}");
    let pids: u32 = field(&s, "pids=").parse().unwrap();
    assert!(pids <= 5, "{s}");
    // And it did leave them.
    assert_eq!(field(&s, "left-tmp="), marker, "{s}");
    assert_eq!(field(&s, "left-root="), marker, "{s}");
    assert_eq!(field(&s, "left-procs="), "1", "{s}");
    assert_eq!(field(&s, "left-listening="), "1", "{s}");
    assert_no_process_with(&format!("sleep\x0086{marker}"));
}

#[tokio::test]
async fn calls_on_prepared_sandboxes_of_one_kind_see_nothing_of_each_other() {
    let fx = Fixture::new();
    let spec = fx.spec(TRACES);
    let base = 1000 + std::process::id() % 8000;
    // Two made before either call, one after the first call (on v1, in the
    // cgroup the first call gave back).
    let (first, _, _) = ready(&fx, &spec).await;
    let (second, _, _) = ready(&fx, &spec).await;
    call_leaving_traces(&fx, first, &base.to_string()).await;
    let (third, _, _) = ready(&fx, &spec).await;
    call_leaving_traces(&fx, second, &(base + 1).to_string()).await;
    call_leaving_traces(&fx, third, &(base + 2).to_string()).await;
    // The layer is untouched.
    assert!(!fx.layer().join("left").exists());
}

#[tokio::test]
async fn a_call_on_a_prepared_sandbox_is_confined_as_any_run() {
    let fx = Fixture::new();
    let spec = fx.spec("sleep 0.6; cat /proc/self/status");
    let (prepared, _, _) = ready(&fx, &spec).await;
    // The timeout counts from the call, not from the sandbox's making.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let out = fx
        .sandbox
        .run_prepared(prepared, b"", Duration::from_secs(1))
        .await
        .unwrap();
    let s = text(&out.stdout);
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    assert!(out.elapsed < Duration::from_secs(1), "{:?}", out.elapsed);
    let caps = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let fields = status_fields(&s, &caps);
    assert_eq!(fields.len(), caps.len(), "{s}");
    for (key, value) in fields {
        assert_eq!(value, "0000000000000000", "{key} in {s}");
    }
    assert_eq!(status_fields(&s, &["NoNewPrivs"]), [("NoNewPrivs", "1")]);
    assert_eq!(status_fields(&s, &["Seccomp"]), [("Seccomp", "2")]);

    // A call past its timeout is killed with everything it started.
    let marker = format!("{}", 7000 + std::process::id() % 1000);
    let spec = fx.spec(&format!("setsid sleep {marker} & sleep {marker}"));
    let (prepared, _, _) = ready(&fx, &spec).await;
    let out = fx
        .sandbox
        .run_prepared(prepared, b"", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(out.status, Status::TimedOut);
    assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
    assert_no_process_with(&format!("sleep\0{marker}"));
}

#[tokio::test]
async fn a_prepared_sandbox_that_cannot_be_built_says_why() {
    let fx = Fixture::new();
    let mut spec = fx.spec("echo never");
    spec.layers = vec![fx.dir.path().join("no-such-layer")];
    let mut prepared = fx.sandbox.prepare(&spec).unwrap();
    let err = prepared.ready().await.unwrap_err();
    assert!(matches!(err, Error::Setup { .. }), "{err}");
    assert!(err.to_string().contains("overlay"), "{err}");
    drop(prepared);
    // A fresh run of it fails the same way.
    let fresh = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
    assert_eq!(fresh.to_string(), err.to_string());
}

#[tokio::test]
async fn a_call_answered_early_is_answered_as_any_and_ends_after_without_a_trace() {
    let fx = Fixture::new();
    // The function leaves a process running that holds none of its stdio:
    // the answer does not wait for it, the ending kills it.
    let marker = format!("{}", 5000 + std::process::id() % 1000);
    let spec = fx.spec(&format!(
        "setsid sleep {marker} </dev/null >/dev/null 2>&1 & read x; echo got $x; echo oops >&2; exit 3"
    ));
    let (prepared, namespaces, cgroups) = ready(&fx, &spec).await;
    let pid = prepared.pid();
    let (out, ending) = fx
        .sandbox
        .answer_prepared(prepared, b"in\n", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(out.status, Status::Exited(3));
    assert_eq!(text(&out.stdout), "got in\n");
    assert_eq!(text(&out.stderr_tail), "oops\n");
    assert!(ending.is_pending(), "{ending:?}");
    if fx.sandbox.limiter.driver().is_some() {
        // Read when the function exited, before the run's end.
        assert!(out.peak_memory_bytes.is_some_and(|b| b > 0), "{out:?}");
        assert!(out.cpu_time.is_some(), "{out:?}");
    }
    ending.finish().await;
    assert_gone(pid, namespaces, &cgroups);
    assert_no_process_with(&format!("sleep\0{marker}"));

    // A function that cannot be executed fails as it does in a fresh run,
    // and a call cut at its timeout has ended when it is answered.
    let mut spec = fx.spec("unused");
    spec.argv = vec!["/no/such/entrypoint".into()];
    let fresh = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
    let (prepared, namespaces, cgroups) = ready(&fx, &spec).await;
    let pid = prepared.pid();
    let early = fx
        .sandbox
        .answer_prepared(prepared, b"", TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(early.to_string(), fresh.to_string());
    assert_gone(pid, namespaces, &cgroups);

    let (prepared, namespaces, cgroups) = ready(&fx, &fx.spec("sleep 60")).await;
    let pid = prepared.pid();
    let (out, ending) = fx
        .sandbox
        .answer_prepared(prepared, b"", Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(out.status, Status::TimedOut);
    assert!(!ending.is_pending(), "{ending:?}");
    assert_gone(pid, namespaces, &cgroups);
}

#[tokio::test]
async fn a_call_answered_early_past_its_memory_limit_is_out_of_memory() {
    let fx = Fixture::new();
    if !fx.sandbox.limit_support().memory.is_available() {
        eprintln!("no memory limits here: covered by the fresh runs' tests");
        return;
    }
    let mut spec = fx.spec("head -c 200m /dev/zero | tail > /dev/null");
    spec.limits.memory_bytes = Some(64 << 20);
    let (prepared, _, _) = ready(&fx, &spec).await;
    let (out, ending) = fx
        .sandbox
        .answer_prepared(prepared, b"", TIMEOUT)
        .await
        .unwrap();
    ending.finish().await;
    assert_eq!(out.status, Status::OutOfMemory, "{out:?}");
}
