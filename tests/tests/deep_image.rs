//! Images of up to 127 layers (Docker's limit) run, as root and rootless.
//! Their 64-character layer names do not fit in one overlay `lowerdir`
//! option; the sandbox adds layers one by one with the new mount API (or
//! mounts them through short names on older kernels; the sandbox's own tests
//! force that path).

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::{ensure_test_user, require_root};

/// busybox plus 126 layers, each adding `/deep/fN` and its own `/deep/top`.
fn deep_image() -> TestImage {
    let mut image = TestImage::script(&report_script(
        "",
        "$(ls /deep | wc -l) files, top from $(cat /deep/top)",
    ));
    for i in 0..126 {
        image = image.layer([
            (format!("/deep/f{i}"), String::new()),
            ("/deep/top".to_owned(), format!("layer {i}")),
        ]);
    }
    image
}

#[test]
fn an_image_of_127_layers_runs_as_root_and_rootless() {
    if !require_root("an_image_of_127_layers_runs_as_root_and_rootless") {
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = deep_image().push_to(&registry, "fns/deep:v1");
    let layers = registry.inspect("fns/deep:v1").expect("inspects")["Layers"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(layers, 127);
    let user = ensure_test_user().expect("test user");
    for cli in [Cli::new().expect("cli"), Cli::as_user(user).expect("cli")] {
        let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
        assert_eq!(out.code, Some(0), "{}", out.describe());
        assert_eq!(last_message(&out.stdout), "127 files, top from layer 125");
    }
}
