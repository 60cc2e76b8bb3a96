//! Command-line flags, and building the cache, sandbox and runner from them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fnrun_cache::{Cache, CacheConfig, LayerOwner};
use fnrun_sandbox::{IdMap, Sandbox, SandboxConfig};

use crate::runner::{Admission, Runner};

/// A rootless container function runner for Crossplane composition functions.
#[derive(Debug, Parser)]
#[command(name = "fnrun", version = crate::VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, help_heading = "Global flags")]
    pub log_format: LogFormat,
    /// Log level [default: info for `serve` and `function serve`, else off].
    /// Without it or -v, RUST_LOG (a tracing filter) is used if set.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "LEVEL",
        help_heading = "Global flags"
    )]
    pub log_level: Option<LogLevel>,
    /// More log output, one level per -v above the command's default (off,
    /// info, debug, trace): `run -v` logs at info, `serve -v` at debug.
    #[arg(
        short = 'v',
        long = "verbose",
        global = true,
        action = clap::ArgAction::Count,
        conflicts_with = "log_level",
        help_heading = "Global flags"
    )]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-level`, in increasing verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level `verbose` steps of -v above `default`: the steps are off,
    /// info, debug, trace (errors and warnings of a one-shot command are
    /// its own error line).
    pub fn raised(default: LogLevel, verbose: u8) -> LogLevel {
        const STEPS: [LogLevel; 4] = [
            LogLevel::Off,
            LogLevel::Info,
            LogLevel::Debug,
            LogLevel::Trace,
        ];
        let start = STEPS.iter().rposition(|l| *l <= default).unwrap_or(0);
        STEPS[(start + usize::from(verbose)).min(STEPS.len() - 1)].max(default)
    }

    /// The tracing filter directive.
    pub fn directive(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `-o`/`--output` of the commands a script may parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OutputFormat {
    /// For people: a table or lines of text.
    #[default]
    #[value(alias = "table")]
    Text,
    Json,
    Yaml,
}

// Parsed once at start and matched at once: the size of the largest
// variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the v1alpha1 ContainerizedFunctionRunnerService.
    #[command(visible_alias = "start")]
    Serve(ServeArgs),
    /// Run one function and print its output FunctionIO (or, for a KRM
    /// function, its output ResourceList).
    Run(RunArgs),
    /// Prefetch images into the cache.
    ///
    /// Prints `REFERENCE DIGEST` for each image pulled, and a progress bar per layer on
    /// stderr when stderr is a terminal.
    Pull(PullArgs),
    /// Manage the image cache: list, prune, verify.
    Cache(crate::cache_cmd::CacheCmdArgs),
    /// Serve or call one Crossplane v1 function (a Function package).
    Function(crate::function_cmd::FunctionArgs),
    /// Print fnrun's version, commit, target and compiler.
    Version(crate::meta_cmd::VersionArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    ///
    /// bash: `source <(fnrun completion bash)`; zsh: `fnrun completion zsh >
    /// "${fpath[1]}/_fnrun"`; fish: `fnrun completion fish >
    /// ~/.config/fish/completions/fnrun.fish`.
    Completion(crate::meta_cmd::CompletionArgs),
    /// Print the man page (roff), or write one per command into a directory.
    Man(crate::meta_cmd::ManArgs),
}

/// Flags for the image cache and registries.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Registry flags")]
pub struct CacheArgs {
    /// Cache directory [default: $FNRUN_CACHE_DIR, else /var/cache/fnrun as
    /// root, else $XDG_CACHE_HOME/fnrun].
    #[arg(long, env = "FNRUN_CACHE_DIR", value_parser = crate::config::parse_path)]
    pub cache_dir: Option<PathBuf>,
    /// Default registry for unqualified image references.
    #[arg(long, default_value = fnrun_cache::DOCKER_HUB)]
    pub registry: String,
    /// A registry (HOST[:PORT]) that may be reached over plain HTTP. Loopback
    /// registries always may: such a registry is used over plain HTTP if it
    /// answers plain HTTP, over verified HTTPS otherwise.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// PEM file of CA certificates trusted for HTTPS registries, in addition
    /// to the system roots.
    #[arg(long, value_name = "FILE", value_parser = crate::config::parse_path)]
    pub ca_bundle: Option<PathBuf>,
    /// Largest unpacked size of one image.
    #[arg(long, default_value = "4Gi", value_parser = parse_size)]
    pub max_image_bytes: u64,
}

