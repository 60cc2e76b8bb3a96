//! Sandbox tests on real namespaces with a busybox-static root filesystem.
//! `scripts/test` installs busybox-static.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

const BUSYBOX: &str = "/bin/busybox";
const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "id", "hostname", "ls", "wc", "head", "dd", "mount", "pwd",
    "env", "touch", "test", "grep", "tr",
];

/// A temp dir with a busybox layer in it, readable by the sandbox's mapped root.
struct Fixture {
    dir: tempfile::TempDir,
    sandbox: Sandbox,
}

impl Fixture {
    fn new() -> Fixture {
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
        let sandbox = Sandbox::new(config).unwrap();
        Fixture { dir, sandbox }
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
            timeout: Duration::from_secs(20),
        }
    }

    async fn sh(&self, script: &str) -> Outcome {
        self.sandbox.run(&self.spec(script), b"").await.unwrap()
    }
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid, gid);
        }
    }
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
    let input: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
    let out = fx.sandbox.run(&spec, &input).await.unwrap();
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
    let out = fx.sandbox.run(&spec, b"").await.unwrap();
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
    let out = fx.sandbox.run(&spec, b"").await.unwrap();
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
        let err = fx.sandbox.run(&spec, b"").await.unwrap_err();
        assert!(err.to_string().contains("uid 1000 is not mapped"), "{err}");
        return;
    }
    let out = fx.sandbox.run(&spec, b"").await.unwrap();
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
    let mut spec = fx.spec(&format!(
        "sleep {marker} & (sleep {marker} &) ; setsid sleep {marker} & sleep {marker}"
    ));
    spec.timeout = Duration::from_millis(800);
    let out = fx.sandbox.run(&spec, b"").await.unwrap();
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
        .run(&fx.spec("echo ignored"), &input)
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
    let err = fx.sandbox.run(&spec, b"").await.unwrap_err().to_string();
    assert!(err.contains("execute the entrypoint"), "{err}");
    assert!(err.contains("no-such-binary"), "{err}");
    assert!(err.contains("ENOENT"), "{err}");
}

#[tokio::test]
async fn dropping_the_run_kills_it() {
    let fx = Fixture::new();
    let marker = format!("{}", 6000 + std::process::id() % 1000);
    let spec = fx.spec(&format!("sleep {marker}"));
    let run = fx.sandbox.run(&spec, b"");
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
    let fx = Arc::new(Fixture::new());
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
                let out = fx.sandbox.run(&spec, input.as_bytes()).await.unwrap();
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
    let steps = fx.sandbox.plan_steps(&fx.spec("true"), "t").unwrap();
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
