//! Bind mounts of host paths and the caller's own ids, as root and rootless.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use super::*;
use crate::mounts::BindMount;

/// A host directory for a test's mount sources, reachable by the sandbox's
/// root (a host id without privileges), with `hello` in it.
fn host_dir(fx: &Fixture, name: &str, mode: u32) -> PathBuf {
    let dir = fx.dir.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("hello"), "hello from the host\n").unwrap();
    std::fs::set_permissions(dir.join("hello"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

fn with_mounts(fx: &Fixture, script: &str, mounts: Vec<BindMount>) -> RunSpec {
    let mut spec = fx.spec(script);
    spec.mounts = mounts;
    spec
}

#[test]
fn plan_clones_sources_first_and_attaches_targets_after_the_host_root_is_gone() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o755);
    let mounts = vec![
        BindMount::new(&data, "/a/b", false).unwrap(),
        BindMount::new(&data, "/a", true).unwrap(),
    ];
    let spec = with_mounts(&fx, "true", mounts);
    let steps = crate::steps::rootfs(fx.sandbox.config(), &spec, "t", false).unwrap();
    let described: Vec<String> = steps.iter().map(Step::describe).collect();
    let pos = |needle: &str| {
        described
            .iter()
            .position(|d| d.starts_with(needle) || d.ends_with(needle))
            .unwrap_or_else(|| panic!("{needle} not in {described:#?}"))
    };
    let source = format!("open the mount source {}", data.display());
    // Both sources right after the mounts are made private, parents first.
    assert!(
        matches!(&steps[1], Step::BindSource { index: 0, target, writable: true, .. } if target.to_str() == Ok("/a"))
    );
    assert!(
        matches!(&steps[2], Step::BindSource { index: 1, target, writable: false, .. } if target.to_str() == Ok("/a/b"))
    );
    assert_eq!(described[1], source);
    assert!(pos("mount overlay on") > 2);
    let a = pos(&format!("mount {} on /a", data.display()));
    let b = pos(&format!("mount {} on /a/b", data.display()));
    assert!(a < b);
    assert!(a > pos("rmdir /.fnrun-old-root-t"));
    assert!(b < pos("start a new session"));
    // Device nodes are bound read-only.
    assert!(pos("remount /dev/null read-only") > pos("on /dev/null"));

    let twice = with_mounts(
        &fx,
        "true",
        vec![
            BindMount::new(&data, "/a", false).unwrap(),
            BindMount::new(&data, "/a/", true).unwrap(),
        ],
    );
    let err = crate::steps::rootfs(fx.sandbox.config(), &twice, "t", false).unwrap_err();
    assert!(
        err.to_string().contains("two bind mounts on \"/a\""),
        "{err}"
    );
    let many = with_mounts(
        &fx,
        "true",
        (0..=crate::MAX_MOUNTS)
            .map(|i| BindMount::new(&data, &format!("/m{i}"), false).unwrap())
            .collect(),
    );
    let err = crate::steps::rootfs(fx.sandbox.config(), &many, "t", false).unwrap_err();
    assert!(
        err.to_string().contains("33 bind mounts; at most 32"),
        "{err}"
    );
}

#[tokio::test]
async fn a_read_only_mount_shows_the_host_files_and_refuses_every_write() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o777);
    // A submount of the source: read-only too (a plain read-only remount
    // would leave it writable). Only root can mount on the host.
    let _sub = nix::unistd::geteuid()
        .is_root()
        .then(|| HostTmpfs::mount(&data.join("sub")));
    let spec = with_mounts(
        &fx,
        "cat /data/hello; echo x > /data/new || echo refused; \
         if [ -d /data/sub ]; then echo x > /data/sub/new || echo sub refused; fi; \
         grep ' /data ' /proc/self/mountinfo",
        vec![BindMount::new(&data, "/data", false).unwrap()],
    );
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    let (s, e) = (text(&out.stdout), text(&out.stderr_tail));
    assert_eq!(out.status, Status::Exited(0), "{s}{e}");
    assert!(s.starts_with("hello from the host\nrefused\n"), "{s}");
    assert!(e.contains("Read-only file system"), "{e}");
    let options = s.lines().last().unwrap();
    assert!(options.contains(" ro,"), "{options}");
    assert!(
        options.contains("nosuid") && options.contains("nodev"),
        "{options}"
    );
    if nix::unistd::geteuid().is_root() {
        assert!(s.contains("sub refused"), "{s}");
    }
    assert!(!data.join("new").exists());
}

