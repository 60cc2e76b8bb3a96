//! The hostile-function suite: functions that attack the runner or the host,
//! each run through `fnrun serve` over gRPC, once with the daemon as root and
//! once as the unprivileged `fnrun-test` user.
//!
//! Every case asserts its own outcome, then that the daemon still serves (an
//! echo run succeeds) and that nothing of the run was left behind: no process
//! (a marker unique to this test process is in every hostile command line), no
//! child of the daemon (but its spawner, and the inits of sandboxes made
//! ahead of their calls, whose one child, the function, waits at its exec), no new mount in the host's or the daemon's mount table,
//! no process in a run cgroup (below `fnrun` in the tests' own cgroup or at
//! the top of a hierarchy) and no new directory there but the daemon's own run cgroups (kept for reuse on v1, all removed
//! when the daemon stops, which is checked once a mode is done), and no growth
//! of the daemon's cache dir after the warm-up pull.
//!
//! All cases of a mode run in sequence in one test (they measure process
//! counts, CPU time and RSS, which concurrent cases would disturb); a failing
//! case is recorded and the others still run, and the test fails at the end
//! with every failure.
//!
//! Safety: the fork bomb only runs after a bounded probe (at most 1100
//! sleeping processes) has shown that the sandbox limits the process count.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fnrun_api::v1alpha1::NetworkPolicy;
use fnrun_tests::client::{self, Client, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::fnrun_bin;
use fnrun_tests::functionio::{MINIMAL, SAMPLE, assert_same_yaml, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::process::{die_with_parent, is_spawner, run_capture};
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{TestUser, ensure_test_user, require_root, unprivileged_userns_blocked};
use tonic::Code;

/// RSS the daemon must stay below during a flood.
const MAX_DAEMON_RSS: u64 = 300 << 20;
/// The most a case may add to the host's process count once it is over
/// (other work on the machine may start a few processes meanwhile).
const PROCESS_SLACK: usize = 40;

type CaseResult = Result<(), String>;

/// Returns `Err(message)` from the case unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

// ---------------------------------------------------------------------------
// Markers and images
// ---------------------------------------------------------------------------

/// A string unique to this test process, in the command line of every
/// process a hostile function starts (script paths and sleep arguments).
fn marker() -> String {
    format!("hstl{}x", std::process::id())
}

/// The argument of every background `sleep`: 1000 seconds and a fraction
/// unique to this test process.
fn sleep_arg() -> String {
    format!("1000.{}", std::process::id())
}

/// The file name the host-path case looks for.
fn sentinel_name() -> String {
    format!("sentinel-{}", marker())
}

/// A busybox image that runs `script` from `/<marker>-<case>.sh`, so that
/// every shell of the run carries the marker in its command line.
fn hostile(case: &str, script: &str) -> TestImage {
    let path = format!("/{}-{case}.sh", marker());
    TestImage::busybox()
        .file(&path, script, 0o755)
        .entrypoint(["/bin/sh".to_owned(), path])
}

/// Prints a minimal FunctionIO without touching stdin.
const PRINT_MINIMAL: &str = "printf 'observed: {}\\ndesired: {}\\n'";

/// Every image of the suite, pushed once and pulled by each daemon before its
/// cases run.
struct Images {
    echo: String,
    bomb_probe: String,
    bomb: String,
    balloon: String,
    spin: String,
    stdout_flood: String,
    stderr_flood: String,
    stdin_ignored: String,
    background: String,
    writer: String,
    mounter: String,
    network: String,
    peek: String,
    signals: String,
}

impl Images {
    fn all(&self) -> Vec<&str> {
        vec![
            &self.echo,
            &self.bomb_probe,
            &self.bomb,
            &self.balloon,
            &self.spin,
            &self.stdout_flood,
            &self.stderr_flood,
            &self.stdin_ignored,
            &self.background,
            &self.writer,
            &self.mounter,
            &self.network,
            &self.peek,
            &self.signals,
        ]
    }

    fn build(registry: &Registry, port: u16, host_addr: Option<&str>) -> Images {
        let m = marker();
        let s = sleep_arg();
        let sentinel = sentinel_name();
        let ext_probe = match host_addr {
            Some(addr) => format!("echo ping | nc -w 2 {addr} {port} >/dev/null 2>&1; ext=$?"),
            None => "ext=none".to_owned(),
        };
        let specs: Vec<(&str, TestImage)> = vec![
            ("echo", TestImage::echo()),
            // At most 1100 sleepers, more than the default pids limit (1024):
            // a sandbox without a process limit finishes with started=1100.
            (
                "bomb_probe",
                hostile(
                    "bombprobe",
                    &report_script(
                        &format!("n=0\nwhile [ $n -lt 1100 ]; do sleep {s} & n=$((n+1)); done"),
                        "started=$n",
                    ),
                ),
            ),
            // The classic bomb, while the main shell spins without forking.
            (
                "bomb",
                hostile(
                    "bomb",
                    "cat >/dev/null\nf(){ f|f& }; f\nwhile :; do :; done\n",
                ),
            ),
            // The shell itself keeps 200 MB of command output in memory.
            (
                "balloon",
                hostile(
                    "balloon",
                    "cat >/dev/null\nx=$(head -c 200000000 /dev/zero | tr '\\0' a)\necho ${#x} >&2\nexit 0\n",
                ),
            ),
            (
                "spin",
                hostile("spin", "cat >/dev/null\nwhile :; do :; done\n"),
            ),
            (
                "stdout_flood",
                hostile(
                    "stdoutflood",
                    &format!("cat >/dev/null\nexec yes {m}-out\n"),
                ),
            ),
            (
                "stderr_flood",
                hostile(
                    "stderrflood",
                    // 2 GiB of text (`yes | head` alone is too slow for it):
                    // a 16 MiB block written 128 times. No `yes` here: see
                    // the signal dispositions case.
                    "cat >/dev/null\n\
                         head -c 1048576 /dev/zero | tr '\\0' e > /tmp/b\n\
                         i=0; while [ $i -lt 16 ]; do cat /tmp/b; i=$((i+1)); done > /tmp/c\n\
                         i=0; while [ $i -lt 128 ]; do cat /tmp/c; i=$((i+1)); done >&2\n\
                         echo stderr-the-end >&2\n\
                         exit 1\n",
                ),
            ),
            (
                "stdin_ignored",
                hostile("stdinignored", &format!("sleep 1\n{PRINT_MINIMAL}\n")),
            ),
            (
                "background",
                hostile(
                    "background",
                    &format!(
                        "cat >/dev/null\n\
                         busybox setsid sleep {s} &\n\
                         (trap '' HUP; exec sleep {s}) &\n\
                         (sleep {s} &)\n\
                         busybox setsid sh -c 'sleep {s} & sleep {s}' &\n\
                         sleep 0.2\n\
                         {PRINT_MINIMAL}\n"
                    ),
                ),
            ),
            (
                "writer",
                hostile(
                    "writer",
                    &report_script(
                        "p=$(head -n 1 /etc/passwd)\n\
                         e=$(test -e /bin/evil && echo yes || echo no)\n\
                         echo x > /etc/passwd; w1=$?\n\
                         touch /bin/evil; w2=$?\n\
                         p2=$(head -n 1 /etc/passwd)\n\
                         e2=$(test -e /bin/evil && echo yes || echo no)",
                        "before=$p evil=$e wrote=$w1$w2 after=$p2 evil_after=$e2",
                    ),
                ),
            ),
            (
                "mounter",
                hostile(
                    "mounter",
                    &report_script(
                        "before=$(wc -l < /proc/self/mountinfo)\n\
                         mount -t tmpfs none /tmp 2>/dev/null; a=$?\n\
                         mkdir -p /mnt; mount --bind / /mnt 2>/dev/null; b=$?\n\
                         mount -o bind / /mnt 2>/dev/null; c=$?\n\
                         busybox unshare -U true 2>/dev/null; d=$?\n\
                         busybox unshare -m true 2>/dev/null; e=$?\n\
                         after=$(wc -l < /proc/self/mountinfo)",
                        "tmpfs=$a bind=$b obind=$c userns=$d mntns=$e mounts=$before/$after",
                    ),
                ),
            ),
            (
                "network",
                hostile(
                    "network",
                    &report_script(
                        &format!(
                            "ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | xargs)\n\
                             echo ping | nc -w 2 127.0.0.1 {port} >/dev/null 2>&1; lo=$?\n\
                             {ext_probe}"
                        ),
                        "ifs=$ifs lo=$lo ext=$ext",
                    ),
                ),
            ),
            (
                "peek",
                hostile(
                    "peek",
                    &report_script(
                        &format!(
                            "n=$(find / -name {sentinel} 2>/dev/null | wc -l)\n\
                             env=$(cat /proc/1/environ 2>/dev/null | wc -c)\n\
                             c=$(tr '\\0' ' ' < /proc/1/cmdline)"
                        ),
                        "found=$n environ=$env init=$c",
                    ),
                ),
            ),
            // What a function starts with: no ignored or blocked signals, so
            // `yes | head` ends with SIGPIPE as it does everywhere else. (With
            // SIGPIPE ignored, busybox `yes WORD` may loop for ever on EPIPE,
            // depending on how its lines meet its stdio buffer: `yes_head` is
            // reported, only the signal sets are asserted.)
            (
                "signals",
                hostile(
                    "signals",
                    &report_script(
                        &format!(
                            "ign=$(grep SigIgn /proc/self/status | cut -f2)\n\
                             blk=$(grep SigBlk /proc/self/status | cut -f2)\n\
                             timeout 2 sh -c 'yes {m}-pipe | head -c 100 >/dev/null'; y=$?"
                        ),
                        "ign=$ign blk=$blk yes_head=$y",
                    ),
                ),
            ),
        ];
        // umoci and skopeo mostly wait for the disk: build in parallel.
        let mut refs: BTreeMap<&str, String> = std::thread::scope(|scope| {
            let handles: Vec<_> = specs
                .into_iter()
                .map(|(name, image)| {
                    let repo = format!("hostile/{}:v1", name.replace('_', "-"));
                    (name, scope.spawn(move || image.push_to(registry, &repo)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(name, h)| (name, h.join().expect("image build thread")))
                .collect()
        });
        let mut take = |name: &str| refs.remove(name).expect("image built");
        Images {
            echo: take("echo"),
            bomb_probe: take("bomb_probe"),
            bomb: take("bomb"),
            balloon: take("balloon"),
            spin: take("spin"),
            stdout_flood: take("stdout_flood"),
            stderr_flood: take("stderr_flood"),
            stdin_ignored: take("stdin_ignored"),
            background: take("background"),
            writer: take("writer"),
            mounter: take("mounter"),
            network: take("network"),
            peek: take("peek"),
            signals: take("signals"),
        }
    }
}

// ---------------------------------------------------------------------------
// Host observations
// ---------------------------------------------------------------------------

fn cmdline_args(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Host processes started by a hostile function of this test process.
fn marked_processes() -> Vec<(u32, String)> {
    let (m, s) = (marker(), sleep_arg());
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let args = cmdline_args(pid)?;
            args.iter()
                .any(|a| a.contains(&m) || *a == s)
                .then(|| (pid, args.join(" ")))
        })
        .collect()
}

/// The function of `pid`, if `pid` is the init of a sandbox the daemon made
/// ahead of its call (`--sandbox-pool`, which this suite's daemons turn on):
/// its one child, the function, waits at its exec, reading a pipe (the sync
/// pipe, waiting for the call) with init's command line (it has not exec'd).
/// Only inits are the daemon's children, and the function of an init that
/// ran a call has exec'd, so this is no leftover of a run.
fn waiting_for_a_call(pid: u32) -> Option<u32> {
    let read = |pid: u32, file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
    let children = read(pid, &format!("task/{pid}/children")).ok()?;
    let [function] = children.split_whitespace().collect::<Vec<_>>()[..] else {
        return None;
    };
    let function: u32 = function.parse().ok()?;
    (read(function, "wchan").is_ok_and(|w| w.ends_with("pipe_read"))
        && cmdline_args(function).is_some()
        && cmdline_args(function) == cmdline_args(pid))
    .then_some(function)
}

/// Processes that are clones of the daemon (sandbox inits have its command
/// line) and children of the daemon, but for one spawner (which stays) and
/// the inits of sandboxes made ahead of their calls.
fn daemon_offspring(daemon_pid: u32, daemon_cmdline: &[String]) -> Vec<(u32, String)> {
    let mut found = BTreeMap::new();
    let mut spawner_seen = false;
    for pid in all_pids() {
        if pid == daemon_pid {
            continue;
        }
        if !spawner_seen && is_spawner(pid, daemon_pid) {
            spawner_seen = true;
            continue;
        }
        if cmdline_args(pid).as_deref() == Some(daemon_cmdline) {
            found.insert(pid, "a clone of the daemon (sandbox init)".to_owned());
        }
    }
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{daemon_pid}/task")) {
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if let Some(function) = waiting_for_a_call(child) {
                    found.remove(&child);
                    found.remove(&function);
                    continue;
                }
                if found.contains_key(&child) || !is_spawner(child, daemon_pid) {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
                    found.insert(child, format!("a child of the daemon: {}", stat.trim()));
                }
            }
        }
    }
    found.into_iter().collect()
}

fn mount_table(path: &str) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every directory below the parents of run cgroups
/// ([`fnrun_tests::cgroups::run_parents`]).
fn cgroup_dirs() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(entry.path());
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    for base in fnrun_tests::cgroups::run_parents() {
        walk(&base, &mut out);
    }
    out
}

