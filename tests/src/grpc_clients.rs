//! fnrun's RunFunction and server reflection through gRPC libraries other than
//! tonic: Python's grpcio (grpc-core), grpc-go and grpc-java, as Crossplane,
//! tools and users run them, each dialing the way its library does.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::go::Toolchain;
use crate::python::Python;
use crate::tool_cache::Protos;

/// How a call ended, as the client library reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `OK` or the status code's name in the library's spelling
    /// (`INVALID_ARGUMENT` in Python, `InvalidArgument` in Go).
    pub code: String,
    /// The status message.
    pub message: String,
    /// The output FunctionIO of a successful call.
    pub output: String,
}

impl Outcome {
    /// Whether the call failed with `code` (in either spelling, e.g.
    /// `INVALID_ARGUMENT`).
    pub fn is(&self, code: &str) -> bool {
        self.code
            .replace('_', "")
            .eq_ignore_ascii_case(&code.replace('_', ""))
    }
}

fn field(value: &serde_json::Value, name: &str) -> Result<String> {
    value[name]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no string {name:?} in {value}"))
}

/// RunFunction with Python's grpcio on its own channel for `target`
/// (`unix:PATH`, `unix-abstract:NAME` or `HOST:PORT`).
pub fn python_run_function(target: &str, image: &str, input: &[u8]) -> Result<Outcome> {
    let python = Python::get()?;
    let stubs = python.stubs(&[Protos::fnrun_v1alpha1()])?;
    let result = python.run_json(
        "run_function.py",
        &["--target", target, "--image", image],
        &stubs,
        Some(input),
    )?;
    Ok(Outcome {
        code: field(&result, "code")?,
        message: field(&result, "details")?,
        output: field(&result, "output")?,
    })
}

/// What grpcio's EvaluateFunction call gave.
#[derive(Debug, Clone)]
pub struct Evaluated {
    pub code: String,
    pub message: String,
    pub resource_list: String,
    pub log: String,
}

/// Porch's EvaluateFunction with Python's grpcio on its own channel for
/// `target` (`unix:PATH`, `unix-abstract:NAME` or `HOST:PORT`).
pub fn python_evaluate(target: &str, image: &str, resource_list: &[u8]) -> Result<Evaluated> {
    let python = Python::get()?;
    let stubs = python.stubs(&[Protos::fnrun_evaluator()])?;
    let result = python.run_json(
        "evaluate.py",
        &["--target", target, "--image", image],
        &stubs,
        Some(resource_list),
    )?;
    Ok(Evaluated {
        code: field(&result, "code")?,
        message: field(&result, "details")?,
        resource_list: field(&result, "resource_list")?,
        log: field(&result, "log")?,
    })
}

/// What grpcio's call of a Crossplane v1 function gave: the status, and the
/// `RunFunctionResponse` as protojson when it succeeded.
#[derive(Debug, Clone)]
pub struct Called {
    pub code: String,
    pub message: String,
    pub response: Option<serde_json::Value>,
}

