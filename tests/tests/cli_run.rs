//! `fnrun run IMAGE [FUNCTIONIO|-]` against a real registry: output, exit codes
//! (0 ok, 1 the function or the run failed, 2 usage or invalid input, 124
//! timeout) and error messages.

use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::fixtures::{self, FAIL_SCRIPT, HELLO_SCRIPT, NOT_FUNCTIONIO};
use fnrun_tests::functionio::{MINIMAL, SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;

fn registry() -> Registry {
    Registry::start().expect("registry starts")
}

#[test]
fn run_prints_the_output_functionio_and_exits_0() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let input = cli.write_file("input.yaml", SAMPLE).expect("input");
    let out = cli.run(&["run", &image, &input], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}

#[test]
fn run_reads_stdin_with_dash_or_without_a_file() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
    let out = cli.run(&["run", &image], Some(MINIMAL.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, MINIMAL);
}

#[test]
fn function_failure_exits_1_with_the_function_stderr() {
    let registry = registry();
    let image = TestImage::script(FAIL_SCRIPT).push_to(&registry, "fns/fail:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("boom"), "{}", out.describe());
    assert!(
        out.stderr.contains('3'),
        "the exit code is reported: {}",
        out.describe()
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout: {}",
        out.describe()
    );
}

#[test]
fn timeout_exits_124_quickly_and_kills_the_function() {
    let registry = registry();
    let image = fixtures::sleeper(61).push_to(&registry, "fns/sleep:v1");
    let cli = Cli::new().expect("cli");
    // Pull first so that the timed run measures the function, not the pull.
    let pull = cli.run(&["pull", &image], None);
    assert_eq!(pull.code, Some(0), "{}", pull.describe());
    let out = cli.run(
        &["run", "--timeout", "2s", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(124), "{}", out.describe());
    assert!(out.elapsed < Duration::from_secs(15), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert!(
        !out.stderr.contains("Function package"),
        "a plain timeout guesses at a Function package: {}",
        out.describe()
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    let left = fixtures::leftover_processes(&["sleep", "61"], Duration::from_secs(5));
    fixtures::kill_pids(&left);
    assert!(
        left.is_empty(),
        "the timed-out function is still running: {left:?}"
    );
}

/// A Crossplane Function package (its `package.yaml` a
/// `meta.pkg.crossplane.io` `Function`) is a gRPC server: `fnrun run` refuses
/// it at once, as FunctionIO and as KRM, with exit 2 and a pointer to
/// `fnrun function call`, instead of waiting for the timeout. Its entrypoint
/// (here one that would sleep) never starts.
#[test]
fn a_function_package_is_pointed_to_function_call() {
    let registry = registry();
    let package = "apiVersion: meta.pkg.crossplane.io/v1beta1\nkind: Function\n\
                   metadata:\n  name: function-sleeps\n";
    let image = fixtures::sleeper(62)
        .annotated_layer(
            [("/package.yaml", package)],
            &[("io.crossplane.xpkg", "base")],
        )
        .push_to(&registry, "fns/package:v1");
    let cli = Cli::new().expect("cli");
    let krm = "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n";
    for input in [SAMPLE, krm] {
        let out = cli.run(&["run", &image, "-"], Some(input.as_bytes()));
        assert_eq!(out.code, Some(2), "{}", out.describe());
        assert!(out.elapsed < Duration::from_secs(15), "{}", out.describe());
        assert!(
            out.stderr
                .contains("is a Crossplane Function package (function-sleeps), a gRPC server")
                && out
                    .stderr
                    .contains("call it with `fnrun function call IMAGE REQUEST`"),
            "{}",
            out.describe()
        );
        assert!(out.stdout.is_empty(), "{}", out.describe());
    }
    let left = fixtures::leftover_processes(&["sleep", "62"], Duration::from_secs(1));
    fixtures::kill_pids(&left);
    assert!(left.is_empty(), "the package's entrypoint ran: {left:?}");
}

#[test]
fn input_that_is_not_functionio_exits_2() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    for input in NOT_FUNCTIONIO {
        let out = cli.run(&["run", &image, "-"], Some(input.as_bytes()));
        assert_eq!(out.code, Some(2), "input {input:?}: {}", out.describe());
        assert!(out.stdout.is_empty(), "{}", out.describe());
        assert!(
            !out.stderr.trim().is_empty(),
            "says why: {}",
            out.describe()
        );
    }
}

#[test]
fn input_is_refused_before_the_image_is_pulled() {
    // The image does not exist: refusing the input first gives 2, not 1.
    let registry = registry();
    let cli = Cli::new().expect("cli");
    let image = registry.reference("fns/missing:v1");
    let out = cli.run(&["run", &image, "-"], Some(b"- not\n- a mapping\n"));
    assert_eq!(out.code, Some(2), "{}", out.describe());
}

#[test]
fn usage_errors_exit_2() {
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run"], None);
    assert_eq!(out.code, Some(2), "missing IMAGE: {}", out.describe());
    let out = cli.run(&["run", "--no-such-flag", "example.org/fn:v1"], None);
    assert_eq!(out.code, Some(2), "unknown flag: {}", out.describe());
    let out = cli.run(
        &["run", "--timeout", "soon", "example.org/fn:v1", "-"],
        Some(MINIMAL.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "bad duration: {}", out.describe());
}

#[test]
fn missing_image_exits_1_with_not_found() {
    let registry = registry();
    TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    for image in [
        registry.reference("fns/missing:v1"),
        registry.reference("fns/echo:no-such-tag"),
    ] {
        let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
        assert_eq!(out.code, Some(1), "{image}: {}", out.describe());
        assert!(
            out.stderr.to_lowercase().contains("not found"),
            "{image}: {}",
            out.describe()
        );
        assert!(out.stdout.is_empty(), "{}", out.describe());
    }
}

#[test]
fn output_that_is_not_functionio_exits_1() {
    let registry = registry();
    let image = TestImage::script(HELLO_SCRIPT).push_to(&registry, "fns/hello:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stdout.is_empty(),
        "invalid output is not printed: {}",
        out.describe()
    );
    assert_eq!(
        out.stderr.trim().lines().count(),
        1,
        "one clear line: {}",
        out.describe()
    );
}

#[test]
fn errors_are_one_line_on_stderr() {
    let registry = registry();
    let cli = Cli::new().expect("cli");
    let image = registry.reference("fns/missing:v1");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.describe());
}

#[test]
fn run_on_a_terminal_says_it_reads_stdin() {
    let cli = Cli::new().expect("cli");
    // Ctrl-D at once: an empty input, which is not a FunctionIO.
    let out = cli.run_on_terminal(
        &[
            "run",
            "--image-pull-policy",
            "Never",
            "example.org/fns/echo:v1",
        ],
        b"\x04",
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stdout.contains(
            "fnrun: reading the input (a FunctionIO or a ResourceList) from stdin; \
             end it with Ctrl-D, or give a file: fnrun run IMAGE FILE"
        ),
        "{}",
        out.describe()
    );
    // Not on a pipe: there stdin is the input, as ever.
    let out = cli.run(
        &[
            "run",
            "--image-pull-policy",
            "Never",
            "example.org/fns/echo:v1",
        ],
        Some(b""),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        !out.stderr.contains("reading the input"),
        "{}",
        out.describe()
    );
}

#[test]
fn a_fatal_result_exits_1_and_is_named() {
    let registry = registry();
    let image = TestImage::script(
        "#!/bin/sh\ncat >/dev/null\nprintf 'results:\\n- severity: Normal\\n  message: fine\\n- severity: Fatal\\n  message: no database\\n'\n",
    )
    .push_to(&registry, "fns/fatal:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert_eq!(
        out.stderr,
        "fnrun: the function returned a fatal result: no database\n",
        "{}",
        out.describe()
    );
    // The output FunctionIO is printed all the same, as Crossplane reads it.
    assert!(out.stdout.contains("no database"), "{}", out.describe());
    // Warnings are no failure.
    let image = TestImage::script(
        "#!/bin/sh\ncat >/dev/null\nprintf 'results:\\n- severity: Warning\\n  message: hm\\n'\n",
    )
    .push_to(&registry, "fns/warning:v1");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}

#[test]
fn a_functions_stderr_keeps_its_line_breaks_on_a_terminal() {
    let registry = registry();
    let image = TestImage::script("#!/bin/sh\necho first line >&2\necho second line >&2\nexit 3\n")
        .push_to(&registry, "fns/two-lines:v1");
    let cli = Cli::new().expect("cli");
    let input = cli.write_file("input.yaml", SAMPLE).expect("input");
    // Piped: one line, `\n` standing for the breaks.
    let out = cli.run(&["run", &image, &input], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("first line\\nsecond line"),
        "{}",
        out.describe()
    );
    // On a terminal: as the function wrote it.
    let out = cli.run_on_terminal(&["run", &image, &input], b"");
    assert!(
        out.stdout.contains("first line\r\nsecond line"),
        "{}",
        out.describe()
    );
    assert!(!out.stdout.contains("\\n"), "{}", out.describe());
}

#[test]
fn a_run_function_request_points_to_function_call() {
    let cli = Cli::new().expect("cli");
    let request =
        "meta: {tag: t}\nobserved:\n  composite:\n    resource: {apiVersion: x/v1, kind: XR}\n";
    let out = cli.run(
        &["run", "example.org/fns/fn:v1", "-"],
        Some(request.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("is a RunFunctionRequest")
            && out.stderr.contains("fnrun function call IMAGE FILE"),
        "{}",
        out.describe()
    );
}
