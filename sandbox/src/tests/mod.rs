//! Sandbox tests on real namespaces with a busybox-static root filesystem.
//! `scripts/test` installs busybox-static.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::steps::{DEV_NODES, MASKED_PATHS, READ_ONLY_PATHS, Step};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BUSYBOX: &str = "/bin/busybox";
/// The timeout of test runs, unless a test says otherwise.
const TIMEOUT: Duration = Duration::from_secs(20);
const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "id", "hostname", "ls", "wc", "head", "dd", "mount", "pwd",
    "env", "touch", "test", "grep", "tr", "tail", "unshare", "stat", "cut", "mkdir", "nc", "chmod",
];

/// A temp dir with a busybox layer in it, readable by the sandbox's mapped root.
struct Fixture {
    dir: tempfile::TempDir,
    sandbox: Sandbox,
    _turn: Turn,
}

/// Tests that load the whole machine (a fork bomb, a balloon, many runs at
/// once) or measure CPU run alone; every other test shares it. A fixture holds
/// its turn for its whole life. (std's RwLock guards are not `Send`, and the
/// fixture of the concurrency test is shared between tasks.)
struct Turn {
    alone: bool,
}

/// (tests sharing the machine, a test has it alone, tests waiting for it alone)
static MACHINE: std::sync::Mutex<(usize, bool, usize)> = std::sync::Mutex::new((0, false, 0));
static MACHINE_FREED: std::sync::Condvar = std::sync::Condvar::new();

impl Turn {
    fn take(alone: bool) -> Turn {
        let mut m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
        if alone {
            m.2 += 1;
            while m.0 > 0 || m.1 {
                m = MACHINE_FREED.wait(m).unwrap_or_else(|e| e.into_inner());
            }
            m.2 -= 1;
            m.1 = true;
        } else {
            // Waiting lone tests go first, so that they are not starved.
            while m.1 || m.2 > 0 {
                m = MACHINE_FREED.wait(m).unwrap_or_else(|e| e.into_inner());
            }
            m.0 += 1;
        }
        Turn { alone }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut m = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
        if self.alone {
            m.1 = false;
        } else {
            m.0 -= 1;
        }
        MACHINE_FREED.notify_all();
    }
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with(|_| {})
    }

    /// A fixture whose sandbox config is changed by `tweak` first.
    fn with(tweak: impl FnOnce(&mut SandboxConfig)) -> Fixture {
        Fixture::build(tweak, Turn::take(false))
    }

    /// A fixture for a test that must have the machine to itself.
    fn alone() -> Fixture {
        Fixture::build(|_| {}, Turn::take(true))
    }

    /// Replaces the sandbox with one whose config is changed by `tweak`.
    fn reconfigure(&mut self, tweak: impl FnOnce(&mut SandboxConfig)) {
        let mut config = self.sandbox.config().clone();
        tweak(&mut config);
        self.sandbox = Sandbox::new(config).unwrap();
    }

    fn build(tweak: impl FnOnce(&mut SandboxConfig), turn: Turn) -> Fixture {
        assert!(
            Path::new(BUSYBOX).exists(),
            "{BUSYBOX} is missing: install busybox-static (scripts/test does)"
        );
        let dir = tempfile::Builder::new()
            .prefix("fnrun-sbx")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let layer = dir.path().join("layers").join("base");
        std::fs::create_dir_all(layer.join("bin")).unwrap();
        std::fs::create_dir_all(layer.join("etc")).unwrap();
        std::fs::copy(BUSYBOX, layer.join("bin/busybox")).unwrap();
        for applet in APPLETS {
            symlink("busybox", layer.join("bin").join(applet)).unwrap();
        }
        std::fs::write(layer.join("etc/motd"), "from the image\n").unwrap();
        for d in [dir.path().join("layers"), layer.clone()] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let id_map = IdMap::detect(100000, 100000);
        // Owned by the sandbox's root, as the cache's unpacker leaves layers.
        if let IdMap::Range {
            host_uid, host_gid, ..
        } = id_map
        {
            chown_tree(&layer, host_uid, host_gid);
        }
        let mut config = SandboxConfig::new(dir.path().join("scratch"), id_map);
        config.max_output_bytes = 32 << 20;
        tweak(&mut config);
        let sandbox = Sandbox::new(config).unwrap();
        Fixture {
            dir,
            sandbox,
            _turn: turn,
        }
    }

    fn layer(&self) -> PathBuf {
        self.dir.path().join("layers").join("base")
    }

    fn spec(&self, script: &str) -> RunSpec {
        RunSpec {
            layers: vec![self.layer()],
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec!["PATH=/bin".into(), "FOO=bar".into()],
            workdir: "/".into(),
            uid: 0,
            gid: 0,
            groups: vec![],
            network: Network::Isolated,
            limits: Limits::default(),
            mounts: Vec::new(),
            caller: None,
        }
    }

    async fn sh(&self, script: &str) -> Outcome {
        self.sandbox
            .run(&self.spec(script), b"", TIMEOUT)
            .await
            .unwrap()
    }
}

impl Drop for Fixture {
    /// Whatever way the runs ended, nothing is left in their cgroups, which
    /// are gone once the sandbox is (v1 keeps them for reuse until then).
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let left = cgroups_left(&self.sandbox);
        for dir in &left {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            assert!(procs.is_empty(), "{} still holds {procs:?}", dir.display());
        }
        let config = self.sandbox.config().clone();
        drop(std::mem::replace(
            &mut self.sandbox,
            Sandbox::new(config).unwrap(),
        ));
        let left: Vec<_> = left.into_iter().filter(|d| d.exists()).collect();
        assert!(left.is_empty(), "run cgroups left behind: {left:?}");
    }
}

/// The run cgroups of `sandbox` that still exist.
fn cgroups_left(sandbox: &Sandbox) -> Vec<PathBuf> {
    let Some(driver) = sandbox.limiter.driver() else {
        return Vec::new();
    };
    driver
        .parents()
        .iter()
        .flat_map(|p| std::fs::read_dir(p).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| sandbox.limiter.is_mine(n))
        })
        .collect()
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid, gid);
        }
    }
}

/// The rootless part of a test: run in a child process as `nobody`. In
/// that child (`child_env` set) it runs `child`; as root it runs the test
/// `test` of this binary again as `nobody` (uid and gid 65534, no groups,
/// no capabilities) and returns the child's output once it passed;
/// otherwise the test is skipped (`None`).
fn rootless_part(test: &str, child_env: &str, child: impl FnOnce()) -> Option<String> {
    if std::env::var_os(child_env).is_some() {
        child();
        return None;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: runs the rootless part as nobody, which needs root");
        return None;
    }
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(child_env, "1")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the rootless part failed:\n{all}");
    Some(all)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn echoes_stdin_of_any_size_without_deadlock() {
    let fx = Fixture::new();
    let mut spec = fx.spec("");
    spec.argv = vec!["cat".into()];
    // Far beyond a pipe buffer in both directions.
    let input: Vec<u8> = (0..8 << 20)
        .map(|i| u8::try_from(i % 251).expect("below 251"))
        .collect();
    let out = fx.sandbox.run(&spec, &input, TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0));
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input);
}

