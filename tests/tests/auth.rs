//! Registry credentials: ImagePullAuth over gRPC, podman's and skopeo's
//! `auth.json`, `~/.docker/config.json` and docker credential helpers for the
//! CLI, and refused credentials.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fnrun_api::v1alpha1::ImagePullAuth;
use fnrun_tests::cli::Cli;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::{SAMPLE, assert_same_yaml};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use tonic::Code;

const USER: &str = "alice";
const PASSWORD: &str = "s3cret";

fn private_registry() -> (Registry, String) {
    let registry = Registry::start_with_htpasswd(USER, PASSWORD).expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "private/echo:v1");
    (registry, image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password_pull_a_private_image() {
    let (_registry, image) = private_registry();
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let output = client::run_function(
        &mut client,
        Run::new(&image, SAMPLE).basic_auth(USER, PASSWORD).build(),
    )
    .await
    .expect("runs");
    assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_config_style_auth_pulls_a_private_image() {
    let (_registry, image) = private_registry();
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    let auth = ImagePullAuth {
        auth: STANDARD.encode(format!("{USER}:{PASSWORD}")),
        ..Default::default()
    };
    let output = client::run_function(&mut client, Run::new(&image, SAMPLE).auth(auth).build())
        .await
        .expect("runs");
    assert_same_yaml(&String::from_utf8_lossy(&output.output), SAMPLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_credentials_are_refused() {
    let (_registry, image) = private_registry();
    let daemon = Daemon::start(DaemonOpts::default()).expect("fnrun serve starts");
    let mut client = daemon.client().await.expect("connects");
    for request in [
        Run::new(&image, SAMPLE),
        Run::new(&image, SAMPLE).basic_auth(USER, "wrong"),
    ] {
        let status = client::run_function(&mut client, request.build())
            .await
            .expect_err("refused");
        assert!(
            matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ),
            "{status:?}"
        );
    }
}

#[test]
fn cli_uses_docker_config_credentials() {
    let (registry, image) = private_registry();
    let mut cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(1), "no credentials yet: {}", out.describe());

    let home = cli.scratch().join("home");
    std::fs::create_dir_all(home.join(".docker")).expect("mkdir");
    let config = serde_json::json!({
        "auths": { registry.addr(): { "auth": STANDARD.encode(format!("{USER}:{PASSWORD}")) } }
    });
    std::fs::write(home.join(".docker/config.json"), config.to_string()).expect("write config");
    cli.env("HOME", &home.display().to_string());
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);
}

/// `--authfile FILE` (and `REGISTRY_AUTH_FILE`), as podman and skopeo take
/// it: an auth.json in the docker config format instead of ~/.docker's.
#[test]
fn cli_takes_an_authfile_as_podman_and_skopeo_do() {
    let (registry, image) = private_registry();
    let mut cli = Cli::new().expect("cli");
    // A home without credentials: only the auth file has them.
    let home = cli.scratch().join("home");
    std::fs::create_dir_all(&home).expect("mkdir");
    cli.env("HOME", &home.display().to_string());
    let auth = serde_json::json!({
        "auths": { registry.addr(): { "auth": STANDARD.encode(format!("{USER}:{PASSWORD}")) } }
    });
    let authfile = cli
        .write_file("auth.json", auth.to_string())
        .expect("write auth.json");
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(1), "no credentials: {}", out.describe());

    let out = cli.run(&["pull", "--authfile", &authfile, &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let out = cli.run(
        &[
            "run",
            "--image-pull-policy",
            "always",
            "--authfile",
            &authfile,
            &image,
            "-",
        ],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);

    // The variable podman and skopeo read.
    cli.env("REGISTRY_AUTH_FILE", &authfile);
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());

    // A missing file is an error that names it, not an anonymous pull.
    let missing = cli.scratch().join("missing.json").display().to_string();
    let out = cli.run(&["pull", "--authfile", &missing, &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("missing.json") && out.stderr.contains("No such file"),
        "{}",
        out.describe()
    );
}

/// podman's and skopeo's logins, where containers-image keeps them:
/// `$XDG_RUNTIME_DIR/containers/auth.json` first, then
/// `$XDG_CONFIG_HOME/containers/auth.json`, then docker's config; a refusal
/// names the files searched (or the one that gave the credentials) and
/// `--authfile`.
#[test]
fn cli_finds_podmans_and_skopeos_logins() {
    let (registry, image) = private_registry();
    let mut cli = Cli::new().expect("cli");
    let dir = cli.scratch().to_owned();
    let (home, run, config) = (dir.join("home"), dir.join("run"), dir.join("config"));
    for d in [&home, &run, &config] {
        std::fs::create_dir_all(d.join("containers")).expect("mkdir");
    }
    cli.env("HOME", &home.display().to_string())
        .env("XDG_RUNTIME_DIR", &run.display().to_string())
        .env("XDG_CONFIG_HOME", &config.display().to_string())
        .env("DOCKER_CONFIG", "");
    let login = |path: &Path, password: &str| {
        let auth = serde_json::json!({
            "auths": { registry.addr(): { "auth": STANDARD.encode(format!("{USER}:{password}")) } }
        });
        std::fs::write(path, auth.to_string()).expect("write auth.json");
    };
    let runtime_file = run.join("containers/auth.json");
    let config_file = config.join("containers/auth.json");
    let docker_file = home.join(".docker/config.json");

    // No login anywhere: refused, naming every file searched and --authfile.
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    for file in [&runtime_file, &config_file, &docker_file] {
        assert!(
            out.stderr.contains(&file.display().to_string()),
            "{}: {}",
            file.display(),
            out.describe()
        );
    }
    assert!(out.stderr.contains("--authfile"), "{}", out.describe());
    assert_eq!(
        out.stderr.trim_end().lines().count(),
        1,
        "{}",
        out.describe()
    );

    // A login kept in $XDG_CONFIG_HOME/containers/auth.json.
    login(&config_file, PASSWORD);
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());

    // podman login's runtime file comes first: its wrong password is sent,
    // and the refusal says where it came from.
    login(&runtime_file, "n0t-the-passw0rd");
    let out = cli.run(
        &["run", "--image-pull-policy", "always", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "the credentials for {} came from {}",
            registry.addr(),
            runtime_file.display()
        )) && !out.stderr.contains("n0t-the-passw0rd"),
        "{}",
        out.describe()
    );
    login(&runtime_file, PASSWORD);
    let out = cli.run(
        &["run", "--image-pull-policy", "always", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert_same_yaml(&out.stdout, SAMPLE);

    // --authfile alone: the others are not read.
    let empty = cli.write_file("empty.json", "{}").expect("write");
    let out = cli.run(&["pull", "--authfile", &empty, &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "--authfile {empty} has no credentials for {}",
            registry.addr()
        )),
        "{}",
        out.describe()
    );
}

/// Writes the credential helper `docker-credential-<name>` into `dir`: `body` runs for
/// `get`, any other action exits 0.
fn install_helper(dir: &Path, name: &str, body: &str) {
    let path = dir.join(format!("docker-credential-{name}"));
    std::fs::write(
        &path,
        format!("#!/bin/sh\n[ \"$1\" = get ] || exit 0\n{body}\n"),
    )
    .expect("write helper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A child another test forked while the file was open for writing keeps it busy
    // until that child execs: wait until it runs.
    for _ in 0..200 {
        match std::process::Command::new(&path).arg("probe").status() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

#[test]
fn cli_runs_docker_credential_helpers() {
    let (registry, image) = private_registry();
    let mut cli = Cli::new().expect("cli");
    let home = cli.scratch().join("home");
    let bin = cli.scratch().join("bin");
    std::fs::create_dir_all(home.join(".docker")).expect("mkdir");
    std::fs::create_dir_all(&bin).expect("mkdir");
    // The credentials exist only in the helper, which checks the server it is asked for.
    install_helper(
        &bin,
        "fnrun-test",
        &format!(
            r#"[ "$(cat)" = "{addr}" ] || {{ echo "unexpected server"; exit 1; }}
echo '{{"ServerURL":"{addr}","Username":"{USER}","Secret":"{PASSWORD}"}}'"#,
            addr = registry.addr()
        ),
    );
    install_helper(
        &bin,
        "empty",
        "cat >/dev/null; echo 'credentials not found in native keychain'; exit 1",
    );
    let path = std::env::var("PATH").unwrap_or_default();
    cli.env("HOME", &home.display().to_string())
        .env("PATH", &format!("{}:{path}", bin.display()));
    let config = |config: serde_json::Value| {
        std::fs::write(home.join(".docker/config.json"), config.to_string()).expect("write");
    };
    let wrong = STANDARD.encode(format!("{USER}:wrong"));
    let right = STANDARD.encode(format!("{USER}:{PASSWORD}"));

    // credHelpers for the registry wins over auths (wrong there).
    config(serde_json::json!({
        "auths": { registry.addr(): { "auth": wrong } },
        "credHelpers": { registry.addr(): "fnrun-test" },
    }));
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.starts_with(&image), "{}", out.describe());

    // A store that has nothing for the registry: anonymous, as docker does, even with
    // the right credentials in auths; refused by the registry.
    config(serde_json::json!({
        "auths": { registry.addr(): { "auth": right } },
        "credsStore": "empty",
    }));
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("refused") && !out.stderr.contains(PASSWORD),
        "{}",
        out.describe()
    );

    // A helper that is not installed: a clear error naming it.
    config(serde_json::json!({ "credsStore": "not-installed" }));
    let out = cli.run(&["pull", &image], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("docker-credential-not-installed"),
        "{}",
        out.describe()
    );
}
