//! The function catalogue: which Crossplane functions the host serves, from
//! `--functions FILE` (YAML) and repeated `--function NAME=IMAGE`.
//!
//! ```yaml
//! functions:
//! - name: function-example          # a DNS label; answers to NAME, NAME.NS, NAME.NS.svc
//!   image: registry.example.org/fns/function-example:v1.2.3
//!   mode: server                    # server (default) | functionio
//!   imagePullPolicy: IfNotPresent   # Always | IfNotPresent | Never
//!   pullSecret: /etc/fnrun/pull/.dockerconfigjson   # or dockerConfig: FILE
//!   resources: {memory: 256Mi, cpu: 500m, pids: 256}
//!   network: Isolated               # Isolated (default) | Runner
//!   idleTimeout: 5m                 # 0: never stop the warm instance
//!   startTimeout: 30s               # pull excluded: start to first gRPC answer
//!   timeout: 25s                    # a call's deadline when the caller sets none
//!   maxConcurrency: 64              # calls at once; as many more may wait
//!   args: []                        # appended after --insecure
//!   env: {}
//! ```
//!
//! Parsing is strict: unknown keys, duplicate keys and duplicate names are
//! refused, and every value is checked before anything runs. Every error
//! names the file, the function (by index and name) and the field, and quotes
//! what it quotes bounded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fnrun_api::{Quoted, quantity, text};
use fnrun_cache::PullPolicy;
use fnrun_sandbox::{Limits, Network};
use serde::Deserialize;

/// Largest functions file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most functions in a catalogue.
pub const MAX_FUNCTIONS: usize = 512;
/// Most bytes of a parser message in an error.
const PARSER_MESSAGE_MAX: usize = 1024;

/// Defaults of a function (SPEC.md).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_TIMEOUT: Duration = fnrun_runner::runner::DEFAULT_TIMEOUT;
pub const DEFAULT_MAX_CONCURRENCY: usize = 64;
/// Highest `maxConcurrency`.
pub const MAX_CONCURRENCY: usize = 4096;

/// How a function is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Mode {
    /// A Function package: a gRPC server, kept warm and called over HTTP/2.
    #[serde(rename = "server")]
    Server,
    /// An xfn-era image that reads FunctionIO on stdin: one run per call.
    #[serde(rename = "functionio")]
    FunctionIo,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Server => "server",
            Mode::FunctionIo => "functionio",
        })
    }
}

/// Where the registry credentials of a function's image come from. They are
/// read each time the image is fetched (an instance starts, a FunctionIO
/// call runs), so a rotated file needs no reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// The daemon's podman, skopeo and docker logins
    /// (`$XDG_RUNTIME_DIR/containers/auth.json`,
    /// `$XDG_CONFIG_HOME/containers/auth.json`, then `$DOCKER_CONFIG/config.json`
    /// or `~/.docker/config.json`), as `fnrun run` reads them.
    DaemonDockerConfig,
    /// A docker config file: `auths`, `credHelpers` and `credsStore`.
    DockerConfig(PathBuf),
    /// The `.dockerconfigjson` of a `kubernetes.io/dockerconfigjson` Secret:
    /// its `auths`, as the kubelet reads it.
    PullSecret(PathBuf),
    /// The `.dockerconfigjson` of pull secrets read through the Kubernetes
    /// API (Kubernetes mode), tried in order: the first whose `auths` has the
    /// image's registry gives its credentials.
    PullSecrets(Vec<PullSecretData>),
}

/// A pull secret's `.dockerconfigjson`, as read through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSecretData {
    /// `secret NAMESPACE/NAME`, for errors.
    pub origin: String,
    pub dockerconfigjson: Arc<[u8]>,
}

/// One function of the catalogue, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionDef {
    pub name: String,
    pub image: String,
    pub mode: Mode,
    pub pull_policy: PullPolicy,
    pub credentials: CredentialSource,
    pub limits: Limits,
    pub network: Network,
    /// `None`: the warm instance is never stopped for being idle.
    pub idle_timeout: Option<Duration>,
    pub start_timeout: Duration,
    pub timeout: Duration,
    pub max_concurrency: usize,
    pub args: Vec<String>,
    /// `(NAME, VALUE)`, sorted by name.
    pub env: Vec<(String, String)>,
}