#[tokio::test]
async fn reports_exit_code_and_stderr_tail() {
    let fx = Fixture::new();
    let out = fx
        .sh("i=0; while [ $i -lt 2000 ]; do echo noise $i >&2; i=$((i+1)); done; echo boom >&2; exit 3")
        .await;
    assert_eq!(out.status, Status::Exited(3));
    let tail = text(&out.stderr_tail);
    assert!(tail.ends_with("boom\n"), "{tail}");
    assert!(out.stderr_tail.len() <= 4096);
}

#[tokio::test]
async fn function_starts_with_default_signal_dispositions() {
    let fx = Fixture::new();
    // Executed directly: a shell would set its own dispositions.
    let mut spec = fx.spec("");
    spec.argv = vec![
        "grep".into(),
        "-E".into(),
        "^Sig(Ign|Blk):".into(),
        "/proc/self/status".into(),
    ];
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    let s = text(&out.stdout);
    assert_eq!(out.status, Status::Exited(0), "{s}");
    // The runner ignores SIGPIPE (as every Rust program does); the function
    // must not inherit that.
    assert!(s.contains("SigBlk:\t0000000000000000"), "{s}");
    assert!(s.contains("SigIgn:\t0000000000000000"), "{s}");
}

#[tokio::test]
async fn killed_by_signal_is_reported() {
    let fx = Fixture::new();
    let out = fx.sh("kill -9 $$").await;
    assert_eq!(out.status, Status::Signaled(9));
}

#[tokio::test]
async fn honours_env_workdir_and_sees_a_private_world() {
    let fx = Fixture::new();
    let mut spec = fx.spec(
        "echo foo=$FOO; echo cwd=$(pwd); echo host=$(hostname); echo uid=$(id -u); \
         echo procs=$(ls /proc | grep -c '^[0-9]'); cat /proc/net/dev | tail -n +3 | wc -l; \
         ls /dev | tr '\\n' ' '; cat /etc/motd",
    );
    spec.workdir = "/work/dir".into();
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    let s = text(&out.stdout);
    assert_eq!(
        out.status,
        Status::Exited(0),
        "{s} {}",
        text(&out.stderr_tail)
    );
    assert!(s.contains("foo=bar\n"), "{s}");
    assert!(s.contains("cwd=/work/dir\n"), "{s}");
    assert!(s.contains("host=function\n"), "{s}");
    assert!(s.contains("uid=0\n"), "{s}");
    // sh and the command substitution's subshell/ls; never the host's processes.
    let procs: u32 = s
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(procs <= 5, "{s}");
    // Only `lo` in the network namespace.
    assert!(s.contains("\n1\n"), "{s}");
    for node in DEV_NODES {
        assert!(s.contains(node), "{node} missing: {s}");
    }
    assert!(s.contains("from the image"), "{s}");
}

#[tokio::test]
async fn runner_network_shares_the_host_namespace() {
    let fx = Fixture::new();
    let mut spec = fx.spec("cat /proc/net/dev | tail -n +3 | wc -l");
    spec.network = Network::Runner;
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    let host = std::fs::read_to_string("/proc/net/dev")
        .unwrap()
        .lines()
        .count()
        - 2;
    assert_eq!(text(&out.stdout).trim(), host.to_string());
}

#[tokio::test]
async fn runs_as_the_requested_user_when_ids_are_mapped() {
    let fx = Fixture::new();
    let mut spec = fx.spec("echo $(id -u):$(id -g)");
    spec.uid = 1000;
    spec.gid = 2000;
    if fx.sandbox.config().id_map.size() == 1 {
        let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
        assert!(err.to_string().contains("uid 1000 is not mapped"), "{err}");
        return;
    }
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(text(&out.stdout).trim(), "1000:2000");
}

#[tokio::test]
async fn writes_are_thrown_away_and_never_reach_the_layer() {
    let fx = Fixture::new();
    let out = fx
        .sh("echo changed > /etc/motd && touch /new-file && echo ok")
        .await;
    assert_eq!(text(&out.stdout), "ok\n", "{}", text(&out.stderr_tail));
    let out = fx
        .sh("cat /etc/motd; test -e /new-file && echo leaked")
        .await;
    assert_eq!(text(&out.stdout), "from the image\n");
    assert_eq!(
        std::fs::read_to_string(fx.layer().join("etc/motd")).unwrap(),
        "from the image\n"
    );
    assert!(!fx.layer().join("new-file").exists());
    // The scratch mount point stays empty on the host.
    let scratch = &fx.sandbox.config().scratch_dir;
    assert_eq!(std::fs::read_dir(scratch).unwrap().count(), 0);
}

#[tokio::test]
async fn timeout_kills_every_process_of_the_run() {
    let fx = Fixture::new();
    let marker = format!("{}", 4000 + std::process::id() % 1000);
    let spec = fx.spec(&format!(
        "sleep {marker} & (sleep {marker} &) ; setsid sleep {marker} & sleep {marker}"
    ));
    let out = fx
        .sandbox
        .run(&spec, b"", Duration::from_millis(800))
        .await
        .unwrap();
    assert_eq!(out.status, Status::TimedOut);
    assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
    assert_no_process_with(&format!("sleep\0{marker}"));
}

#[tokio::test]
async fn background_children_die_with_the_run() {
    let fx = Fixture::new();
    let marker = format!("{}", 5000 + std::process::id() % 1000);
    let out = fx
        .sh(&format!(
            "setsid sleep {marker} & sleep {marker} & echo done"
        ))
        .await;
    assert_eq!(out.status, Status::Exited(0));
    assert_eq!(text(&out.stdout), "done\n");
    assert_no_process_with(&format!("sleep\0{marker}"));
}

#[tokio::test]
async fn output_past_the_limit_is_cut_off() {
    let fx = Fixture::new();
    let out = fx
        .sh("dd if=/dev/zero bs=1M count=64 2>/dev/null; sleep 30")
        .await;
    assert_eq!(out.status, Status::OutputTooLarge);
    assert!(out.stdout.len() <= 32 << 20);
    assert!(out.elapsed < Duration::from_secs(10));
}

#[tokio::test]
async fn unread_input_does_not_block() {
    let fx = Fixture::new();
    let input = vec![b'x'; 16 << 20];
    let out = fx
        .sandbox
        .run(&fx.spec("echo ignored"), &input, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(out.status, Status::Exited(0));
    assert_eq!(text(&out.stdout), "ignored\n");
}

#[tokio::test]
async fn missing_entrypoint_is_a_clear_error() {
    let fx = Fixture::new();
    let mut spec = fx.spec("");
    spec.argv = vec!["no-such-binary".into()];
    let err = fx
        .sandbox
        .run(&spec, b"", TIMEOUT)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("execute the entrypoint"), "{err}");
    assert!(err.contains("no-such-binary"), "{err}");
    assert!(err.contains("ENOENT"), "{err}");
}

