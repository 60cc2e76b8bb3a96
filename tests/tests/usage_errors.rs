//! Usage and invalid-input errors exit 2 in every command, with one
//! `fnrun:` line (or clap's usage message): `pull` of something that is no
//! image reference, `serve` with an address that cannot be one or flags
//! that do not go together.

use fnrun_tests::cli::Cli;

#[test]
fn pull_of_what_is_no_image_reference_exits_2_and_pulls_nothing() {
    let cli = Cli::new().expect("cli");
    for image in ["Not A Ref", "docker-archive:/tmp/fn.tar", ""] {
        let out = cli.run(&["pull", image], None);
        assert_eq!(out.code, Some(2), "{image:?}: {}", out.describe());
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
        assert!(out.stderr.starts_with("fnrun: "), "{}", out.describe());
    }
    // A bad reference after a good one: refused before anything is pulled
    // (nothing listens on port 9 of loopback: a pull would fail with 1).
    let out = cli.run(&["pull", "127.0.0.1:9/fns/a:v1", "Not A Ref"], None);
    assert_eq!(out.code, Some(2), "{}", out.describe());
}

#[test]
fn serve_usage_errors_exit_2_in_one_line() {
    let cli = Cli::new().expect("cli");
    let cache = cli.cache_dir().display().to_string();
    for (args, says) in [
        (
            &["--listen", "127.0.0.1:80000"][..],
            "the port \"80000\" is not a number from 0 to 65535",
        ),
        (&["--listen", "nowhere"][..], "is not unix:PATH"),
        (
            &["--listen", "none"][..],
            "--listen none leaves nothing to serve",
        ),
        (
            &[
                "--function",
                "fn-a=oci:/nowhere:v1",
                "--functions-listen",
                "127.0.0.1:0",
            ][..],
            "serves TLS: give --functions-ca-cert and --functions-ca-key",
        ),
    ] {
        let serve = [&["serve", "--cache-dir", &cache][..], args].concat();
        let out = cli.run_as_given(&serve, &[], None);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.describe());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.describe());
        assert_eq!(
            out.stderr.lines().count(),
            1,
            "{args:?}: {}",
            out.describe()
        );
        assert!(out.stderr.starts_with("fnrun: "), "{}", out.describe());
    }
}

#[test]
fn function_serve_usage_errors_exit_2() {
    let cli = Cli::new().expect("cli");
    let cache = cli.cache_dir().display().to_string();
    for (args, says) in [
        (&["--listen", "nowhere"][..], "--listen"),
        (&["--env", "NOVALUE"][..], "NOVALUE"),
    ] {
        let serve = [
            &["function", "serve", "--cache-dir", &cache][..],
            args,
            &["example.org/fns/fn:v1"],
        ]
        .concat();
        let out = cli.run_as_given(&serve, &[], None);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.describe());
        assert!(out.stderr.contains(says), "{args:?}: {}", out.describe());
        assert!(out.stderr.starts_with("fnrun: "), "{}", out.describe());
    }
}