/// Where registry credentials come from.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Registry flags")]
pub struct AuthArgs {
    /// Registry credentials from this file instead of ~/.docker/config.json:
    /// a docker config.json or the auth.json of `podman login` and `skopeo
    /// --authfile` (`auths`, `credHelpers`, `credsStore`).
    #[arg(
        long,
        value_name = "FILE",
        env = "REGISTRY_AUTH_FILE",
        value_parser = crate::config::parse_path
    )]
    pub authfile: Option<PathBuf>,
}

/// Flags for the sandbox.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sandbox flags")]
pub struct SandboxArgs {
    /// First host uid of the 65536 ids mapped into sandboxes (privileged runner).
    #[arg(long, default_value_t = 100000)]
    pub map_root_uid: u32,
    /// First host gid of the 65536 ids mapped into sandboxes (privileged runner).
    #[arg(long, default_value_t = 100000)]
    pub map_root_gid: u32,
    /// Most bytes of stdout a function may write.
    #[arg(long, default_value = "100Mi", value_parser = parse_size)]
    pub max_output_bytes: u64,
    /// A seccomp profile file (JSON, see docs/seccomp.md) to use instead of
    /// the default profile.
    #[arg(long, value_name = "FILE", conflicts_with = "seccomp_unconfined", value_parser = crate::config::parse_path)]
    pub seccomp_profile: Option<PathBuf>,
    /// Run functions without a seccomp filter (not recommended).
    #[arg(long)]
    pub seccomp_unconfined: bool,
    /// Run anyway, with a warning, when a requested cpu or memory limit cannot
    /// be enforced on this host (default: fail with FAILED_PRECONDITION).
    #[arg(long)]
    pub best_effort_limits: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve the runner (v1alpha1) and Porch's evaluator on:
    /// unix:PATH, unix-abstract:NAME or HOST:PORT. Repeatable; `none` turns
    /// it off (with `--functions`: only functions are served).
    #[arg(
        long = "listen",
        default_value = "unix-abstract:crossplane/fn/default.sock"
    )]
    pub listen: Vec<String>,
    /// Runs at once [default: 4 per core].
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Calls that may wait for a run slot; beyond it calls fail at once with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Permissions of unix sockets (octal); never world-writable.
    #[arg(long, default_value = "0660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// On SIGTERM/SIGINT, how long health reports NOT_SERVING while new calls
    /// are still served, before the listeners close (so that Kubernetes and
    /// load balancers stop sending first); 0: close at once. A second signal
    /// ends it.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Once the listeners are closed, how long in-flight runs may take to
    /// finish before they are killed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// TLS certificate (PEM) for TCP listeners; unix sockets stay plain.
    #[arg(long, value_name = "FILE", requires = "tls_key", value_parser = crate::config::parse_path)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert", value_parser = crate::config::parse_path)]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM): TCP clients must present a certificate it signed (mTLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert", value_parser = crate::config::parse_path)]
    pub tls_client_ca: Option<PathBuf>,
    /// Only run images from this registry (HOST[:PORT]; `oci` for local
    /// layouts). Repeatable; default: any.
    #[arg(long = "allowed-registry", value_name = "HOST[:PORT]")]
    pub allowed_registries: Vec<String>,
    /// Keep the image cache under SIZE (e.g. 10Gi): after runs, least recently
    /// used images are evicted; images in use never are.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_max_size: Option<u64>,
    /// Pull these images into the cache at start, unless cached (for Porch's
    /// functions, say). A failed prefetch is a warning; the daemon serves
    /// meanwhile.
    #[arg(long, value_name = "IMAGE", num_args = 1..)]
    pub prefetch: Vec<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub functions: crate::host::args::FunctionsArgs,
}

