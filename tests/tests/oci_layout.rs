//! `oci:PATH[:TAG]` and `oci-archive:PATH[:TAG]` images: no registry needed.

use fnrun_tests::cli::Cli;
use fnrun_tests::demo_image_layout;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml, parse};
use fnrun_tests::image::TestImage;

#[test]
fn oci_layout_runs_without_a_registry() {
    let image = TestImage::echo().tag("v1").build().expect("image builds");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image.oci_ref(), "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}

#[test]
fn oci_layout_tag_defaults_to_latest() {
    let image = TestImage::echo().build().expect("image builds");
    assert_eq!(image.tag(), "latest");
    let cli = Cli::new().expect("cli");
    let reference = format!("oci:{}", image.layout().display());
    let out = cli.run(&["run", &reference, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}

#[test]
fn oci_layout_missing_tag_is_not_found() {
    let image = TestImage::echo().tag("v1").build().expect("image builds");
    let cli = Cli::new().expect("cli");
    let reference = format!("oci:{}:v2", image.layout().display());
    let out = cli.run(&["run", &reference, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.to_lowercase().contains("not found"),
        "{}",
        out.describe()
    );
}

#[test]
fn oci_archive_runs_without_a_registry() {
    let image = TestImage::echo().tag("v1").build().expect("image builds");
    let archive = image.oci_archive().expect("archive");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &archive, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}

#[test]
fn demo_function_labels_the_example() {
    let Some(layout) = demo_image_layout() else {
        eprintln!("SKIPPED demo_function_labels_the_example: run `cargo xtask demo-image` first");
        return;
    };
    let cli = Cli::new().expect("cli");
    let input = fnrun_tests::workspace_root().join("examples/functionio.yaml");
    let reference = format!("oci:{}:latest", layout.display());
    let out = cli.run(&["run", &reference, &input.display().to_string()], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let output = parse(&out.stdout);
    let labels = &output["desired"]["resources"][0]["resource"]["metadata"]["labels"];
    assert_eq!(labels["team"], "payments", "{}", out.stdout);
    assert_eq!(labels["fnrun.dev/demo"], "true", "{}", out.stdout);
    let results = output["results"].as_sequence().expect("results");
    assert_eq!(
        results.last().expect("result")["message"],
        "demo-function labelled 1 resources"
    );
}