/// The pid of the daemon whose run cgroup `path` is (its name is
/// `<pidns>-<daemon pid>-<start>-<sandbox>-<run>`); `None` for other names.
fn cgroup_daemon(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let parts: Vec<&str> = name.split('-').collect();
    (parts.len() == 5 && parts.iter().all(|p| p.parse::<u64>().is_ok()))
        .then(|| parts[1].parse().ok())
        .flatten()
}

/// Whether a run cgroup belongs to another daemon: other tests on this
/// machine may run functions at the same time.
fn foreign_cgroup(path: &Path, daemon_pid: u32) -> bool {
    cgroup_daemon(path).is_some_and(|pid| pid != daemon_pid)
}

/// Whether `path` is a run cgroup of the daemon `daemon_pid`.
fn own_cgroup(path: &Path, daemon_pid: u32) -> bool {
    cgroup_daemon(path) == Some(daemon_pid)
}

/// Whether the cgroup `dir` holds a process, other than the init of a
/// sandbox made ahead of its call and its function waiting at its exec.
fn holds_process(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| {
        let pids: Vec<u32> = p
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect();
        let waiting: BTreeSet<u32> = pids
            .iter()
            .filter_map(|&pid| Some([pid, waiting_for_a_call(pid)?]))
            .flatten()
            .collect();
        pids.iter().any(|pid| !waiting.contains(pid))
    })
}