#[tokio::test]
async fn dropping_the_run_kills_it() {
    let fx = Fixture::new();
    let marker = format!("{}", 6000 + std::process::id() % 1000);
    let spec = fx.spec(&format!("sleep {marker}"));
    let run = fx.sandbox.run(&spec, b"", TIMEOUT);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), run)
            .await
            .is_err()
    );
    assert_no_process_with(&format!("sleep\0{marker}"));
}

/// Many sandboxes at once from a multi-threaded runtime while other threads
/// allocate: the child must never touch the allocator or a lock.
#[test]
fn concurrent_spawns_while_other_threads_allocate() {
    let fx = Arc::new(Fixture::alone());
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let v: Vec<String> = (0..64).map(|j| format!("{i}-{j}-{n}")).collect();
                    n += v.len() as u64;
                    std::hint::black_box(v);
                }
                n
            })
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..64 {
            let fx = fx.clone();
            tasks.push(tokio::spawn(async move {
                let mut spec = fx.spec("");
                spec.argv = vec!["cat".into()];
                let input = format!("run {i}\n").repeat(1000);
                let out = fx
                    .sandbox
                    .run(&spec, input.as_bytes(), TIMEOUT)
                    .await
                    .unwrap();
                assert_eq!(out.status, Status::Exited(0));
                assert_eq!(out.stdout, input.as_bytes());
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("a spawn hung")
                .unwrap();
        }
    });
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        assert!(c.join().unwrap() > 0);
    }
}

#[test]
fn plan_builds_the_root_in_a_safe_order() {
    let fx = Fixture::new();
    let steps = crate::steps::rootfs(fx.sandbox.config(), &fx.spec("true"), "t", false).unwrap();
    let described: Vec<String> = steps.iter().map(Step::describe).collect();
    let pos = |needle: &str| {
        described
            .iter()
            .position(|d| d.ends_with(needle))
            .unwrap_or_else(|| panic!("{needle} not in {described:#?}"))
    };
    assert!(matches!(&steps[0], Step::Mount { flags, .. } if flags & libc::MS_PRIVATE != 0));
    let overlay = described
        .iter()
        .position(|d| d.starts_with("mount overlay on"))
        .unwrap();
    assert!(overlay < pos("pivot_root into the new root"));
    assert!(pos("pivot_root into the new root") < pos("mount proc on /proc"));
    assert!(pos("pivot_root into the new root") < pos("mount tmpfs on /tmp"));
    assert!(pos("mount tmpfs on /dev") < pos("/dev/null"));
    assert!(pos("detach /.fnrun-old-root-t") > pos("mount /.fnrun-old-root-t/dev/tty on /dev/tty"));
    assert!(described.last().unwrap().contains("loopback"));
    // Masks need /proc and /dev/null; sysfs needs the host's still visible.
    assert!(pos("mask /proc/kcore") > pos("mount proc on /proc"));
    assert!(pos("mask /proc/kcore") > pos("mount /.fnrun-old-root-t/dev/null on /dev/null"));
    assert!(pos("mount sysfs on /sys") < pos("mask /sys/firmware"));
    assert!(pos("mount sysfs on /sys") < pos("detach /.fnrun-old-root-t"));
    assert!(pos("bind /proc/sys read-only") > pos("mount proc on /proc"));
    assert!(pos("remount /dev read-only") > pos("mount tmpfs on /dev/shm"));
    assert!(pos("remount /dev read-only") > pos("symlink /dev/stderr"));
    assert!(pos("start a new session") > pos("detach /.fnrun-old-root-t"));
}

/// The lines of /proc/self/status whose key is one of `keys`.
fn status_fields<'a>(status: &'a str, keys: &[&str]) -> Vec<(&'a str, &'a str)> {
    status
        .lines()
        .filter_map(|l| l.split_once(":\t"))
        .filter(|(k, _)| keys.contains(k))
        .collect()
}

#[tokio::test]
async fn the_function_has_no_privileges_and_a_seccomp_filter() {
    let fx = Fixture::new();
    let out = fx.sh("cat /proc/self/status").await;
    let s = text(&out.stdout);
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    let caps = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let fields = status_fields(&s, &caps);
    assert_eq!(fields.len(), caps.len(), "{s}");
    for (key, value) in fields {
        assert_eq!(value, "0000000000000000", "{key} in {s}");
    }
    assert_eq!(status_fields(&s, &["NoNewPrivs"]), [("NoNewPrivs", "1")]);
    // 2 = SECCOMP_MODE_FILTER.
    assert_eq!(status_fields(&s, &["Seccomp"]), [("Seccomp", "2")]);
}

#[tokio::test]
async fn mount_unshare_and_friends_are_denied() {
    let fx = Fixture::new();
    let out = fx
        .sh("mount -t tmpfs none /tmp; echo mount=$?; \
             unshare -U true; echo unshare-user=$?; \
             unshare -Um true; echo unshare-mount=$?")
        .await;
    let s = text(&out.stdout);
    let e = text(&out.stderr_tail);
    for line in ["mount=", "unshare-user=", "unshare-mount="] {
        let code = s
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .unwrap_or_else(|| panic!("{line} missing: {s} {e}"));
        assert_ne!(code, "0", "{line}: {s} {e}");
    }
    // EPERM from the filter (busybox words it its own way for mount).
    assert!(e.contains("mount: permission denied"), "{e}");
    assert_eq!(e.matches("Operation not permitted").count(), 2, "{e}");
}

#[tokio::test]
async fn without_seccomp_the_same_calls_reach_the_kernel() {
    // The control for the tests above: an operator who turns seccomp off gets
    // an unfiltered function, which may create a user namespace (without any
    // capability) and a mount namespace inside it.
    let mut fx = Fixture::new();
    let mut config = fx.sandbox.config().clone();
    config.seccomp = None;
    fx.sandbox = Sandbox::new(config).unwrap();
    let out = fx
        .sh("grep Seccomp: /proc/self/status; unshare -Um true; echo unshare=$?")
        .await;
    let s = text(&out.stdout);
    assert!(s.contains("Seccomp:\t0\n"), "{s}");
    assert!(s.contains("unshare=0\n"), "{s} {}", text(&out.stderr_tail));
}

