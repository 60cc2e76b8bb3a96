//! The runs of one kind share a network namespace, one run at a time, and
//! nothing of one run reaches the next (SPEC, "Sandbox"; docs/security.md),
//! root and rootless, with the sandbox pool on and off.
//!
//! `sharednet` (`tests/go/sharednet`) is one image, one kind of run; its
//! input says what a call does. Per daemon:
//! - a call that waits (4 s) holds a namespace of the kind meanwhile, so that
//!   the kind's namespaces live through the calls below (a kind's
//!   namespaces end with its last sandbox);
//! - a "leave" call leaves a background process listening on TCP 9443, an
//!   abstract unix socket, a TCP listener alive only in flight in a unix
//!   socket's queue, SysV shared memory, semaphores and a message queue, a
//!   POSIX message queue, and tries to set the hostname, add an address and a
//!   route, set sysctls and make a TCP fast open attempt: none of those
//!   tries may work;
//! - two "look" calls of the same kind find none of it (the ports free to
//!   bind, `/proc/net` empty, only loopback's addresses); as root, where
//!   namespaces are shared, they find `tcp_no_metrics_save=1` and
//!   `tcp_fastopen=0`;
//! - as root with the pool off, of two "quiet" calls (that open no socket:
//!   a closed socket's count in its namespace lasts an RCU grace period
//!   longer) one after the other (with a moment between for the first's
//!   teardown, which follows its answer), the second is in the first's
//!   namespace (given back clean, reused);
//! - the waiting call's namespace is none of theirs (one run at a time), and
//!   a call of another kind (another image) shares none of the namespaces
//!   alive then;
//! - once the daemon has stopped, no process of the runs is alive, no
//!   process or descriptor on the host holds any of their network
//!   namespaces, and no mount under the daemon's cache or run cgroup is
//!   left.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{MINIMAL, last_message};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{TestUser, ensure_test_user, require_root, unprivileged_userns_blocked};

fn modes() -> Vec<(&'static str, Option<TestUser>)> {
    let mut modes = Vec::new();
    if !require_root("shared network namespaces, as root and rootless") {
        return modes;
    }
    modes.push(("root", None));
    match unprivileged_userns_blocked() {
        Some(reason) => eprintln!("SKIPPED rootless: {reason}"),
        None => modes.push(("rootless", Some(ensure_test_user().expect("the test user")))),
    }
    modes
}

/// One call's report: its words `key=value`.
#[derive(Debug, Clone)]
struct Report {
    netns: String,
    found: Vec<String>,
    worked: Vec<String>,
}

impl Report {
    fn parse(message: &str) -> Report {
        let field = |key: &str| {
            message
                .split(' ')
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_default()
                .to_owned()
        };
        let list = |key: &str| {
            field(key)
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        Report {
            netns: field("netns="),
            found: list("found="),
            worked: list("worked="),
        }
    }

    /// What was found besides the sysctls' values.
    fn left(&self) -> Vec<&String> {
        self.found
            .iter()
            .filter(|f| !f.starts_with("sysctl:"))
            .collect()
    }

    fn sysctl(&self, name: &str) -> Option<&str> {
        self.found
            .iter()
            .find_map(|f| f.strip_prefix(&format!("sysctl:ipv4/{name}=")))
    }
}

async fn call(daemon: &Daemon, image: &str, input: &str) -> Report {
    let mut client = daemon.client().await.expect("connects");
    let request = Run::new(image, input).timeout(Duration::from_secs(60));
    let output = client::run_function(&mut client, request.build())
        .await
        .unwrap_or_else(|status| panic!("{input:?}: {status:?}"));
    Report::parse(&last_message(&String::from_utf8_lossy(&output.output)))
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

/// Processes running `/sharednet`.
fn sharednet_processes() -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/sharednet\0"))
        })
        .collect()
}

/// Processes, and descriptors of processes, that refer to one of `netns`
/// (`net:[INODE]`).
fn holders(netns: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    for pid in pids() {
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net"))
            && netns.contains(&ns.display().to_string())
        {
            found.push(format!("process {pid} is in {}", ns.display()));
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            if let Ok(target) = std::fs::read_link(fd.path())
                && netns.contains(&target.display().to_string())
            {
                found.push(format!(
                    "{} holds {}",
                    fd.path().display(),
                    target.display()
                ));
            }
        }
    }
    found
}