/// Kubernetes' spellings (`IfNotPresent`), kpt's (`ifNotPresent`) and any
/// other case (`--image-pull-policy` is parsed ignoring case).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PullPolicyArg {
    #[value(name = "IfNotPresent", alias = "if-not-present")]
    IfNotPresent,
    #[value(name = "Always")]
    Always,
    #[value(name = "Never")]
    Never,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NetworkPolicyArg {
    #[value(name = "Isolated", alias = "isolated")]
    Isolated,
    #[value(name = "Runner", alias = "runner")]
    Runner,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kill the function after this long (e.g. 30s, 500ms, 1m).
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// When to pull the image: IfNotPresent (kpt: ifNotPresent), Always or
    /// Never.
    #[arg(long, value_enum, ignore_case = true, default_value_t = PullPolicyArg::IfNotPresent)]
    pub image_pull_policy: PullPolicyArg,
    #[arg(long, value_enum, default_value_t = NetworkPolicyArg::Isolated)]
    pub network_policy: NetworkPolicyArg,
    /// Memory limit (Kubernetes quantity, e.g. 128Mi).
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// CPU limit (Kubernetes quantity, e.g. 500m).
    #[arg(long, value_parser = parse_cpu)]
    pub cpu: Option<u64>,
    /// The function image: [docker://][REGISTRY/]REPO[:TAG][@DIGEST],
    /// oci:PATH[:TAG] or oci-archive:PATH[:TAG].
    pub image: String,
    /// The input FunctionIO (or, for a KRM function, ResourceList) file, or -
    /// for stdin.
    #[arg(default_value = "-")]
    pub input: String,
    // Flag groups, each under its heading in `run --help`.
    #[command(flatten)]
    pub krm: crate::krm::KrmArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Output format: text (`REFERENCE DIGEST` lines), json or yaml (a list
    /// of {image, reference, digest}, printed when every image is pulled).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Images to pull.
    #[arg(required = true)]
    pub images: Vec<String>,
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    fnrun_api::quantity::parse_memory(s).map_err(|e| e.to_string())
}

pub fn parse_cpu(s: &str) -> Result<u64, String> {
    fnrun_api::quantity::parse_cpu_millis(s).map_err(|e| e.to_string())
}

pub fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode"))?;
    if mode & 0o002 != 0 {
        return Err(format!("{s} would make the socket world-writable"));
    }
    if mode > 0o777 {
        return Err(format!("{s} is not a permission mode"));
    }
    Ok(mode)
}

/// The longest duration a flag or a functions file may give: a year. Longer
/// ones are refused rather than added to a clock reading, where they would
/// overflow (`Instant + Duration` panics past the clock's range).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `30s`, `500ms`, `1m`, `1m30s`, `2h`, or plain seconds; at most
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 30s, 500ms, 1m)");
    let too_long = || {
        format!(
            "{:?} is longer than a duration may be ({}h)",
            fnrun_api::text::bounded(s, 64),
            MAX_DURATION.as_secs() / 3600
        )
    };
    if let Ok(secs) = s.parse::<u64>() {
        let d = Duration::from_secs(secs);
        return if d > MAX_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[u_end..];
        let part = Duration::try_from_secs_f64(n * unit).map_err(|_| too_long())?;
        total = total
            .checked_add(part)
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(too_long)?;
    }
    Ok(total)
}

/// A path the user gives, made absolute against the working directory once,
/// as the command line is read: the sandbox's spawner, the daemon's tasks and
/// the mount code do not run from it (a relative `--cache-dir ./c` failed
/// every run with ENOENT). Symlinks are left as they are.
pub fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("the path is empty".to_owned());
    }
    std::path::absolute(s).map_err(|e| format!("cannot make {s:?} absolute: {e}"))
}

/// The cache directory when none is given: `/var/cache/fnrun` as root, else
/// `$XDG_CACHE_HOME/fnrun`, else `$HOME/.cache/fnrun`, else the home of the
/// user's passwd entry (a service user without `HOME`), else a private
/// `/tmp/fnrun-UID` (never the shared `/tmp/fnrun`: another user could
/// create it first and replace the layers functions run from). Whichever
/// it is, if it exists it must be this user's and writable by no one else.
pub fn default_cache_dir() -> anyhow::Result<PathBuf> {
    let uid = nix::unistd::geteuid();
    let (dir, private_tmp) = default_cache_location(
        uid.is_root(),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
        || {
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.dir)
        },
        uid.as_raw(),
    );
    if private_tmp {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => anyhow::bail!(
                "cannot create the cache directory {} ({e}); give one with --cache-dir",
                dir.display()
            ),
        }
    }
    check_private(&dir, uid.as_raw())?;
    Ok(dir)
}

/// Where the default cache is (see [`default_cache_dir`]), and whether it is
/// the `/tmp` fallback that fnrun creates itself.
fn default_cache_location(
    root: bool,
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    passwd_home: impl FnOnce() -> Option<PathBuf>,
    uid: u32,
) -> (PathBuf, bool) {
    if root {
        return (PathBuf::from("/var/cache/fnrun"), false);
    }
    // As podman and skopeo read them: only absolute values count.
    let absolute = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && p != Path::new("/"))
    };
    if let Some(dir) = absolute(xdg_cache_home) {
        return (dir.join("fnrun"), false);
    }
    if let Some(home) =
        absolute(home).or_else(|| passwd_home().filter(|p| p.is_absolute() && p != Path::new("/")))
    {
        return (home.join(".cache/fnrun"), false);
    }
    (PathBuf::from(format!("/tmp/fnrun-{uid}")), true)
}

