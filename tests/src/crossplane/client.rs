//! Calls as Crossplane's function runner makes them, with grpc-go
//! (`tests/go/crossplaneclient`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::certs::TlsFiles;
use crate::go::Toolchain;
use crate::process::run_capture;

/// The `crossplaneclient` binary, built once.
pub fn client_binary() -> Result<PathBuf> {
    Toolchain::find()?.build("crossplaneclient", &[])
}

/// Which RunFunction to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// v1, then v1beta1 if v1 is UNIMPLEMENTED: what Crossplane does.
    #[default]
    Auto,
    V1,
    V1beta1,
}

/// Transport security of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClientTls {
    /// Plain h2c.
    Insecure,
    /// TLS: the server's certificate must chain to `ca`; `client` is the
    /// client certificate and key, if any.
    Tls {
        ca: PathBuf,
        client: Option<(PathBuf, PathBuf)>,
    },
}

/// One call, or a benchmark of many, described; [`Call::run`] makes it.
#[derive(Debug, Clone)]
#[must_use]
pub struct Call {
    address: String,
    tls: ClientTls,
    server_name: Option<String>,
    authority: Option<String>,
    api: Api,
    request: Vec<u8>,
    timeout: Duration,
    wrapper: Vec<String>,
}

impl Call {
    /// A call over h2c to `address` (`HOST:PORT`, or any grpc-go target).
    pub fn insecure(address: &str) -> Call {
        Call::new(address, ClientTls::Insecure)
    }

    /// A call over TLS to `address`, verifying the server against `ca`;
    /// add Crossplane's client certificate with [`Call::client_cert`].
    pub fn mtls(address: &str, ca: &Path) -> Call {
        Call::new(
            address,
            ClientTls::Tls {
                ca: ca.to_path_buf(),
                client: None,
            },
        )
    }

    fn new(address: &str, tls: ClientTls) -> Call {
        Call {
            address: address.to_owned(),
            tls,
            server_name: None,
            authority: None,
            api: Api::Auto,
            request: b"{}".to_vec(),
            timeout: Duration::from_secs(30),
            wrapper: Vec::new(),
        }
    }

    /// Presents `files`' certificate and key (the CA file is not used: the
    /// server is verified against the CA given to [`Call::mtls`]).
    pub fn client_cert(mut self, files: &TlsFiles) -> Self {
        if let ClientTls::Tls { client, .. } = &mut self.tls {
            *client = Some((files.cert.clone(), files.key.clone()));
        }
        self
    }

    /// The TLS server name (SNI) to send and verify; by default the
    /// target's host, as grpc-go does.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = Some(name.to_owned());
        self
    }

    /// The `:authority` to send; by default the target.
    pub fn authority(mut self, authority: &str) -> Self {
        self.authority = Some(authority.to_owned());
        self
    }

    /// Which RunFunction to call (default [`Api::Auto`]).
    pub fn api(mut self, api: Api) -> Self {
        self.api = api;
        self
    }

    /// The v1 `RunFunctionRequest`, protojson as JSON or YAML (default `{}`).
    pub fn request(mut self, request: impl AsRef<[u8]>) -> Self {
        self.request = request.as_ref().to_vec();
        self
    }

    /// The deadline of each call (default 30s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the client under `wrapper`, a command and its arguments that run
    /// the rest: `nsenter --net=/proc/PID/ns/net --` calls from another
    /// network namespace.
    pub fn wrapper(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|w| (*w).to_owned()).collect();
        self
    }

    fn command(&self, binary: &Path) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(binary);
                cmd
            }
            None => Command::new(binary),
        };
        cmd.arg(format!("-address={}", self.address))
            .arg("-request=-")
            .arg(format!("-timeout={}ms", self.timeout.as_millis()))
            .arg(format!(
                "-api={}",
                match self.api {
                    Api::Auto => "auto",
                    Api::V1 => "v1",
                    Api::V1beta1 => "v1beta1",
                }
            ));
        match &self.tls {
            ClientTls::Insecure => {
                cmd.arg("-insecure");
            }
            ClientTls::Tls { ca, client } => {
                cmd.arg(format!("-ca={}", ca.display()));
                if let Some((cert, key)) = client {
                    cmd.arg(format!("-cert={}", cert.display()))
                        .arg(format!("-key={}", key.display()));
                }
            }
        }
        if let Some(name) = &self.server_name {
            cmd.arg(format!("-server-name={name}"));
        }
        if let Some(authority) = &self.authority {
            cmd.arg(format!("-authority={authority}"));
        }
        // Nothing from the environment changes how grpc-go dials.
        for var in [
            "GRPC_GO_LOG_SEVERITY_LEVEL",
            "http_proxy",
            "https_proxy",
            "grpc_proxy",
        ] {
            cmd.env_remove(var);
        }
        cmd.env_remove("HTTPS_PROXY").env_remove("HTTP_PROXY");
        cmd
    }

    fn exec<T: for<'de> Deserialize<'de>>(&self, extra: &[String], guard: Duration) -> Result<T> {
        let binary = client_binary()?;
        let out = run_capture(
            self.command(&binary).args(extra),
            Some(&self.request),
            guard,
        );
        if out.code != Some(0) {
            bail!("crossplaneclient failed: {}", out.describe());
        }
        serde_json::from_str(&out.stdout)
            .with_context(|| format!("crossplaneclient printed no outcome: {}", out.describe()))
    }

    /// Makes the call; fails only if the client could not run (bad files,
    /// bad request), never for the call's status.
    pub fn run(&self) -> Result<Outcome> {
        let raw: RawOutcome = self.exec(&[], self.timeout * 2 + Duration::from_secs(30))?;
        Ok(Outcome {
            version: raw.version,
            fallback: raw.fallback,
            code: tonic::Code::from_i32(raw.code_number),
            code_name: raw.code,
            message: raw.message,
            response: raw.response,
            tls: raw.tls,
            elapsed: Duration::from_secs_f64(raw.elapsed_ms / 1000.0),
        })
    }

    /// Makes `calls` calls, `concurrency` at once, on one connection.
    pub fn bench(&self, calls: u32, concurrency: u32) -> Result<Bench> {
        let guard = self.timeout * calls.div_ceil(concurrency.max(1)) + Duration::from_secs(60);
        self.exec(
            &[
                format!("-calls={calls}"),
                format!("-concurrency={concurrency}"),
            ],
            guard,
        )
    }
}