#[tokio::test]
async fn proc_sys_and_dev_are_masked_or_read_only() {
    // A run's own network namespace, for a fresh sysfs whose paths to mask
    // exist (in a kind's, `/sys` is an empty tmpfs: see `netns`).
    let fx = Fixture::with(|c| c.network_namespaces = crate::NetworkNamespaces::PerRun);
    let out = fx
        .sh("echo x > /proc/sys/kernel/hostname; echo hostname=$?; \
             echo x > /proc/sysrq-trigger; echo sysrq=$?; \
             touch /sys/x; echo sys=$?; \
             touch /dev/x; echo dev=$?; \
             echo discarded > /dev/null; echo null=$?; \
             echo shm > /dev/shm/x; echo shm=$?; \
             echo kcore=$(cat /proc/kcore | wc -c); \
             stat -c 'kcore-type=%F %t,%T' /proc/kcore; \
             echo acpi=$(ls -A /proc/acpi | wc -l) firmware=$(ls -A /sys/firmware | wc -l); \
             cat /proc/self/mountinfo")
        .await;
    let s = text(&out.stdout);
    let e = text(&out.stderr_tail);
    let sysrq = Path::new("/proc/sysrq-trigger").exists();
    for (key, ok) in [
        ("hostname", false),
        ("sysrq", false),
        ("sys", false),
        ("dev", false),
        ("null", true),
        ("shm", true),
    ] {
        let code = s
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} missing: {s}"));
        assert_eq!(code == "0", ok, "{key}={code}: {s} {e}");
    }
    // EROFS, not EACCES: the read-only mounts refuse, not permissions alone.
    for path in [
        "/proc/sys/kernel/hostname",
        "/proc/sysrq-trigger",
        "/sys/x",
        "/dev/x",
    ] {
        if path == "/proc/sysrq-trigger" && !sysrq {
            continue; // Not in this kernel (CONFIG_MAGIC_SYSRQ off).
        }
        assert!(
            e.lines()
                .any(|l| l.contains(path) && l.contains("Read-only file system")),
            "{path}: {e}"
        );
    }
    // Masked: /dev/null over files, an empty tmpfs over directories.
    assert!(s.contains("kcore=0\n"), "{s}");
    if Path::new("/proc/kcore").exists() {
        assert!(s.contains("kcore-type=character special file 1,3\n"), "{s}");
    }
    assert!(s.contains("acpi=0 firmware=0\n"), "{s}");
    // mountinfo: mount point is field 5, per-mount options field 6.
    let mounts: Vec<(&str, &str)> = s
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 6).then(|| (f[4], f[5]))
        })
        .collect();
    let options = |point: &str| {
        mounts
            .iter()
            .rev()
            .find(|(p, _)| *p == point)
            .map(|(_, o)| *o)
    };
    for path in READ_ONLY_PATHS.iter().chain(["/sys", "/dev"].iter()) {
        if path.starts_with("/proc") && !Path::new(path).exists() {
            continue;
        }
        let o = options(path).unwrap_or_else(|| panic!("{path} is not a mount: {s}"));
        assert!(o.starts_with("ro,"), "{path} is {o}");
    }
    for path in MASKED_PATHS {
        if Path::new(path).exists() {
            assert!(options(path).is_some(), "{path} is not masked: {s}");
        }
    }
}

/// A masked directory gets its tmpfs without a bind of `/dev/null` tried
/// over it first (a bind the kernel refuses only after cloning the mount,
/// whose drop then waits out an expedited RCU grace period, host-wide), a
/// missing path is passed over, and a file gets `/dev/null`. Shown in a
/// root without `/dev/null`, where no bind of it can succeed: the directory
/// is masked all the same, and the file's mask fails instead of being
/// passed over as missing.
#[test]
fn a_mask_goes_by_the_type_of_its_path() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("f"), "x").unwrap();
    let root = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
    let mask = |path: &std::ffi::CStr| Step::Mask {
        path: path.to_owned(),
    };
    let (d, missing, f) = (mask(c"/d"), mask(c"/missing"), mask(c"/f"));
    // The child of a threaded process: raw system calls only, then _exit,
    // with the first check that failed as its status.
    let child = || -> i32 {
        // SAFETY: unshare, chroot, statfs and statvfs are system calls; the
        // strings and steps were made before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return 10;
            }
            if crate::sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None).is_err()
                || libc::chroot(root.as_ptr()) != 0
                || libc::chdir(c"/".as_ptr()) != 0
            {
                return 11;
            }
            let mut trees = crate::steps::Trees::new();
            if d.run(&mut trees).is_err() {
                return 20;
            }
            let mut fs: libc::statfs = std::mem::zeroed();
            if libc::statfs(c"/d".as_ptr(), &mut fs) != 0 || fs.f_type != libc::TMPFS_MAGIC {
                return 21;
            }
            let mut vfs: libc::statvfs = std::mem::zeroed();
            if libc::statvfs(c"/d".as_ptr(), &mut vfs) != 0 || vfs.f_flag & libc::ST_RDONLY == 0 {
                return 22;
            }
            if missing.run(&mut trees).is_err() {
                return 30;
            }
            if f.run(&mut trees) != Err(nix::errno::Errno::ENOENT) {
                return 40;
            }
            0
        }
    };
    // SAFETY: the child only calls `child` and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: _exit ends the child without running the parent's
        // destructors or atexit handlers.
        unsafe { libc::_exit(child()) }
    }
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0),
        "10: unshare, 11: the root, 2x: the directory (20: the step, 21: not a \
         tmpfs, 22: writable), 30: the missing path, 40: the file"
    );
}

#[tokio::test]
async fn sys_is_a_read_only_sysfs_or_empty() {
    let mut fx = Fixture::with(|c| c.network_namespaces = crate::NetworkNamespaces::PerRun);
    let out = fx.sh("ls /sys/class/net; ls /sys/fs/cgroup | wc -l").await;
    assert_eq!(text(&out.stdout), "lo\n0\n", "{}", text(&out.stderr_tail));
    let mut spec = fx.spec("ls -A /sys | wc -l");
    spec.network = Network::Runner;
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(text(&out.stdout), "0\n", "{}", text(&out.stderr_tail));
    // In a kind's network namespace (root), an empty tmpfs too.
    fx.reconfigure(|c| c.network_namespaces = crate::NetworkNamespaces::PerKind);
    if fx.sandbox.shares_network_namespaces() {
        let out = fx.sh("ls -A /sys | wc -l; echo x > /sys/x; echo $?").await;
        assert_eq!(text(&out.stdout), "0\n1\n", "{}", text(&out.stderr_tail));
    }
}

#[tokio::test]
async fn resource_limits_stay_within_the_hard_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let fx = Fixture::new();
    // A soft limit below the hard one, as on most hosts, so the test shows the
    // function gets the hard limit (capped) rather than what the runner had.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard / 2), hard).unwrap();
    let out = fx
        .sh("echo $(ulimit -n) $(ulimit -Hn) $(ulimit -c) $(ulimit -Hc)")
        .await;
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let nofile = hard.min(1 << 20);
    assert_eq!(
        text(&out.stdout),
        format!("{nofile} {nofile} 0 0\n"),
        "{}",
        text(&out.stderr_tail)
    );
}

#[tokio::test]
async fn the_function_has_its_own_session() {
    let fx = Fixture::new();
    // Field 6 of /proc/PID/stat is the session id, seen from the sandbox's PID
    // namespace: 1 (init's) rather than 0 (the runner's, outside).
    let out = fx.sh("cut -d ' ' -f 6 /proc/self/stat").await;
    assert_eq!(text(&out.stdout), "1\n", "{}", text(&out.stderr_tail));
}

fn assert_no_process_with(needle: &str) {
    // Give the kernel a moment to finish tearing down the PID namespace.
    for _ in 0..50 {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .any(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()));
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("a process with {needle:?} outlived its run");
}

#[test]
fn limit_support_is_reported() {
    let fx = Fixture::new();
    let support = fx.sandbox.limit_support();
    println!("limits on this host: {support}");
    // The pids limit is always enforced, by a cgroup or by the rlimit.
    assert!(support.pids.is_available(), "{support}");
    if nix::unistd::geteuid().is_root() {
        // This project's hosts: root has the v1 controllers.
        for e in [&support.memory, &support.cpu, &support.pids] {
            assert!(matches!(e, Enforcement::Cgroup(_)), "{support}");
        }
    }
}