/// Refuses a default cache directory (if it exists) that is not a directory
/// of `uid`'s, or that others may write to: whoever can write it can replace
/// the layers functions run from.
fn check_private(dir: &Path, uid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => anyhow::bail!(
            "cannot inspect the cache directory {} ({e}); give one with --cache-dir",
            dir.display()
        ),
    };
    let problem = if !meta.is_dir() {
        Some("is not a directory".to_owned())
    } else if meta.uid() != uid {
        Some(format!(
            "is owned by uid {}, not by this user ({uid})",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by other users (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => anyhow::bail!(
            "the default cache directory {} {problem}: another user could replace the \
             layers functions run from; give a directory of your own with --cache-dir \
             (or $FNRUN_CACHE_DIR)",
            dir.display()
        ),
        None => Ok(()),
    }
}

/// Builds the runner from flags.
pub fn build_runner(
    cache: &CacheArgs,
    sandbox: &SandboxArgs,
    admission: Admission,
) -> anyhow::Result<Runner> {
    let root = match &cache.cache_dir {
        Some(dir) => dir.clone(),
        None => default_cache_dir()?,
    };
    let id_map = IdMap::detect(sandbox.map_root_uid, sandbox.map_root_gid);
    let owner = match id_map {
        IdMap::Range {
            host_uid,
            host_gid,
            size,
        } => LayerOwner::Shift {
            uid: host_uid,
            gid: host_gid,
            size,
        },
        IdMap::Own { .. } => LayerOwner::Identity,
    };
    let mut cache_config = CacheConfig::new(&root);
    cache_config.default_registry = cache.registry.clone();
    cache_config.insecure_registries = cache.insecure_registries.clone();
    cache_config.owner = owner;
    cache_config.max_image_bytes = cache.max_image_bytes;
    if let Some(path) = &cache.ca_bundle {
        let pem = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read --ca-bundle {}: {e}", path.display()))?;
        cache_config.ca_bundle = Some(pem);
    }
    let cache = Cache::open(cache_config)
        .map_err(|e| anyhow::anyhow!("cannot open the cache at {}: {e}", root.display()))?;
    let mut sandbox_config = SandboxConfig::new(root.join("mnt"), id_map);
    sandbox_config.max_output_bytes = usize::try_from(sandbox.max_output_bytes)
        .map_err(|_| anyhow::anyhow!("--max-output-bytes is too large"))?;
    sandbox_config.best_effort_limits = sandbox.best_effort_limits;
    // This binary, which serves as the spawner when exec'd as one (see `main`).
    sandbox_config.spawner_exe = Some(std::path::PathBuf::from("/proc/self/exe"));
    if sandbox.seccomp_unconfined {
        sandbox_config.seccomp = None;
    } else if let Some(path) = &sandbox.seccomp_profile {
        let program = fnrun_seccomp::program_from_file(path)
            .map_err(|e| anyhow::anyhow!("seccomp profile {}: {e}", path.display()))?;
        sandbox_config.seccomp = Some(std::sync::Arc::new(program));
    }
    let sandbox = Sandbox::new(sandbox_config)
        .map_err(|e| anyhow::anyhow!("cannot set up the sandbox: {e}"))?;
    Ok(Runner::new(cache, sandbox, admission))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "soon", "5x", "s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_that_overflow_are_refused() {
        assert_eq!(parse_duration("8760h").unwrap(), MAX_DURATION);
        for long in [
            "18446744073709550000s18446744073709550000s",
            "18446744073709551615",
            "1e300s",
            "8760h1ns",
            "31536001",
            "9999999999999999999999999h",
        ] {
            let err = parse_duration(long).unwrap_err();
            assert!(
                err.contains("is longer than a duration may be (8760h)")
                    || err.contains("is not a duration"),
                "{long}: {err}"
            );
        }
        assert_eq!(
            parse_duration("18446744073709550000s18446744073709550000s").unwrap_err(),
            "\"18446744073709550000s18446744073709550000s\" is longer than a duration may be (8760h)"
        );
    }

    #[test]
    fn paths_are_made_absolute_at_start() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(parse_path("./c").unwrap(), cwd.join("c"));
        assert_eq!(parse_path("c/d").unwrap(), cwd.join("c/d"));
        assert_eq!(parse_path("/abs").unwrap(), PathBuf::from("/abs"));
        assert_eq!(parse_path("").unwrap_err(), "the path is empty");
        let cli = Cli::try_parse_from(["fnrun", "run", "--cache-dir", "./c", "img"]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.cache.cache_dir, Some(cwd.join("c")));
    }

    #[test]
    fn the_default_cache_is_never_the_shared_tmp() {
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        let none = || None;
        assert_eq!(
            default_cache_location(true, os("/x"), os("/h"), none, 0),
            (PathBuf::from("/var/cache/fnrun"), false)
        );
        assert_eq!(
            default_cache_location(false, os("/x"), os("/h"), none, 1000),
            (PathBuf::from("/x/fnrun"), false)
        );
        // A relative or empty XDG_CACHE_HOME is ignored, as podman does.
        assert_eq!(
            default_cache_location(false, os("rel"), os("/h"), none, 1000),
            (PathBuf::from("/h/.cache/fnrun"), false)
        );
        // A service user without HOME: the passwd entry's home.
        assert_eq!(
            default_cache_location(false, None, None, || Some(PathBuf::from("/srv/svc")), 1000),
            (PathBuf::from("/srv/svc/.cache/fnrun"), false)
        );
        // No home at all (or `/`): a private directory of this uid's.
        assert_eq!(
            default_cache_location(false, os(""), None, || Some(PathBuf::from("/")), 1000),
            (PathBuf::from("/tmp/fnrun-1000"), true)
        );
    }

    #[test]
    fn a_default_cache_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let dir = tmp.path().join("fnrun");
        check_private(&dir, uid).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_private(&dir, uid).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_private(&dir, uid).unwrap_err().to_string();
        assert!(e.contains("is writable by other users (mode 1777)"), "{e}");
        assert!(e.contains("--cache-dir"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_private(&dir, uid + 1).unwrap_err().to_string();
        assert!(
            e.contains(&format!("is owned by uid {uid}, not by this user")),
            "{e}"
        );
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = check_private(&link, uid).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn socket_modes() {
        assert_eq!(parse_mode("0660").unwrap(), 0o660);
        assert_eq!(parse_mode("600").unwrap(), 0o600);
        assert!(parse_mode("0666").is_err());
        assert!(parse_mode("0777").is_err());
        assert!(parse_mode("rw").is_err());
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["fnrun", "start"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!()
        };
        assert_eq!(s.listen, vec!["unix-abstract:crossplane/fn/default.sock"]);
        let cli = Cli::try_parse_from([
            "fnrun",
            "run",
            "--timeout",
            "2s",
            "--image-pull-policy",
            "Never",
            "img",
            "in.yaml",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.timeout, Duration::from_secs(2));
        assert_eq!(r.input, "in.yaml");
    }

    #[test]
    fn pull_policies_in_kubernetes_and_kpt_spellings() {
        for (given, want) in [
            ("IfNotPresent", "IfNotPresent"),
            ("ifNotPresent", "IfNotPresent"),
            ("if-not-present", "IfNotPresent"),
            ("always", "Always"),
            ("Always", "Always"),
            ("never", "Never"),
            ("NEVER", "Never"),
        ] {
            let cli = Cli::try_parse_from(["fnrun", "run", "--image-pull-policy", given, "img"])
                .unwrap_or_else(|e| panic!("{given}: {e}"));
            let Command::Run(r) = cli.command else {
                panic!()
            };
            assert_eq!(format!("{:?}", r.image_pull_policy), want, "{given}");
        }
        assert!(
            Cli::try_parse_from(["fnrun", "run", "--image-pull-policy", "sometimes", "img"])
                .is_err()
        );
    }

    #[test]
    fn log_levels_from_flags() {
        use LogLevel::*;
        assert_eq!(LogLevel::raised(Off, 1), Info);
        assert_eq!(LogLevel::raised(Off, 2), Debug);
        assert_eq!(LogLevel::raised(Off, 9), Trace);
        assert_eq!(LogLevel::raised(Info, 1), Debug);
        assert_eq!(LogLevel::raised(Info, 2), Trace);
        assert_eq!(LogLevel::raised(Warn, 1), Info);
        let cli = Cli::try_parse_from(["fnrun", "pull", "-vv", "img"]).unwrap();
        assert_eq!((cli.verbose, cli.log_level), (2, None));
        let cli = Cli::try_parse_from(["fnrun", "--log-level", "debug", "cache", "list"]).unwrap();
        assert_eq!(cli.log_level, Some(Debug));
        assert!(Cli::try_parse_from(["fnrun", "-v", "--log-level", "info", "version"]).is_err());
    }
}
