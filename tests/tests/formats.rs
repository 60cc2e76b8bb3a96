//! Image formats as skopeo converts them, run with `fnrun run` from a registry:
//! zstd-compressed OCI layers and Docker schema 2 manifests.

use std::process::Command;

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::{BuiltImage, TestImage};
use fnrun_tests::process::check_output;
use fnrun_tests::registry::Registry;

/// Pushes `image` to `registry` as `repo` with extra `skopeo copy` flags; returns the
/// reference and the raw manifest the registry serves.
fn push_converted(
    image: &BuiltImage,
    registry: &Registry,
    repo: &str,
    flags: &[&str],
) -> (String, serde_json::Value) {
    let reference = registry.reference(repo);
    check_output(
        Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
            ])
            .args(flags)
            .arg(format!("oci:{}:{}", image.layout().display(), image.tag()))
            .arg(format!("docker://{reference}")),
    )
    .unwrap_or_else(|e| panic!("cannot push {reference}: {e:#}"));
    let raw = check_output(
        Command::new("skopeo")
            .args([
                "--insecure-policy",
                "inspect",
                "--raw",
                "--tls-verify=false",
            ])
            .arg(format!("docker://{reference}")),
    )
    .expect("skopeo inspect --raw");
    let manifest = serde_json::from_str(&raw).expect("the manifest is JSON");
    (reference, manifest)
}

fn layer_media_types(manifest: &serde_json::Value) -> Vec<String> {
    manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["mediaType"].as_str().expect("mediaType").to_owned())
        .collect()
}

fn assert_runs(reference: &str) {
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", reference, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
    // Once cached, the image needs no registry.
    let out = cli.run(
        &["run", "--image-pull-policy", "Never", reference, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn zstd_layers_run() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().build().expect("image builds");
    let (reference, manifest) = push_converted(
        &image,
        &registry,
        "formats/zstd:v1",
        &["--dest-compress-format", "zstd"],
    );
    let types = layer_media_types(&manifest);
    assert!(
        !types.is_empty()
            && types
                .iter()
                .all(|t| t == "application/vnd.oci.image.layer.v1.tar+zstd"),
        "skopeo did not write zstd layers: {manifest}"
    );
    assert_runs(&reference);
}

#[test]
fn docker_schema2_runs() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().build().expect("image builds");
    let (reference, manifest) =
        push_converted(&image, &registry, "formats/v2s2:v1", &["--format", "v2s2"]);
    assert_eq!(
        manifest["mediaType"], "application/vnd.docker.distribution.manifest.v2+json",
        "{manifest}"
    );
    assert_eq!(
        manifest["config"]["mediaType"], "application/vnd.docker.container.image.v1+json",
        "{manifest}"
    );
    let types = layer_media_types(&manifest);
    assert!(
        !types.is_empty()
            && types
                .iter()
                .all(|t| t == "application/vnd.docker.image.rootfs.diff.tar.gzip"),
        "{manifest}"
    );
    assert_runs(&reference);
}
