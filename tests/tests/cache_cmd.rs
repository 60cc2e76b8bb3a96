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
    // The image was leased during the run and is evicted after it: with the
    // sandbox pool (on by default), once the pool has ended the sandboxes
    // made ahead for this kind, 10 s after its last call (the pool's sweep
    // and the prune it asks for take a few seconds more).
    let blobs = daemon.cache_dir().join("blobs/sha256");
    let emptied = fnrun_tests::wait_for(std::time::Duration::from_secs(30), || {
        files(&blobs).is_empty().then_some(())
    });
    assert!(emptied.is_some(), "blobs left: {:?}", files(&blobs));
    assert!(files(&daemon.cache_dir().join("refs")).is_empty());
}

/// Parses a command's JSON stdout.
fn json(out: &fnrun_tests::process::Finished) -> serde_json::Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.describe()))
}

/// Image management as skopeo and podman have it: `pull -o json` (and the
/// `docker://` prefix), `cache list -o json|yaml`, `cache inspect`, `cache rm`
/// and `--dry-run`; `rm` keeps an image a run is using, as `prune` does.
#[test]
fn inspect_rm_dry_runs_and_structured_output() {
    let registry = Registry::start().expect("registry starts");
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let sleeper = TestImage::script("sleep 30\n").push_to(&registry, "fns/sleep:v1");
    let cli = Cli::new().expect("cli");

    let out = cli.run(
        &["pull", "-o", "json", &format!("docker://{echo}"), &sleeper],
        None,
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let pulled = json(&out);
    assert_eq!(pulled[0]["image"], format!("docker://{echo}"));
    assert_eq!(pulled[0]["reference"], echo.as_str(), "{pulled}");
    assert!(
        pulled[1]["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{pulled}"
    );
    let echo_digest = pulled[0]["digest"].as_str().unwrap().to_owned();

    let out = cli.run(&["cache", "list", "-o", "json"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let listed = json(&out);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["reference"] == echo.as_str())
        .expect("echo listed");
    assert_eq!(row["digest"], echo_digest.as_str());
    assert!(row["size"].as_u64().is_some_and(|s| s > 100_000), "{row}");
    assert_eq!(row["inUse"], false);
    let out = cli.run(&["cache", "list", "-o", "yaml"], None);
    let yaml: serde_json::Value = serde_norway::from_str(&out.stdout).expect("YAML");
    assert_eq!(yaml, listed);

    // inspect, by reference (docker:// too) and by the digest `list` shows.
    let out = cli.run(&["cache", "inspect", &echo], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let details = json(&out);
    assert_eq!(details["digest"], echo_digest.as_str());
    assert_eq!(details["entrypoint"], serde_json::json!(["/bin/cat"]));
    assert!(
        details["layers"]
            .as_array()
            .is_some_and(|l| !l.is_empty() && l.iter().all(|l| l["unpacked"] == true)),
        "{details}"
    );
    let short = &echo_digest["sha256:".len().."sha256:".len() + 12];
    let out = cli.run(&["cache", "inspect", "-o", "yaml", short], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let yaml: serde_json::Value = serde_norway::from_str(&out.stdout).expect("YAML");
    assert_eq!(yaml, details);
    let missing = registry.reference("fns/missing:v1");
    let out = cli.run(&["cache", "inspect", &missing], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("is not in the cache"),
        "{}",
        out.describe()
    );

    // Dry runs remove nothing.
    let blobs = cli.cache_dir().join("blobs/sha256");
    let before = files(&blobs).len();
    let out = cli.run(&["cache", "prune", "--max-size", "0", "--dry-run"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains(&format!("would remove {echo}"))
            && out.stdout.contains(&format!("would remove {sleeper}")),
        "{}",
        out.describe()
    );
    let out = cli.run(&["cache", "rm", "--dry-run", "-o", "json", &echo], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let plan = json(&out);
    assert_eq!(plan["dryRun"], true);
    assert_eq!(plan["removed"], serde_json::json!([echo]));
    assert!(plan["freedBytes"].as_u64().is_some_and(|b| b > 0), "{plan}");
    assert_eq!(files(&blobs).len(), before, "a dry run removes nothing");
    assert_eq!(
        json(&cli.run(&["cache", "list", "-o", "json"], None)),
        listed
    );

    // A run holds the sleeper: rm keeps it and says so, exit 1.
    let input = cli.write_file("in.yaml", SAMPLE).expect("input");
    let mut run = Command::new(fnrun_tests::fnrun_bin())
        .args(["run", "--cache-dir"])
        .arg(cli.cache_dir())
        .args(["--image-pull-policy", "Never", &sleeper, &input])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("fnrun run starts");
    let in_use = fnrun_tests::wait_for(std::time::Duration::from_secs(30), || {
        let listed = json(&cli.run(&["cache", "list", "-o", "json"], None));
        listed
            .as_array()?
            .iter()
            .any(|i| i["reference"] == sleeper.as_str() && i["inUse"] == true)
            .then_some(())
    });
    let out = cli.run(&["cache", "rm", &sleeper, &echo, &missing], None);
    let _ = run.kill();
    let _ = run.wait();
    assert!(in_use.is_some(), "the run never leased its image");
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stdout.contains(&format!("removed {echo}"))
            && out.stdout.contains(&format!("kept {sleeper} (in use)")),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains(&format!("{sleeper} is in use"))
            && out
                .stderr
                .contains(&format!("{missing} is not in the cache")),
        "{}",
        out.describe()
    );
    // Only a missing image: its error, and no line about 0 B freed.
    let out = cli.run(&["cache", "rm", &missing], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(out.stdout, "", "{}", out.describe());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    let out = cli.run(&["cache", "list", "-o", "json"], None);
    let left: Vec<String> = json(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["reference"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, std::slice::from_ref(&sleeper));

    // Released: rm by digest removes it and every blob it used.
    let out = cli.run(&["cache", "rmi", &short_digest(&cli, &sleeper)], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(files(&blobs).is_empty(), "{:?}", files(&blobs));
}

/// The 12 hex digits `cache list` shows for `reference`.
fn short_digest(cli: &Cli, reference: &str) -> String {
    let out = cli.run(&["cache", "list"], None);
    out.stdout
        .lines()
        .find(|l| l.starts_with(reference))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("{reference} not listed: {}", out.describe()))
        .to_owned()
}