#[tokio::test]
async fn memory_limit_ends_a_balloon_with_out_of_memory() {
    let mut fx = Fixture::alone();
    // tail keeps its whole input when it has no newline: one process that
    // holds 200 MiB.
    let mut spec = fx.spec("head -c 200m /dev/zero | tail > /dev/null");
    spec.limits.memory_bytes = Some(64 << 20);
    if !fx.sandbox.limit_support().memory.is_available() {
        // Rootless without a delegated cgroup.
        let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
        assert!(
            matches!(err, Error::LimitUnavailable { what: "memory", .. }),
            "{err}"
        );
        fx.reconfigure(|c| c.best_effort_limits = true);
        let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
        assert_eq!(out.status, Status::Exited(0));
        return;
    }
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(
        out.status,
        Status::OutOfMemory,
        "{}",
        text(&out.stderr_tail)
    );
    let peak = out.peak_memory_bytes.unwrap();
    assert!(peak <= 64 << 20 && peak > 32 << 20, "peak {peak}");

    // The control: without the limit the same run succeeds.
    spec.limits.memory_bytes = None;
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    let peak = out.peak_memory_bytes.unwrap();
    assert!(peak > 150 << 20, "peak {peak}");
}

#[tokio::test]
async fn fork_bomb_is_contained_by_the_default_pids_limit() {
    let fx = Fixture::alone();
    let limit = fx.sandbox.config().default_pids_limit;
    let marker = format!("bomb{}", std::process::id());
    // The bomb runs for a few seconds; on a machine busy with other work
    // (the test command builds its Go peers meanwhile) it may not reach the
    // limit in that time, and gets a longer window once. Each run must be
    // contained.
    for (window, last) in [(3, false), (12, true)] {
        let (at_once, seen, out) = fork_bomb(&fx, &marker, window).await;
        println!(
            "fork bomb for {window} s: at most {at_once} processes at once, {seen} in one scan \
             (limit {limit}, {}), {:?}, {:?}",
            fx.sandbox.limit_support().pids,
            out.status,
            out.elapsed
        );
        assert!(at_once as u64 <= limit, "{at_once} processes at once");
        assert_no_process_with(&marker);
        let reached = seen > 100 && text(&out.stderr_tail).contains("can't fork");
        if !reached && !last {
            continue;
        }
        // It went off and ran into the limit (the host's own limits are far
        // away), and the run went on to its end.
        assert!(seen > 100, "the bomb never went off: {seen}");
        assert!(
            text(&out.stderr_tail).contains("can't fork"),
            "the bomb never reached the limit: {}",
            text(&out.stderr_tail)
        );
        assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
        assert_eq!(text(&out.stdout), "done\n");
        return;
    }
}