/// A v1 `RunFunction` with Python's grpcio to the functions listener at
/// `target` (`HOST:PORT`) with `:authority` `authority`: over h2c, or over
/// mTLS with `tls` (its CA verifies the server, its certificate is the
/// client's) and the TLS server name `server_name`. `request` is protojson.
pub fn python_crossplane_call(
    target: &str,
    authority: &str,
    tls: Option<(&crate::certs::TlsFiles, &str)>,
    request: &serde_json::Value,
) -> Result<Called> {
    let python = Python::get()?;
    let stubs = python.stubs(&[Protos::crossplane_v1()])?;
    let mut args: Vec<String> = ["--target", target, "--authority", authority]
        .map(str::to_owned)
        .to_vec();
    if let Some((files, server_name)) = tls {
        for (flag, path) in [
            ("--ca", &files.ca),
            ("--cert", &files.cert),
            ("--key", &files.key),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        args.push("--server-name".to_owned());
        args.push(server_name.to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = python.run_json(
        "crossplane_call.py",
        &args,
        &stubs,
        Some(request.to_string().as_bytes()),
    )?;
    Ok(Called {
        code: field(&result, "code")?,
        message: field(&result, "details")?,
        response: Some(result["response"].clone()).filter(|r| !r.is_null()),
    })
}

/// What grpcio-reflection's client (reflection v1alpha) found.
#[derive(Debug, Clone)]
pub struct Reflected {
    /// The services the server lists.
    pub services: Vec<String>,
    /// The file that defines the symbol asked for: its name and package.
    pub file: (String, String),
    /// That file's services and their methods.
    pub methods: Vec<(String, Vec<String>)>,
}

/// Server reflection v1alpha with grpcio-reflection: the services, and the
/// file that defines `symbol`.
pub fn python_reflection(target: &str, symbol: &str) -> Result<Reflected> {
    let python = Python::get()?;
    let result = python.run_json(
        "reflection.py",
        &["--target", target, "--symbol", symbol],
        &python.stubs(&[Protos::fnrun_v1alpha1()])?,
        None,
    )?;
    reflected(&result)
}

/// A [`Reflected`] from a client's JSON: `{services, file: {name, package,
/// services: {NAME: [METHOD]}}}`.
fn reflected(result: &serde_json::Value) -> Result<Reflected> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let file = &result["file"];
    let methods = file["services"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
        .unwrap_or_default();
    Ok(Reflected {
        services: strings(&result["services"]),
        file: (field(file, "name")?, field(file, "package")?),
        methods,
    })
}

/// How grpc-go dials, which decides the `:authority` it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoDial {
    /// Its own unix support: target `unix:PATH` (`:authority` localhost).
    Unix(PathBuf),
    /// Target `PATH` and a dialer of its own (`:authority` the path).
    PathWithDialer(PathBuf),
    /// Target `unix-abstract:NAME` and a dialer of its own (`:authority` the
    /// whole target).
    AbstractWithDialer(String),
    /// Target `HOST:PORT`, over TCP.
    Tcp(String),
}

/// The `runfunction` Go client (`tests/go/runfunction`), built once.
pub fn go_runfunction() -> Result<PathBuf> {
    Toolchain::find()?.build("runfunction", &[Protos::fnrun_v1alpha1()])
}

/// What the `runfunction` Go client measured in its load mode.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct GoLoad {
    pub calls: u64,
    pub concurrency: u64,
    pub errors: u64,
    pub first_error: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub runs_per_s: f64,
}

/// A load of `calls` RunFunction calls, `concurrency` at a time on one
/// grpc-go connection, after `warmup` calls not counted (what
/// `bench/run.sh`'s grpc-go step runs).
pub fn go_run_load(
    dial: &GoDial,
    image: &str,
    input: &[u8],
    (calls, concurrency, warmup): (u32, u32, u32),
) -> Result<GoLoad> {
    let bin = go_runfunction()?;
    let (target, dialer) = go_target(dial);
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["-target", &target, "-image", image, "-input", "-"]);
    cmd.args(["-calls", &calls.to_string()]);
    cmd.args(["-concurrency", &concurrency.to_string()]);
    cmd.args(["-warmup", &warmup.to_string()]);
    if let Some(dialer) = dialer {
        cmd.args(["-dial", dialer]);
    }
    let out = crate::process::run_capture(&mut cmd, Some(input), crate::python::GUARD);
    if out.code != Some(0) {
        bail!("runfunction's load {target} failed: {}", out.describe());
    }
    serde_json::from_str(&out.stdout)
        .with_context(|| format!("runfunction's load printed no summary: {}", out.describe()))
}

/// The target and dialer `runfunction` takes for `dial`.
fn go_target(dial: &GoDial) -> (String, Option<&'static str>) {
    match dial {
        GoDial::Unix(path) => (format!("unix:{}", path.display()), None),
        GoDial::PathWithDialer(path) => (path.display().to_string(), Some("unix")),
        GoDial::AbstractWithDialer(name) => {
            (format!("unix-abstract:{name}"), Some("unix-abstract"))
        }
        GoDial::Tcp(addr) => (addr.clone(), None),
    }
}

