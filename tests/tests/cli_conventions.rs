//! The conventions users of podman, skopeo, kpt and kubectl reach for:
//! `fnrun version [-o json]`, `fnrun completion bash|zsh|fish`, `fnrun man`,
//! `-v`/`--log-level`, kpt's `--image-pull-policy ifNotPresent`, skopeo's
//! transports (`docker://` taken, `docker-archive:` refused with what to use),
//! `--help` grouped by flag kind, and `function call -o json`.

use std::process::Command;

use fnrun_tests::cli::{Cli, run_cli};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;

#[test]
fn version_as_text_and_json() {
    let out = run_cli(&["version"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let first = out.stdout.lines().next().unwrap_or_default();
    assert_eq!(first, format!("fnrun {}", env!("CARGO_PKG_VERSION")));
    assert!(out.stdout.contains("\ncommit: "), "{}", out.describe());

    let out = run_cli(&["version", "-o", "json"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    for key in ["commit", "target", "rustc"] {
        assert!(v[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {v}");
    }
    // `--version` says the same.
    let out = run_cli(&["--version"], None);
    assert!(
        out.stdout.contains(v["commit"].as_str().unwrap()),
        "{}",
        out.describe()
    );
}

#[test]
fn completions_load_in_bash_and_cover_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run_cli(&["completion", shell], None);
        assert_eq!(out.code, Some(0), "{shell}: {}", out.describe());
        for word in ["run", "pull", "cache", "image-pull-policy"] {
            assert!(out.stdout.contains(word), "{shell}: no {word}");
        }
    }
    // bash loads the script and completes `fnrun ca` and `fnrun cache r`.
    let script = run_cli(&["completion", "bash"], None).stdout;
    let probe = format!(
        "{script}\n\
         COMP_WORDS=(fnrun ca); COMP_CWORD=1; _fnrun fnrun ca fnrun; echo \"1:${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(fnrun cache r); COMP_CWORD=2; _fnrun fnrun r cache; echo \"2:${{COMPREPLY[*]}}\"\n"
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &probe])
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |n: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{n}:")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("1").split(' ').any(|w| w == "cache"), "{stdout}");
    let cache = line("2");
    assert!(
        cache.split(' ').any(|w| w == "rm") && cache.split(' ').any(|w| w == "rmi"),
        "{stdout}"
    );
}

#[test]
fn man_pages_are_generated_from_the_command_line() {
    let out = run_cli(&["man"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains(".TH fnrun 1"), "{}", out.describe());
    for command in ["run", "pull", "cache", "serve", "completion"] {
        assert!(out.stdout.contains(command), "{command} not in fnrun.1");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let out = run_cli(&["man", "--output-dir", pages.to_str().unwrap()], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for page in [
        "fnrun.1",
        "fnrun-run.1",
        "fnrun-cache-rm.1",
        "fnrun-function-call.1",
    ] {
        assert!(pages.join(page).is_file(), "{page} missing");
    }
    // man renders them (groff), with the run flags in it.
    let out = Command::new("man")
        .arg("-l")
        .arg(pages.join("fnrun-run.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .expect("man runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("--image-pull-policy"), "{text}");
}

#[test]
fn run_help_groups_its_flags() {
    let out = run_cli(&["run", "--help"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let help = &out.stdout;
    let at = |heading: &str| {
        help.find(&format!("\n{heading}:\n"))
            .unwrap_or_else(|| panic!("no {heading} heading:\n{help}"))
    };
    let (krm, sandbox, registry, global) = (
        at("KRM flags"),
        at("Sandbox flags"),
        at("Registry flags"),
        at("Global flags"),
    );
    let under = |flag: &str, start: usize| {
        let i = help.find(flag).unwrap_or_else(|| panic!("no {flag}"));
        let next = [krm, sandbox, registry, global]
            .into_iter()
            .filter(|&h| h > start)
            .min()
            .unwrap_or(help.len());
        assert!(
            i > start && i < next,
            "{flag} is not under its heading:\n{help}"
        );
    };
    under("--fn-config", krm);
    under("--mount", krm);
    under("--seccomp-profile", sandbox);
    under("--insecure-registry", registry);
    under("--authfile", registry);
    under("--log-level", global);
}

#[test]
fn log_level_flags_and_kpts_pull_policy() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    // Silent by default: stderr is empty.
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.is_empty(), "{}", out.describe());
    // -v: info (the pull's own log line); --log-level debug: more.
    let out = cli.run(&["pull", "-v", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stderr.contains("INFO") && out.stderr.contains("pulling image"),
        "{}",
        out.describe()
    );
    assert!(!out.stderr.contains("DEBUG"), "{}", out.describe());
    let out = cli.run(&["pull", "--log-level", "debug", &image], None);
    assert!(out.stderr.contains("DEBUG"), "{}", out.describe());
    // The flag wins over RUST_LOG.
    let mut quiet = Cli::new().expect("cli");
    quiet.env("RUST_LOG", "debug");
    let out = quiet.run(&["pull", "--log-level", "off", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.is_empty(), "{}", out.describe());
    let out = quiet.run(&["pull", &image], None);
    assert!(out.stderr.contains("DEBUG"), "RUST_LOG: {}", out.describe());

    for policy in ["ifNotPresent", "never", "always", "IfNotPresent"] {
        let out = cli.run(
            &["run", "--image-pull-policy", policy, &image, "-"],
            Some(SAMPLE.as_bytes()),
        );
        assert_eq!(out.code, Some(0), "{policy}: {}", out.describe());
        assert_same_yaml(&out.stdout, SAMPLE);
    }
}

#[test]
fn skopeo_transports_docker_taken_docker_archive_refused_with_what_to_use() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", &format!("docker://{image}"), "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);

    let archive = cli.scratch().join("fn.tar").display().to_string();
    let out = cli.run(
        &["run", &format!("docker-archive:{archive}"), "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("docker-archive")
            && out.stderr.contains("skopeo copy")
            && out.stderr.contains("oci-archive:"),
        "{}",
        out.describe()
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
}

#[test]
fn help_says_what_each_command_and_flag_is() {
    // `pull -h`: its images are its argument, not a sandbox flag, and the
    // sandbox's run-only flags are not there.
    let out = run_cli(&["pull", "-h"], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let sandbox = out
        .stdout
        .split("Sandbox flags:")
        .nth(1)
        .unwrap_or_default();
    assert!(
        !sandbox.contains("IMAGES") && !sandbox.contains("--max-output-bytes"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("Arguments:") && out.stdout.contains("--quiet"),
        "{}",
        out.stdout
    );
    let out = run_cli(&["cache", "--help"], None);
    assert!(
        out.stdout.contains("list, inspect, rm, prune, verify"),
        "{}",
        out.stdout
    );
    let out = run_cli(&["--help"], None);
    let serve = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("serve"))
        .unwrap_or_default();
    assert!(
        serve.contains("Crossplane v1.14+ Function packages"),
        "{serve}"
    );
    let out = run_cli(&["run", "--help"], None);
    assert!(
        out.stdout
            .contains("--network-policy <NETWORK_POLICY>\n          The function's network"),
        "{}",
        out.stdout
    );
    let out = run_cli(&["function", "call", "--help"], None);
    assert!(
        out.stdout
            .contains("--mode <MODE>\n          How the image is run"),
        "{}",
        out.stdout
    );
    // `none`, as podman's `--network none`, is Isolated; never Runner.
    let out = run_cli(
        &[
            "run",
            "--network-policy",
            "none",
            "--memory",
            "1",
            "img",
            "-",
        ],
        None,
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        !out.stderr.contains("network-policy"),
        "none is taken: {}",
        out.describe()
    );
}

#[test]
fn pull_quiet_prints_only_digests() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["pull", "-q", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.describe());
    assert!(
        lines[0].starts_with("sha256:") && !lines[0].contains(' '),
        "{}",
        out.describe()
    );
    assert!(out.stderr.is_empty(), "{}", out.describe());
}
