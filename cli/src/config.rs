//! The flag groups and value parsers every command shares, and building the
//! cache, sandbox and runner from them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use fnrun_cache::{Cache, CacheConfig, LayerOwner, PullPolicy};
use fnrun_sandbox::{IdMap, Network, NetworkNamespaces, Sandbox, SandboxConfig};

use fnrun_runner::runner::{Admission, Runner};

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

/// `--cache-dir`: among the registry flags of the commands that pull
/// ([`CacheArgs`]), and a global flag of `fnrun cache`, which makes it so.
#[derive(Debug, Clone, Args)]
pub struct CacheDirArgs {
    /// Cache directory [default: $FNRUN_CACHE_DIR, else /var/cache/fnrun as
    /// root, else $XDG_CACHE_HOME/fnrun].
    #[arg(long, env = "FNRUN_CACHE_DIR", value_parser = crate::config::parse_path)]
    pub cache_dir: Option<PathBuf>,
}

/// `-o`/`--output` of every command that prints for scripts (`pull`,
/// `cache list|inspect|rm|prune`, `function call`, `version`): text by
/// default, but json for `cache inspect` and yaml for `function call`,
/// whose text is that (they set it with `mut_arg`, and the help says so).
#[derive(Debug, Clone, Copy, Args)]
pub struct OutputArgs {
    /// Output format: text (for people), json or yaml. The text of `cache
    /// inspect` is JSON, and of `function call` YAML (its json is the protobuf
    /// JSON mapping).
    #[arg(id = "output", short = 'o', long = "output", value_name = "OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

/// `--socket-mode` of the daemons, `serve` and `function serve`.
#[derive(Debug, Clone, Copy, Args)]
pub struct SocketModeArgs {
    /// Permissions of unix sockets (octal); never world-writable.
    #[arg(long, default_value = "0660", value_parser = parse_mode)]
    pub socket_mode: u32,
}

/// `--dry-run` of `cache rm` and `cache prune`.
#[derive(Debug, Clone, Copy, Args)]
pub struct DryRunArgs {
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Flags for the image cache and registries.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Registry flags")]
pub struct CacheArgs {
    #[command(flatten)]
    pub dir: CacheDirArgs,
    /// Default registry for unqualified image references.
    #[arg(long, default_value = fnrun_registry::DOCKER_HUB)]
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
    /// How long pulling one image from a registry may take (token,
    /// manifests, layers; waiting for the same pull started by another call
    /// counts). Past it the pull fails (UNAVAILABLE, exit 1), naming the
    /// image; 0: no deadline.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = fnrun_api::duration::parse)]
    pub pull_timeout: std::time::Duration,
}

/// Where registry credentials come from.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Registry flags")]
pub struct AuthArgs {
    /// Registry credentials from this file alone: a docker config.json or the
    /// auth.json of `podman login` and `skopeo --authfile` (`auths`,
    /// `credHelpers`, `credsStore`). Default: the first with credentials for
    /// the registry of $XDG_RUNTIME_DIR/containers/auth.json,
    /// $XDG_CONFIG_HOME/containers/auth.json and ~/.docker/config.json.
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
    #[command(flatten)]
    pub ids: IdMapArgs,
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
    /// Network namespace of an isolated call: per-kind (the calls of one
    /// image and run spec share one, one call at a time in each, made by
    /// the runner: no call holds a capability in it; a rootless runner
    /// cannot, and gives each call its own) or per-run (a new one for
    /// every call). See docs/security.md.
    #[arg(long, value_enum, default_value_t = NetworkNamespaceArg::PerKind)]
    pub network_namespace: NetworkNamespaceArg,
}

/// `--network-namespace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkNamespaceArg {
    /// A new network namespace for every call.
    PerRun,
    /// The calls of one kind share one, one at a time in each.
    PerKind,
}

/// The id map of the sandboxes, and of the layers a pull unpacks: among the
/// sandbox flags ([`SandboxArgs`]), and alone in `fnrun pull` (the
/// sandbox's other flags are for runs).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sandbox flags")]
pub struct IdMapArgs {
    /// First host uid of the 65536 ids mapped into sandboxes (privileged
    /// runner); they own the files of the layers unpacked.
    #[arg(long, default_value_t = 100000)]
    pub map_root_uid: u32,
    /// First host gid of the 65536 ids mapped into sandboxes (privileged
    /// runner); they own the files of the layers unpacked.
    #[arg(long, default_value_t = 100000)]
    pub map_root_gid: u32,
}

impl IdMapArgs {
    /// The sandbox flags of a run with these ids and every other default.
    pub fn sandbox(&self) -> SandboxArgs {
        SandboxArgs {
            ids: self.clone(),
            max_output_bytes: 100 << 20,
            seccomp_profile: None,
            seccomp_unconfined: false,
            best_effort_limits: false,
            network_namespace: NetworkNamespaceArg::PerKind,
        }
    }
}

/// `--timeout` of `run`, `function serve` and `function call`: 25s in each,
/// the deadline of what each runs (its help says which).
#[derive(Debug, Clone, Args)]
pub struct TimeoutArgs {
    /// The deadline, e.g. 30s, 500ms, 1m: of the run (`run`: the function is
    /// killed past it), or of a call (`function call`: the server's start is
    /// not counted; `function serve`: of a call whose caller sets none).
    #[arg(long, default_value = "25s", value_parser = fnrun_api::duration::parse)]
    pub timeout: Duration,
}

/// How a function's image is pulled and what its sandbox may use: the
/// flags of `run` and of `function serve` and `function call` (which add
/// `--pids`).
#[derive(Debug, Clone, Args)]
pub struct RunPolicyArgs {
    /// When to pull the image: IfNotPresent (kpt: ifNotPresent), Always or
    /// Never.
    #[arg(long, value_enum, ignore_case = true, default_value_t = PullPolicyArg::IfNotPresent)]
    pub image_pull_policy: PullPolicyArg,
    /// The function's network: Isolated (none or isolated: loopback only,
    /// in a network namespace of its own) or Runner (the host's network).
    #[arg(long, value_enum, ignore_case = true, default_value_t = NetworkPolicyArg::Isolated)]
    pub network_policy: NetworkPolicyArg,
    /// Memory limit [default: none]: a Kubernetes quantity (128Mi, 1Gi; 1G
    /// is 10^9 bytes) or podman's spelling, in binary units (128m, 1g, 100k,
    /// 512b); at least 4Mi.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_limit)]
    pub memory: Option<u64>,
    /// CPU limit [default: none], more than 0: a Kubernetes quantity (500m
    /// is half a core, 2 two cores).
    #[arg(long, value_name = "CPUS", value_parser = parse_cpu_limit)]
    pub cpu: Option<u64>,
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

impl From<PullPolicyArg> for PullPolicy {
    fn from(policy: PullPolicyArg) -> PullPolicy {
        match policy {
            PullPolicyArg::IfNotPresent => PullPolicy::IfNotPresent,
            PullPolicyArg::Always => PullPolicy::Always,
            PullPolicyArg::Never => PullPolicy::Never,
        }
    }
}

/// `--network-policy`, as the v1alpha1 API's `NetworkPolicy`; `none` (as
/// podman's and docker's `--network none`) is Isolated.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NetworkPolicyArg {
    /// Loopback only, in a network namespace of its own.
    #[value(name = "Isolated", alias = "none")]
    Isolated,
    /// The runner's (the host's) network.
    #[value(name = "Runner")]
    Runner,
}

impl From<NetworkPolicyArg> for Network {
    fn from(policy: NetworkPolicyArg) -> Network {
        match policy {
            NetworkPolicyArg::Isolated => Network::Isolated,
            NetworkPolicyArg::Runner => Network::Runner,
        }
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    fnrun_api::quantity::parse_memory(s).map_err(|e| e.to_string())
}

/// `--memory`: a Kubernetes quantity or podman's spelling (binary units),
/// at least the smallest limit a process can start in.
pub fn parse_memory_limit(s: &str) -> Result<u64, String> {
    fnrun_api::quantity::parse_memory_limit_cli(s).map_err(|e| e.to_string())
}

/// `--cpu`: a Kubernetes quantity above 0.
pub fn parse_cpu_limit(s: &str) -> Result<u64, String> {
    fnrun_api::quantity::parse_cpu_limit(s).map_err(|e| e.to_string())
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

/// Refuses a cache directory that a run of a root runner cannot reach: its
/// init, already the mapped root of its user namespace (host ids `uid` and
/// `gid`, no supplementary groups, no capability over the host's files),
/// mounts the run's scratch and layers below the cache by their paths, so
/// every directory above the cache (and the cache itself, where it exists)
/// must let those ids search it. `mktemp -d` and `/root` are mode 0700.
fn check_reachable(cache: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let cache = std::path::absolute(cache).map_err(|e| {
        anyhow::anyhow!(
            "cannot resolve the cache directory {}: {e}",
            cache.display()
        )
    })?;
    for dir in cache.ancestors() {
        // Not there yet: fnrun makes it, searchable.
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        let searchable = mode & 0o001 != 0
            || (meta.uid() == uid && mode & 0o100 != 0)
            || (meta.gid() == gid && mode & 0o010 != 0);
        if !searchable {
            anyhow::bail!(
                "the cache directory {} cannot be used: runs (host uid {uid}) cannot search {} \
                 (mode {:04o}, owner {}); make it searchable (chmod o+x {}) or give another \
                 --cache-dir",
                cache.display(),
                dir.display(),
                mode & 0o7777,
                meta.uid(),
                dir.display()
            );
        }
    }
    Ok(())
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
    let root = match &cache.dir.cache_dir {
        Some(dir) => dir.clone(),
        None => default_cache_dir()?,
    };
    let id_map = IdMap::detect(sandbox.ids.map_root_uid, sandbox.ids.map_root_gid);
    if let IdMap::Range {
        host_uid, host_gid, ..
    } = id_map
    {
        check_reachable(&root, host_uid, host_gid)?;
    }
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
    cache_config.pull_timeout = (!cache.pull_timeout.is_zero()).then_some(cache.pull_timeout);
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
    sandbox_config.network_namespaces = match sandbox.network_namespace {
        NetworkNamespaceArg::PerRun => NetworkNamespaces::PerRun,
        NetworkNamespaceArg::PerKind => NetworkNamespaces::PerKind,
    };
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
}
