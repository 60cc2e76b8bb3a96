//! `fnrun function serve` and `fnrun function call`: one Crossplane function
//! from a terminal, without Docker.
//!
//! - `serve IMAGE [--listen 127.0.0.1:9443]` hosts the function on plain h2c:
//!   any `:authority` reaches it, so `crossplane render` with the Development
//!   runtime (`render.crossplane.io/runtime: Development`, target
//!   `localhost:9443`) renders through it;
//! - `call IMAGE REQUEST|-` starts the function, calls it once with a
//!   `RunFunctionRequest` in YAML or JSON (the protobuf JSON mapping), prints
//!   the `RunFunctionResponse` as YAML (or, with `-o json`, JSON) and stops it.
//!
//! Both run the function as the daemon does ([`fnrun_host`]): in a sandbox,
//! reached inside its own network namespace.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use fnrun_api::Quoted;
use fnrun_sandbox::Limits;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use tonic::metadata::MetadataMap;

use crate::config::{
    AuthArgs, CacheArgs, OutputArgs, OutputFormat, RunPolicyArgs, SandboxArgs, SocketModeArgs,
    TimeoutArgs,
};
use fnrun_host::catalogue::{self, CredentialSource, FunctionDef, Mode};
use fnrun_host::instance::Api;
use fnrun_host::routing::Route;
use fnrun_host::{CallError, Catalogue, Host, Routing, listener};
use fnrun_runner::error::{Class, bounded};
use fnrun_runner::runner::Admission;
use fnrun_transport::deadline::CallDeadline;
use fnrun_transport::listen::ListenAddr;

const REQUEST_TYPE: &str = "apiextensions.fn.proto.v1.RunFunctionRequest";
const RESPONSE_TYPE: &str = "apiextensions.fn.proto.v1.RunFunctionResponse";
/// Largest request file read.
const MAX_REQUEST_BYTES: u64 = 64 << 20;

#[derive(Debug, Args)]
pub struct FunctionArgs {
    #[command(subcommand)]
    pub command: FunctionCommand,
}

#[derive(Debug, Subcommand)]
pub enum FunctionCommand {
    /// Host one Crossplane function on plain h2c (for `crossplane render`).
    Serve(ServeArgs),
    /// Start a Crossplane function, call it once, print the response as YAML (-o json: JSON).
    Call(CallArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// A Function package: its gRPC server.
    #[value(name = "server")]
    Server,
    /// An xfn-era FunctionIO image, run per call.
    #[value(name = "functionio")]
    FunctionIo,
}

/// How the function runs, for both commands.
#[derive(Debug, Args)]
pub struct FunctionOptions {
    /// How the image is run: server (a Crossplane v1.14+ Function
    /// package, its gRPC server started once) or functionio (an xfn-era
    /// image, run per call on a FunctionIO).
    #[arg(long, value_enum, default_value_t = ModeArg::Server)]
    pub mode: ModeArg,
    // Shared with `run`.
    #[command(flatten)]
    pub policy: RunPolicyArgs,
    /// Processes and threads the function may have.
    #[arg(long)]
    pub pids: Option<u64>,
    /// How long the server may take from its start to its first gRPC answer.
    #[arg(long, default_value = "30s", value_parser = fnrun_api::duration::parse)]
    pub start_timeout: Duration,
    /// An argument for the server, after --insecure. Repeatable.
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// An environment variable for the server. Repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Registry credentials from this `.dockerconfigjson` (a pull secret's)
    /// instead of the auth.json and config.json files searched by default.
    #[arg(
        long,
        value_name = "FILE",
        value_parser = crate::config::parse_path,
        conflicts_with = "authfile"
    )]
    pub pull_secret: Option<PathBuf>,
    /// The function's name in logs and metrics [default: from the image].
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where to serve: [tcp://]HOST:PORT (HOST a name, every address of it
    /// listened on, or an address; :PORT: every address), unix:PATH or
    /// unix-abstract:NAME.
    #[arg(long, default_value = "127.0.0.1:9443")]
    pub listen: String,
    /// Stop the server after this long without a call (0: never); the next
    /// call starts it again, in a sandbox made ahead when the server
    /// stopped (kept for as long again, 10s at least).
    #[arg(long, default_value = "0", value_parser = fnrun_api::duration::parse)]
    pub idle_timeout: Duration,
    #[command(flatten)]
    pub timeout: TimeoutArgs,
    #[command(flatten)]
    pub socket_mode: SocketModeArgs,
    /// The function image: [REGISTRY/]REPO[:TAG][@DIGEST], oci:PATH[:TAG] or oci-archive:PATH[:TAG].
    pub image: String,
    #[command(flatten)]
    pub options: FunctionOptions,
}

