//! SIGINT, SIGTERM, SIGHUP and SIGKILL on `fnrun run` and `fnrun function
//! call`, as root and rootless: within 2 s of the signal no process, cgroup
//! or mount of the run is left. The first three are caught: fnrun stops the
//! function, removes its sandbox, says so in one line and exits 128 + the
//! signal's number (130, 143, 129), as podman does. SIGKILL cannot be
//! caught: the sandbox dies with fnrun (its spawner and init by their
//! parent-death signal), and its cgroups are left empty within the 2 s,
//! for the next fnrun to sweep (nothing else can remove them): checked
//! with the `fnrun pull` that follows.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use fnrun_tests::cli::Cli;
use fnrun_tests::fixtures::{kill_pids, processes_with_argv};
use fnrun_tests::function_host::alive;
use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::image::TestImage;
use fnrun_tests::process::{signal, spawners_of, wait_timeout};
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{TestUser, require_root, rootless_user};
use nix::sys::signal::Signal;

/// How long after the signal the run may take to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(2);

/// The command interrupted.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `fnrun run IMAGE FILE` of a FunctionIO function.
    Run,
    /// `fnrun function call IMAGE FILE` of a server that never answers.
    Call,
}

/// What a run left on the host while it ran: its processes (the function,
/// its init and fnrun's spawner) and its cgroups.
#[derive(Debug)]
struct Footprint {
    pids: Vec<i32>,
    cgroups: Vec<PathBuf>,
}

impl Footprint {
    /// What is still there: with `empty_cgroups_ok`, a cgroup only if it
    /// holds a process.
    fn left(&self, cli: &Cli, empty_cgroups_ok: bool) -> Vec<String> {
        let mut left: Vec<String> = self
            .pids
            .iter()
            .filter(|p| alive(**p))
            .map(|p| format!("process {p}"))
            .collect();
        let holds_process = |c: &PathBuf| {
            std::fs::read_to_string(c.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
        };
        left.extend(
            self.cgroups
                .iter()
                .filter(|c| c.exists() && (!empty_cgroups_ok || holds_process(c)))
                .map(|c| format!("cgroup {}", c.display())),
        );
        let cache = cli.cache_dir().display().to_string();
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            left.extend(
                mounts
                    .lines()
                    .filter(|l| l.contains(&cache))
                    .map(|l| format!("mount {l}")),
            );
        }
        left
    }
}

/// The parent pid of `pid`.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The cgroup directories of `pid` under fnrun's parent cgroups.
fn fnrun_cgroups(pid: i32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut dirs = BTreeSet::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = match (fields.next(), fields.next(), fields.next()) {
            (Some(id), Some(c), Some(p)) => (id, c, p),
            _ => continue,
        };
        if !path.contains("/fnrun/") {
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
                dirs.insert(dir);
                break;
            }
        }
    }
    dirs.into_iter().collect()
}

