//! Issue 18's hostile documents and values through the CLI: each is refused
//! with a usage error (exit 2) naming what was wrong, or, from a function, is
//! the function's failure (exit 1); none panics, takes the process's memory
//! or a quadratic amount of CPU. (The daemon's side is `request_budget.rs`.)

use fnrun_tests::cli::Cli;
use fnrun_tests::functionio::MINIMAL;
use fnrun_tests::image::TestImage;
use fnrun_tests::krm::{self, RESOURCE_LIST};
use fnrun_tests::process::Finished;
use fnrun_tests::registry::Registry;

/// A duration that overflowed `Duration` when its parts were added.
const OVERFLOWING: &str = "18446744073709550000s18446744073709550000s";

/// An image reference that is never pulled: every case here is refused first.
const NEVER_PULLED: &str = "127.0.0.1:1/never/pulled:v1";

/// A FunctionIO with one anchored scalar of 1 MiB and 1,000 aliases to it:
/// 1 GiB once expanded.
fn alias_bomb() -> String {
    format!(
        "{MINIMAL}bomb:\n  s: &s \"{}\"\n  l: [{}]\n",
        "a".repeat(1 << 20),
        vec!["*s"; 1000].join(",")
    )
}

#[track_caller]
fn assert_usage_error(out: &Finished, want: &str) {
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains(want),
        "want {want:?}: {}",
        out.describe()
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.describe());
}

#[test]
fn an_overflowing_duration_is_a_usage_error_naming_the_flag() {
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "--timeout", OVERFLOWING, NEVER_PULLED, "-"],
        Some(MINIMAL.as_bytes()),
    );
    assert_usage_error(&out, "--timeout");
    assert_usage_error(&out, "is longer than a duration may be (8760h)");
}

#[test]
fn an_overflowing_idle_timeout_in_a_functions_file_is_a_usage_error() {
    let cli = Cli::new().expect("cli");
    let file = cli
        .write_file(
            "functions.yaml",
            format!(
                "functions:\n- name: f\n  image: {NEVER_PULLED}\n  idleTimeout: {OVERFLOWING}\n"
            ),
        )
        .expect("functions file");
    let out = cli.run(
        &[
            "serve",
            "--listen",
            &format!("unix://{}/fnrun.sock", cli.scratch().display()),
            "--functions-listen",
            "127.0.0.1:0",
            "--functions-insecure",
            "--functions",
            &file,
        ],
        None,
    );
    assert_usage_error(&out, "idleTimeout");
    assert_usage_error(&out, "is longer than a duration may be (8760h)");
}

#[test]
fn a_yaml_alias_bomb_is_refused_before_it_is_expanded() {
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", NEVER_PULLED, "-"], Some(alias_bomb().as_bytes()));
    assert_usage_error(&out, "YAML aliases expand the document by more than");
}

#[test]
fn a_quote_inside_a_plain_scalar_does_not_hide_deep_nesting() {
    let cli = Cli::new().expect("cli");
    let input = format!(
        "{MINIMAL}config: [a:\",{}{}\n",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let out = cli.run(&["run", NEVER_PULLED, "-"], Some(input.as_bytes()));
    assert_usage_error(&out, "YAML nodes are nested more than 128 deep (line ");
}

/// A function whose output is the alias bomb fails; the runner does not
/// expand it.
#[test]
fn a_function_that_writes_an_alias_bomb_fails() {
    let registry = Registry::start().expect("registry starts");
    let script = fnrun_tests::functionio::alias_bomb_function();
    let image = TestImage::script(&script).push_to(&registry, "fns/bomb:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(MINIMAL.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .contains("YAML aliases expand the document by more than"),
        "{}",
        out.describe()
    );
}

/// A multi-line string in a resource is written back as a block scalar when
/// fnrun sets the functionConfig (`-- key=value`); text there is not nesting.
#[test]
fn brackets_in_a_block_scalar_are_text() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let value = format!("x\n{}", "[".repeat(129));
    let input = format!(
        "{RESOURCE_LIST}- {{apiVersion: v1, kind: ConfigMap, metadata: {{name: text}}, data: {{v: {value:?}}}}}\n"
    );
    let out = cli.run(
        &["run", "--krm", &image, "-", "--", "a=b"],
        Some(input.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let items = krm::parse(&out.stdout)["items"].clone();
    assert_eq!(items[2]["data"]["v"].as_str(), Some(value.as_str()));
}
