//! `fnrun cache list | prune --max-size SIZE | verify`, and layer sharing: two
//! images on one base layer take the cache space of one.

use std::path::Path;
use std::process::Command;

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;

/// Files under `dir` (recursively).
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Disk usage of `dir` in KiB (`du -sk`).
fn du_kib(dir: &Path) -> u64 {
    let out = Command::new("du")
        .arg("-sk")
        .arg(dir)
        .output()
        .expect("du runs");
    assert!(out.status.success(), "du {}", dir.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du prints a size")
}

#[test]
fn list_verify_and_prune() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());

    let out = cli.run(&["cache", "list"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.describe());
    assert!(lines[0].starts_with("REFERENCE"), "{}", out.describe());
    assert!(
        lines[1].contains(&image) && lines[1].contains("MiB") && lines[1].contains("s ago"),
        "{}",
        out.describe()
    );

    let out = cli.run(&["cache", "verify"], None);
    assert_eq!(
        out.code,
        Some(0),
        "a fresh pull is sound: {}",
        out.describe()
    );
    assert!(out.stdout.contains("sound"), "{}", out.describe());

    // Bit rot in the largest blob (the layer): found, removed, exit 1; then sound.
    let blobs = cli.cache_dir().join("blobs/sha256");
    let biggest = files(&blobs)
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .expect("blobs stored");
    let mut bytes = std::fs::read(&biggest).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&biggest, bytes).unwrap();
    let name = biggest.file_name().unwrap().to_str().unwrap().to_owned();
    let out = cli.run(&["cache", "verify"], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stdout
            .contains(&format!("removed corrupt blob sha256:{name}")),
        "{}",
        out.describe()
    );
    assert!(!biggest.exists());
    let out = cli.run(&["cache", "verify"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    // The unpacked layer is intact: the image still runs from the cache.
    let out = cli.run(
        &["run", "--image-pull-policy", "Never", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);

    // Prune to 0 removes everything (nothing is in use).
    let out = cli.run(&["cache", "prune", "--max-size", "0"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains(&format!("removed {image}")),
        "{}",
        out.describe()
    );
    assert!(files(&blobs).is_empty(), "blobs left: {:?}", files(&blobs));
    let layers = files(&cli.cache_dir().join("layers"));
    assert!(layers.is_empty(), "layers left: {layers:?}");
    let out = cli.run(&["cache", "list"], None);
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.describe());

    // And a pull brings it back.
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn two_images_on_one_base_layer_take_the_space_of_one() {
    let registry = Registry::start().expect("registry starts");
    let built = TestImage::echo()
        .file(
            "/data.bin",
            fnrun_tests::fixtures::noise(
                24 << 20,
                0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()),
            ),
            0o644,
        )
        .build()
        .expect("image builds");
    // A second image: the same layer, another config.
    let layout = built.layout().display().to_string();
    let status = Command::new("umoci")
        .args(["config", "--image", &format!("{layout}:latest")])
        .args(["--tag", "other", "--config.env=OTHER=1"])
        .status()
        .expect("umoci runs");
    assert!(status.success());
    let mut refs = Vec::new();
    for (tag, repo) in [("latest", "fns/a:v1"), ("other", "fns/b:v1")] {
        let reference = registry.reference(repo);
        let status = Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
            ])
            .arg(format!("oci:{layout}:{tag}"))
            .arg(format!("docker://{reference}"))
            .status()
            .expect("skopeo runs");
        assert!(status.success(), "push {reference}");
        refs.push(reference);
    }

    let cli = Cli::new().expect("cli");
    let out = cli.run(&["pull", &refs[0]], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let one = du_kib(&cli.cache_dir());
    let out = cli.run(&["pull", &refs[1]], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let two = du_kib(&cli.cache_dir());
    eprintln!("cache: one image {one} KiB, two images {two} KiB");
    assert!(
        one > 24 << 10,
        "one image holds its 24 MiB layer: {one} KiB"
    );
    assert!(
        (two as f64) < 1.3 * one as f64,
        "two images on one layer take {two} KiB, one takes {one} KiB"
    );
    let out = cli.run(&["cache", "list"], None);
    assert_eq!(out.stdout.lines().count(), 3, "{}", out.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_prunes_to_cache_max_size_after_a_run() {
    use fnrun_tests::client::{self, Run};
    use fnrun_tests::daemon::{Daemon, DaemonOpts};

    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let opts = DaemonOpts {
        args: vec!["--cache-max-size".into(), "1".into()],
        ..DaemonOpts::default()
    };
    let daemon = Daemon::start(opts).expect("fnrun serve starts");
    let mut c = daemon.client().await.expect("connects");
    let out = client::run_function(&mut c, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs");
    assert_same_yaml(&String::from_utf8(out.output).unwrap(), SAMPLE);
    // The image was leased during the run and is evicted after it.
    let blobs = daemon.cache_dir().join("blobs/sha256");
    let emptied = fnrun_tests::wait_for(std::time::Duration::from_secs(10), || {
        files(&blobs).is_empty().then_some(())
    });
    assert!(emptied.is_some(), "blobs left: {:?}", files(&blobs));
    assert!(files(&daemon.cache_dir().join("refs")).is_empty());
}