/// `path -> (kind, size)` of everything below `dir`.
fn tree_listing(dir: &Path) -> BTreeMap<PathBuf, (char, u64)> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (char, u64)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            let kind = if meta.is_dir() {
                'd'
            } else if meta.file_type().is_symlink() {
                'l'
            } else {
                'f'
            };
            out.insert(
                entry.path(),
                (kind, if kind == 'f' { meta.len() } else { 0 }),
            );
            if kind == 'd' {
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The daemon's RSS stayed below [`MAX_DAEMON_RSS`] during a flood.
fn rss_below_bound(rss: u64) -> CaseResult {
    ensure!(
        rss < MAX_DAEMON_RSS,
        "the daemon's RSS reached {} MiB during the flood",
        rss >> 20
    );
    Ok(())
}

/// Samples the daemon's RSS every 10 ms until dropped; keeps the maximum.
struct RssSampler {
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let max = Arc::new(AtomicU64::new(rss_bytes(pid).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (max, stop) = (max.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rss) = rss_bytes(pid) {
                        max.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        RssSampler {
            max,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

/// A first non-loopback IPv4 address of the host, if any.
fn host_address() -> Option<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            let _index = words.next()?;
            let ifname = words.next()?;
            let _family = words.next()?;
            let addr = words.next()?.split('/').next()?;
            (ifname != "lo" && !addr.starts_with("127.")).then(|| addr.to_owned())
        })
}

/// A TCP listener on all host addresses that counts connections.
struct Listener {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start() -> Listener {
        let listener = TcpListener::bind("0.0.0.0:0").expect("bind 0.0.0.0:0");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepted, stop) = (accepted.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            accepted.fetch_add(1, Ordering::SeqCst);
                            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                            let _ = stream.read(&mut [0u8; 64]);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Listener {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------
// One daemon, its baseline and the checks after each case
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Root,
    Rootless,
}

struct Baseline {
    host_mounts: BTreeSet<String>,
    daemon_mounts: BTreeSet<String>,
    cgroups: BTreeSet<PathBuf>,
    cache: BTreeMap<PathBuf, (char, u64)>,
    processes: usize,
}

struct Harness {
    mode: Mode,
    daemon: Daemon,
    pid: u32,
    cmdline: Vec<String>,
    client: Client,
    baseline: Baseline,
}

impl Harness {
    async fn start(mode: Mode, user: Option<TestUser>, images: &Images) -> Harness {
        // With the sandbox pool on: hostile functions run beside sandboxes
        // made ahead of calls, and in them.
        let mut opts = DaemonOpts::default().arg("--sandbox-pool=8");
        if let Some(user) = user.clone() {
            opts = opts.user(user);
        }
        let daemon = Daemon::start(opts).expect("fnrun serve starts");
        let pid = daemon.pid().expect("the daemon runs");
        // setpriv has exec'd fnrun by the time the socket accepts.
        let cmdline = cmdline_args(pid).expect("the daemon's command line");

        // Warm-up: pull every image of the suite into the daemon's cache, as
        // the daemon's user, so that the cases start from a full cache.
        let bin = fnrun_bin();
        let mut pull = match &user {
            Some(user) => user.command(&bin),
            None => {
                let mut cmd = Command::new(&bin);
                die_with_parent(&mut cmd);
                cmd
            }
        };
        pull.arg("pull").arg("--cache-dir").arg(daemon.cache_dir());
        pull.args(images.all());
        let out = run_capture(&mut pull, None, Duration::from_secs(120));
        assert_eq!(out.code, Some(0), "warm-up pull: {out:?}");

        let mut client = daemon.client().await.expect("connects");
        let output = client::run_function(&mut client, Run::new(&images.echo, SAMPLE).build())
            .await
            .unwrap_or_else(|s| panic!("{mode:?}: the warm-up echo run fails: {s:?}"));
        assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);

        let baseline = Baseline {
            host_mounts: mount_table("/proc/self/mountinfo"),
            daemon_mounts: mount_table(&format!("/proc/{pid}/mountinfo")),
            cgroups: cgroup_dirs(),
            cache: tree_listing(daemon.cache_dir()),
            processes: all_pids().len(),
        };
        Harness {
            mode,
            daemon,
            pid,
            cmdline,
            client,
            baseline,
        }
    }

    /// Calls RunFunction; returns the result and how long it took.
    async fn run(&mut self, request: Run) -> (Result<String, tonic::Status>, Duration) {
        let start = Instant::now();
        let result = client::run_function(&mut self.client, request.build())
            .await
            .map(|r| String::from_utf8_lossy(&r.output).into_owned());
        (result, start.elapsed())
    }

    /// Calls RunFunction while sampling the daemon's RSS; also returns the
    /// highest RSS seen.
    async fn run_sampling_rss(
        &mut self,
        request: Run,
    ) -> (Result<String, tonic::Status>, Duration, u64) {
        let sampler = RssSampler::start(self.pid);
        let (result, elapsed) = self.run(request).await;
        (result, elapsed, sampler.finish())
    }

    /// The daemon still serves, and nothing of the case is left behind.
    async fn after_case(&mut self, echo: &str) -> CaseResult {
        let mut problems = Vec::new();

        // The daemon is alive and serves a normal run.
        if let Some(status) = self.daemon.try_wait() {
            return Err(format!("the daemon exited: {status}"));
        }
        match client::run_function(&mut self.client, Run::new(echo, SAMPLE).build()).await {
            Ok(output) => {
                let out = String::from_utf8_lossy(&output.output);
                if fnrun_tests::functionio::parse(&out) != fnrun_tests::functionio::parse(SAMPLE) {
                    problems.push(format!("the echo run after the case returned:\n{out}"));
                }
            }
            Err(status) => problems.push(format!("the echo run after the case failed: {status:?}")),
        }

        // No process of the run.
        let left = poll(Duration::from_secs(10), marked_processes).await;
        if !left.is_empty() {
            fnrun_tests::fixtures::kill_pids(
                &left
                    .iter()
                    .map(|(p, _)| i32::try_from(*p).expect("pids fit in i32"))
                    .collect::<Vec<_>>(),
            );
            problems.push(format!(
                "{} processes of the run remain on the host, e.g. {:?}",
                left.len(),
                &left[..left.len().min(5)]
            ));
        }
        let (pid, cmdline) = (self.pid, self.cmdline.clone());
        let offspring = poll(Duration::from_secs(5), || daemon_offspring(pid, &cmdline)).await;
        if !offspring.is_empty() {
            problems.push(format!("processes of the daemon remain: {offspring:?}"));
        }
        let base = self.baseline.processes;
        let extra = poll(Duration::from_secs(10), || {
            let now = all_pids().len();
            if now > base + PROCESS_SLACK {
                vec![now]
            } else {
                Vec::new()
            }
        })
        .await;
        if let Some(now) = extra.first() {
            problems.push(format!(
                "the host has {now} processes, {base} before the suite"
            ));
        }

        // No mounts.
        for (what, path, before) in [
            (
                "host",
                "/proc/self/mountinfo".to_owned(),
                &self.baseline.host_mounts,
            ),
            (
                "daemon",
                format!("/proc/{pid}/mountinfo"),
                &self.baseline.daemon_mounts,
            ),
        ] {
            let new = poll(Duration::from_secs(3), || {
                mount_table(&path)
                    .difference(before)
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .await;
            if !new.is_empty() {
                problems.push(format!("new mounts in the {what}'s mount table: {new:#?}"));
            }
        }

        // No process in a cgroup, and no new cgroup but the daemon's run
        // cgroups, which v1 keeps for the next runs.
        let before = &self.baseline.cgroups;
        let new = poll(Duration::from_secs(3), || {
            cgroup_dirs()
                .into_iter()
                .filter(|p| !foreign_cgroup(p, pid))
                .filter(|p| holds_process(p) || !(before.contains(p) || own_cgroup(p, pid)))
                .collect::<Vec<_>>()
        })
        .await;
        if !new.is_empty() {
            problems.push(format!(
                "cgroups that are new and not the daemon's, or hold a process: {new:#?}"
            ));
        }

        // No growth of the cache. Lease files are the daemon's note of the
        // images in use, not anything a run wrote: a sandbox made ahead of
        // its call holds its image's lease until it is used or ended.
        let cache_dir = self.daemon.cache_dir().to_path_buf();
        let leases = cache_dir.join("leases");
        let before = &self.baseline.cache;
        let grown = poll(Duration::from_secs(3), || {
            tree_listing(&cache_dir)
                .into_iter()
                .filter(|(path, _)| path.parent() != Some(leases.as_path()))
                .filter(|(path, (kind, size))| match before.get(path) {
                    None => true,
                    Some((k, s)) => k != kind || size > s,
                })
                .collect::<Vec<_>>()
        })
        .await;
        if !grown.is_empty() {
            problems.push(format!(
                "the cache grew: {:#?}",
                &grown[..grown.len().min(20)]
            ));
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// Polls `check` until it returns an empty list or `timeout` passes; returns
/// the last list.
async fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Vec<T>) -> Vec<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = check();
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect_err(
    result: Result<String, tonic::Status>,
    codes: &[Code],
) -> Result<tonic::Status, String> {
    match result {
        Ok(output) => Err(format!("expected one of {codes:?}, got output:\n{output}")),
        Err(status) if codes.contains(&status.code()) => Ok(status),
        Err(status) => Err(format!("expected one of {codes:?}, got {status:?}")),
    }
}

fn ok_message(result: Result<String, tonic::Status>) -> Result<String, String> {
    let output = result.map_err(|s| format!("the run failed: {s:?}"))?;
    Ok(last_message(&output))
}

// ---------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------

async fn fork_bomb(h: &mut Harness, images: &Images) -> CaseResult {
    // Safety first: the real bomb only runs if a bounded one is stopped.
    let (result, _) = h
        .run(Run::new(&images.bomb_probe, SAMPLE).timeout(Duration::from_secs(60)))
        .await;
    match &result {
        Ok(output) => {
            let message = last_message(output);
            ensure!(
                message != "started=1100",
                "no process limit in the sandbox ({message}): the real fork bomb is not run"
            );
        }
        Err(status) => ensure!(
            status.code() == Code::Aborted,
            "the bounded fork probe: {status:?}"
        ),
    }
    // Let its leftovers (if any) be found by the checks of the real bomb.
    let left = poll(Duration::from_secs(10), marked_processes).await;
    ensure!(
        left.is_empty(),
        "{} processes of the bounded fork probe survived it",
        left.len()
    );

    let timeout = Duration::from_secs(5);
    let (result, elapsed) = h.run(Run::new(&images.bomb, SAMPLE).timeout(timeout)).await;
    let status = expect_err(result, &[Code::DeadlineExceeded, Code::Aborted])?;
    ensure!(
        elapsed < timeout + Duration::from_secs(5),
        "the fork bomb ended after {elapsed:?} (timeout {timeout:?}): {status:?}"
    );
    eprintln!("    fork bomb: {:?} after {elapsed:?}", status.code());
    Ok(())
}

async fn memory_balloon(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, elapsed) = h
        .run(
            Run::new(&images.balloon, SAMPLE)
                .memory("64Mi")
                .timeout(Duration::from_secs(60)),
        )
        .await;
    match h.mode {
        Mode::Root => {
            let status = expect_err(result, &[Code::ResourceExhausted])?;
            ensure!(
                status.message().contains("memory limit"),
                "the message does not say memory limit: {status:?}"
            );
            eprintln!("    balloon: {:?} after {elapsed:?}", status.code());
        }
        Mode::Rootless => {
            // No cgroup delegation for unprivileged users on this host.
            let status = expect_err(result, &[Code::FailedPrecondition])?;
            ensure!(
                status.message().contains("memory"),
                "the message does not name the memory limit: {status:?}"
            );
            eprintln!("    balloon: {:?}: {}", status.code(), status.message());
        }
    }
    Ok(())
}

async fn cpu_spin(h: &mut Harness, images: &Images) -> CaseResult {
    let timeout = Duration::from_secs(2);
    // While it spins, the checks of `after_case` must see the run: its shell
    // by the marker, and (root mode) its cgroup, one of the daemon's that
    // holds a process.
    let pid = h.pid;
    let watcher = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_millis(1500);
        let (mut procs, mut cgroups) = (false, false);
        while Instant::now() < deadline && !(procs && cgroups) {
            procs |= !marked_processes().is_empty();
            cgroups |= cgroup_dirs()
                .iter()
                .any(|p| own_cgroup(p, pid) && holds_process(p));
            std::thread::sleep(Duration::from_millis(20));
        }
        (procs, cgroups)
    });
    let (result, elapsed) = h.run(Run::new(&images.spin, SAMPLE).timeout(timeout)).await;
    let (saw_procs, saw_cgroup) = watcher.join().expect("watcher");
    ensure!(saw_procs, "the marker scan did not see the spinning shell");
    ensure!(
        saw_cgroup == (h.mode == Mode::Root),
        "{:?} mode, a run cgroup of the daemon seen: {saw_cgroup}",
        h.mode
    );
    let status = expect_err(result, &[Code::DeadlineExceeded])?;
    ensure!(
        elapsed < timeout + Duration::from_secs(2),
        "the spinning function ended after {elapsed:?} (timeout {timeout:?})"
    );
    ensure!(
        elapsed >= timeout,
        "ended before its timeout: {elapsed:?}: {status:?}"
    );
    eprintln!("    spin: {:?} after {elapsed:?}", status.code());
    Ok(())
}

async fn stdout_flood(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, elapsed, rss) = h
        .run_sampling_rss(Run::new(&images.stdout_flood, SAMPLE).timeout(Duration::from_secs(60)))
        .await;
    let status = expect_err(result, &[Code::Aborted])?;
    ensure!(
        status.message().contains("output") && status.message().contains("limit"),
        "the message does not mention the output limit: {status:?}"
    );
    rss_below_bound(rss)?;
    ensure!(
        elapsed < Duration::from_secs(60),
        "the flood took {elapsed:?} to end"
    );
    eprintln!(
        "    stdout flood: {:?} after {elapsed:?}, daemon RSS max {} MiB",
        status.code(),
        rss >> 20
    );
    Ok(())
}

async fn stderr_flood(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, elapsed, rss) = h
        .run_sampling_rss(Run::new(&images.stderr_flood, SAMPLE).timeout(Duration::from_secs(60)))
        .await;
    let status = expect_err(result, &[Code::Aborted])?;
    let message = status.message();
    ensure!(
        message.contains("code 1") && message.contains("stderr-the-end"),
        "the message does not give the exit code and the stderr tail: {}",
        &message[..message.len().min(500)]
    );
    ensure!(
        message.len() <= 16 << 10,
        "the message holds {} bytes of stderr, not only a tail",
        message.len()
    );
    rss_below_bound(rss)?;
    ensure!(
        elapsed < Duration::from_secs(60),
        "2 GiB of stderr took {elapsed:?}"
    );
    eprintln!(
        "    stderr flood: {:?} after {elapsed:?}, message {} bytes, daemon RSS max {} MiB",
        status.code(),
        message.len(),
        rss >> 20
    );
    Ok(())
}

async fn stdin_never_read(h: &mut Harness, images: &Images) -> CaseResult {
    let input = format!(
        "observed: {{}}\ndesired: {{}}\nresults:\n- severity: Normal\n  message: \"{}\"\n",
        "a".repeat(32 << 20)
    );
    let (result, elapsed, rss) = h
        .run_sampling_rss(Run::new(&images.stdin_ignored, input).timeout(Duration::from_secs(60)))
        .await;
    let output = result.map_err(|s| format!("the run failed: {s:?}"))?;
    ensure!(
        fnrun_tests::functionio::parse(&output) == fnrun_tests::functionio::parse(MINIMAL),
        "unexpected output:\n{output}"
    );
    ensure!(
        elapsed < Duration::from_secs(30),
        "the run took {elapsed:?}"
    );
    eprintln!(
        "    stdin never read: ok after {elapsed:?}, daemon RSS max {} MiB",
        rss >> 20
    );
    Ok(())
}

async fn background_children(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, elapsed) = h
        .run(Run::new(&images.background, SAMPLE).timeout(Duration::from_secs(30)))
        .await;
    let output = result.map_err(|s| format!("the run failed: {s:?}"))?;
    ensure!(
        fnrun_tests::functionio::parse(&output) == fnrun_tests::functionio::parse(MINIMAL),
        "unexpected output:\n{output}"
    );
    ensure!(
        elapsed < Duration::from_secs(10),
        "the run waited {elapsed:?} for its background children"
    );
    // `after_case` checks that no `sleep 1000.<pid>` remains.
    eprintln!("    background children: ok after {elapsed:?}");
    Ok(())
}

async fn rootfs_writes(h: &mut Harness, images: &Images) -> CaseResult {
    let expected = "before=root:x:0:0:root:/root:/bin/sh evil=no wrote=00 after=x evil_after=yes";
    for run in 1..=2 {
        let (result, _) = h.run(Run::new(&images.writer, SAMPLE)).await;
        let message = ok_message(result).map_err(|e| format!("run {run}: {e}"))?;
        ensure!(message == expected, "run {run}: {message}");
    }
    Ok(())
}

async fn mount_attempts(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, _) = h.run(Run::new(&images.mounter, SAMPLE)).await;
    let message = ok_message(result)?;
    let field = |key: &str| {
        message
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .unwrap_or("?")
            .to_owned()
    };
    for key in ["tmpfs", "bind", "obind", "userns", "mntns"] {
        let rc = field(key);
        ensure!(
            rc != "0" && rc != "?",
            "{key} succeeded inside the sandbox: {message}"
        );
    }
    let mounts = field("mounts");
    let (before, after) = mounts.split_once('/').unwrap_or(("?", "!"));
    ensure!(before == after, "the mount table changed: {message}");
    eprintln!("    mount attempts: {message}");
    Ok(())
}

async fn network_egress(
    h: &mut Harness,
    images: &Images,
    listener: &Listener,
    has_ext: bool,
) -> CaseResult {
    let before = listener.accepted();
    let (result, _) = h
        .run(Run::new(&images.network, SAMPLE).network(NetworkPolicy::Isolated))
        .await;
    let message = ok_message(result)?;
    ensure!(
        message.starts_with("ifs=lo "),
        "interfaces other than lo: {message}"
    );
    ensure!(
        !message.contains(" lo=0"),
        "reached the host's 127.0.0.1: {message}"
    );
    if has_ext {
        ensure!(
            !message.contains(" ext=0") && !message.contains("ext=none"),
            "reached the host's address: {message}"
        );
    }
    ensure!(
        listener.accepted() == before,
        "the host listener accepted {} connections",
        listener.accepted() - before
    );
    eprintln!("    network: {message}");
    Ok(())
}

async fn host_paths(h: &mut Harness, images: &Images) -> CaseResult {
    let name = sentinel_name();
    let sentinels = [
        PathBuf::from("/tmp").join(&name),
        h.daemon.cache_dir().join(&name),
    ];
    for s in &sentinels {
        std::fs::write(s, "host secret\n").map_err(|e| format!("write {}: {e}", s.display()))?;
    }
    let (result, _) = h.run(Run::new(&images.peek, SAMPLE)).await;
    for s in &sentinels {
        let _ = std::fs::remove_file(s);
    }
    let message = ok_message(result)?;
    ensure!(
        message.starts_with("found=0 "),
        "the function sees the host's sentinel files: {message}"
    );
    let host_init = cmdline_args(1).unwrap_or_default().join(" ");
    // Init is a clone of the daemon: its environment must stay out of reach.
    ensure!(
        message.contains(" environ=0 "),
        "the function reads the environment of the sandbox init (the daemon's): {message}"
    );
    let init = message
        .split_once(" init=")
        .map(|(_, c)| c.trim())
        .unwrap_or("");
    ensure!(!init.is_empty(), "no /proc/1/cmdline inside: {message}");
    ensure!(
        init != host_init.trim(),
        "/proc/1/cmdline inside is the host's init: {init}"
    );
    eprintln!("    host paths: {message}");
    Ok(())
}

/// A function starts with default signal dispositions and an empty signal
/// mask, as under any container runtime: a runner written in Rust ignores
/// SIGPIPE, and exec keeps ignored signals ignored unless the sandbox resets
/// them. With SIGPIPE ignored, `yes WORD | head` never ends.
async fn signal_dispositions(h: &mut Harness, images: &Images) -> CaseResult {
    let (result, _) = h
        .run(Run::new(&images.signals, SAMPLE).timeout(Duration::from_secs(20)))
        .await;
    let message = ok_message(result)?;
    ensure!(
        message.starts_with("ign=0000000000000000 blk=0000000000000000 "),
        "the function starts with ignored or blocked signals: {message}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

/// The test user, or None (after saying why) if rootless mode must be skipped.
fn test_user() -> Option<TestUser> {
    if !require_root("hostile functions, rootless mode") {
        return None;
    }
    if let Some(reason) = unprivileged_userns_blocked() {
        eprintln!("SKIPPED rootless mode: unprivileged user namespaces are disabled ({reason})");
        return None;
    }
    Some(ensure_test_user().expect("the test user exists"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_functions_are_contained_as_root_and_rootless() {
    let registry = Registry::start().expect("registry starts");
    let listener = Listener::start();
    let host_addr = host_address();
    let images = Images::build(&registry, listener.port, host_addr.as_deref());

    let mut modes = Vec::new();
    if fnrun_tests::user::is_root() {
        modes.push((Mode::Root, None));
    } else {
        eprintln!("SKIPPED root mode: the tests do not run as root");
    }
    if let Some(user) = test_user() {
        modes.push((Mode::Rootless, Some(user)));
    }

    let mut failures = Vec::new();
    for (mode, user) in modes {
        let mode_start = Instant::now();
        let mut h = Harness::start(mode, user, &images).await;
        eprintln!("== {mode:?} (daemon pid {})", h.pid);
        macro_rules! case {
            ($name:literal, $call:expr) => {{
                // `FNRUN_HOSTILE_CASES=flood,mount` runs only matching cases.
                let only = std::env::var("FNRUN_HOSTILE_CASES").unwrap_or_default();
                if !only.is_empty() && !only.split(',').any(|c| $name.contains(c.trim())) {
                    eprintln!("  skip {mode:?} {}", $name);
                } else {
                    let start = Instant::now();
                    let outcome = $call.await;
                    let outcome = match outcome {
                        Ok(()) => h.after_case(&images.echo).await,
                        Err(e) => {
                            // Still clean up and report what was left behind.
                            let after = h.after_case(&images.echo).await;
                            Err(match after {
                                Ok(()) => e,
                                Err(a) => format!("{e}\n{a}"),
                            })
                        }
                    };
                    match outcome {
                        Ok(()) => eprintln!("  ok   {mode:?} {} ({:?})", $name, start.elapsed()),
                        Err(e) => {
                            eprintln!("  FAIL {mode:?} {} ({:?}): {e}", $name, start.elapsed());
                            failures.push(format!("{mode:?} / {}: {e}", $name));
                        }
                    }
                }
            }};
        }
        case!("fork bomb", fork_bomb(&mut h, &images));
        case!("memory balloon", memory_balloon(&mut h, &images));
        case!("cpu spin", cpu_spin(&mut h, &images));
        case!("stdout flood", stdout_flood(&mut h, &images));
        case!("stderr flood", stderr_flood(&mut h, &images));
        case!("stdin never read", stdin_never_read(&mut h, &images));
        case!("background children", background_children(&mut h, &images));
        case!("root filesystem writes", rootfs_writes(&mut h, &images));
        case!("mount attempts", mount_attempts(&mut h, &images));
        case!(
            "network egress",
            network_egress(&mut h, &images, &listener, host_addr.is_some())
        );
        case!("host paths", host_paths(&mut h, &images));
        case!("signal dispositions", signal_dispositions(&mut h, &images));
        // A daemon that stops removes all its run cgroups. (The wait runs off
        // this runtime's thread, which drives the client's connection that
        // the daemon's graceful shutdown waits for.)
        let (mut daemon, pid) = (h.daemon, h.pid);
        let status = tokio::task::spawn_blocking(move || daemon.stop())
            .await
            .expect("stop");
        let left: Vec<PathBuf> = cgroup_dirs()
            .into_iter()
            .filter(|p| own_cgroup(p, pid))
            .collect();
        if !status.is_some_and(|s| s.success()) || !left.is_empty() {
            failures.push(format!(
                "{mode:?}: the daemon stopped ({status:?}) and left its run cgroups: {left:#?}"
            ));
        }
        eprintln!("== {mode:?} done in {:?}", mode_start.elapsed());
    }
    assert!(
        failures.is_empty(),
        "{} hostile cases failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
