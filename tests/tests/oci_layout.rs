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

/// `pull oci:LAYOUT` caches the image as a registry pull does: `cache list`
/// shows it, `cache inspect` finds it, `cache rm` removes it (#37).
#[test]
fn pulled_oci_layout_is_listed_inspected_and_removed() {
    let image = TestImage::echo().tag("v1").build().expect("image builds");
    let archive = image.oci_archive().expect("archive");
    let cli = Cli::new().expect("cli");
    let reference = image.oci_ref();
    for pulled in [&reference, &archive] {
        let out = cli.run(&["pull", pulled], None);
        assert_eq!(out.code, Some(0), "{}", out.describe());
    }
    let out = cli.run(&["cache", "list", "-o", "json"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let listed: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let references: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|i| i["reference"].as_str())
        .collect();
    assert!(
        references.contains(&reference.as_str()) && references.contains(&archive.as_str()),
        "{references:?}: {}",
        out.describe()
    );
    let out = cli.run(&["cache", "inspect", &reference], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let details: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(
        details["reference"],
        reference.as_str(),
        "{}",
        out.describe()
    );
    assert!(
        details["layers"]
            .as_array()
            .is_some_and(|l| !l.is_empty() && l.iter().all(|l| l["unpacked"] == true)),
        "{}",
        out.describe()
    );
    // Still run from the layout, then removed like any cached image.
    let out = cli.run(&["run", &reference, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let out = cli.run(&["cache", "rm", &reference], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let out = cli.run(&["cache", "inspect", &reference], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());

    // A relative path is recorded made absolute: found by either spelling.
    let copy = cli.scratch().join("layout");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(image.layout())
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(status.success());
    let out = cli.run(&["pull", &format!("oci:layout:{}", image.tag())], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let absolute = format!("oci:{}:{}", copy.display(), image.tag());
    for spelling in [absolute.as_str(), &format!("oci:./layout:{}", image.tag())] {
        let out = cli.run(&["cache", "inspect", spelling], None);
        assert_eq!(out.code, Some(0), "{spelling}: {}", out.describe());
        let details: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        assert_eq!(
            details["reference"],
            absolute.as_str(),
            "{}",
            out.describe()
        );
    }
}
