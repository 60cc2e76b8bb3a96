//! `fnrun run --krm IMAGE [RESOURCE_LIST|-]`: KRM functions (kpt, kustomize)
//! against a real registry, as root and rootless. The Go function of
//! `tests/go/krmfn` (built in module mode on yaml.v3) and busybox scripts.
//!
//! Covered: the output ResourceList on stdout and a kpt-like summary on
//! stderr, `--quiet`; the choice by the input's kind; the function's
//! configuration from `-- key=value` and `--fn-config`; exit codes 0, 1 (the
//! function exited non-zero or reported an error), 2, 124; `--results-dir`;
//! the environment (nothing of the host's, `--env`); read-only and writable
//! mounts; `nobody` and `--as-current-user`; the network.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::fixtures::{self, PongServer};
use fnrun_tests::go;
use fnrun_tests::image::TestImage;
use fnrun_tests::krm::{self, RESOURCE_LIST, labels, result_starting, results, with_config};
use fnrun_tests::process::Finished;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::rootless_user;

fn registry() -> Registry {
    Registry::start().expect("registry starts")
}

/// `fnrun ARGS` with the sample ResourceList on stdin.
fn krm_run(cli: &Cli, args: &[&str]) -> Finished {
    cli.run(args, Some(RESOURCE_LIST.as_bytes()))
}

/// [`krm_run`], which must exit 0.
#[track_caller]
fn krm_ok(cli: &Cli, args: &[&str]) -> Finished {
    let out = krm_run(cli, args);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    out
}

/// Makes the CLI's scratch dir reachable by a root runner's sandbox (whose
/// root is an unprivileged host id) and returns it.
fn shared_scratch(cli: &Cli) -> &Path {
    let dir = cli.scratch();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// `data/hello` ("hi") in the CLI's scratch directory, for the mount probe.
fn data_dir(cli: &Cli) -> std::path::PathBuf {
    let data = shared_scratch(cli).join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("hello"), "hi\n").expect("write");
    data
}