impl FunctionDef {
    /// A server-mode function with every default, as `--function NAME=IMAGE`
    /// and `fnrun function serve` give.
    pub fn new(name: &str, image: &str) -> Result<FunctionDef, FieldError> {
        check_dns_label(name)?;
        check_image(image)?;
        Ok(FunctionDef {
            name: name.to_owned(),
            image: image.to_owned(),
            mode: Mode::Server,
            pull_policy: PullPolicy::IfNotPresent,
            credentials: CredentialSource::DaemonDockerConfig,
            limits: Limits::default(),
            network: Network::Isolated,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            start_timeout: DEFAULT_START_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            args: Vec::new(),
            env: Vec::new(),
        })
    }
}

/// The functions served, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    functions: BTreeMap<String, Arc<FunctionDef>>,
}

impl Catalogue {
    /// A catalogue of these functions; names must be unique.
    pub fn new(defs: impl IntoIterator<Item = FunctionDef>) -> Result<Catalogue, CatalogueError> {
        let mut functions = BTreeMap::new();
        for def in defs {
            if functions.len() == MAX_FUNCTIONS {
                return Err(CatalogueError::TooMany {
                    limit: MAX_FUNCTIONS,
                });
            }
            let name = def.name.clone();
            if functions.insert(name.clone(), Arc::new(def)).is_some() {
                return Err(CatalogueError::Duplicate { name });
            }
        }
        Ok(Catalogue { functions })
    }

    /// The catalogue of `--functions FILE` (if any) and `--function NAME=IMAGE`.
    #[cfg(test)]
    pub fn load(file: Option<&Path>, flags: &[String]) -> Result<Catalogue, CatalogueError> {
        Ok(Catalogue::load_contents(file, flags)?.0)
    }

    /// The catalogue of `--functions FILE` (if any) and `--function
    /// NAME=IMAGE`, with the file's contents as read: what a watcher compares
    /// later, so that a change made while loading is seen.
    pub fn load_contents(
        file: Option<&Path>,
        flags: &[String],
    ) -> Result<(Catalogue, Option<Vec<u8>>), CatalogueError> {
        let contents = file.map(read_file).transpose()?;
        let catalogue = Catalogue::from_contents(file.zip(contents.as_deref()), flags)?;
        Ok((catalogue, contents))
    }

    /// The catalogue of a functions file's contents (`path` names it in
    /// errors and anchors its relative paths) and `--function NAME=IMAGE`.
    pub fn from_contents(
        file: Option<(&Path, &[u8])>,
        flags: &[String],
    ) -> Result<Catalogue, CatalogueError> {
        let mut defs = match file {
            Some((path, bytes)) => parse(path, bytes)?,
            None => Vec::new(),
        };
        for flag in flags {
            defs.push(parse_flag(flag)?);
        }
        Catalogue::new(defs)
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Arc<FunctionDef>> {
        self.functions.get(name)
    }

    /// Every function, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<FunctionDef>> {
        self.functions.values()
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.keys().map(String::as_str)
    }
}

/// Why a catalogue cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error("cannot read the functions file {}: {err}", .path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("the functions file {} is larger than {limit} bytes", .path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("the functions file {} is not valid: {message}", .path.display())]
    Parse { path: PathBuf, message: String },
    #[error("the functions file {}: functions[{index}] ({name}): {field}: {problem}", .path.display())]
    Function {
        path: PathBuf,
        index: usize,
        name: Quoted,
        field: &'static str,
        problem: FieldError,
    },
    #[error("--function {value}: {problem}")]
    Flag { value: Quoted, problem: FlagError },
    #[error("function {name:?} is defined twice")]
    Duplicate { name: String },
    #[error("more than {limit} functions")]
    TooMany { limit: usize },
}

/// A value of a function that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error(
        "{0} is not a DNS label (1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit)"
    )]
    NotDnsLabel(Quoted),
    #[error("is empty")]
    Empty,
    #[error("{0} has a NUL byte")]
    Nul(Quoted),
    #[error(transparent)]
    Quantity(#[from] quantity::Error),
    #[error("must be more than 0")]
    Zero,
    #[error("{0}")]
    Duration(String),
    #[error("{value} is out of range (1 to {max})")]
    OutOfRange { value: u64, max: u64 },
    #[error("{0} is not an environment variable name")]
    EnvName(Quoted),
    #[error("dockerConfig and pullSecret are both set; choose one")]
    TwoCredentialSources,
}