/// RunFunction with grpc-go, dialing as `dial` says.
pub fn go_run_function(dial: &GoDial, image: &str, input: &[u8]) -> Result<Outcome> {
    let bin = go_runfunction()?;
    let (target, dialer) = go_target(dial);
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["-target", &target, "-image", image, "-input", "-"]);
    if let Some(dialer) = dialer {
        cmd.args(["-dial", dialer]);
    }
    let out = crate::process::run_capture(&mut cmd, Some(input), crate::python::GUARD);
    if out.code != Some(0) {
        bail!("runfunction {target} failed: {}", out.describe());
    }
    let result: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("runfunction printed no JSON object: {}", out.describe()))?;
    Ok(Outcome {
        code: field(&result, "code")?,
        message: field(&result, "message")?,
        output: field(&result, "output")?,
    })
}

/// The grpc-java client (`tests/java`, [`crate::java`]) run with `args` and
/// `stdin`; its JSON object.
fn java_json(args: &[&str], stdin: Option<&[u8]>) -> Result<serde_json::Value> {
    let mut cmd = crate::java::grpc_java_command(args)?;
    let out = crate::process::run_capture(&mut cmd, stdin, crate::python::GUARD);
    if out.code != Some(0) {
        bail!("grpc-java {args:?} failed: {}", out.describe());
    }
    serde_json::from_str(&out.stdout)
        .with_context(|| format!("grpc-java printed no JSON object: {}", out.describe()))
}

/// RunFunction with grpc-java on its own channel for `target` (`unix:PATH`
/// and `HOST:PORT` as grpc-java dials them; `unix-abstract:NAME` on Netty's
/// epoll transport, grpc-java having no such scheme).
pub fn java_run_function(target: &str, image: &str, input: &[u8]) -> Result<Outcome> {
    let result = java_json(
        &["run-function", "--target", target, "--image", image],
        Some(input),
    )?;
    Ok(Outcome {
        code: field(&result, "code")?,
        message: field(&result, "message")?,
        output: field(&result, "output")?,
    })
}

/// Porch's EvaluateFunction with grpc-java, dialing `target` as
/// [`java_run_function`] does.
pub fn java_evaluate(target: &str, image: &str, resource_list: &[u8]) -> Result<Evaluated> {
    let result = java_json(
        &["evaluate", "--target", target, "--image", image],
        Some(resource_list),
    )?;
    Ok(Evaluated {
        code: field(&result, "code")?,
        message: field(&result, "message")?,
        resource_list: field(&result, "resource_list")?,
        log: field(&result, "log")?,
    })
}

/// Server reflection v1 with grpc-java's reflection stubs (grpc-services):
/// the services, and the file that defines `symbol`.
pub fn java_reflection(target: &str, symbol: &str) -> Result<Reflected> {
    let result = java_json(
        &["reflection", "--target", target, "--symbol", symbol],
        None,
    )?;
    reflected(&result)
}

/// A v1 `RunFunction` with grpc-java to the functions listener at `target`
/// (`HOST:PORT`) with `:authority` `authority`: over h2c, or over mTLS with
/// `tls` and the TLS server name `server_name` (grpc-java takes it from the
/// `:authority`, so it must be that host). `request` is protojson.
pub fn java_crossplane_call(
    target: &str,
    authority: &str,
    tls: Option<(&crate::certs::TlsFiles, &str)>,
    request: &serde_json::Value,
) -> Result<Called> {
    let mut args: Vec<String> = [
        "crossplane-call",
        "--target",
        target,
        "--authority",
        authority,
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some((files, server_name)) = tls {
        for (flag, path) in [
            ("--ca", &files.ca),
            ("--cert", &files.cert),
            ("--key", &files.key),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        args.push("--server-name".to_owned());
        args.push(server_name.to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = java_json(&args, Some(request.to_string().as_bytes()))?;
    Ok(Called {
        code: field(&result, "code")?,
        message: field(&result, "message")?,
        response: Some(result["response"].clone()).filter(|r| !r.is_null()),
    })
}