/// Runs a fork bomb for `seconds` in a sandbox of `fx`, counting its
/// processes from outside: the most seen alive at once, the most in one scan
/// of `/proc`, and the run's outcome.
async fn fork_bomb(fx: &Fixture, marker: &str, seconds: u64) -> (usize, usize, Outcome) {
    // Every process of the bomb is a fork of this shell, so carries the marker
    // in its command line. Each one waits for the two it forks, so the tree
    // only grows until forks fail. The shell forks its sleep first and then
    // nothing more (a failed fork ends a non-interactive busybox sh).
    let spec = fx.spec(&format!(
        ": {marker}; sleep {seconds} & s=$!; b() {{ b | b; }}; b & wait $s; echo done"
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let counter = {
        let stop = stop.clone();
        let needle = marker.to_owned();
        std::thread::spawn(move || {
            // One scan of /proc is no snapshot: while it reads, bomb
            // processes end and others take their place, and it can count
            // more than ever lived at once. A process seen by two scans in a
            // row lived through the time between them, so those seen by both
            // lived at the same time: that count is the one held to the
            // limit. It may see none on a loaded machine, where a scan takes
            // longer than the bomb's processes live; whether the bomb went
            // off at all is what a single scan tells.
            let (mut at_once, mut seen) = (0, 0);
            let mut before = processes_with(&needle);
            while !stop.load(Ordering::Relaxed) {
                let now = processes_with(&needle);
                at_once = at_once.max(before.intersection(&now).count());
                seen = seen.max(now.len());
                before = now;
            }
            (at_once, seen)
        })
    };
    // The timeout is a safety net only: the limit must contain the bomb.
    let out = fx
        .sandbox
        .run(&spec, b"", Duration::from_secs(seconds + 5))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let (at_once, seen) = counter.join().unwrap();
    (at_once, seen, out)
}

/// How many processes have `needle` in their command line.
fn processes_with(needle: &str) -> std::collections::HashSet<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
                .then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn cpu_limit_slows_a_busy_loop() {
    let mut fx = Fixture::alone();
    // Counts loop iterations for one second of wall time.
    let script = "i=0; trap 'echo $i; exit 0' USR1; (sleep 1; kill -USR1 $$) & \
                  while :; do i=$((i+1)); done";
    let free = fx.spec(script);
    let mut limited = fx.spec(script);
    limited.limits.cpu_millis = Some(100);
    if !fx.sandbox.limit_support().cpu.is_available() {
        let err = fx.sandbox.run(&limited, b"", TIMEOUT).await.unwrap_err();
        assert!(
            matches!(err, Error::LimitUnavailable { what: "cpu", .. }),
            "{err}"
        );
        fx.reconfigure(|c| c.best_effort_limits = true);
        let out = fx.sandbox.run(&limited, b"", TIMEOUT).await.unwrap();
        assert_eq!(out.status, Status::Exited(0));
        return;
    }
    let count = |o: &Outcome| -> u64 {
        text(&o.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{o:?}"))
    };
    // The comparison needs a CPU for the free loop: on a machine busy with
    // other work (builds of other crates...) it is retried a few times.
    for attempt in 1.. {
        // Side by side, so that both see the same load from anything else.
        let (free, limited) = tokio::join!(
            fx.sandbox.run(&free, b"", TIMEOUT),
            fx.sandbox.run(&limited, b"", TIMEOUT)
        );
        let (free, limited) = (free.unwrap(), limited.unwrap());
        let (n_free, n_limited) = (count(&free), count(&limited));
        let (cpu_free, cpu_limited) = (free.cpu_time.unwrap(), limited.cpu_time.unwrap());
        println!(
            "1 s busy loop: {n_free} iterations ({cpu_free:?} CPU) free, \
             {n_limited} ({cpu_limited:?} CPU) at 100m"
        );
        if cpu_free.as_secs_f64() < 0.5 * free.elapsed.as_secs_f64() && attempt < 5 {
            continue;
        }
        if cpu_free.as_secs_f64() >= 0.5 * free.elapsed.as_secs_f64() {
            assert!(
                n_free >= 4 * n_limited,
                "{n_free} iterations free, {n_limited} at 100m"
            );
        } else {
            println!("the machine stayed too busy to compare: checking the quota alone");
        }
        // 100m is a tenth of a CPU per 100 ms period; one period of slack.
        let most = limited.elapsed.as_secs_f64() / 10.0 + 0.1;
        assert!(
            cpu_limited.as_secs_f64() <= most,
            "{cpu_limited:?} of CPU in {:?} at 100m",
            limited.elapsed
        );
        break;
    }
}

#[tokio::test]
async fn requested_limits_are_refused_or_applied_never_ignored() {
    let mut fx = Fixture::new();
    let mut spec = fx.spec("echo ok");
    spec.limits = Limits {
        memory_bytes: Some(256 << 20),
        cpu_millis: Some(500),
        pids: Some(64),
    };
    let support = fx.sandbox.limit_support().clone();
    if support.memory.is_available() && support.cpu.is_available() {
        let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
        assert_eq!(text(&out.stdout), "ok\n");
        assert!(out.peak_memory_bytes.is_some());
        assert!(out.cpu_time.is_some());
    } else {
        let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
        assert!(matches!(err, Error::LimitUnavailable { .. }), "{err}");
        assert!(err.to_string().contains("cannot be enforced"), "{err}");
        fx.reconfigure(|c| c.best_effort_limits = true);
        let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
        assert_eq!(text(&out.stdout), "ok\n");
    }
}

#[tokio::test]
async fn an_explicit_pids_limit_caps_the_run() {
    let fx = Fixture::new();
    let mut spec = fx.spec(
        "n=0; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & n=$((n+1)); done; \
         echo started; ls /proc | grep -c '^[0-9]'",
    );
    spec.limits.pids = Some(8);
    let out = fx
        .sandbox
        .run(&spec, b"", Duration::from_secs(10))
        .await
        .unwrap();
    let s = text(&out.stdout);
    // init, the shell and its sleeps; `ls` and `grep` need slots too, so the
    // count, when it can be taken at all, stays within the limit.
    let count: Option<u64> = s.lines().nth(1).and_then(|l| l.trim().parse().ok());
    assert!(count.is_none_or(|c| c <= 8), "{s}");
    assert!(
        text(&out.stderr_tail).contains("fork"),
        "{s} {}",
        text(&out.stderr_tail)
    );
}

#[test]
fn sandbox_start_sweeps_run_cgroups_of_a_dead_daemon() {
    let fx = Fixture::new();
    let Some(driver) = fx.sandbox.limiter.driver() else {
        return;
    };
    // pid 1 of this PID namespace did not start then: a daemon that is gone.
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let stale = format!("{ns}-1-999999999999-0-0");
    let dirs: Vec<PathBuf> = driver.parents().iter().map(|p| p.join(&stale)).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let _again = Sandbox::new(fx.sandbox.config().clone()).unwrap();
    for d in &dirs {
        assert!(!d.exists(), "{} survived the sweep", d.display());
    }
}

/// The v1 driver of `fx`, when runs get pooled cgroups here (root on a v1 host).
fn pooled_v1(fx: &Fixture) -> bool {
    fx.sandbox
        .limiter
        .driver()
        .is_some_and(|d| d.version() == CgroupVersion::V1)
        && nix::unistd::geteuid().is_root()
}

/// The memory, CPU and pids limits of the run of `fx` that is under way, as
/// its cgroup files hold them.
async fn busy_limits(fx: &Fixture) -> (String, String, String) {
    (
        busy_cgroup_file(fx, "memory", "memory.limit_in_bytes").await,
        busy_cgroup_file(fx, "cpu", "cpu.cfs_quota_us").await,
        busy_cgroup_file(fx, "pids", "pids.max").await,
    )
}

/// The cgroups of what clones the inits of `fx`: its spawner, or this thread.
fn cloner_cgroups(fx: &Fixture) -> String {
    let path = fx.sandbox.spawner_pid().map_or_else(
        || "/proc/thread-self/cgroup".to_owned(),
        |pid| format!("/proc/{pid}/cgroup"),
    );
    std::fs::read_to_string(path).unwrap()
}

/// Reads `file` of the one cgroup of `fx` that holds a process, once a run has
/// put one there.
async fn busy_cgroup_file(fx: &Fixture, controller: &str, file: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let busy = cgroups_left(&fx.sandbox).into_iter().find(|d| {
            d.starts_with(Path::new("/sys/fs/cgroup").join(controller))
                && std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| !p.is_empty())
        });
        if let Some(dir) = busy {
            return std::fs::read_to_string(dir.join(file))
                .unwrap()
                .trim()
                .to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {controller} cgroup of the sandbox holds a process");
}

#[tokio::test]
async fn v1_runs_reuse_one_cgroup_with_their_own_limits_and_usage() {
    let fx = Fixture::new();
    if !pooled_v1(&fx) {
        return;
    }
    let home = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
    // 1: limits on, a busy loop, then an OOM kill.
    let mut spec = fx.spec(
        "sleep 0.3; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; \
         head -c 64m /dev/zero | tail > /dev/null",
    );
    spec.limits = Limits {
        memory_bytes: Some(16 << 20),
        cpu_millis: Some(1500),
        pids: Some(50),
    };
    let (first, limits) = tokio::join!(fx.sandbox.run(&spec, b"", TIMEOUT), busy_limits(&fx));
    let first = first.unwrap();
    assert_eq!(
        limits,
        ("16777216".into(), "150000".into(), "50".into()),
        "the first run's limits"
    );
    assert_eq!(first.status, Status::OutOfMemory, "{first:?}");
    let slots = cgroups_left(&fx.sandbox);
    assert!(
        !slots.is_empty(),
        "v1 keeps the run's cgroups for the next run"
    );
    // The cloning thread (the spawner's) went back to its own cgroups.
    assert_eq!(cloner_cgroups(&fx), home);
    // An idle slot holds no limit that could hold up the next clone.
    let memory = slots
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/memory"))
        .unwrap();
    let unlimited: u64 = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(unlimited > 1 << 50, "idle memory limit {unlimited}");

    // 2: the same cgroups, the default limits, and only its own usage: the
    // first run's OOM kill and CPU time do not count.
    let mut spec = fx.spec("sleep 0.3; exit 3");
    spec.limits = Limits::default();
    let (second, limits) = tokio::join!(fx.sandbox.run(&spec, b"", TIMEOUT), busy_limits(&fx));
    let second = second.unwrap();
    assert_eq!(
        cgroups_left(&fx.sandbox),
        slots,
        "the second run reused them"
    );
    assert_eq!(limits.0, unlimited.to_string());
    assert_eq!(limits.1, "-1");
    assert_eq!(limits.2, fx.sandbox.config().default_pids_limit.to_string());
    assert_eq!(second.status, Status::Exited(3), "{second:?}");
    let (busy, idle) = (first.cpu_time.unwrap(), second.cpu_time.unwrap());
    assert!(idle * 4 < busy, "cpu time: first {busy:?}, second {idle:?}");
    assert!(
        second.peak_memory_bytes.unwrap() < 16 << 20,
        "{:?}",
        second.peak_memory_bytes
    );
    assert_eq!(cloner_cgroups(&fx), home);
}

/// This process's descriptors open on a file in one of `dirs`.
fn descriptors_into(dirs: &[PathBuf]) -> std::collections::BTreeSet<(String, PathBuf)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            dirs.iter()
                .any(|d| target.parent() == Some(d.as_path()))
                .then(|| (e.file_name().to_string_lossy().into_owned(), target))
        })
        .collect()
}

