//! Registry credentials: ImagePullAuth over gRPC, `~/.docker/config.json` for
//! the CLI, and refused credentials.

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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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
