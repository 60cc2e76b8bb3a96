//! Tests of the e2e harness itself; none of them needs fnrun. They show that
//! the registry, the image builder, the test user, the gRPC client plumbing
//! and the Python and Go clients work, so a failing e2e test points at fnrun,
//! not at the harness.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use fnrun_api::v1alpha1::containerized_function_runner_service_server::{
    ContainerizedFunctionRunnerService, ContainerizedFunctionRunnerServiceServer,
};
use fnrun_api::v1alpha1::{
    ImagePullPolicy, NetworkPolicy, RunFunctionRequest, RunFunctionResponse,
};
use fnrun_tests::client::{self, Client, HEALTH_SERVING, Run};
use fnrun_tests::fixtures::{self, PongServer};
use fnrun_tests::functionio::{self, SAMPLE};
use fnrun_tests::grpc_clients::{self, GoDial};
use fnrun_tests::image::TestImage;
use fnrun_tests::process::{check_output, run_capture};
use fnrun_tests::registry::{Registry, http_status};
use fnrun_tests::tool_cache::{self, Key, Protos};
use fnrun_tests::user::{ensure_test_user, require_root};
use fnrun_tests::{profile_dir, unique_name};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};

#[test]
fn registry_starts_answers_and_stops() {
    let mut registry = Registry::start().expect("registry starts");
    assert!(registry.addr().starts_with("127.0.0.1:"));
    assert_eq!(http_status(registry.addr(), "/v2/").expect("GET /v2/"), 200);
    assert!(registry.is_running());
    registry.stop();
    assert!(
        http_status(registry.addr(), "/v2/").is_err(),
        "a stopped registry refuses connections"
    );
}

#[test]
fn image_is_built_pushed_and_inspected() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script("#!/bin/sh\ncat\n")
        .cmd(["arg1"])
        .env("FOO", "bar")
        .dir("/work", 0o755)
        .workdir("/work")
        .user("1000:1000")
        .tag("v1")
        .build()
        .expect("image builds");
    check_output(
        Command::new("umoci")
            .args(["stat", "--image"])
            .arg(format!("{}:v1", image.layout().display())),
    )
    .expect("umoci stat accepts the layout");

    let reference = image.push(&registry, "fns/script:v1").expect("pushes");
    assert_eq!(reference, format!("{}/fns/script:v1", registry.addr()));
    let inspect = registry.inspect("fns/script:v1").expect("inspects");
    assert!(
        inspect["Digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{inspect}"
    );
    assert_eq!(
        registry.digest("fns/script:v1").expect("digest"),
        inspect["Digest"]
    );

    let config = check_output(
        Command::new("skopeo")
            .args([
                "--insecure-policy",
                "inspect",
                "--config",
                "--tls-verify=false",
            ])
            .arg(format!("docker://{reference}")),
    )
    .expect("skopeo inspect --config");
    let config: serde_json::Value = serde_json::from_str(&config).expect("config JSON");
    let config = &config["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/bin/sh", "/fn.sh"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["arg1"]));
    assert_eq!(config["WorkingDir"], "/work");
    assert_eq!(config["User"], "1000:1000");
    let env: Vec<&str> = config["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(env.contains(&"FOO=bar"), "{env:?}");
    assert!(env.iter().any(|e| e.starts_with("PATH=")), "{env:?}");

    // A missing tag really is missing.
    assert!(registry.inspect("fns/script:v2").is_err());
}

#[test]
fn oci_archive_is_readable() {
    let image = TestImage::echo().tag("t1").build().expect("image builds");
    let archive = image.oci_archive().expect("archive");
    assert!(
        archive.starts_with("oci-archive:") && archive.ends_with(":t1"),
        "{archive}"
    );
    let out = check_output(Command::new("skopeo").args(["--insecure-policy", "inspect", &archive]))
        .expect("skopeo reads the archive");
    assert!(out.contains("\"Digest\""), "{out}");
    assert!(image.oci_ref().starts_with("oci:"));
}

/// Unpacks `image` and runs its entrypoint with `unshare --root` in new mount
/// and pid namespaces (and a new network namespace if `isolated`): checks the
/// test images and scripts themselves, outside any fnrun sandbox.
fn run_unpacked(
    image: &fnrun_tests::image::BuiltImage,
    entrypoint: &[&str],
    input: &str,
    isolated: bool,
) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    check_output(
        Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{}", image.layout().display(), image.tag()))
            .arg(&bundle),
    )
    .expect("umoci unpack");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("proc")).expect("mkdir /proc");
    std::fs::create_dir_all(rootfs.join("dev")).expect("mkdir /dev");
    check_output(
        Command::new("mknod")
            .arg(rootfs.join("dev/null"))
            .args(["-m", "666", "c", "1", "3"]),
    )
    .expect("mknod /dev/null");
    let mut unshare = Command::new("/usr/bin/unshare");
    if isolated {
        unshare.arg("--net");
    }
    let out = run_capture(
        unshare
            .args(["--mount", "--pid", "--fork", "--mount-proc"])
            .arg(format!("--root={}", rootfs.display()))
            .args(entrypoint)
            .env_clear()
            .env("PATH", "/bin"),
        Some(input.as_bytes()),
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    out.stdout
}