#[derive(Debug, Args)]
#[command(mut_arg("output", |a| a.default_value("yaml")))]
pub struct CallArgs {
    #[command(flatten)]
    pub timeout: TimeoutArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// The function image: [REGISTRY/]REPO[:TAG][@DIGEST], oci:PATH[:TAG] or oci-archive:PATH[:TAG].
    pub image: String,
    /// The RunFunctionRequest (YAML or JSON, protobuf JSON mapping), or - for stdin.
    #[arg(default_value = "-")]
    pub request: String,
    #[command(flatten)]
    pub options: FunctionOptions,
}

/// Runs `fnrun function ...`.
pub fn main(args: FunctionArgs) -> ExitCode {
    match args.command {
        FunctionCommand::Serve(args) => match serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => crate::support::daemon_failed(&e, crate::support::exit_code_of(&e)),
        },
        FunctionCommand::Call(args) => call(args),
    }
}

/// The function's definition from the command line.
fn definition(
    image: &str,
    options: &FunctionOptions,
    idle_timeout: Option<Duration>,
    timeout: Duration,
) -> anyhow::Result<FunctionDef> {
    let name = match &options.name {
        Some(name) => name.clone(),
        None => name_from_image(image),
    };
    let mut def = FunctionDef::new(&name, image).map_err(|e| anyhow::anyhow!("--name {e}"))?;
    def.mode = match options.mode {
        ModeArg::Server => Mode::Server,
        ModeArg::FunctionIo => Mode::FunctionIo,
    };
    def.pull_policy = options.policy.image_pull_policy.into();
    def.network = options.policy.network_policy.into();
    def.limits = Limits {
        memory_bytes: options.policy.memory,
        cpu_millis: options.policy.cpu,
        pids: options.pids,
    };
    if let Some(path) = &options.pull_secret {
        def.credentials = CredentialSource::PullSecret(path.clone());
    }
    if let Some(path) = &options.auth.authfile {
        def.credentials = CredentialSource::DockerConfig(path.clone());
    }
    def.start_timeout = options.start_timeout;
    def.idle_timeout = idle_timeout;
    def.timeout = timeout;
    def.args = options.args.clone();
    for pair in &options.env {
        let (name, value) = pair
            .split_once('=')
            .filter(|(n, _)| !n.is_empty())
            .ok_or_else(|| anyhow::anyhow!("--env {}: not NAME=VALUE", Quoted::new(pair)))?;
        def.env.push((name.to_owned(), value.to_owned()));
    }
    def.env.sort();
    Ok(def)
}

