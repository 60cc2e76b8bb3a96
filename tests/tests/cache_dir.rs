//! Where the cache is: a relative `--cache-dir` or `$FNRUN_CACHE_DIR` works
//! (paths are made absolute at start), `cache list` and `verify` never create
//! a cache where there is none, and the default cache directory is never one
//! that another user owns or may write.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{ensure_test_user, require_root, root_and_rootless};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_relative_cache_dir_runs_functions() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    for user in root_and_rootless("a_relative_cache_dir_runs_functions") {
        let cli = match &user {
            Some(user) => Cli::as_user(user.clone()).expect("cli"),
            None => Cli::new().expect("cli"),
        };
        let input = cli.write_file("in.yaml", SAMPLE).expect("input");
        // The flag, as the user typed it, and the variable.
        let out = cli.run_as_given(&["run", "--cache-dir", "./c", &image, &input], &[], None);
        assert_eq!(out.code, Some(0), "{user:?}: {}", out.describe());
        assert_same_yaml(&out.stdout, SAMPLE);
        assert!(cli.scratch().join("c/refs").is_dir(), "{user:?}");
        let out = cli.run_as_given(
            &["run", &image, "in.yaml"],
            &[("FNRUN_CACHE_DIR", Some("c2"))],
            None,
        );
        assert_eq!(out.code, Some(0), "{user:?}: {}", out.describe());
        assert_same_yaml(&out.stdout, SAMPLE);
        assert!(cli.scratch().join("c2/refs").is_dir(), "{user:?}");
        // And the cache commands find the same cache by its relative path.
        let out = cli.run_as_given(&["cache", "list", "--cache-dir", "c2"], &[], None);
        assert_eq!(out.code, Some(0), "{user:?}: {}", out.describe());
        assert!(out.stdout.contains("fns/echo:v1"), "{}", out.describe());
    }
}

#[test]
fn list_and_verify_refuse_a_directory_that_is_not_a_cache_and_create_nothing() {
    let cli = Cli::new().expect("cli");
    let missing = cli.scratch().join("does/not/exist");
    let unrelated = cli.scratch().join("documents");
    std::fs::create_dir(&unrelated).unwrap();
    std::fs::write(unrelated.join("notes.txt"), "mine").unwrap();
    for action in ["list", "verify", "prune"] {
        let dir = missing.to_str().unwrap();
        let out = cli.run_as_given(&["cache", action, "--cache-dir", dir], &[], None);
        assert_eq!(out.code, Some(1), "{action}: {}", out.describe());
        assert_eq!(
            out.stderr,
            format!(
                "fnrun: {dir} is not an fnrun cache: it does not exist (give the cache \
                 directory with --cache-dir or $FNRUN_CACHE_DIR)\n"
            ),
            "{action}"
        );
        assert!(out.stdout.is_empty(), "{action}: {}", out.describe());
        assert!(!cli.scratch().join("does").exists(), "{action} created it");

        let dir = unrelated.to_str().unwrap();
        let out = cli.run_as_given(&["cache", action], &[("FNRUN_CACHE_DIR", Some(dir))], None);
        assert_eq!(out.code, Some(1), "{action}: {}", out.describe());
        assert!(
            out.stderr.starts_with(&format!(
                "fnrun: {dir} is not an fnrun cache: it has no blobs/, layers/ and refs/ directories"
            )),
            "{action}: {}",
            out.describe()
        );
        assert_eq!(names(&unrelated), ["notes.txt"], "{action} wrote into it");
    }
}

#[test]
fn the_default_cache_is_never_a_directory_another_user_may_write() {
    // Another user (root here) made the directory the default cache would
    // be, world-writable, before this user ran fnrun: it is refused, and
    // nothing is written into it.
    // Only root can switch to the test user.
    if !require_root("the_default_cache_is_never_a_directory_another_user_may_write") {
        return;
    }
    let user = ensure_test_user().expect("the test user exists");
    let cli = Cli::as_user(user.clone()).expect("cli");
    let xdg = cli.scratch().join("xdg");
    let planted = xdg.join("fnrun");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o1777)).unwrap();
    for args in [&["cache", "list"][..], &["pull", "example.org/fns/echo:v1"]] {
        let out = cli.run_as_given(
            args,
            &[
                ("XDG_CACHE_HOME", Some(xdg.to_str().unwrap())),
                ("HOME", None),
            ],
            None,
        );
        assert_eq!(out.code, Some(1), "{args:?}: {}", out.describe());
        assert!(
            out.stderr.starts_with(&format!(
                "fnrun: the default cache directory {} is owned by uid 0, not by this user ({})",
                planted.display(),
                user.uid
            )) && out.stderr.contains("--cache-dir"),
            "{args:?}: {}",
            out.describe()
        );
        assert!(names(&planted).is_empty(), "{args:?} wrote into it");
    }
    // Its own directory, even group- or world-writable, is refused too.
    user.chown(&planted).unwrap();
    let out = cli.run_as_given(
        &["cache", "list"],
        &[("XDG_CACHE_HOME", Some(xdg.to_str().unwrap()))],
        None,
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .contains("is writable by other users (mode 1777)"),
        "{}",
        out.describe()
    );
    // Without HOME or XDG_CACHE_HOME (a service user), the cache is in
    // the home of the user's passwd entry, never the shared /tmp/fnrun.
    let shared = Path::new("/tmp/fnrun");
    let shared_existed = shared.exists();
    let out = cli.run_as_given(&["cache", "list"], &[("HOME", None)], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.starts_with("REFERENCE"), "{}", out.describe());
    if !shared_existed {
        assert!(!shared.exists(), "{} was created", shared.display());
    }
}

/// As root, a cache directory below a directory only root may search (as
/// `mktemp -d` makes, or `/root`) is refused at start, naming the directory
/// and the fix: a run's init, the mapped root of its user namespace (host
/// uid 100000), cannot reach it. It used to fail every run with `mount tmpfs
/// on …/cache/mnt: EACCES`.
#[test]
fn a_cache_directory_runs_cannot_reach_is_refused_naming_the_fix() {
    if !require_root("a cache directory below a root-only directory") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let input = cli.write_file("in.yaml", SAMPLE).expect("input");
    let private = cli.scratch().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cache = private.join("cache");
    let cache_arg = cache.to_str().unwrap();
    let out = cli.run_as_given(
        &["run", "--cache-dir", cache_arg, &image, &input],
        &[],
        None,
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let line = out.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{}", out.describe());
    assert!(
        line.contains(&format!("cannot search {}", private.display()))
            && line.contains(&format!("chmod o+x {}", private.display())),
        "{}",
        out.describe()
    );
    // Searchable, it works.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = cli.run_as_given(
        &["run", "--cache-dir", cache_arg, &image, &input],
        &[],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}
