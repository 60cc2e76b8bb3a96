//! The image config is honoured: Entrypoint + Cmd, Env, WorkingDir, User.

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;

/// Runs `image` (pushed to a fresh registry) with the CLI and returns the
/// message of the last result.
fn report(image: TestImage) -> String {
    let registry = Registry::start().expect("registry starts");
    let image = image.push_to(&registry, "fns/config:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    last_message(&out.stdout)
}

const WHO: &str = "uid=$(id -u) gid=$(id -g) cwd=$(pwd) foo=$FOO";

#[test]
fn env_workdir_and_user_are_honoured() {
    let image = TestImage::script(&report_script("", WHO))
        .env("FOO", "bar")
        .dir("/work", 0o755)
        .workdir("/work")
        .user("1000:1000");
    assert_eq!(report(image), "uid=1000 gid=1000 cwd=/work foo=bar");
}

#[test]
fn defaults_are_root_in_the_root_directory() {
    let image = TestImage::script(&report_script("", WHO));
    assert_eq!(report(image), "uid=0 gid=0 cwd=/ foo=");
}

#[test]
fn user_by_name_is_looked_up_in_the_image() {
    // /etc/passwd of the test images has fn:x:1000:1000.
    let image = TestImage::script(&report_script("", WHO)).user("fn");
    assert_eq!(report(image), "uid=1000 gid=1000 cwd=/ foo=");
}

#[test]
fn entrypoint_gets_cmd_as_arguments() {
    let image = TestImage::busybox()
        .file("/fn.sh", report_script("", "args=$*"), 0o755)
        .entrypoint(["/bin/sh", "/fn.sh"])
        .cmd(["first", "second"]);
    assert_eq!(report(image), "args=first second");
}

#[test]
fn cmd_alone_is_the_command() {
    let image = TestImage::busybox()
        .file("/fn.sh", report_script("", "args=$*"), 0o755)
        .cmd(["/bin/sh", "/fn.sh", "only-cmd"]);
    assert_eq!(report(image), "args=only-cmd");
}

#[test]
fn entrypoint_is_looked_up_in_the_image_path() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::busybox()
        .entrypoint(["cat"])
        .push_to(&registry, "fns/cat:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}
