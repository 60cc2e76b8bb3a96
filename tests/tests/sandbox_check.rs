//! `fnrun serve` makes one sandbox before it listens, and refuses to start
//! where it cannot: a daemon that could run no function never says it is
//! ready (in a pod, a Ready pod that fails every call). Shown here with the
//! case a pod's default masked `/proc` makes: a path of `/proc` covered by
//! another mount, so that the kernel refuses a new procfs to anyone not in
//! the initial user namespace (as every sandbox's init is).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fnrun_tests::fnrun_bin;
use fnrun_tests::user::require_root;

/// Starts `fnrun serve` on a unix socket in `dir` with its cache there, in
/// a mount namespace of its own where `setup` (a shell snippet) ran first.
fn serve_in_mount_ns(setup: &str, dir: &Path) -> Child {
    let script = format!(
        "{setup}\nexec \"$0\" serve --listen \"unix:$1/fnrun.sock\" --cache-dir \"$1/cache\" \
         --shutdown-delay 0s"
    );
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(fnrun_bin())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare runs")
}

/// Waits up to 30 s for `child` to exit: its code and stderr.
fn exited(mut child: Child) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Entries named `sandbox-check*` in the cache of `dir`.
fn check_layers_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("cache"))
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().into_owned();
                    name.starts_with("sandbox-check").then_some(name)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_daemon_that_cannot_make_a_sandbox_refuses_to_start_naming_the_fix() {
    if !require_root("a_daemon_that_cannot_make_a_sandbox_refuses_to_start_naming_the_fix") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // /proc/timer_list covered, as a container runtime masks it.
    let child = serve_in_mount_ns(
        "mount --bind /dev/null /proc/timer_list || exit 99",
        dir.path(),
    );
    let (code, err) = exited(child);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("fnrun: cannot make a sandbox here, so no function could run")
            && err.contains("procMount: Unmasked"),
        "{err}"
    );
    assert!(err.len() < 4000, "bounded: {err}");
    // It never listened, and left no empty layer in its cache.
    assert!(!dir.path().join("fnrun.sock").exists());
    assert_eq!(check_layers_left(dir.path()), Vec::<String>::new());
}

#[test]
fn with_proc_unmasked_the_same_daemon_starts_and_serves() {
    if !require_root("with_proc_unmasked_the_same_daemon_starts_and_serves") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = serve_in_mount_ns("true", dir.path());
    let socket = dir.path().join("fnrun.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(socket.exists(), "it listens once its sandbox check passed");
    assert_eq!(check_layers_left(dir.path()), Vec::<String>::new());
    // `unshare` exec'd sh, which exec'd fnrun: the child is the daemon.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let (code, err) = exited(child);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn an_empty_layer_left_by_an_earlier_start_as_pid_1_is_no_obstacle() {
    if !require_root("an_empty_layer_left_by_an_earlier_start_as_pid_1_is_no_obstacle") {
        return;
    }
    // As in a container restarted on the same cache: fnrun is pid 1 every
    // time, and an earlier start killed before it removed its check's empty
    // layer left `sandbox-check-1`.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cache/sandbox-check-1")).unwrap();
    let script = "exec \"$0\" serve --listen \"unix:$1/fnrun.sock\" --cache-dir \"$1/cache\" \
                  --shutdown-delay 0s";
    let child = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGTERM",
            "sh",
            "-c",
            script,
        ])
        .arg(fnrun_bin())
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare runs");
    let socket = dir.path().join("fnrun.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let listening = socket.exists();
    // `unshare --fork` ignores SIGTERM while it waits: the daemon, its
    // child, is told.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
        .unwrap_or_default();
    for pid in children.split_whitespace() {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
    let (_, err) = exited(child);
    assert!(listening, "it started: {err}");
    assert_eq!(check_layers_left(dir.path()), Vec::<String>::new(), "{err}");
}