/// A tmpfs mounted on the host (in the test's own mount namespace), removed
/// on drop.
struct HostTmpfs(PathBuf);

impl HostTmpfs {
    fn mount(path: &Path) -> HostTmpfs {
        std::fs::create_dir(path).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0777"),
        )
        .unwrap();
        HostTmpfs(path.to_owned())
    }
}

impl Drop for HostTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn a_writable_mount_writes_through_to_the_host_as_the_functions_id() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o777);
    let spec = with_mounts(
        &fx,
        "echo written > /out/result; cat /out/hello",
        vec![BindMount::new(&data, "/out", true).unwrap()],
    );
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    assert_eq!(text(&out.stdout), "hello from the host\n");
    let result = data.join("result");
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "written\n");
    // Uid 0 inside is the sandbox's first mapped host id.
    let owner = match fx.sandbox.config().id_map {
        IdMap::Range { host_uid, .. } => host_uid,
        IdMap::Own { host_uid, .. } => host_uid,
    };
    assert_eq!(std::fs::metadata(&result).unwrap().uid(), owner);
}

#[tokio::test]
async fn a_file_mount_and_missing_target_directories_are_made_in_the_run() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o755);
    let spec = with_mounts(
        &fx,
        "cat /etc/deep/config.yaml; stat -c %F /etc/deep/config.yaml",
        vec![BindMount::new(&data.join("hello"), "/etc/deep/config.yaml", false).unwrap()],
    );
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    assert_eq!(text(&out.stdout), "hello from the host\nregular file\n");
    // The directories were made in the run's throwaway layer, not in the image.
    assert!(!fx.layer().join("etc/deep").exists());
}

#[tokio::test]
async fn an_image_symlink_cannot_take_the_target_out_of_the_run() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o755);
    // On the host, /up and /abs would lead to the host's /etc; in the run
    // they lead to the image's.
    symlink("../../../../../../../../etc", fx.layer().join("up")).unwrap();
    symlink("/etc", fx.layer().join("abs")).unwrap();
    symlink("/proc/self/root/etc", fx.layer().join("magic")).unwrap();
    symlink("/nowhere", fx.layer().join("dangling")).unwrap();
    let spec = with_mounts(
        &fx,
        "cat /etc/fnrun-planted-up/hello /etc/fnrun-planted-abs/hello",
        vec![
            BindMount::new(&data, "/up/fnrun-planted-up", false).unwrap(),
            BindMount::new(&data, "/abs/fnrun-planted-abs", false).unwrap(),
        ],
    );
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    assert_eq!(out.status, Status::Exited(0), "{}", text(&out.stderr_tail));
    assert_eq!(text(&out.stdout), "hello from the host\n".repeat(2));
    // Made in the run's throwaway layer: neither on the host nor in the image.
    for planted in ["fnrun-planted-up", "fnrun-planted-abs"] {
        assert!(!Path::new("/etc").join(planted).exists());
        assert!(!fx.layer().join("etc").join(planted).exists());
    }
    for target in ["/magic/x", "/dangling/x"] {
        let spec = with_mounts(
            &fx,
            "true",
            vec![BindMount::new(&data, target, false).unwrap()],
        );
        let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
        assert_mount_error(
            &err,
            nix::errno::Errno::ELOOP,
            &format!("on {target}: a component"),
        );
    }
}

/// `err` is a mount that failed with `errno`, and says `says`.
#[track_caller]
fn assert_mount_error(err: &Error, errno: nix::errno::Errno, says: &str) {
    assert!(
        matches!(err, Error::Mount { errno: e, .. } if *e == errno),
        "{err}"
    );
    assert!(err.to_string().contains(says), "{err}");
}

