//! One error, once: a daemon that cannot start says so in one `fnrun:` line,
//! as every command does (a JSON log line with `--log-format json`), and
//! `pull` names the image it could not pull once.

use fnrun_tests::cli::Cli;

/// The lines of `stderr` that mention `needle`.
fn mentions<'a>(stderr: &'a str, needle: &str) -> Vec<&'a str> {
    stderr.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn a_daemon_that_cannot_start_says_why_once() {
    let cli = Cli::new().expect("cli");
    let cache = cli.cache_dir().display().to_string();
    // 192.0.2.1 (TEST-NET-1) is no address of this host: bind fails.
    let serve = ["serve", "--cache-dir", &cache, "--listen", "192.0.2.1:9"];
    let out = cli.run_as_given(&serve, &[], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let lines = mentions(&out.stderr, "listen on 192.0.2.1:9");
    assert_eq!(lines.len(), 1, "{}", out.describe());
    assert!(lines[0].starts_with("fnrun: "), "{}", out.describe());

    let json = [&["--log-format", "json"][..], &serve].concat();
    let out = cli.run_as_given(&json, &[], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    for line in out.stderr.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{}", out.describe()));
        assert!(value["level"].is_string(), "{line}");
    }
    let lines = mentions(&out.stderr, "listen on 192.0.2.1:9");
    assert_eq!(lines.len(), 1, "{}", out.describe());

    // A function that cannot start: not a WARN, one `fnrun:` line.
    let out = cli.run_as_given(
        &[
            "function",
            "serve",
            "--cache-dir",
            &cache,
            "--image-pull-policy",
            "Never",
            "--listen",
            "127.0.0.1:0",
            "example.org/fns/absent:v1",
        ],
        &[],
        None,
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let lines = mentions(&out.stderr, "is not cached and the pull policy is Never");
    assert_eq!(lines.len(), 1, "{}", out.describe());
    assert!(lines[0].starts_with("fnrun: "), "{}", out.describe());
}

#[test]
fn pull_names_the_image_it_could_not_pull_once() {
    let cli = Cli::new().expect("cli");
    // Nothing listens on port 9 of loopback.
    let image = "127.0.0.1:9/fns/absent:v1";
    let out = cli.run(&["pull", image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    assert!(out.stderr.starts_with("fnrun: "), "{}", out.describe());
    assert_eq!(out.stderr.matches(image).count(), 1, "{}", out.describe());
}