/// Starts the command of `kind` on a function that sleeps `seconds`, and
/// waits until the function runs; returns fnrun and what its run holds.
fn start(cli: &Cli, kind: Kind, image: &str, seconds: u32) -> (Child, Footprint) {
    let args: Vec<String> = match kind {
        Kind::Run => {
            let input = cli.write_file("input.yaml", SAMPLE).expect("input");
            vec!["run".into(), image.into(), input]
        }
        Kind::Call => {
            let request = cli.write_file("request.yaml", "{}\n").expect("request");
            vec![
                "function".into(),
                "call".into(),
                "--start-timeout".into(),
                "5m".into(),
                "--timeout".into(),
                "5m".into(),
                image.into(),
                request,
            ]
        }
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut fnrun = cli.spawn(&args).expect("fnrun starts");
    let argv = ["sleep".to_owned(), seconds.to_string()];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let function = loop {
        if let Some(pid) = processes_with_argv(&argv).first() {
            break *pid;
        }
        if let Ok(Some(status)) = fnrun.try_wait() {
            let mut stderr = String::new();
            let _ = fnrun.stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("{kind:?}: fnrun ended ({status}) before the function ran: {stderr}");
        }
        assert!(
            Instant::now() < deadline,
            "{kind:?}: the function did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The function, its shell, init (in the run's PID namespace, all
    // descendants of the spawner) and the spawner (fnrun's child).
    let fnrun_pid = i32::try_from(fnrun.id()).expect("a pid");
    let mut pids = vec![function];
    let mut p = function;
    while let Some(q) = parent(p) {
        if q == fnrun_pid || q <= 1 {
            break;
        }
        pids.push(q);
        p = q;
    }
    pids.extend(
        spawners_of(fnrun.id())
            .into_iter()
            .filter_map(|p| i32::try_from(p).ok()),
    );
    pids.sort_unstable();
    pids.dedup();
    let cgroups = fnrun_cgroups(function);
    (fnrun, Footprint { pids, cgroups })
}

/// Sends each of `signals` to a fresh `fnrun` of `kind` and checks what it
/// did and left.
fn interrupt(kind: Kind, user: Option<TestUser>, signals: &[Signal], first_seconds: u32) {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script("#!/bin/sh\nsleep \"$SECONDS_TO_SLEEP\"\n");
    let cli = match &user {
        Some(user) => Cli::as_user(user.clone()).expect("cli"),
        None => Cli::new().expect("cli"),
    };
    let mut failures = Vec::new();
    for (seconds, &sig) in (first_seconds..).zip(signals) {
        let image = image
            .clone()
            .env("SECONDS_TO_SLEEP", &seconds.to_string())
            .push_to(&registry, &format!("fns/sleep:{seconds}"));
        let (mut fnrun, footprint) = start(&cli, kind, &image, seconds);
        let signalled = Instant::now();
        signal(&fnrun, sig);
        let status = wait_timeout(&mut fnrun, Duration::from_secs(10));
        let mut stderr = String::new();
        if status.is_some() {
            let _ = fnrun.stderr.take().unwrap().read_to_string(&mut stderr);
        } else {
            let _ = fnrun.kill();
            let _ = fnrun.wait();
        }
        let killed = sig == Signal::SIGKILL;
        let mut left = footprint.left(&cli, killed);
        while !left.is_empty() && signalled.elapsed() < GONE_WITHIN {
            std::thread::sleep(Duration::from_millis(20));
            left = footprint.left(&cli, killed);
        }
        let who = format!(
            "{kind:?} {} {sig}",
            if user.is_some() { "rootless" } else { "root" }
        );
        if !left.is_empty() {
            failures.push(format!(
                "{who}: left {:?} after the signal (held {footprint:?}): {left:#?}",
                signalled.elapsed()
            ));
            kill_pids(&footprint.pids);
        }
        match (sig, status) {
            (_, None) => failures.push(format!("{who}: fnrun still ran 10 s after the signal")),
            (Signal::SIGKILL, Some(status)) => {
                if status.signal() != Some(Signal::SIGKILL as i32) {
                    failures.push(format!("{who}: {status}"));
                }
                // The next fnrun sweeps the empty cgroups of a dead one.
                let out = cli.run(&["pull", "-q", &image], None);
                let left = footprint.left(&cli, false);
                if out.code != Some(0) || !left.is_empty() {
                    failures.push(format!(
                        "{who}: left after the next fnrun: {left:#?}\n{}",
                        out.describe()
                    ));
                }
            }
            (sig, Some(status)) => {
                let code = 128 + sig as i32;
                if status.code() != Some(code) {
                    failures.push(format!("{who}: {status}, not exit {code}: {stderr}"));
                }
                let want = format!("fnrun: {sig}: stopped the function and removed its sandbox\n");
                if stderr != want {
                    failures.push(format!("{who}: stderr {stderr:?}, not {want:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

const CAUGHT: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

#[test]
fn run_stopped_by_a_signal_as_root_leaves_nothing() {
    if !require_root("run_stopped_by_a_signal_as_root_leaves_nothing") {
        return;
    }
    interrupt(Kind::Run, None, &CAUGHT, 4310);
}

#[test]
fn run_stopped_by_a_signal_rootless_leaves_nothing() {
    let Some(user) = rootless_user("run_stopped_by_a_signal_rootless_leaves_nothing") else {
        return;
    };
    interrupt(Kind::Run, Some(user), &CAUGHT, 4320);
}

#[test]
fn function_call_stopped_by_a_signal_as_root_leaves_nothing() {
    if !require_root("function_call_stopped_by_a_signal_as_root_leaves_nothing") {
        return;
    }
    interrupt(Kind::Call, None, &CAUGHT, 4330);
}

#[test]
fn function_call_stopped_by_a_signal_rootless_leaves_nothing() {
    let Some(user) = rootless_user("function_call_stopped_by_a_signal_rootless_leaves_nothing")
    else {
        return;
    };
    interrupt(Kind::Call, Some(user), &CAUGHT, 4340);
}

/// As root, the sandbox's init changes its ids, which clears its
/// parent-death signal unless it sets it again afterwards.
#[test]
fn killed_run_as_root_leaves_nothing() {
    if !require_root("killed_run_as_root_leaves_nothing") {
        return;
    }
    interrupt(Kind::Run, None, &[Signal::SIGKILL], 4350);
}

#[test]
fn killed_run_rootless_leaves_nothing() {
    let Some(user) = rootless_user("killed_run_rootless_leaves_nothing") else {
        return;
    };
    interrupt(Kind::Run, Some(user), &[Signal::SIGKILL], 4360);
}

#[test]
fn killed_function_call_as_root_leaves_nothing() {
    if !require_root("killed_function_call_as_root_leaves_nothing") {
        return;
    }
    interrupt(Kind::Call, None, &[Signal::SIGKILL], 4370);
}

#[test]
fn killed_function_call_rootless_leaves_nothing() {
    let Some(user) = rootless_user("killed_function_call_rootless_leaves_nothing") else {
        return;
    };
    interrupt(Kind::Call, Some(user), &[Signal::SIGKILL], 4380);
}

/// Under `nohup` (SIGHUP ignored), a hangup does not stop the run; SIGTERM
/// still does.
#[test]
fn a_run_under_nohup_outlives_a_hangup() {
    if !require_root("a_run_under_nohup_outlives_a_hangup") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = fnrun_tests::fixtures::sleeper(4399).push_to(&registry, "fns/sleep:nohup");
    let cli = Cli::new().expect("cli");
    let input = cli.write_file("input.yaml", SAMPLE).expect("input");
    let mut cmd = std::process::Command::new("nohup");
    cmd.arg(fnrun_tests::fnrun_bin())
        .args(["run", "--cache-dir"])
        .arg(cli.cache_dir())
        .args([image.as_str(), input.as_str()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut fnrun = fnrun_tests::process::die_with_parent(&mut cmd)
        .spawn()
        .expect("nohup fnrun run starts");
    let running = fnrun_tests::wait_for(Duration::from_secs(120), || {
        let pids = processes_with_argv(&["/bin/sleep", "4399"]);
        (!pids.is_empty()).then_some(pids)
    })
    .expect("the function runs");
    signal(&fnrun, Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        fnrun.try_wait().expect("wait").is_none(),
        "a hangup stopped a run under nohup"
    );
    signal(&fnrun, Signal::SIGTERM);
    let status = wait_timeout(&mut fnrun, Duration::from_secs(10)).expect("SIGTERM stops it");
    assert_eq!(status.code(), Some(143), "{status}");
    let left = fnrun_tests::fixtures::leftover_processes(&["/bin/sleep", "4399"], GONE_WITHIN);
    kill_pids(&left);
    assert!(left.is_empty(), "left {left:?} (was {running:?})");
}
