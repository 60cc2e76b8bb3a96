//! A run is over only when every one of its processes is dead (SPEC,
//! "Sandbox"): a call is answered only then, with the sandbox pool on and off,
//! root and rootless; and a run whose runner dies dies with it.
//!
//! - `planter` (`tests/go/planter`) leaves a process behind that holds a TCP
//!   listener, an abstract unix socket, an OFD lock and 128 MiB of memory (so
//!   that its exit is slow: a dying process closes its files only after it
//!   has freed its memory). The moment its call is answered, nothing of it
//!   may answer a connection or be alive.
//! - A daemon killed with SIGKILL during a call leaves no process of any run
//!   (the call's, the sandboxes made ahead of calls, the spawner) alive 2 s
//!   later.
//! - What a run sees of others through `/proc`: not the host's lock table,
//!   not its own init's descriptors.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use fnrun_api::v1alpha1::NetworkPolicy;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::{Registry, free_port};
use fnrun_tests::user::{TestUser, ensure_test_user, require_root, unprivileged_userns_blocked};

/// The modes this machine can test: root (when the tests run as root) and
/// rootless (a test user, when unprivileged user namespaces work).
fn modes() -> Vec<(&'static str, Option<TestUser>)> {
    let mut modes = Vec::new();
    if !require_root("the run's lifetime, as root and rootless") {
        return modes;
    }
    modes.push(("root", None));
    match unprivileged_userns_blocked() {
        Some(reason) => eprintln!("SKIPPED rootless: {reason}"),
        None => modes.push(("rootless", Some(ensure_test_user().expect("the test user")))),
    }
    modes
}

fn daemon(user: Option<&TestUser>, pool: u32) -> Daemon {
    let mut opts = DaemonOpts::default().arg(format!("--sandbox-pool={pool}"));
    if let Some(user) = user {
        opts = opts.user(user.clone());
    }
    Daemon::start(opts).expect("fnrun serve starts")
}

/// The command line of `pid`, arguments joined by spaces.
fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes whose command line holds `marker`, with their command lines.
fn marked(marker: &str) -> Vec<(u32, String)> {
    pids()
        .into_iter()
        .filter(|&pid| pid != std::process::id())
        .filter_map(|pid| {
            let line = cmdline(pid)?;
            line.contains(marker).then_some((pid, line))
        })
        .collect()
}

/// `(ppid, start time)` of `pid` from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state ppid ... starttime is field 22, the 20th after ')'.
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every descendant of `root`, with its start time (a pid with another start
/// time later is another process).
fn descendants(root: u32) -> BTreeMap<u32, u64> {
    let table: Vec<(u32, u32, u64)> = pids()
        .into_iter()
        .filter_map(|pid| stat(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut found = BTreeMap::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, start) in &table {
            if ppid == parent && found.insert(pid, start).is_none() {
                frontier.push(pid);
            }
        }
    }
    found
}

/// Those of `processes` still alive (not zombies) as the same process.
fn alive(processes: &BTreeMap<u32, u64>) -> Vec<String> {
    processes
        .iter()
        .filter(|&(&pid, &start)| stat(pid).is_some_and(|(_, s)| s == start))
        .filter(|&(&pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                !s.lines()
                    .any(|l| l.starts_with("State:") && l.contains('Z'))
            })
        })
        .map(|(&pid, _)| format!("{pid}: {}", cmdline(pid).unwrap_or_default()))
        .collect()
}

/// What is still reachable or alive of a planted holder: said in words,
/// empty when nothing is.
fn planted_left(port: u16, name: &str) -> Vec<String> {
    let mut left = Vec::new();
    let tcp = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into();
    match TcpStream::connect_timeout(&tcp, Duration::from_millis(500)) {
        Ok(_) => left.push(format!("127.0.0.1:{port} accepted a connection")),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
        Err(e) => left.push(format!("127.0.0.1:{port}: {e}")),
    }
    let abstract_name = SocketAddr::from_abstract_name(name.as_bytes()).expect("an abstract name");
    match UnixStream::connect_addr(&abstract_name) {
        Ok(_) => left.push(format!("@{name} accepted a connection")),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
        Err(e) => left.push(format!("@{name}: {e}")),
    }
    left.extend(
        marked(name)
            .into_iter()
            .map(|(pid, line)| format!("process {pid} is alive: {line}")),
    );
    left
}

