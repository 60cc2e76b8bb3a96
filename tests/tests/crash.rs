//! Crash safety of the image cache: `fnrun pull` killed with SIGKILL at
//! three moments of a 200 MiB pull leaves a cache that the next run uses and
//! that `fnrun cache verify` passes.

use std::process::{Command, Stdio};
use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::fixtures::noise;
use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;

#[test]
fn pull_killed_at_any_moment_leaves_a_usable_cache() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo()
        .file(
            "/data/a.bin",
            noise(100 << 20, 0x9e37_79b9_7f4a_7c15),
            0o644,
        )
        .file(
            "/data/b.bin",
            noise(100 << 20, 0x2545_f491_4f6c_dd1d),
            0o644,
        )
        .push_to(&registry, "fns/big:v1");
    let cli = Cli::new().expect("cli");

    // Early (manifest, first bytes), middle (download), late (unpack).
    for delay in [
        Duration::from_millis(150),
        Duration::from_millis(700),
        Duration::from_millis(1600),
    ] {
        let mut pull = Command::new(fnrun_tests::fnrun_bin())
            .args(["pull", "--cache-dir"])
            .arg(cli.cache_dir())
            .arg(&image)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fnrun pull starts");
        std::thread::sleep(delay);
        let finished_first = pull.try_wait().expect("wait").is_some();
        pull.kill().ok();
        pull.wait().expect("reaped");
        eprintln!("killed pull after {delay:?} (had finished already: {finished_first})");
        // Start over from an empty cache if this pull got to the end, so the
        // next kill lands mid-pull again.
        if finished_first {
            let _ = std::fs::remove_dir_all(cli.cache_dir());
        }
    }

    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "the next run works: {}", out.describe());
    let out = cli.run(&["cache", "verify"], None);
    assert_eq!(out.code, Some(0), "verify passes: {}", out.describe());
    let out = cli.run(
        &["run", "--image-pull-policy", "Never", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "cached after verify: {}", out.describe());
}
