//! `fnrun pull`, and `fnrun run` when it pulls, draw one progress bar per layer on a
//! terminal (short digest, bytes, final state); with stderr not a terminal `pull`
//! prints only its line per image and `run` only the function's output.
//!
//! The terminal is a pseudo-terminal from util-linux `script -qec CMD /dev/null`, which
//! copies everything the command writes to it onto its own stdout.

use std::process::Command;

use fnrun_tests::cli::{CLI_GUARD, Cli};
use fnrun_tests::fnrun_bin;
use fnrun_tests::functionio::{MINIMAL, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::process::{Finished, run_capture};
use fnrun_tests::registry::Registry;

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs the shell command `command` on a pseudo-terminal of type `term` (`$TERM`).
fn on_terminal(command: &str, term: &str) -> Finished {
    run_capture(
        Command::new("script")
            .args(["-qec", command, "/dev/null"])
            .env("TERM", term),
        None,
        CLI_GUARD,
    )
}

/// The layer digests of `repo` in `registry`, as `docker pull` names them (12 hex digits).
fn short_layer_digests(registry: &Registry, repo: &str) -> Vec<String> {
    let inspect = registry.inspect(repo).expect("skopeo inspect");
    let layers = inspect["Layers"].as_array().expect("skopeo lists layers");
    assert!(!layers.is_empty(), "{inspect}");
    layers
        .iter()
        .map(|l| {
            let digest = l.as_str().expect("a layer digest is a string");
            digest.trim_start_matches("sha256:")[..12].to_owned()
        })
        .collect()
}

#[test]
fn pull_shows_layer_bars_on_a_terminal_only() {
    if !fnrun_tests::have_tool("script") {
        eprintln!("skipping: util-linux script is missing");
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let digest = registry.digest("fns/echo:v1").expect("digest");
    let layers = short_layer_digests(&registry, "fns/echo:v1");
    let summary = format!("{image} {digest}");
    let cli = Cli::new().expect("cli");
    let pull = format!(
        "{} pull --cache-dir {} {}",
        quote(&fnrun_bin().display().to_string()),
        quote(&cli.cache_dir().display().to_string()),
        quote(&image)
    );

    // A first pull downloads every layer: a bar each, with sizes, ending complete.
    let out = on_terminal(&pull, "xterm");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for layer in &layers {
        assert!(
            out.stdout.contains(layer.as_str()),
            "{layer}: {}",
            out.describe()
        );
    }
    assert!(
        out.stdout.contains("MiB"),
        "no byte unit: {}",
        out.describe()
    );
    assert!(out.stdout.contains("Pull complete"), "{}", out.describe());
    assert!(out.stdout.contains(&summary), "{}", out.describe());

    // Pulled again, the layers are there already.
    let out = on_terminal(&pull, "xterm");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("Already exists"), "{}", out.describe());
    for layer in &layers {
        assert!(
            out.stdout.contains(layer.as_str()),
            "{layer}: {}",
            out.describe()
        );
    }

    // stderr to a file, stdout on the terminal: no bar anywhere, the summary line only.
    let fresh = Cli::new().expect("cli");
    let stderr_file = fresh.scratch().join("stderr");
    let pull_quiet = format!(
        "{} pull --cache-dir {} {} 2>{}",
        quote(&fnrun_bin().display().to_string()),
        quote(&fresh.cache_dir().display().to_string()),
        quote(&image),
        quote(&stderr_file.display().to_string())
    );
    let out = on_terminal(&pull_quiet, "xterm");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let stderr = std::fs::read_to_string(&stderr_file).expect("stderr file");
    assert_eq!(stderr, "", "{}", out.describe());
    assert_eq!(out.stdout.trim_end(), summary, "{}", out.describe());

    // A dumb terminal cannot redraw a line: no bars there either.
    let out = on_terminal(&pull, "dumb");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(out.stdout.trim_end(), summary, "{}", out.describe());

    // Pipes (a script, a log): the same one line on stdout, nothing on stderr.
    let fresh = Cli::new().expect("cli");
    let out = fresh.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(out.stdout, format!("{summary}\n"), "{}", out.describe());
    assert_eq!(out.stderr, "", "{}", out.describe());
}

#[test]
fn run_shows_its_pull_on_a_terminal_before_the_output() {
    if !fnrun_tests::have_tool("script") {
        eprintln!("skipping: util-linux script is missing");
        return;
    }
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let layers = short_layer_digests(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let input = cli.scratch().join("in.yaml");
    std::fs::write(&input, MINIMAL).expect("write the input");
    let input = input.display().to_string();

    // The first run pulls: a bar per layer, all of them drawn before the output.
    let out = cli.run_on_terminal(&["run", &image, &input], b"");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("Pull complete"), "{}", out.describe());
    let output_at = out.stdout.find("desired").expect("the output FunctionIO");
    for layer in &layers {
        let at = out.stdout.find(layer.as_str());
        assert!(
            at.is_some_and(|at| at < output_at),
            "{layer} before the output: {}",
            out.describe()
        );
    }

    // The image is cached: nothing of a pull.
    let out = cli.run_on_terminal(&["run", &image, &input], b"");
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("Pull complete"), "{}", out.describe());
    assert!(
        !layers.iter().any(|l| out.stdout.contains(l.as_str())),
        "{}",
        out.describe()
    );

    // Not a terminal: stdout is the output alone, and stderr stays empty.
    let fresh = Cli::new().expect("cli");
    let out = fresh.run(&["run", &image, &input], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(out.stderr, "", "{}", out.describe());
    assert_same_yaml(&out.stdout, MINIMAL);
}