#[test]
fn test_images_and_scripts_work_outside_fnrun() {
    if !require_root("test_images_and_scripts_work_outside_fnrun") {
        return;
    }
    let echo = TestImage::echo().build().expect("builds");
    let out = run_unpacked(&echo, &["/bin/cat"], SAMPLE, true);
    functionio::assert_same_yaml(&out, SAMPLE);

    let script = functionio::report_script("", "uid=$(id -u) cwd=$(pwd) foo=$FOO");
    let image = TestImage::script(&script).build().expect("builds");
    let out = run_unpacked(&image, &["/bin/sh", "/fn.sh"], SAMPLE, true);
    assert_eq!(functionio::last_message(&out), "uid=0 cwd=/ foo=");

    let fail = TestImage::script(fixtures::FAIL_SCRIPT)
        .build()
        .expect("builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    check_output(
        Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{}", fail.layout().display(), fail.tag()))
            .arg(&bundle),
    )
    .expect("umoci unpack");
    let out = run_capture(
        Command::new("/usr/sbin/chroot")
            .arg(bundle.join("rootfs"))
            .args(["/bin/sh", "/fn.sh"]),
        Some(SAMPLE.as_bytes()),
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(3), "{}", out.describe());
    assert_eq!(out.stderr, "boom\n");
}

#[test]
fn network_probe_tells_isolated_from_shared_networks() {
    if !require_root("network_probe_tells_isolated_from_shared_networks") {
        return;
    }
    let server = PongServer::start();
    let image = fixtures::network_probe(server.port())
        .build()
        .expect("builds");
    let isolated = run_unpacked(&image, &["/bin/sh", "/fn.sh"], SAMPLE, true);
    assert_eq!(functionio::last_message(&isolated), "ifs=lo reply=");
    assert!(!server.answered());
    let shared = run_unpacked(&image, &["/bin/sh", "/fn.sh"], SAMPLE, false);
    let message = functionio::last_message(&shared);
    assert!(
        message.starts_with("ifs=") && message.contains("lo"),
        "{message}"
    );
    assert!(message.ends_with(" reply=pong"), "{message}");
    assert!(server.answered());
}

#[test]
fn sleeper_processes_are_found_on_the_host() {
    let mut child = Command::new("/bin/busybox")
        .args(["sleep", "977"])
        .spawn()
        .expect("spawn");
    let pid = i32::try_from(child.id()).expect("pid");
    let argv = ["/bin/busybox", "sleep", "977"];
    // The child shows its command line once it has exec'd.
    let found = fnrun_tests::wait_for(Duration::from_secs(5), || {
        Some(fixtures::processes_with_argv(&["busybox", "sleep", "977"])).filter(|p| !p.is_empty())
    });
    let found_full = fixtures::processes_with_argv(&argv);
    child.kill().expect("kill");
    child.wait().expect("reap");
    assert_eq!(found, Some(vec![pid]));
    assert_eq!(found_full, vec![pid]);
    assert!(fixtures::leftover_processes(&argv, Duration::from_secs(2)).is_empty());
}

#[test]
fn registry_with_htpasswd_requires_credentials() {
    let registry = Registry::start_with_htpasswd("alice", "s3cret").expect("registry starts");
    assert_eq!(http_status(registry.addr(), "/v2/").expect("GET /v2/"), 401);
    assert_eq!(registry.credentials(), Some(("alice", "s3cret")));
    let image = TestImage::echo().build().expect("builds");
    image
        .push(&registry, "private/echo:v1")
        .expect("push with credentials");
    registry
        .inspect("private/echo:v1")
        .expect("inspect with credentials");
    let anonymous = Command::new("skopeo")
        .args([
            "--insecure-policy",
            "inspect",
            "--tls-verify=false",
            "--no-creds",
        ])
        .arg(format!(
            "docker://{}",
            registry.reference("private/echo:v1")
        ))
        .output()
        .expect("skopeo runs");
    assert!(
        !anonymous.status.success(),
        "anonymous inspect must be refused"
    );
}