#[tokio::test]
async fn a_source_replaced_after_it_was_resolved_is_refused() {
    let fx = Fixture::new();
    let data = host_dir(&fx, "data", 0o755);
    let mount = BindMount::new(&data, "/data", false).unwrap();
    std::fs::rename(&data, fx.dir.path().join("moved")).unwrap();
    host_dir(&fx, "data", 0o755);
    let err = fx
        .sandbox
        .run(&with_mounts(&fx, "true", vec![mount.clone()]), b"", TIMEOUT)
        .await
        .unwrap_err();
    assert_mount_error(
        &err,
        nix::errno::Errno::ESTALE,
        "no longer the file fnrun resolved",
    );
    // A symlink in its place is not followed.
    std::fs::remove_file(data.join("hello")).unwrap();
    std::fs::remove_dir(&data).unwrap();
    symlink(fx.dir.path().join("moved"), &data).unwrap();
    let err = fx
        .sandbox
        .run(&with_mounts(&fx, "true", vec![mount]), b"", TIMEOUT)
        .await
        .unwrap_err();
    assert_mount_error(&err, nix::errno::Errno::ELOOP, "became a symlink");
}

/// A privileged runner maps the caller one past its range: the function runs
/// as them and writes on a writable mount as them, and still cannot change
/// the host's device nodes, which they may own.
#[tokio::test]
async fn the_caller_is_mapped_past_the_range_of_a_privileged_runner() {
    let fx = Fixture::new();
    let IdMap::Range { size, .. } = fx.sandbox.config().id_map else {
        eprintln!("skipped: the runner is unprivileged (see the rootless test)");
        return;
    };
    let me = HostUser {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    // Root-owned and not world-writable: only the caller can write there.
    let data = host_dir(&fx, "data", 0o755);
    let mut spec = with_mounts(
        &fx,
        "echo $(id -u):$(id -g); echo mine > /out/mine; \
         chmod 600 /dev/null || echo chmod refused; touch /dev/null || echo touch refused; \
         echo still works > /dev/null && echo null ok",
        vec![BindMount::new(&data, "/out", true).unwrap()],
    );
    spec.uid = size;
    spec.gid = size;
    let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
    assert!(err.to_string().contains("uid 65536 is not mapped"), "{err}");
    spec.caller = Some(me);
    let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
    let (s, e) = (text(&out.stdout), text(&out.stderr_tail));
    assert_eq!(out.status, Status::Exited(0), "{s}{e}");
    assert!(s.starts_with("65536:65536\n"), "{s}");
    assert!(
        s.contains("chmod refused\ntouch refused\nnull ok\n"),
        "{s}{e}"
    );
    let mine = std::fs::metadata(data.join("mine")).unwrap();
    assert_eq!((mine.uid(), mine.gid()), (me.uid, me.gid));
    assert_eq!(
        std::fs::metadata("/dev/null").unwrap().mode() & 0o777,
        0o666
    );
}

/// Set in the child process of the rootless test.
const ROOTLESS_CHILD: &str = "FNRUN_SANDBOX_TEST_ROOTLESS_MOUNTS";

/// As `nobody`: mounts work, and the caller is the runner's one id.
#[test]
fn mounts_work_for_a_rootless_runner() {
    if let Some(all) = super::rootless_part(
        "tests::mounts::mounts_work_for_a_rootless_runner",
        ROOTLESS_CHILD,
        rootless_child,
    ) {
        assert!(all.contains("rootless mounts work"), "{all}");
    }
}

fn rootless_child() {
    assert_ne!(nix::unistd::geteuid().as_raw(), 0);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let fx = Fixture::new();
            assert!(matches!(fx.sandbox.config().id_map, IdMap::Own { .. }));
            let data = host_dir(&fx, "data", 0o755);
            let me = HostUser {
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
            };
            let mut spec = with_mounts(
                &fx,
                "id -u; cat /in/hello; echo x > /in/no || true; echo mine > /out/mine",
                vec![
                    BindMount::new(&data, "/in", false).unwrap(),
                    BindMount::new(&data, "/out", true).unwrap(),
                ],
            );
            spec.caller = Some(me);
            let out = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap();
            let (s, e) = (text(&out.stdout), text(&out.stderr_tail));
            assert_eq!(out.status, Status::Exited(0), "{s}{e}");
            assert_eq!(s, "0\nhello from the host\n");
            assert!(e.contains("Read-only file system"), "{e}");
            assert_eq!(std::fs::metadata(data.join("mine")).unwrap().uid(), me.uid);
            // Another host user cannot be mapped by an unprivileged runner.
            spec.caller = Some(HostUser { uid: 0, gid: 0 });
            let err = fx.sandbox.run(&spec, b"", TIMEOUT).await.unwrap_err();
            assert!(
                err.to_string().contains("only its own uid and gid"),
                "{err}"
            );
            println!("rootless mounts work");
        });
}