/// A DNS label for the function from its image's repository name:
/// `xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.8.2`
/// gives `function-patch-and-transform`.
fn name_from_image(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let repo = last.split(':').next().unwrap_or(last);
    let mut name: String = repo
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    name.truncate(63);
    let name = name.trim_matches('-').to_owned();
    if catalogue::check_dns_label(&name).is_ok() {
        name
    } else {
        "function".to_owned()
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")
}

fn admission() -> Admission {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Admission {
        max_concurrency: 4 * cores,
        max_queue: 64,
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::support::raise_open_files_limit();
    let idle = (!args.idle_timeout.is_zero()).then_some(args.idle_timeout);
    let def = definition(&args.image, &args.options, idle, args.timeout.timeout)
        .map_err(|e| crate::support::Usage(format!("{e:#}")))?;
    let addrs = ListenAddr::resolve(&args.listen)
        .map_err(|e| crate::support::Usage(format!("--listen {e:#}")))?;
    // A pool of one: the place of the function's spare sandbox, made when
    // its server stops for idleness (`fnrun_host`'s function module).
    let runner =
        crate::config::build_runner(&args.options.cache, &args.options.sandbox, admission())?
            .with_sandbox_pool(1, None);
    runtime()?.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
        let name = def.name.clone();
        let host = Arc::new(Host::new(Arc::new(runner), Routing::Single, Arc::default()));
        host.apply(&Catalogue::new([def])?);
        let function = host
            .function(&name)
            .context("the function is in the catalogue")?;
        tracing::info!(function = name, image = args.image, "starting the function");
        function.prepare().await?;
        let (router, health) = listener::services(host.clone())?;
        listener::serving(&health, std::slice::from_ref(&name)).await;
        // Every address of the name given, each its own listener.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        let mut socket_files = Vec::new();
        for addr in &addrs {
            let listener = addr.bind(args.socket_mode.socket_mode)?;
            if let fnrun_transport::listen::Listener::Unix(_, Some(path)) = &listener {
                socket_files.push(path.clone());
            }
            let mut stop = stop_rx.clone();
            servers.push(listener::serve(
                router.clone(),
                listener,
                None,
                async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                },
            ));
            tracing::info!(address = %addr, function = name, "serving the function (h2c)");
        }
        let signal = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal, "stopping");
        let _ = stop_tx.send(true);
        host.shutdown(Duration::from_secs(30)).await;
        let _ =
            tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(servers)).await;
        for path in socket_files {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    })
}

/// Why a request file cannot be sent.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("cannot read {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path} is larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge { path: String },
    #[error("{path} is not YAML or JSON: {message}")]
    Syntax { path: String, message: String },
    #[error("{path} is not a RunFunctionRequest: {message}")]
    Schema { path: String, message: String },
}

fn message_type(name: &str) -> MessageDescriptor {
    DescriptorPool::decode(fnrun_api::v1::FILE_DESCRIPTOR_SET)
        .expect("the api crate's v1 descriptor set decodes")
        .get_message_by_name(name)
        .expect("the v1 descriptor set has RunFunctionRequest and RunFunctionResponse")
}