#[test]
fn test_user_exists_and_commands_run_as_it() {
    if !require_root("test_user_exists_and_commands_run_as_it") {
        return;
    }
    let user = ensure_test_user().expect("user");
    assert_ne!(user.uid, 0);
    assert_eq!(ensure_test_user().expect("again"), user, "idempotent");
    let out = run_capture(
        user.command("/bin/sh")
            .args(["-c", "id -u; id -g; id -G; grep CapEff /proc/self/status"]),
        None,
        Duration::from_secs(10),
    );
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], user.uid.to_string());
    assert_eq!(lines[1], user.gid.to_string());
    assert_eq!(lines[2], user.gid.to_string(), "no supplementary groups");
    assert!(
        lines[3].ends_with("0000000000000000"),
        "no capabilities: {}",
        lines[3]
    );
}

#[test]
fn fnrun_is_looked_up_next_to_the_test_binary() {
    let profile = profile_dir();
    assert!(!profile.ends_with("deps"), "{}", profile.display());
    assert!(
        profile.join("deps").is_dir(),
        "{} has deps/",
        profile.display()
    );
    // fnrun_bin() panics with a clear message while fnrun is not built.
    let bin = profile.join("fnrun");
    if std::env::var_os("FNRUN_BIN").is_some() {
        return;
    }
    if bin.is_file() {
        assert_eq!(fnrun_tests::fnrun_bin(), bin);
    } else {
        let err = std::panic::catch_unwind(fnrun_tests::fnrun_bin).expect_err("panics");
        let msg = err.downcast_ref::<String>().expect("message");
        assert!(msg.contains("cargo build -p fnrun"), "{msg}");
    }
}

/// A stand-in RunFunction service, only to check the harness's client plumbing
/// (unix path, abstract socket, health) without fnrun.
#[derive(Default)]
struct Echo;

#[tonic::async_trait]
impl ContainerizedFunctionRunnerService for Echo {
    async fn run_function(
        &self,
        request: tonic::Request<RunFunctionRequest>,
    ) -> Result<tonic::Response<RunFunctionResponse>, tonic::Status> {
        let request = request.into_inner();
        let config = request.run_function_config.unwrap_or_default();
        let pull = request.image_pull_config.unwrap_or_default();
        if request.image.is_empty() {
            return Err(tonic::Status::invalid_argument("empty image"));
        }
        let summary = format!(
            "image={} policy={} network={} timeout={} memory={} cpu={}\n",
            request.image,
            pull.pull_policy,
            config.network.unwrap_or_default().policy,
            config.timeout.map(|t| t.seconds).unwrap_or(-1),
            config
                .resources
                .clone()
                .unwrap_or_default()
                .limits
                .unwrap_or_default()
                .memory,
            config
                .resources
                .unwrap_or_default()
                .limits
                .unwrap_or_default()
                .cpu,
        );
        let mut output = summary.into_bytes();
        output.extend_from_slice(&request.input);
        Ok(tonic::Response::new(RunFunctionResponse { output }))
    }
}

async fn serve(listener: tokio::net::UnixListener) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<ContainerizedFunctionRunnerServiceServer<Echo>>()
        .await;
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(ContainerizedFunctionRunnerServiceServer::new(Echo))
        .serve_with_incoming(UnixListenerStream::new(listener))
        .await
        .expect("serves");
}

/// The stand-in service on a loopback TCP port (where tonic takes any
/// client's `:authority`); returns its address.
async fn serve_tcp() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(fnrun_api::v1alpha1::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("reflection");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reflection)
            .add_service(ContainerizedFunctionRunnerServiceServer::new(Echo))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

async fn exercise(mut client: Client) {
    let request = Run::new("example.org/fn:v1", SAMPLE)
        .pull_policy(ImagePullPolicy::Never)
        .network(NetworkPolicy::Runner)
        .timeout(Duration::from_secs(7))
        .memory("64Mi")
        .cpu("500m")
        .build();
    let output = client::run_function(&mut client, request)
        .await
        .expect("echo answers");
    let output = String::from_utf8(output.output).expect("utf-8");
    let (summary, rest) = output.split_once('\n').expect("summary line");
    assert_eq!(
        summary,
        "image=example.org/fn:v1 policy=3 network=2 timeout=7 memory=64Mi cpu=500m"
    );
    assert_eq!(rest, SAMPLE);
    let status = client::run_function(&mut client, Run::new("", "x").build())
        .await
        .expect_err("empty image is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn grpc_client_connects_over_a_unix_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("echo.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    assert!(
        std::fs::metadata(&path)
            .expect("socket")
            .permissions()
            .mode()
            != 0
    );
    let server = tokio::spawn(serve(listener));
    let channel = client::channel_unix(&path).await.expect("connects");
    exercise(Client::new(channel.clone())).await;
    let status = client::health(channel.clone(), "").await.expect("health");
    assert_eq!(status, HEALTH_SERVING);
    let status = client::health(channel, fnrun_api::v1alpha1::SERVICE_NAME)
        .await
        .expect("service health");
    assert_eq!(status, HEALTH_SERVING);
    server.abort();
}

#[tokio::test]
async fn grpc_client_connects_over_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("crossplane/fn/{}.sock", unique_name("harness"));
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract");
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::UnixListener::from_std(listener).expect("tokio listener");
    let server = tokio::spawn(serve(listener));
    let channel = client::channel_abstract(&name).await.expect("connects");
    exercise(Client::new(channel)).await;
    server.abort();
}