#[derive(Deserialize)]
struct RawOutcome {
    version: String,
    fallback: bool,
    code: String,
    code_number: i32,
    message: String,
    response: Option<serde_json::Value>,
    tls: Option<TlsSeen>,
    elapsed_ms: f64,
}

/// How a call ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The API version that answered last: `v1` or `v1beta1`.
    pub version: String,
    /// Whether v1 answered UNIMPLEMENTED and v1beta1 was called.
    pub fallback: bool,
    pub code: tonic::Code,
    /// The code as grpc-go names it (`Unimplemented`).
    pub code_name: String,
    pub message: String,
    /// The `RunFunctionResponse` as protojson, when the call succeeded.
    pub response: Option<serde_json::Value>,
    /// The connection's TLS, as the client saw it.
    pub tls: Option<TlsSeen>,
    pub elapsed: Duration,
}

impl Outcome {
    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.code == tonic::Code::Ok
    }

    /// The response; panics with the outcome if the call failed.
    pub fn response(&self) -> &serde_json::Value {
        self.response
            .as_ref()
            .unwrap_or_else(|| panic!("the call failed: {self:?}"))
    }

    /// The response's results as (severity, message), e.g.
    /// `("SEVERITY_NORMAL", "...")`.
    pub fn results(&self) -> Vec<(String, String)> {
        self.response()["results"]
            .as_array()
            .map(|results| {
                results
                    .iter()
                    .map(|r| {
                        let text = |name: &str| r[name].as_str().unwrap_or_default().to_owned();
                        (text("severity"), text("message"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The desired composed resource `name` of the response (its
    /// `resource` object).
    pub fn desired_resource(&self, name: &str) -> Option<&serde_json::Value> {
        self.response()["desired"]["resources"]
            .get(name)
            .map(|r| &r["resource"])
    }

    /// The desired composite resource of the response (its `resource`
    /// object).
    pub fn desired_composite(&self) -> Option<&serde_json::Value> {
        self.response()["desired"]["composite"].get("resource")
    }
}

/// A server's TLS as the client saw it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct TlsSeen {
    /// `TLS 1.2` or `TLS 1.3`.
    pub version: String,
    /// The negotiated ALPN protocol (`h2`).
    pub alpn: String,
    /// The SNI the client sent.
    pub server_name: String,
    /// The DNS names of the server's certificate.
    pub peer_dns_names: Option<Vec<String>>,
    pub peer_common_name: String,
}

/// What many calls did.
#[derive(Debug, Clone, Deserialize)]
pub struct Bench {
    pub calls: u32,
    pub concurrency: u32,
    /// How many succeeded.
    pub ok: u32,
    /// How many ended with each code (grpc-go's names: `OK`, `Unavailable`).
    pub codes: BTreeMap<String, u32>,
    /// How many each API version answered.
    pub versions: BTreeMap<String, u32>,
    /// The first failure's error, empty if none.
    pub first_error: String,
    pub elapsed_ms: f64,
    pub calls_per_second: f64,
    pub latency_ms: Latency,
}

/// Latencies of a [`Bench`], in milliseconds.
#[derive(Debug, Clone, Deserialize)]
pub struct Latency {
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}