#[tokio::test]
async fn a_reused_v1_slot_keeps_its_files_open_until_it_is_removed() {
    let fx = Fixture::new();
    if !pooled_v1(&fx) {
        return;
    }
    assert_eq!(fx.sh("exit 0").await.status, Status::Exited(0));
    let slot = cgroups_left(&fx.sandbox);
    let first = descriptors_into(&slot);
    let names: std::collections::BTreeSet<_> = first
        .iter()
        .filter_map(|(_, p)| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    for name in ["tasks", "memory.max_usage_in_bytes", "cpuacct.usage"] {
        assert!(names.contains(name), "{name} is not kept open: {first:?}");
    }
    // A reused slot also resets its peak: one more file, then no other.
    assert_eq!(fx.sh("exit 1").await.status, Status::Exited(1));
    assert_eq!(cgroups_left(&fx.sandbox), slot, "the slot was reused");
    let second = descriptors_into(&slot);
    assert!(second.is_superset(&first), "{first:?} then {second:?}");
    let out = fx.sh("exit 2").await;
    assert_eq!(out.status, Status::Exited(2));
    assert!(out.cpu_time.is_some() && out.peak_memory_bytes.is_some());
    assert_eq!(
        descriptors_into(&slot),
        second,
        "the same files, not opened again"
    );
    drop(fx);
    assert_eq!(
        descriptors_into(&slot),
        Default::default(),
        "closed with the slot"
    );
    for d in &slot {
        assert!(!d.exists(), "{} was kept", d.display());
    }
}

#[test]
fn a_v1_cgroup_that_is_not_empty_after_its_run_is_removed_not_reused() {
    let fx = Fixture::new();
    if !pooled_v1(&fx) {
        return;
    }
    let driver = fx.sandbox.limiter.driver().unwrap();
    let name = format!("stray-{}", std::process::id());
    let mut run = driver.create(&name, &Limits::default()).unwrap();
    let dirs = run.dirs();
    assert!(dirs.iter().all(|d| d.ends_with(&name)), "{dirs:?}");
    // Nothing to kill yet: its process list is read while empty. v1 caches
    // that list for a second for the open file that read it.
    run.kill().unwrap();
    // A process the run left behind.
    let mut stray = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    run.admit(libc::pid_t::try_from(stray.id()).unwrap(), false)
        .unwrap();
    run.remove().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(stray.wait().unwrap().signal(), Some(libc::SIGKILL));
    for d in &dirs {
        assert!(!d.exists(), "{} was kept", d.display());
    }
    // The next run gets cgroups of its own.
    let next = driver.create("next", &Limits::default()).unwrap();
    assert!(next.dirs().iter().all(|d| d.ends_with("next")));
}

#[tokio::test]
async fn without_the_pool_each_v1_run_gets_cgroups_of_its_own() {
    let fx = Fixture::with(|c| c.cgroup.pool = false);
    if !pooled_v1(&fx) {
        return;
    }
    let home = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
    let mut spec = fx.spec("sleep 0.3; head -c 64m /dev/zero | tail > /dev/null");
    spec.limits.memory_bytes = Some(16 << 20);
    let (out, limit) = tokio::join!(
        fx.sandbox.run(&spec, b"", TIMEOUT),
        busy_cgroup_file(&fx, "memory", "memory.limit_in_bytes")
    );
    assert_eq!(limit, "16777216");
    assert_eq!(out.unwrap().status, Status::OutOfMemory);
    // Removed with the run, and init was moved in rather than cloned there.
    assert_eq!(cgroups_left(&fx.sandbox), Vec::<PathBuf>::new());
    assert_eq!(
        std::fs::read_to_string("/proc/thread-self/cgroup").unwrap(),
        home
    );
    let out = fx.sh("exit 3").await;
    assert_eq!(out.status, Status::Exited(3));
    assert_eq!(cgroups_left(&fx.sandbox), Vec::<PathBuf>::new());
}

/// Asserts that the prepared sandbox of init `init` holds its function and
/// nothing of the function's code yet: init's one child, waiting on a pipe
/// (the call's byte), not yet exec'd (its command line is still init's),
/// with every privilege dropped and the seccomp filter installed. Returns
/// its pid.
fn function_at_its_exec(init: i32) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap();
    let children: Vec<i32> = children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    let [function] = children[..] else {
        panic!("init {init} has children {children:?}, not one function");
    };
    let read = |what: &str| std::fs::read(format!("/proc/{function}/{what}")).unwrap();
    assert_eq!(
        read("cmdline"),
        std::fs::read(format!("/proc/{init}/cmdline")).unwrap(),
        "the function exec'd before its call"
    );
    let wchan = String::from_utf8(read("wchan")).unwrap();
    assert!(
        wchan.ends_with("pipe_read"),
        "the function waits in {wchan}"
    );
    for (field, want) in [
        ("CapEff", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ] {
        assert_eq!(
            proc_status(function, field).as_deref(),
            Some(want),
            "{field} of the waiting function"
        );
    }
    function
}

/// A field of `/proc/<pid>/status` ("PPid", "Threads", ...).
fn proc_status(pid: i32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// The host pid of the init of the run whose function's command line is
/// `cmdline` (NUL-separated), found while it runs: the ancestor of that process
/// whose parent is this process.
async fn init_of(cmdline: &str) -> i32 {
    let me = i32::try_from(std::process::id()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline.as_bytes())
            });
        let mut pid = found;
        while let Some(p) = pid {
            let parent = proc_status(p, "PPid").and_then(|v| v.parse::<i32>().ok());
            if parent == Some(me) {
                return p;
            }
            pid = parent.filter(|&pp| pp > 1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no run of {cmdline:?} found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_is_cloned_by_the_spawner_as_a_child_of_this_process() {
    let fx = Fixture::new();
    let spec = fx.spec("sleep 1.25; echo done");
    let (out, init) = tokio::join!(
        fx.sandbox.run(&spec, b"", TIMEOUT),
        init_of("sleep\x001.25\x00")
    );
    assert_eq!(out.unwrap().stdout, b"done\n");
    // A clone of the spawner (it carries the name of the spawner's thread), and
    // this process's child: it reaped init through its pidfd.
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap_or_default(),
        "",
        "init {init} is still there"
    );
    let spawner = fx.sandbox.spawner_pid().expect("a spawner runs");
    let me = std::process::id().to_string();
    assert_eq!(proc_status(spawner, "PPid").as_deref(), Some(me.as_str()));
    assert_eq!(proc_status(spawner, "Threads").as_deref(), Some("1"));
    // It holds its socket and stdio, nothing of this process's.
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{spawner}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    fds.sort();
    assert!(fds.iter().all(|&fd| fd <= 3) && fds.contains(&3), "{fds:?}");
    // A pooled v1 cgroup was entered and left by the spawner, not by us.
    if pooled_v1(&fx) {
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{spawner}/cgroup")).unwrap(),
            std::fs::read_to_string("/proc/self/cgroup").unwrap()
        );
    }

    // Seen while it runs: init's name and parent.
    let spec = fx.spec("sleep 1.5; echo again");
    let check = async {
        let init = init_of("sleep\x001.5\x00").await;
        (
            std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap(),
            proc_status(init, "PPid"),
        )
    };
    let (out, (comm, parent)) = tokio::join!(fx.sandbox.run(&spec, b"", TIMEOUT), check);
    assert_eq!(out.unwrap().stdout, b"again\n");
    assert_eq!(comm.trim(), "fnrun-spawner");
    assert_eq!(parent.as_deref(), Some(me.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_spawner_init_is_cloned_here() {
    let fx = Fixture::with(|c| c.spawner = false);
    let spec = fx.spec("sleep 1.75; echo here");
    let check = async {
        let init = init_of("sleep\x001.75\x00").await;
        std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap()
    };
    let (out, comm) = tokio::join!(fx.sandbox.run(&spec, b"", TIMEOUT), check);
    assert_eq!(out.unwrap().stdout, b"here\n");
    assert_ne!(comm.trim(), "fnrun-spawner");
    assert_eq!(fx.sandbox.spawner_pid(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_spawner_is_replaced_and_runs_go_on() {
    let fx = Fixture::new();
    assert_eq!(fx.sh("echo one").await.stdout, b"one\n");
    let first = fx.sandbox.spawner_pid().expect("a spawner runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Reaped by its thread, then noticed at the next run.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.sandbox.spawner_pid() == Some(first) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fx.sandbox.spawner_pid(), None);
    assert_eq!(fx.sh("echo two").await.stdout, b"two\n");
    let second = fx.sandbox.spawner_pid().expect("a new spawner");
    assert_ne!(second, first);
    // Gone but maybe not reaped yet: the next run finds its socket closed, or
    // the reaped flag, and starts another either way.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_status(second, "State").is_some_and(|s| !s.starts_with('Z'))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(fx.sh("echo three").await.stdout, b"three\n");
    assert!(!matches!(fx.sandbox.spawner_pid(), Some(p) if p == second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_too_large_for_the_spawner_is_cloned_here() {
    let fx = Fixture::new();
    // Three variables of 100 KiB (one string may have at most 128 KiB).
    let mut spec = fx.spec("echo ${#A}${#B}${#C}");
    for name in ["A", "B", "C"] {
        spec.env.push(format!("{name}={}", "x".repeat(100 << 10)));
    }
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0));
    assert_eq!(out.stdout, b"102400102400102400\n");
}

/// `n` layers above the fixture's busybox layer, named like the cache names
/// them (a 64-hex digest each, all in one directory), each with a file of its
/// own and its own copy of `/deep/top`: the topmost must win.
fn deep_layers(fx: &Fixture, n: usize) -> Vec<PathBuf> {
    let parent = fx.dir.path().join("layers");
    let mut layers = vec![fx.layer()];
    for i in 0..n {
        let layer = parent.join(format!("{i:064x}"));
        std::fs::create_dir_all(layer.join("deep")).unwrap();
        std::fs::write(layer.join("deep").join(format!("f{i}")), "").unwrap();
        std::fs::write(layer.join("deep/top"), format!("layer {i}\n")).unwrap();
        for d in [&layer, &layer.join("deep")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if let IdMap::Range {
            host_uid, host_gid, ..
        } = fx.sandbox.config().id_map
        {
            chown_tree(&layer, host_uid, host_gid);
        }
        layers.push(layer);
    }
    layers
}

/// Whether this kernel's overlayfs takes `lowerdir+` (Linux 6.8).
fn kernel_has_lowerdir_plus() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    (next(), next()) >= (6, 8)
}

/// Docker's limit of 127 layers: 64-character names do not fit in one
/// `lowerdir` option (a page), so layers are added one by one with the new
/// mount API, or mounted through short names; the root's mount entry shows
/// which.
#[tokio::test]
async fn an_image_of_127_layers_runs() {
    for (overlay, first_lower) in [
        (
            OverlayMount::Auto,
            if kernel_has_lowerdir_plus() {
                format!("lowerdir+={:064x}", 126)
            } else {
                "lowerdir=0".to_owned()
            },
        ),
        (OverlayMount::Legacy, "lowerdir=0".to_owned()),
    ] {
        let fx = Fixture::with(|c| c.overlay = overlay);
        let mut spec = fx.spec(
            "ls /deep | wc -l; cat /deep/top; \
             grep -o ' - overlay overlay rw,lowerdir[+]*=[^,:]*' /proc/self/mountinfo",
        );
        spec.layers = deep_layers(&fx, 127);
        let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
        assert_eq!(
            out.status,
            Status::Exited(0),
            "{overlay:?}: {}",
            text(&out.stderr_tail)
        );
        assert_eq!(
            text(&out.stdout),
            format!("128\nlayer 126\n - overlay overlay rw,{first_lower}\n"),
            "{overlay:?}"
        );
    }
}

mod mounts;
mod netns;
mod prepared;
mod service;

/// Clones as the launcher it wraps does, noting the thread that asked.
#[derive(Debug)]
struct ThreadNoting {
    inner: Box<dyn crate::launch::Launcher>,
    threads: Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
}

impl crate::launch::Launcher for ThreadNoting {
    fn clone_init(
        &self,
        request: &crate::launch::Request<'_>,
    ) -> Result<crate::launch::Launched, crate::launch::Failure> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        self.inner.clone_init(request)
    }

    fn spawner_pid(&self) -> Option<libc::pid_t> {
        self.inner.spawner_pid()
    }
}

#[test]
fn a_run_off_the_worker_makes_its_sandbox_on_the_blocking_pool() {
    let fx = Fixture::new();
    let mut sandbox = Sandbox::new(fx.sandbox.config().clone()).unwrap();
    let threads = Arc::<std::sync::Mutex<Vec<_>>>::default();
    let inner = std::mem::replace(
        &mut sandbox.launcher,
        Box::new(crate::launch::Direct::new(None)),
    );
    sandbox.launcher = Box::new(ThreadNoting {
        inner,
        threads: threads.clone(),
    });
    let sandbox = Arc::new(sandbox);
    // One worker, this thread: a clone made on it holds up every task.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let worker = std::thread::current().id();
    let outcome = runtime
        .block_on(sandbox.run_off_worker(Arc::new(fx.spec("echo off")), b"", TIMEOUT))
        .unwrap();
    assert_eq!(outcome.status, Status::Exited(0));
    assert_eq!(outcome.stdout, b"off\n");
    // `run` clones on its caller's thread.
    let outcome = runtime
        .block_on(sandbox.run(&fx.spec("echo on"), b"", TIMEOUT))
        .unwrap();
    assert_eq!(outcome.stdout, b"on\n");
    let threads = threads.lock().unwrap();
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert_ne!(threads[0], worker, "run_off_worker cloned on the worker");
    assert_eq!(threads[1], worker);
}