/// A `--function` flag that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("is not NAME=IMAGE")]
    NotNameImage,
    #[error("name: {0}")]
    Name(FieldError),
    #[error("image: {0}")]
    Image(FieldError),
}

fn parse_flag(value: &str) -> Result<FunctionDef, CatalogueError> {
    let flag = |problem| CatalogueError::Flag {
        value: Quoted::new(value),
        problem,
    };
    let (name, image) = value
        .split_once('=')
        .ok_or_else(|| flag(FlagError::NotNameImage))?;
    check_dns_label(name).map_err(|e| flag(FlagError::Name(e)))?;
    check_image(image).map_err(|e| flag(FlagError::Image(e)))?;
    FunctionDef::new(name, image).map_err(|e| flag(FlagError::Name(e)))
}

/// The contents of the functions file at `path`, refused over
/// [`MAX_FILE_BYTES`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, CatalogueError> {
    use std::io::Read;
    let read = |err| CatalogueError::Read {
        path: path.to_owned(),
        err,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(read)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(CatalogueError::TooLarge {
            path: path.to_owned(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// The functions of a functions file's contents (`path` names it in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<FunctionDef>, CatalogueError> {
    // Nesting, aliases and documents bounded before the parser builds
    // anything, as for every other YAML fnrun reads.
    fnrun_api::yaml_bounds::check(bytes).map_err(|e| CatalogueError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let doc: FileDoc = serde_norway::from_slice(bytes).map_err(|e| CatalogueError::Parse {
        path: path.to_owned(),
        message: text::bounded(&e.to_string(), PARSER_MESSAGE_MAX).into_owned(),
    })?;
    if doc.functions.len() > MAX_FUNCTIONS {
        return Err(CatalogueError::TooMany {
            limit: MAX_FUNCTIONS,
        });
    }
    doc.functions
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            let name = Quoted::new(&raw.name);
            raw.check(path.parent().unwrap_or(Path::new("/")))
                .map_err(|(field, problem)| CatalogueError::Function {
                    path: path.to_owned(),
                    index,
                    name,
                    field,
                    problem,
                })
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    functions: Vec<RawFunction>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFunction {
    name: String,
    image: String,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    image_pull_policy: Option<RawPullPolicy>,
    #[serde(default)]
    docker_config: Option<PathBuf>,
    #[serde(default)]
    pull_secret: Option<PathBuf>,
    #[serde(default)]
    resources: Option<RawResources>,
    #[serde(default)]
    network: Option<RawNetwork>,
    #[serde(default, deserialize_with = "scalar")]
    idle_timeout: Option<String>,
    #[serde(default, deserialize_with = "scalar")]
    start_timeout: Option<String>,
    #[serde(default, deserialize_with = "scalar")]
    timeout: Option<String>,
    #[serde(default)]
    max_concurrency: Option<u64>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    #[serde(default, deserialize_with = "scalar")]
    memory: Option<String>,
    #[serde(default, deserialize_with = "scalar")]
    cpu: Option<String>,
    #[serde(default)]
    pids: Option<u64>,
}

#[derive(Clone, Copy, Deserialize)]
enum RawPullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(Clone, Copy, Deserialize)]
enum RawNetwork {
    Isolated,
    Runner,
}

/// Largest `resources.pids`.
const MAX_PIDS: u64 = 1 << 22;

impl RawFunction {
    /// The function, checked; relative credential paths are taken against
    /// `base`, the functions file's directory (as kubeconfig's paths are).
    fn check(self, base: &Path) -> Result<FunctionDef, (&'static str, FieldError)> {
        check_dns_label(&self.name).map_err(|e| ("name", e))?;
        check_image(&self.image).map_err(|e| ("image", e))?;
        let credentials = match (self.docker_config, self.pull_secret) {
            (None, None) => CredentialSource::DaemonDockerConfig,
            (Some(path), None) => CredentialSource::DockerConfig(
                check_path(base, path).map_err(|e| ("dockerConfig", e))?,
            ),
            (None, Some(path)) => {
                CredentialSource::PullSecret(check_path(base, path).map_err(|e| ("pullSecret", e))?)
            }
            (Some(_), Some(_)) => return Err(("pullSecret", FieldError::TwoCredentialSources)),
        };
        let mut limits = Limits::default();
        if let Some(r) = self.resources {
            if let Some(memory) = r.memory {
                let bytes = quantity::parse_memory_limit(&memory)
                    .map_err(|e| ("resources.memory", e.into()))?;
                limits.memory_bytes = Some(bytes);
            }
            if let Some(cpu) = r.cpu {
                let millis =
                    quantity::parse_cpu_limit(&cpu).map_err(|e| ("resources.cpu", e.into()))?;
                limits.cpu_millis = Some(millis);
            }
            if let Some(pids) = r.pids {
                if !(1..=MAX_PIDS).contains(&pids) {
                    return Err((
                        "resources.pids",
                        FieldError::OutOfRange {
                            value: pids,
                            max: MAX_PIDS,
                        },
                    ));
                }
                limits.pids = Some(pids);
            }
        }
        let duration = |field, value: Option<String>, default| match value {
            None => Ok(default),
            Some(v) => fnrun_api::duration::parse(&v).map_err(|e| (field, FieldError::Duration(e))),
        };
        let idle = duration("idleTimeout", self.idle_timeout, DEFAULT_IDLE_TIMEOUT)?;
        let start_timeout = duration("startTimeout", self.start_timeout, DEFAULT_START_TIMEOUT)?;
        if start_timeout.is_zero() {
            return Err(("startTimeout", FieldError::Zero));
        }
        let timeout = duration("timeout", self.timeout, DEFAULT_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(("timeout", FieldError::Zero));
        }
        let max_concurrency = match self.max_concurrency {
            None => DEFAULT_MAX_CONCURRENCY,
            Some(n) if (1..=MAX_CONCURRENCY as u64).contains(&n) => {
                usize::try_from(n).unwrap_or(MAX_CONCURRENCY)
            }
            Some(n) => {
                return Err((
                    "maxConcurrency",
                    FieldError::OutOfRange {
                        value: n,
                        max: MAX_CONCURRENCY as u64,
                    },
                ));
            }
        };
        for arg in &self.args {
            if arg.contains('\0') {
                return Err(("args", FieldError::Nul(Quoted::new(arg))));
            }
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(("env", FieldError::EnvName(Quoted::new(name))));
            }
            if value.contains('\0') {
                return Err(("env", FieldError::Nul(Quoted::new(value))));
            }
        }
        Ok(FunctionDef {
            name: self.name,
            image: self.image,
            mode: self.mode.unwrap_or(Mode::Server),
            pull_policy: match self.image_pull_policy {
                None | Some(RawPullPolicy::IfNotPresent) => PullPolicy::IfNotPresent,
                Some(RawPullPolicy::Always) => PullPolicy::Always,
                Some(RawPullPolicy::Never) => PullPolicy::Never,
            },
            credentials,
            limits,
            network: match self.network {
                None | Some(RawNetwork::Isolated) => Network::Isolated,
                Some(RawNetwork::Runner) => Network::Runner,
            },
            idle_timeout: (!idle.is_zero()).then_some(idle),
            start_timeout,
            timeout,
            max_concurrency,
            args: self.args,
            env: self.env.into_iter().collect(),
        })
    }
}

/// A DNS label (RFC 1123), as Kubernetes names a Service.
pub fn check_dns_label(name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(FieldError::NotDnsLabel(Quoted::new(name)))
    }
}

/// An image reference is parsed by the cache when the function starts; here
/// only what can never be one is refused.
pub fn check_image(image: &str) -> Result<(), FieldError> {
    if image.trim().is_empty() {
        return Err(FieldError::Empty);
    }
    if image.contains('\0') {
        return Err(FieldError::Nul(Quoted::new(image)));
    }
    Ok(())
}

/// A path of the file, absolute: a relative one is taken against `base`.
fn check_path(base: &Path, path: PathBuf) -> Result<PathBuf, FieldError> {
    if path.as_os_str().is_empty() {
        Err(FieldError::Empty)
    } else {
        Ok(base.join(path))
    }
}

/// A YAML scalar (string, integer or float) as text: `5m`, `0`, `0.5`.
fn scalar<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Scalar;
    impl serde::de::Visitor<'_> for Scalar {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Scalar)
}

#[cfg(test)]
mod tests;