/// The request file (or stdin) as the protobuf bytes of a v1
/// `RunFunctionRequest`, read with the protobuf JSON mapping (unknown fields
/// refused).
fn read_request(path: &str) -> Result<Vec<u8>, RequestError> {
    use std::io::Read;
    let label = if path == "-" {
        "stdin".to_owned()
    } else {
        path.to_owned()
    };
    let read = |err| RequestError::Read {
        path: label.clone(),
        err,
    };
    let mut bytes = Vec::new();
    if path == "-" {
        std::io::stdin()
            .lock()
            .take(MAX_REQUEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
    } else {
        std::fs::File::open(path)
            .map_err(read)?
            .take(MAX_REQUEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
    }
    if bytes.len() as u64 > MAX_REQUEST_BYTES {
        return Err(RequestError::TooLarge { path: label });
    }
    request_bytes(&label, &bytes)
}

fn request_bytes(label: &str, text: &[u8]) -> Result<Vec<u8>, RequestError> {
    use prost::Message;
    fnrun_api::yaml_bounds::check(text).map_err(|e| RequestError::Syntax {
        path: label.to_owned(),
        message: e.to_string(),
    })?;
    let value: serde_json::Value =
        serde_norway::from_slice(text).map_err(|e| RequestError::Syntax {
            path: label.to_owned(),
            message: bounded(&e, 1024),
        })?;
    let value = if value.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        value
    };
    let message = DynamicMessage::deserialize(message_type(REQUEST_TYPE), value).map_err(|e| {
        RequestError::Schema {
            path: label.to_owned(),
            message: bounded(&e, 1024),
        }
    })?;
    Ok(message.encode_to_vec())
}

/// A response's protobuf bytes as YAML or JSON (the protobuf JSON mapping;
/// text is YAML).
fn response_text(bytes: &[u8], format: OutputFormat) -> anyhow::Result<String> {
    let message = DynamicMessage::decode(message_type(RESPONSE_TYPE), bytes)
        .context("the function's response is not a RunFunctionResponse")?;
    // Fields in the proto's order, as protojson writes them.
    match format {
        OutputFormat::Json => {
            let mut json = serde_json::to_string_pretty(&message)
                .context("the response cannot be written as JSON")?;
            json.push('\n');
            Ok(json)
        }
        OutputFormat::Yaml | OutputFormat::Text => {
            serde_norway::to_string(&message).context("the response cannot be written as YAML")
        }
    }
}

/// The first fatal result's message, if the response has one.
fn fatal_result(bytes: &[u8]) -> Option<String> {
    use prost::Message;
    let response = fnrun_api::v1::RunFunctionResponse::decode(bytes).ok()?;
    response
        .results
        .iter()
        .find(|r| r.severity == fnrun_api::v1::Severity::Fatal as i32)
        .map(|r| r.message.clone())
}

fn call(args: CallArgs) -> ExitCode {
    let fail = |code: u8, message: &dyn std::fmt::Display| {
        eprintln!("fnrun: {}", crate::support::error_line(message));
        ExitCode::from(code)
    };
    let request = match read_request(&args.request) {
        Ok(r) => r,
        Err(e) => return fail(crate::support::EXIT_USAGE, &e),
    };
    let def = match definition(&args.image, &args.options, None, args.timeout.timeout) {
        Ok(def) => def,
        Err(e) => return fail(crate::support::EXIT_USAGE, &e),
    };
    let runner = match crate::config::build_runner(
        &args.options.cache,
        &args.options.sandbox,
        Admission::ONE,
    ) {
        Ok(r) => r,
        Err(e) => return fail(crate::support::EXIT_FAILED, &format!("{e:#}")),
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(crate::support::EXIT_FAILED, &format!("{e:#}")),
    };
    rt.block_on(async move {
        // Before the server starts: SIGINT, SIGTERM or SIGHUP stops it and
        // removes its sandbox, then fnrun exits 128 + the signal.
        let mut signals = match crate::support::StopSignals::install() {
            Ok(signals) => signals,
            Err(e) => {
                return fail(
                    crate::support::EXIT_FAILED,
                    &format!("cannot install the signal handlers: {e}"),
                );
            }
        };
        let name = def.name.clone();
        let host = Host::new(Arc::new(runner), Routing::Single, Arc::default());
        let catalogue = Catalogue::new([def]).expect("one function");
        host.apply(&catalogue);
        let function = host
            .function(&name)
            .expect("the function is in the catalogue");
        let work = async {
            match function.prepare().await {
                Err(e) => Err(CallError::Failed(e)),
                Ok(()) => {
                    host.call(
                        &Route::default(),
                        Api::V1,
                        Bytes::from(request),
                        MetadataMap::new(),
                        Some(CallDeadline::from_now(args.timeout.timeout)),
                    )
                    .await
                }
            }
        };
        let result = signals.until(work).await;
        // The server stops, and is cleaned up, before the answer is printed
        // (at once when a signal stopped the call: nothing is in flight).
        let grace = if result.is_ok() { 10 } else { 2 };
        host.shutdown(Duration::from_secs(grace)).await;
        let result = match result {
            Ok(result) => result,
            Err(stopped) => return stopped.report(),
        };
        match result {
            Ok(response) => {
                let bytes = response.into_inner();
                let yaml = match response_text(&bytes, args.output.format) {
                    Ok(yaml) => yaml,
                    Err(e) => return fail(crate::support::EXIT_FAILED, &format!("{e:#}")),
                };
                let mut stdout = std::io::stdout().lock();
                if stdout
                    .write_all(yaml.as_bytes())
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return ExitCode::from(crate::support::EXIT_FAILED);
                }
                match fatal_result(&bytes) {
                    Some(message) => fail(
                        crate::support::EXIT_FAILED,
                        &format!("the function returned a fatal result: {message}"),
                    ),
                    None => ExitCode::SUCCESS,
                }
            }
            Err(CallError::Failed(e)) => fail(e.class().exit_code(), &e),
            Err(CallError::Function(status)) => {
                let code = if status.code() == tonic::Code::DeadlineExceeded {
                    Class::DeadlineExceeded.exit_code()
                } else {
                    crate::support::EXIT_FAILED
                };
                fail(
                    code,
                    &format!(
                        "the function answered {}: {}",
                        fnrun_host::metrics::code_name(status.code()),
                        status.message()
                    ),
                )
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_repository() {
        for (image, name) in [
            (
                "xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.8.2",
                "function-patch-and-transform",
            ),
            ("fn@sha256:abcd", "fn"),
            ("registry:5000/Fns/My_Function", "my-function"),
            ("oci:/tmp/layout:v1", "layout"),
            ("___", "function"),
        ] {
            assert_eq!(name_from_image(image), name, "{image}");
        }
    }

    #[test]
    fn requests_are_read_with_the_protobuf_json_mapping() {
        use prost::Message;
        let yaml = b"meta: {tag: t1}\ninput: {apiVersion: x/v1, kind: In}\nobserved:\n  composite:\n    resource: {kind: XR}\n    connectionDetails: {password: czNjcjN0}\n";
        let bytes = request_bytes("req.yaml", yaml).unwrap();
        let request = fnrun_api::v1::RunFunctionRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(request.meta.unwrap().tag, "t1");
        let composite = request.observed.unwrap().composite.unwrap();
        assert_eq!(composite.connection_details["password"], b"s3cr3t");
        let json = br#"{"meta": {"tag": "t2"}}"#;
        let bytes = request_bytes("req.json", json).unwrap();
        assert_eq!(
            fnrun_api::v1::RunFunctionRequest::decode(bytes.as_slice())
                .unwrap()
                .meta
                .unwrap()
                .tag,
            "t2"
        );
        assert!(request_bytes("empty", b"").unwrap().is_empty());
        let e = request_bytes("req.yaml", b"metta: {}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("req.yaml is not a RunFunctionRequest:"),
            "{e}"
        );
        assert!(e.contains("metta"), "{e}");
        let e = request_bytes("req.yaml", b"a: [\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("req.yaml is not YAML or JSON"), "{e}");
        let bomb = format!(
            "meta: {{tag: &t \"{}\"}}\ncontext: {{k: [{}]}}\n",
            "t".repeat(64 << 10),
            vec!["*t"; 64].join(",")
        );
        let e = request_bytes("bomb.yaml", bomb.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("YAML aliases expand the document"), "{e}");
        let long = format!("{}: 1\n", "k".repeat(1 << 20));
        let e = request_bytes("big", long.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 1200, "{}", e.len());
    }

    #[test]
    fn responses_are_printed_as_protobuf_json_yaml() {
        use prost::Message;
        let response = fnrun_api::v1::RunFunctionResponse {
            meta: Some(fnrun_api::v1::ResponseMeta {
                tag: "t".into(),
                ttl: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
            }),
            results: vec![fnrun_api::v1::Result {
                severity: fnrun_api::v1::Severity::Fatal.into(),
                message: "no".into(),
                reason: None,
                target: None,
            }],
            ..Default::default()
        };
        let bytes = response.encode_to_vec();
        let yaml = response_text(&bytes, OutputFormat::Yaml).unwrap();
        assert_eq!(
            yaml,
            "meta:\n  tag: t\n  ttl: 60s\nresults:\n- severity: SEVERITY_FATAL\n  message: no\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&response_text(&bytes, OutputFormat::Json).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"meta": {"tag": "t", "ttl": "60s"},
                "results": [{"severity": "SEVERITY_FATAL", "message": "no"}]})
        );
        assert_eq!(fatal_result(&bytes).as_deref(), Some("no"));
    }
}