/// The run cgroup directories of `pid` (under fnrun's parents).
fn run_cgroups(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut dirs = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !path.contains("fnrun") {
            continue;
        }
        let hierarchy = match controllers {
            "" => "unified".to_owned(),
            c => c.trim_start_matches("name=").to_owned(),
        };
        for base in [
            format!("/sys/fs/cgroup/{hierarchy}"),
            "/sys/fs/cgroup".to_owned(),
        ] {
            let dir = PathBuf::from(format!("{base}{path}"));
            if dir.is_dir() {
                dirs.push(dir);
                break;
            }
        }
    }
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_a_run_reaches_the_next_of_its_kind() {
    let modes = modes();
    if modes.is_empty() {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let sharednet = fnrun_tests::go::Toolchain::find()
        .and_then(|go| go.build("sharednet", &[]))
        .expect("tests/go/sharednet builds");
    let image = TestImage::scratch()
        .binary(&sharednet, "/sharednet")
        .entrypoint(["/sharednet"])
        .push_to(&registry, "fns/sharednet:v1");
    // Another kind: the same program, another argument.
    let other = TestImage::scratch()
        .binary(&sharednet, "/sharednet")
        .entrypoint(["/sharednet", "other"])
        .push_to(&registry, "fns/sharednet-other:v1");
    let leave = format!("# leave\n{MINIMAL}");
    let wait = format!("# wait\n{MINIMAL}");

    let mut failures: Vec<String> = Vec::new();
    for (mode, user) in &modes {
        for pool in [8, 0] {
            let what = format!("{mode}, --sandbox-pool={pool}");
            let mut opts = DaemonOpts::default()
                .arg(format!("--sandbox-pool={pool}"))
                .env("RUST_LOG", "info,fnrun_sandbox::netns=debug");
            if let Some(user) = user {
                opts = opts.user(user.clone());
            }
            let mut daemon = Daemon::start(opts).expect("fnrun serve starts");
            let shared = user.is_none();
            // The images cached, the kinds' pools (if any) started.
            call(&daemon, &image, MINIMAL).await;
            call(&daemon, &other, MINIMAL).await;

            let waiting = {
                let (daemon_client, image) =
                    (daemon.client().await.expect("connects"), image.clone());
                let wait = wait.clone();
                tokio::spawn(async move {
                    let mut client = daemon_client;
                    let request = Run::new(&image, wait).timeout(Duration::from_secs(60));
                    let output = client::run_function(&mut client, request.build())
                        .await
                        .expect("the waiting call");
                    Report::parse(&last_message(&String::from_utf8_lossy(&output.output)))
                })
            };
            let mut cgroups = Vec::new();
            for _ in 0..100 {
                if let Some(&pid) = sharednet_processes().first() {
                    cgroups = run_cgroups(pid);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }

            let left = call(&daemon, &image, &leave).await;
            let allowed: &[&str] = if shared { &[] } else { &["fastopen"] };
            let worked: Vec<_> = left
                .worked
                .iter()
                .filter(|w| !allowed.contains(&w.as_str()))
                .collect();
            if !worked.is_empty() {
                failures.push(format!("{what}: a run could {worked:?}"));
            }
            let first = call(&daemon, &image, MINIMAL).await;
            let second = call(&daemon, &image, MINIMAL).await;
            // A run's teardown follows its answer in the background: a
            // moment for it before the next call.
            let quiet = format!("# quiet\n{MINIMAL}");
            let quiet_first = call(&daemon, &image, &quiet).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let quiet_second = call(&daemon, &image, &quiet).await;
            let another = call(&daemon, &other, MINIMAL).await;
            let still_waiting = !waiting.is_finished();
            let waited = waiting.await.expect("the waiting call");
            eprintln!(
                "{what}: wait {} leave {} look {} look {} quiet {} quiet {} other {}",
                waited.netns,
                left.netns,
                first.netns,
                second.netns,
                quiet_first.netns,
                quiet_second.netns,
                another.netns
            );
            for (name, report) in [("first", &first), ("second", &second)] {
                if !report.left().is_empty() {
                    failures.push(format!(
                        "{what}: the {name} call after a leave found {:?}",
                        report.left()
                    ));
                }
                if shared
                    && (report.sysctl("tcp_no_metrics_save") != Some("1")
                        || report.sysctl("tcp_fastopen") != Some("0"))
                {
                    failures.push(format!("{what}: the kind's sysctls: {:?}", report.found));
                }
            }
            if [&left, &first, &second, &quiet_first, &quiet_second]
                .iter()
                .any(|r| r.netns == waited.netns)
            {
                failures.push(format!(
                    "{what}: two runs in one namespace at once: {}",
                    waited.netns
                ));
            }
            if shared && pool == 0 && quiet_first.netns != quiet_second.netns {
                failures.push(format!(
                    "{what}: a clean namespace was not reused: {} then {}",
                    quiet_first.netns, quiet_second.netns
                ));
            }
            if still_waiting
                && [&waited, &quiet_second]
                    .iter()
                    .any(|r| r.netns == another.netns)
            {
                failures.push(format!(
                    "{what}: another kind's call shared {}",
                    another.netns
                ));
            }
            if !still_waiting {
                eprintln!("{what}: the waiting call ended before the other kind's: not compared");
            }

            daemon.stop();
            let netns: BTreeSet<String> = [
                &waited,
                &left,
                &first,
                &second,
                &quiet_first,
                &quiet_second,
                &another,
            ]
            .iter()
            .map(|r| r.netns.clone())
            .collect();
            let mut after = Vec::new();
            for _ in 0..40 {
                after = holders(&netns);
                after.extend(
                    sharednet_processes()
                        .into_iter()
                        .map(|pid| format!("process {pid} is alive")),
                );
                after.extend(
                    cgroups
                        .iter()
                        .filter(|c| c.exists())
                        .map(|c| format!("cgroup {}", c.display())),
                );
                let cache = daemon.cache_dir().display().to_string();
                if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
                    after.extend(
                        mounts
                            .lines()
                            .filter(|l| l.contains(&cache))
                            .map(|l| format!("mount {l}")),
                    );
                }
                if after.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if cgroups.is_empty() && shared {
                failures.push(format!("{what}: no run cgroup seen"));
            }
            if !after.is_empty() {
                failures.push(format!("{what}: left after the daemon stopped: {after:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