#[test]
fn krm_run_prints_the_output_resourcelist_and_a_summary() {
    let registry = registry();
    let image = go::push_krm_function(&registry);
    let cli = Cli::new().expect("cli");
    let input = cli
        .write_file("rl.yaml", with_config("{key: app, value: web}"))
        .expect("input");
    let out = cli.run(&["run", "--krm", &image, &input], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        labels(&out.stdout, "app"),
        [Some("web".into()), Some("web".into())]
    );
    assert_eq!(
        results(&out.stdout),
        [("info".into(), "labelled 2 resources with app=web".into())]
    );
    // stderr: kpt's summary, with the function's own stderr.
    let summary = format!("[PASS] {image:?} in ");
    assert!(out.stderr.starts_with(&summary), "{}", out.describe());
    assert!(
        out.stderr
            .contains("  Results:\n    [info]: labelled 2 resources with app=web\n"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .contains("  Stderr:\n    krmfn: labelled 2 resources\n"),
        "{}",
        out.describe()
    );
    assert!(!out.stderr.contains("fnrun:"), "{}", out.describe());

    // Chosen by the input's kind, from stdin; --quiet leaves the function's
    // own stderr only.
    let out = cli.run(
        &["run", "-q", &image],
        Some(with_config("{key: app, value: api}").as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        labels(&out.stdout, "app"),
        [Some("api".into()), Some("api".into())]
    );
    assert_eq!(out.stderr, "krmfn: labelled 2 resources\n");
}

#[test]
fn the_function_config_comes_from_key_values_or_a_file() {
    let registry = registry();
    let image = go::push_krm_function(&registry);
    let cli = Cli::new().expect("cli");
    // kpt's function-input ConfigMap replaces the input's own.
    let out = cli.run(
        &["run", "--krm", &image, "-", "--", "key=tier", "value=gold"],
        Some(with_config("{key: app, value: web}").as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_eq!(
        labels(&out.stdout, "tier"),
        [Some("gold".into()), Some("gold".into())]
    );
    assert_eq!(labels(&out.stdout, "app"), [None, None]);
    let config = parse_function_config(&out.stdout);
    assert_eq!(config["metadata"]["name"].as_str(), Some("function-input"));
    assert_eq!(config["kind"].as_str(), Some("ConfigMap"));

    let file = cli
        .write_file(
            "fn-config.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: my-config}\ndata: {key: owner, value: team-a}\n",
        )
        .expect("fn-config");
    let out = krm_ok(&cli, &["run", "--fn-config", &file, &image]);
    assert_eq!(
        labels(&out.stdout, "owner"),
        [Some("team-a".into()), Some("team-a".into())]
    );
    assert_eq!(
        parse_function_config(&out.stdout)["metadata"]["name"].as_str(),
        Some("my-config")
    );

    // Both at once, a config that is not a KRM object, an argument that is
    // not key=value: usage errors, before anything runs.
    for (args, want) in [
        (
            vec!["run", "--fn-config", &file, &image, "--", "a=b"],
            "cannot be used with",
        ),
        (
            vec!["run", "--krm", &image, "--", "a=b", "oops"],
            "not of the form key=value",
        ),
    ] {
        let out = krm_run(&cli, &args);
        assert_eq!(out.code, Some(2), "{}", out.describe());
        assert!(out.stderr.contains(want), "{}", out.describe());
        assert!(out.stdout.is_empty(), "{}", out.describe());
    }
    let bad = cli
        .write_file("bad.yaml", "kind: ConfigMap\ndata: {}\n")
        .expect("bad config");
    let out = krm_run(&cli, &["run", "--fn-config", &bad, &image]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("functionConfig: resource must have `apiVersion`"),
        "{}",
        out.describe()
    );
}

fn parse_function_config(yaml: &str) -> serde_norway::Value {
    krm::parse(yaml)["functionConfig"].clone()
}

#[test]
fn exit_codes_follow_kpt() {
    let registry = registry();
    let image = go::push_krm_function(&registry);
    let sleeper = fixtures::sleeper(67).push_to(&registry, "fns/sleep:v1");
    let cli = Cli::new().expect("cli");

    // An error result with exit 0: exit 1, the output (with its results)
    // still printed, as kpt and kustomize read it.
    let out = krm_run(
        &cli,
        &["run", &image, "-", "--", "key=a", "value=b", "fail=result"],
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        results(&out.stdout).contains(&("error".into(), "value is not allowed".into())),
        "{}",
        out.describe()
    );
    assert!(out.stderr.starts_with("[FAIL] "), "{}", out.describe());
    assert!(
        out.stderr
            .contains("    [error] apps/v1/Deployment/prod/web: value is not allowed\n"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .ends_with("fnrun: the function reported 1 error result\n"),
        "{}",
        out.describe()
    );

    // An error result and exit 1, as kpt's Go SDK fails: the same, with the
    // exit code.
    let out = krm_run(&cli, &["run", &image, "-", "--", "fail=exit"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        results(&out.stdout).contains(&("error".into(), "value is not allowed".into())),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("  Exit code: 1\n"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.ends_with("fnrun: function exited with code 1\n"),
        "{}",
        out.describe()
    );

    // A crash: nothing on stdout, its stderr and exit code on stderr.
    let out = krm_run(&cli, &["run", &image, "-", "--", "fail=crash"]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert!(
        out.stderr.contains("    krmfn: panic: asked to crash\n"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("  Exit code: 2\n"),
        "{}",
        out.describe()
    );

    // Output that is not a ResourceList: exit 1, nothing printed.
    let hello = TestImage::script(fixtures::HELLO_SCRIPT).push_to(&registry, "fns/hello:v1");
    let out = krm_run(&cli, &["run", "--krm", &hello]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert!(
        out.stderr
            .contains("fnrun: function output is not a ResourceList: "),
        "{}",
        out.describe()
    );

    // Invalid input: 2; a missing image: 1; a timeout: 124.
    let out = cli.run(
        &["run", "--krm", &image],
        Some(b"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: {}\n"),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("input is not a ResourceList: items is a mapping, expected a sequence"),
        "{}",
        out.describe()
    );
    let missing = registry.reference("fns/missing:v1");
    let out = krm_run(&cli, &["run", "--krm", &missing]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("not found"), "{}", out.describe());
    let out = krm_run(&cli, &["run", "--krm", "--timeout", "1s", &sleeper]);
    assert_eq!(out.code, Some(124), "{}", out.describe());
    assert!(
        out.stderr.contains("ran past its timeout of 1s"),
        "{}",
        out.describe()
    );
    let left = fixtures::leftover_processes(&["sleep", "67"], Duration::from_secs(5));
    fixtures::kill_pids(&left);
    assert!(left.is_empty(), "the timed-out function is still running");
}

#[test]
fn results_dir_gets_kpts_results_yaml() {
    let registry = registry();
    let image = go::push_krm_function(&registry);
    let cli = Cli::new().expect("cli");
    let dir = cli.scratch().join("results/nested");
    let dir_arg = dir.display().to_string();
    let out = krm_ok(
        &cli,
        &[
            "run",
            "--results-dir",
            &dir_arg,
            &image,
            "-",
            "--",
            "key=a",
            "value=b",
        ],
    );
    assert!(
        out.stderr.contains(&format!(
            "For complete results, see {dir_arg}/results.yaml\n"
        )),
        "{}",
        out.describe()
    );
    let yaml = std::fs::read_to_string(dir.join("results.yaml")).expect("results.yaml");
    assert_eq!(
        yaml,
        format!(
            "apiVersion: kpt.dev/v1\nkind: FunctionResultList\nmetadata:\n  name: fnresults\nexitCode: 0\nitems:\n- image: {image}\n  stderr: |\n    krmfn: labelled 2 resources\n  exitCode: 0\n  results:\n  - message: labelled 2 resources with a=b\n    severity: info\n"
        )
    );
    let out = krm_run(
        &cli,
        &[
            "run",
            "--results-dir",
            &dir_arg,
            &image,
            "-",
            "--",
            "fail=exit",
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let yaml = std::fs::read_to_string(dir.join("results.yaml")).expect("results.yaml");
    let doc = fnrun_tests::functionio::parse(&yaml);
    assert_eq!(doc["exitCode"].as_i64(), Some(1), "{yaml}");
    assert_eq!(doc["items"][0]["exitCode"].as_i64(), Some(1), "{yaml}");
    assert_eq!(
        doc["items"][0]["results"][1]["resourceRef"]["name"].as_str(),
        Some("web"),
        "{yaml}"
    );
}

#[test]
fn results_yaml_records_the_functions_stderr_not_fnruns_message() {
    // A function that says what it is doing, then runs past its timeout:
    // results.yaml's stderr is what it said, as kpt records it.
    let registry = registry();
    let image = TestImage::script(
        "#!/bin/sh\ncat >/dev/null\necho 'slow: still working' >&2\nexec sleep 60\n",
    )
    .push_to(&registry, "fns/slow-krm:v1");
    let cli = Cli::new().expect("cli");
    let dir = cli.scratch().join("results");
    let dir_arg = dir.display().to_string();
    let out = krm_run(
        &cli,
        &[
            "run",
            "--krm",
            "--timeout",
            "2s",
            "--results-dir",
            &dir_arg,
            &image,
            "-",
        ],
    );
    assert_eq!(out.code, Some(124), "{}", out.describe());
    let yaml = std::fs::read_to_string(dir.join("results.yaml")).expect("results.yaml");
    let doc = fnrun_tests::functionio::parse(&yaml);
    assert_eq!(
        doc["items"][0]["stderr"].as_str(),
        Some("slow: still working\n"),
        "{yaml}"
    );
    // The summary shows it once; fnrun's own line says what happened.
    assert_eq!(
        out.stderr.matches("slow: still working").count(),
        1,
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .contains("fnrun: function ran past its timeout of 2s\n"),
        "{}",
        out.describe()
    );
}

#[test]
fn the_environment_is_the_images_and_what_env_passes() {
    let registry = registry();
    let image = TestImage::script(
        "#!/bin/sh\ncat\necho \"results:\"\n\
         for v in FROM_IMAGE FNRUN_TEST_SECRET PASSED; do\n  \
           line=$(env | grep \"^$v=\")\n  \
           [ -n \"$line\" ] || line=\"$v=unset\"\n  \
           echo \"- {severity: info, message: '$line'}\"\n\
         done\n",
    )
    .env("FROM_IMAGE", "image")
    .env("PASSED", "image")
    .push_to(&registry, "fns/env:v1");
    let mut cli = Cli::new().expect("cli");
    cli.env("FNRUN_TEST_SECRET", "s3cr3t").env("PASSED", "host");
    let messages = |args: &[&str]| {
        let out = krm_ok(&cli, args);
        results(&out.stdout)
            .into_iter()
            .map(|(_, m)| m)
            .collect::<Vec<_>>()
    };
    // Nothing of fnrun's environment.
    assert_eq!(
        messages(&["run", "--krm", &image]),
        [
            "FROM_IMAGE=image",
            "FNRUN_TEST_SECRET=unset",
            "PASSED=image"
        ]
    );
    // KEY takes fnrun's value; KEY=VALUE is given; both replace the image's.
    assert_eq!(
        messages(&[
            "run",
            "--krm",
            "--env",
            "FNRUN_TEST_SECRET",
            "-e",
            "PASSED=flag",
            "-e",
            "FNRUN_NOT_SET_ANYWHERE",
            &image
        ]),
        [
            "FROM_IMAGE=image",
            "FNRUN_TEST_SECRET=s3cr3t",
            "PASSED=flag"
        ]
    );
    let out = krm_run(&cli, &["run", "--krm", "-e", "=x", &image]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("the name is empty"),
        "{}",
        out.describe()
    );
}

/// A script function that reports, in results, what it sees at /data and
/// whether it can write there.
fn mount_probe(registry: &Registry) -> String {
    TestImage::script(
        "#!/bin/sh\ncat\nread -r hello < /data/hello\n\
         if echo x > /data/written 2>/dev/null; then w=ok; else w=refused; fi\n\
         echo \"results:\"\n\
         echo \"- {severity: info, message: 'read=$hello write=$w id=$(id -u):$(id -g)'}\"\n",
    )
    .push_to(registry, "fns/mounts:v1")
}

#[test]
fn mounts_are_read_only_unless_rw_and_checked_strictly() {
    let registry = registry();
    let image = mount_probe(&registry);
    let cli = Cli::new().expect("cli");
    let data = data_dir(&cli);
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let ro = format!("type=bind,src={},dst=/data", data.display());
    let out = krm_ok(&cli, &["run", "--krm", "--mount", &ro, &image]);
    // nobody: 65534 of the root runner's range.
    assert_eq!(
        krm::last_message(&out.stdout),
        "read=hi write=refused id=65534:65534"
    );
    assert!(!data.join("written").exists());
    // Writable, and given relative to the current directory (kustomize's
    // working directory for exec functions).
    let out = krm_ok(
        &cli,
        &[
            "run",
            "--mount",
            "type=bind,src=data,dst=/data,rw=true",
            &image,
        ],
    );
    assert_eq!(
        krm::last_message(&out.stdout),
        "read=hi write=ok id=65534:65534"
    );
    let written = std::fs::metadata(data.join("written")).expect("written on the host");
    assert_eq!(written.uid(), 100_000 + 65534, "nobody of the mapped range");
    std::fs::remove_file(data.join("written")).expect("rm");
    // docker's spellings: source=, target= (or destination=), readonly.
    for (options, write) in [
        ("readonly", "refused"),
        ("ro=true", "refused"),
        ("readonly=false", "ok"),
    ] {
        let spec = format!("type=bind,source={},target=/data,{options}", data.display());
        let out = krm_ok(&cli, &["run", "--krm", "--mount", &spec, &image]);
        assert_eq!(
            krm::last_message(&out.stdout),
            format!("read=hi write={write} id=65534:65534"),
            "{spec}"
        );
    }
    let spec = format!("type=bind,source={},destination=/data", data.display());
    let out = krm_ok(&cli, &["run", "--krm", "--mount", &spec, &image]);
    assert!(krm::last_message(&out.stdout).starts_with("read=hi write=refused"));

    for (spec, want) in [
        (
            format!("type=bind,src={},dst=/data/../etc", data.display()),
            "has a \"..\" component",
        ),
        (
            format!("type=bind,src={}/../data,dst=/data", data.display()),
            "has a `..` component",
        ),
        (
            format!("type=bind,src={},dst=data", data.display()),
            "is not an absolute path",
        ),
        (
            format!("type=bind,src={},dst=/proc/sys", data.display()),
            "under /proc",
        ),
        (
            "type=bind,src=/nonexistent/fnrun,dst=/data".to_owned(),
            "No such file or directory",
        ),
        (
            "type=bind,src=/dev/null,dst=/data".to_owned(),
            "is a device",
        ),
        (
            format!("type=volume,src={},dst=/data", data.display()),
            "only bind mounts",
        ),
        (
            format!("type=bind,src={},dst=/data,rw=1", data.display()),
            "rw is \"1\"",
        ),
        (
            format!(
                "type=bind,src={},dst=/data,rw=true,readonly",
                data.display()
            ),
            "rw and readonly are both given",
        ),
    ] {
        let out = krm_run(&cli, &["run", "--krm", "--mount", &spec, &image]);
        assert_eq!(out.code, Some(2), "{spec}: {}", out.describe());
        assert!(out.stderr.contains(want), "{spec}: {}", out.describe());
        assert!(out.stdout.is_empty(), "{}", out.describe());
    }
    // A source the sandbox's root cannot reach (a root runner's sandbox root
    // is an unprivileged host id): refused with why.
    let private = cli.scratch().join("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::create_dir(private.join("data")).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let spec = format!("type=bind,src={}/data,dst=/data", private.display());
    let out = krm_run(&cli, &["run", "--krm", "--mount", &spec, &image]);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("cannot reach the source") && out.stderr.contains("EACCES"),
        "{}",
        out.describe()
    );
}

#[test]
fn as_current_user_writes_as_the_caller() {
    let registry = registry();
    let image = mount_probe(&registry);
    let cli = Cli::new().expect("cli");
    // Root's own directory, not writable by nobody.
    let data = data_dir(&cli);
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let rw = format!("type=bind,src={},dst=/data,rw=true", data.display());
    let out = krm_ok(&cli, &["run", "--krm", "--mount", &rw, &image]);
    assert!(
        krm::last_message(&out.stdout).contains("write=refused"),
        "{}",
        out.describe()
    );
    let out = krm_ok(
        &cli,
        &["run", "--krm", "--as-current-user", "--mount", &rw, &image],
    );
    // The caller, root, is mapped one past the range: 65536 inside.
    assert_eq!(
        krm::last_message(&out.stdout),
        "read=hi write=ok id=65536:65536"
    );
    let written = std::fs::metadata(data.join("written")).expect("written on the host");
    assert_eq!((written.uid(), written.gid()), (0, 0));
}

#[test]
fn network_is_off_unless_asked() {
    let registry = registry();
    let image = go::push_krm_function(&registry);
    let server = PongServer::start();
    let cli = Cli::new().expect("cli");
    let dial = format!("dial=127.0.0.1:{}", server.port());
    let out = krm_ok(&cli, &["run", &image, "-", "--", &dial]);
    assert!(
        result_starting(&out.stdout, "dial ").ends_with(": failed"),
        "{}",
        out.describe()
    );
    let out = krm_ok(&cli, &["run", "--network", &image, "-", "--", &dial]);
    assert!(
        result_starting(&out.stdout, "dial ").ends_with(": connected"),
        "{}",
        out.describe()
    );
}

#[test]
fn krm_flags_need_a_resourcelist() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "-e", "A=b", &image],
        Some(fnrun_tests::functionio::SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("--env is for KRM functions, and the input is not a ResourceList"),
        "{}",
        out.describe()
    );
    // --krm on a FunctionIO: refused as input that is not a ResourceList.
    let out = cli.run(
        &["run", "--krm", &image],
        Some(fnrun_tests::functionio::SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("input is not a ResourceList: kind is missing"),
        "{}",
        out.describe()
    );
}

/// `-o` is a format, as in every other command: `-o json` and `-o yaml`
/// print the ResourceList so, and make no directory `./json`; a directory
/// is kpt's `--output DIR` or `--output-dir DIR`.
#[test]
fn dash_o_is_a_format_and_the_directory_is_spelled_out() {
    let registry = registry();
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let cli = Cli::new().expect("cli");
    let out = krm_ok(&cli, &["run", &image, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.describe()));
    assert_eq!(json["kind"], "ResourceList", "{}", out.stdout);
    assert_eq!(
        json["items"][0]["metadata"]["name"], "web",
        "{}",
        out.stdout
    );
    let out = krm_ok(&cli, &["run", &image, "-o", "yaml"]);
    let yaml: serde_json::Value = serde_norway::from_str(&out.stdout).expect("YAML");
    assert_eq!(yaml, json);
    for format in ["json", "yaml"] {
        assert!(
            !cli.scratch().join(format).exists(),
            "-o {format} made a directory"
        );
    }
    let out = krm_run(&cli, &["run", &image, "-o", "out"]);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(out.stderr.contains("--output DIR"), "{}", out.describe());
    assert!(!cli.scratch().join("out").exists());
    let dir = cli.scratch().join("out-dir");
    let out = krm_ok(
        &cli,
        &["run", &image, "--output-dir", dir.to_str().unwrap()],
    );
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert!(dir.join("deployment.yaml").is_file(), "{}", out.describe());
}

/// Rootless: the runner maps one id, the caller's own, as 0: the function
/// runs as that (nobody does not exist), with or without
/// `--as-current-user`, and so writes as the caller.
#[test]
fn rootless_krm_runs_as_the_callers_one_id() {
    let Some(user) = rootless_user("rootless_krm_runs_as_the_callers_one_id") else {
        return;
    };
    let registry = registry();
    let go_image = go::push_krm_function(&registry);
    let probe = mount_probe(&registry);
    let server = PongServer::start();
    let cli = Cli::as_user(user.clone()).expect("cli");
    let data = data_dir(&cli);
    user.chown_recursive(&data).expect("chown");
    let rw = format!("type=bind,src={},dst=/data,rw=true", data.display());
    for extra in [None, Some("--as-current-user")] {
        let mut args = vec!["run", "--krm", "--mount", &rw];
        args.extend(extra);
        args.push(&probe);
        let out = krm_ok(&cli, &args);
        assert_eq!(krm::last_message(&out.stdout), "read=hi write=ok id=0:0");
        let written = std::fs::metadata(data.join("written")).expect("written");
        assert_eq!((written.uid(), written.gid()), (user.uid, user.gid));
        std::fs::remove_file(data.join("written")).expect("rm");
    }
    let dial = format!("dial=127.0.0.1:{}", server.port());
    let out = krm_ok(
        &cli,
        &[
            "run",
            "--network",
            &go_image,
            "-",
            "--",
            "key=app",
            "value=web",
            &dial,
        ],
    );
    assert_eq!(
        labels(&out.stdout, "app"),
        [Some("web".into()), Some("web".into())]
    );
    assert!(
        result_starting(&out.stdout, "dial ").ends_with(": connected"),
        "{}",
        out.describe()
    );
    let out = krm_ok(&cli, &["run", &go_image, "-", "--", &dial]);
    assert!(
        result_starting(&out.stdout, "dial ").ends_with(": failed"),
        "{}",
        out.describe()
    );
}
