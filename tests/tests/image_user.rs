//! The image's `User` is resolved in the image's own root file system, never on the
//! host (SPEC.md, Sandbox): an image whose `/etc` is an absolute symlink to a host
//! directory gets nothing from that directory, while the same symlink to a directory
//! of the image is followed. As root and rootless.

use std::os::unix::fs::PermissionsExt;

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::process::Finished;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::rootless_user;

const PROBE_PASSWD: &str = "probeuser:x:4242:4242::/:/bin/sh\n";

/// A host directory everyone may read, holding a passwd with `probeuser` (4242).
fn host_etc() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("fnrun-host-etc-")
        .tempdir()
        .expect("temp dir");
    std::fs::write(dir.path().join("passwd"), PROBE_PASSWD).expect("passwd");
    std::fs::write(dir.path().join("group"), "probeuser:x:4242:\n").expect("group");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// A function reporting its ids, run as `probeuser`, whose `/etc` is a symlink to
/// `target`.
fn image(target: &str) -> TestImage {
    TestImage::script(&report_script("", "uid=$(id -u) gid=$(id -g)"))
        .symlink("/etc", target)
        .user("probeuser")
}

fn run(cli: &Cli, image: TestImage) -> Finished {
    let registry = Registry::start().expect("registry starts");
    let image = image.push_to(&registry, "fns/user:v1");
    cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()))
}

fn assert_no_user(out: &Finished) {
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("no user \"probeuser\"") && out.stdout.is_empty(),
        "{}",
        out.describe()
    );
}

#[test]
fn an_etc_symlink_to_a_host_directory_finds_no_user() {
    let host = host_etc();
    let out = run(
        &Cli::new().expect("cli"),
        image(host.path().to_str().expect("utf-8")),
    );
    assert_no_user(&out);
}

#[test]
fn an_etc_symlink_to_a_host_directory_finds_no_user_rootless() {
    let Some(user) = rootless_user("an_etc_symlink_to_a_host_directory_finds_no_user_rootless")
    else {
        return;
    };
    let host = host_etc();
    let out = run(
        &Cli::as_user(user).expect("cli"),
        image(host.path().to_str().expect("utf-8")),
    );
    assert_no_user(&out);
}

#[test]
fn an_etc_symlink_within_the_image_is_followed() {
    let image = image("/private/etc").file("/private/etc/passwd", PROBE_PASSWD, 0o644);
    let out = run(&Cli::new().expect("cli"), image);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(last_message(&out.stdout), "uid=4242 gid=4242");
}

#[test]
fn an_etc_symlink_within_the_image_is_followed_rootless() {
    let Some(user) = rootless_user("an_etc_symlink_within_the_image_is_followed_rootless") else {
        return;
    };
    let image = image("/private/etc").file("/private/etc/passwd", PROBE_PASSWD, 0o644);
    let out = run(&Cli::as_user(user).expect("cli"), image);
    // A rootless runner maps one id: the function runs as 0 (docs/design.md).
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(last_message(&out.stdout), "uid=0 gid=0");
}
