//! fnrun as root in a user namespace of its own that maps 65536 ids from 0
//! (as in a `hostUsers: false` pod): it holds CAP_SETUID and CAP_SETGID
//! there, but the ids `--map-root-uid` names by default (100000 on) do not
//! exist in it. Runs map the ids it has, and work; they used to fail at the
//! first layer (`cannot chown … Invalid argument`).

use std::io::{Read, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{require_root, unprivileged_userns_blocked};

/// The host ids the namespace's 0..65536 map to.
const OUTSIDE: u32 = 300_000;

#[test]
fn root_in_a_user_namespace_of_65536_ids_runs_functions() {
    if !require_root("fnrun in a user namespace of 65536 ids") {
        return;
    }
    if let Some(reason) = unprivileged_userns_blocked() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::busybox()
        .file("/etc/owned-by-nobody", "x", 0o644)
        .file(
            "/run.sh",
            "#!/bin/sh\ncat >/dev/null\nprintf 'desired: {}\\nresults:\\n- severity: Normal\\n  message: \"%s\"\\n' \"$(id -u) $(awk '{print $1\",\"$2\",\"$3}' /proc/self/uid_map)\"\n",
            0o755,
        )
        .entrypoint(["/run.sh"])
        .push_to(&registry, "fns/nested:v1");
    // Everything the namespace's root writes is its host id's.
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("input.yaml");
    std::fs::write(&input, SAMPLE).expect("input");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("cache dir");
    for path in [dir.path(), cache.as_path(), input.as_path()] {
        chown(path, Some(OUTSIDE), Some(OUTSIDE)).expect("chown");
    }

    // A new user namespace whose maps this test writes (host root may map
    // any ids): the child unshares it before its exec and sends its pid; a
    // thread of this test writes the maps and lets it go on; it takes uid and
    // gid 0 there and execs fnrun, which starts with every capability of the
    // namespace.
    let (pid_r, pid_w) = nix::unistd::pipe().expect("pipe");
    let (go_r, go_w) = nix::unistd::pipe().expect("pipe");
    let writer = std::thread::spawn(move || {
        let mut pid = [0u8; 4];
        std::fs::File::from(pid_r).read_exact(&mut pid)?;
        let pid = i32::from_ne_bytes(pid);
        for file in ["uid_map", "gid_map"] {
            std::fs::write(
                format!("/proc/{pid}/{file}"),
                format!("0 {OUTSIDE} 65536\n"),
            )?;
        }
        std::fs::File::from(go_w).write_all(b"g")
    });
    let (pid_w, go_r) = (pid_w.into_raw_fd(), go_r.into_raw_fd());
    let mut cmd = Command::new(fnrun_tests::fnrun_bin());
    cmd.args(["run", "--cache-dir"])
        .arg(&cache)
        .arg(&image)
        .arg(&input)
        .env("HOME", dir.path())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe system calls between fork and exec,
    // on memory made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: libc::c_int| {
                if r < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            check(libc::unshare(libc::CLONE_NEWUSER))?;
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(pid_w, pid.as_ptr().cast(), 4) != 4 {
                return Err(std::io::Error::last_os_error());
            }
            let mut go = [0u8; 1];
            if libc::read(go_r, go.as_mut_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::other("the maps were not written"));
            }
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(0, 0, 0))?;
            check(libc::setresuid(0, 0, 0))
        });
    }
    let child = cmd.spawn().expect("fnrun run starts");
    let _ = (nix::unistd::close(pid_w), nix::unistd::close(go_r));
    writer
        .join()
        .expect("writer")
        .expect("the maps are written");
    let out = child.wait_with_output().expect("fnrun run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fnrun run failed:\n{stdout}\n{stderr}"
    );
    // The function is root of a namespace of 65535 ids past the runner's.
    let message = fnrun_tests::functionio::last_message(&stdout);
    assert_eq!(message, "0 0,1,65535", "{stdout}\n{stderr}");
}