/// Call K leaves a holder behind; the moment K is answered, nothing of it
/// is left, whether K's sandbox was made ahead of the call (pool on) or for
/// it (pool off). Before init killed its namespace ahead of its report, a
/// pooled call was answered while the holder still listened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_answered_only_once_every_process_of_its_run_is_dead() {
    let modes = modes();
    if modes.is_empty() {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let planter = fnrun_tests::go::Toolchain::find()
        .and_then(|go| go.build("planter", &[]))
        .expect("tests/go/planter builds");
    let port = free_port().expect("a free port");
    let name = format!("fnrun-plant-{}", std::process::id());
    // 128 MiB: within the call's limit as root; rootless on a v1 host the
    // runner has no cgroup to set one in.
    let image = TestImage::busybox()
        .binary(&planter, "/planter")
        .entrypoint([
            "/planter".to_owned(),
            "plant".to_owned(),
            port.to_string(),
            name.clone(),
            "128".to_owned(),
        ])
        .push_to(&registry, "fns/planter:v1");

    let mut failures = Vec::new();
    for (mode, user) in &modes {
        for pool in [8, 0] {
            let daemon = daemon(user.as_ref(), pool);
            let mut client = daemon.client().await.expect("connects");
            for call in 1..=3 {
                let mut request = Run::new(&image, SAMPLE)
                    .network(NetworkPolicy::Runner)
                    .timeout(Duration::from_secs(60));
                if user.is_none() {
                    request = request.memory("512Mi");
                }
                let answer = client::run_function(&mut client, request.build()).await;
                // At once: any wait would let a slow teardown finish.
                let left = planted_left(port, &name);
                let what = format!("{mode}, --sandbox-pool={pool}, call {call}");
                match answer {
                    Ok(_) if left.is_empty() => eprintln!("ok   {what}"),
                    Ok(_) => failures.push(format!("{what}: answered with {left:?}")),
                    Err(status) => failures.push(format!("{what}: {status:?}")),
                }
                // Whatever was left must not spill into the next call.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !planted_left(port, &name).is_empty() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A daemon killed with SIGKILL during a call: within 2 s, no process it
/// started is alive (the call's function and init, the sandboxes made ahead
/// of calls, the spawner), root and rootless. As root, init used to lose its
/// parent-death signal when it changed its ids, and ran on past its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dies_with_its_killed_daemon() {
    let modes = modes();
    if modes.is_empty() {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let marker = format!("1000.{}", std::process::id());
    let image = TestImage::busybox()
        .file(
            "/run.sh",
            format!("#!/bin/sh\nsleep {marker} &\nsleep {marker}\n"),
            0o755,
        )
        .entrypoint(["/run.sh"])
        .push_to(&registry, "fns/sleeper:v1");

    let mut failures = Vec::new();
    for (mode, user) in &modes {
        let mut daemon = daemon(user.as_ref(), 4);
        let pid = daemon.pid().expect("the daemon runs");
        let mut client = daemon.client().await.expect("connects");
        let request = Run::new(&image, SAMPLE).timeout(Duration::from_secs(60));
        let call =
            tokio::spawn(async move { client::run_function(&mut client, request.build()).await });
        let deadline = Instant::now() + Duration::from_secs(60);
        while marked(&marker).len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(marked(&marker).len(), 2, "{mode}: the function started");
        let started = descendants(pid);
        daemon.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = daemon.wait_exit(Duration::from_secs(5));
        let _ = call.await;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut left = alive(&started);
        while !left.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            left = alive(&started);
        }
        if left.is_empty() {
            eprintln!(
                "ok   {mode}: {} processes ended with the daemon",
                started.len()
            );
        } else {
            failures.push(format!(
                "{mode}: alive 2 s after the daemon's SIGKILL: {left:#?}"
            ));
            // Leave nothing behind on the test machine either.
            for line in &left {
                if let Some(pid) = line.split(':').next().and_then(|p| p.parse().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `/proc/locks` (every lock of the host, other sandboxes' among them) is
/// masked, init's descriptors are closed to the function, and the run is
/// the OOM killer's first pick, root and rootless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_sees_neither_the_hosts_locks_nor_its_inits_descriptors() {
    let modes = modes();
    if modes.is_empty() {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let script = report_script(
        "",
        "locks=$(wc -c </proc/locks) fds=$(ls /proc/1/fd 2>/dev/null | wc -l) \
         oom=$(cat /proc/self/oom_score_adj)",
    );
    let image = TestImage::busybox()
        .file("/run.sh", script, 0o755)
        .entrypoint(["/run.sh"])
        .push_to(&registry, "fns/peek:v1");
    // A lock the host holds while the function looks.
    let held = tempfile::tempfile().expect("a file");
    nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive).expect("lock");
    for (mode, user) in &modes {
        let daemon = daemon(user.as_ref(), 0);
        let mut client = daemon.client().await.expect("connects");
        let out = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
            .await
            .unwrap_or_else(|s| panic!("{mode}: {s:?}"));
        let message = last_message(&String::from_utf8_lossy(&out.output));
        // And the OOM killer's first pick (see runs_count_against_…).
        assert_eq!(message, "locks=0 fds=0 oom=1000", "{mode}");
    }
}

/// Whether this host's cgroups are v1 (the memory controller in a hierarchy
/// of its own).
fn memory_v1() -> bool {
    std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
}

/// On cgroup v1, a run cgroup that a run with no limit left charged (page
/// cache and dentries of a million lookups of absent names, which outlive
/// its processes) takes no later run's memory limit: that run gets a clean
/// cgroup, and its limit holds. It used to fail with `INTERNAL write
/// …/memory.limit_in_bytes: Device or resource busy` 4 times in 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_is_never_set_on_a_cgroup_an_earlier_run_left_charged() {
    if !require_root("memory limits after a run that charged its cgroup") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let lookups = TestImage::busybox()
        .file(
            "/run.sh",
            "#!/bin/sh\ncat >/dev/null\n\
             seq -f /etc/absent-%g 1000000 | xargs ls >/dev/null 2>&1\n\
             cat /bin/busybox >/dev/null\n\
             printf 'observed: {}\\ndesired: {}\\n'\n",
            0o755,
        )
        .entrypoint(["/run.sh"])
        .push_to(&registry, "fns/lookups:v1");
    let limited = TestImage::echo().push_to(&registry, "fns/limited:v1");
    let mut failures = Vec::new();
    for pool in [8, 0] {
        let daemon = daemon(None, pool);
        let mut client = daemon.client().await.expect("connects");
        for round in 1..=3 {
            let charge = Run::new(&lookups, SAMPLE).timeout(Duration::from_secs(60));
            if let Err(s) = client::run_function(&mut client, charge.build()).await {
                failures.push(format!("pool {pool}, round {round}: the lookups: {s:?}"));
            }
            let limited = Run::new(&limited, SAMPLE).memory("32Mi");
            if let Err(s) = client::run_function(&mut client, limited.build()).await {
                failures.push(format!("pool {pool}, round {round}: 32Mi after: {s:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The daemon in a memory cgroup of 256 MiB (as in a pod with that limit):
/// a function that allocates 400 MiB, with no limit of its own, is killed,
/// not the daemon, which serves on. On cgroup v1 run cgroups used to go to
/// the top of each hierarchy, where the daemon's limit did not reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_count_against_the_daemons_own_cgroup_and_die_before_it() {
    if !require_root("runs within the daemon's own memory cgroup") {
        return;
    }
    if !memory_v1() {
        eprintln!(
            "SKIPPED: not a cgroup v1 host (v2 runs nest below the daemon's cgroup by delegation)"
        );
        return;
    }
    // A memory cgroup of this test's own, below the test's (its runs'
    // parent follows the daemon into it).
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .expect("/proc/self/cgroup")
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',').any(|c| c == "memory").then(|| p.to_owned())
        })
        .expect("a memory cgroup");
    let pod = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/memory{}/fnrun-test-pod-{}",
        own.trim_end_matches('/'),
        std::process::id()
    ));
    std::fs::create_dir(&pod).expect("create the pod's cgroup");
    let limit = 256u64 << 20;
    std::fs::write(pod.join("memory.limit_in_bytes"), limit.to_string()).expect("limit");
    let _ = std::fs::write(pod.join("memory.memsw.limit_in_bytes"), limit.to_string());
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let _remove = Remove(pod.clone());

    let registry = Registry::start().expect("registry starts");
    let hungry = TestImage::busybox()
        .file(
            "/run.sh",
            "#!/bin/sh\ncat >/dev/null\ndd if=/dev/zero of=/dev/null bs=400M count=1 2>/dev/null || exit 1\n\
             printf 'observed: {}\\ndesired: {}\\n'\n",
            0o755,
        )
        .entrypoint(["/run.sh"])
        .push_to(&registry, "fns/hungry:v1");
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let procs = pod.join("cgroup.procs");
    let daemon = Daemon::start(DaemonOpts::default().in_cgroup(procs))
        .expect("fnrun serve starts in the pod's cgroup");
    let mut client = daemon.client().await.expect("connects");
    let answer = client::run_function(
        &mut client,
        Run::new(&hungry, SAMPLE)
            .timeout(Duration::from_secs(60))
            .build(),
    )
    .await;
    let status = answer.expect_err("a 400 MiB function in a 256 MiB pod is stopped");
    assert!(
        matches!(
            status.code(),
            tonic::Code::ResourceExhausted | tonic::Code::Aborted
        ),
        "{status:?}"
    );
    // The daemon is alive and serves.
    client::run_function(&mut client, Run::new(&echo, SAMPLE).build())
        .await
        .expect("the daemon serves after the kill");
}