#[test]
fn pong_server_answers_ping() {
    use std::io::{BufRead, BufReader, Write};
    let server = PongServer::start();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    stream.write_all(b"ping\n").expect("write");
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).expect("read");
    assert_eq!(line, "pong\n");
    assert!(server.answered());
}

#[test]
fn cache_keys_tell_their_parts_apart() {
    let key = |parts: &[(&str, &str)]| {
        let mut key = Key::new();
        for (label, bytes) in parts {
            key.part(label, bytes);
        }
        key.short()
    };
    assert_eq!(key(&[("a", "b")]), key(&[("a", "b")]));
    assert_eq!(key(&[("a", "b")]).len(), 16);
    assert_ne!(key(&[("a", "b")]), key(&[("a", "c")]));
    assert_ne!(key(&[("ab", "")]), key(&[("a", "b")]));
    assert_ne!(key(&[("a", "b"), ("c", "")]), key(&[("a", "bc")]));
}

#[test]
fn a_cache_entry_is_built_once_and_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let entry = dir.path().join("thing-0123");
    let mut builds = 0;
    for _ in 0..2 {
        let path = tool_cache::entry(&entry, |work| {
            builds += 1;
            std::fs::write(work.join("made"), "yes")?;
            Ok(())
        })
        .expect("builds");
        assert_eq!(path, entry);
        assert_eq!(std::fs::read_to_string(entry.join("made")).unwrap(), "yes");
    }
    assert_eq!(builds, 1);
    // A failed build leaves nothing behind.
    let failed = dir.path().join("failed-0123");
    tool_cache::entry(&failed, |_| anyhow::bail!("no")).expect_err("fails");
    assert!(!failed.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn python_grpcio_calls_and_reflects_a_tonic_server() {
    let addr = serve_tcp().await;
    let target = addr.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        grpc_clients::python_run_function(&target, "example.org/fn:v1", SAMPLE.as_bytes())
    })
    .await
    .unwrap()
    .expect("the Python client runs");
    assert_eq!(outcome.code, "OK", "{outcome:?}");
    assert!(
        outcome.output.starts_with("image=example.org/fn:v1 "),
        "{outcome:?}"
    );
    assert!(outcome.output.ends_with(SAMPLE), "{outcome:?}");
    let target = addr.clone();
    let outcome =
        tokio::task::spawn_blocking(move || grpc_clients::python_run_function(&target, "", b"x"))
            .await
            .unwrap()
            .expect("the Python client runs");
    assert!(outcome.is("INVALID_ARGUMENT"), "{outcome:?}");
    assert_eq!(outcome.message, "empty image");

    let reflected = tokio::task::spawn_blocking(move || {
        grpc_clients::python_reflection(&addr, fnrun_api::v1alpha1::SERVICE_NAME)
    })
    .await
    .unwrap()
    .expect("grpcio-reflection answers");
    assert!(
        reflected
            .services
            .iter()
            .any(|s| s == fnrun_api::v1alpha1::SERVICE_NAME),
        "{reflected:?}"
    );
    assert_eq!(reflected.file.1, "apiextensions.fn.proto.v1alpha1");
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_go_client_is_built_once_and_calls_a_tonic_server() {
    let first = tokio::task::spawn_blocking(grpc_clients::go_runfunction)
        .await
        .unwrap()
        .expect("the Go client builds");
    let again = tokio::task::spawn_blocking(grpc_clients::go_runfunction)
        .await
        .unwrap()
        .expect("the Go client is cached");
    assert_eq!(first, again);
    assert!(first.starts_with(tool_cache::dir()), "{}", first.display());
    let mut key = Key::new();
    Protos::fnrun_v1alpha1()
        .hash_into(&mut key)
        .expect("protos");

    let addr = serve_tcp().await;
    let outcome = tokio::task::spawn_blocking(move || {
        grpc_clients::go_run_function(&GoDial::Tcp(addr), "example.org/fn:v1", SAMPLE.as_bytes())
    })
    .await
    .unwrap()
    .expect("the Go client runs");
    assert_eq!(outcome.code, "OK", "{outcome:?}");
    assert!(outcome.output.ends_with(SAMPLE), "{outcome:?}");
}
