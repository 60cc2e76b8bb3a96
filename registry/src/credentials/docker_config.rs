//! Registry credentials from the files of podman, skopeo and docker, for `fnrun run`,
//! `fnrun pull`, Porch's evaluator and the function host.
//!
//! The files are `--authfile FILE` (`REGISTRY_AUTH_FILE`) alone when given; else, as
//! containers-image searches them, `$XDG_RUNTIME_DIR/containers/auth.json`
//! (`/run/containers/UID/auth.json` without `XDG_RUNTIME_DIR`), then
//! `$XDG_CONFIG_HOME/containers/auth.json` (`~/.config/containers/auth.json`), then
//! docker's `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; the first that
//! has credentials for the registry gives them ([`find_credentials`], which also says
//! where they came from, or where they were looked for, for a registry's refusal).
//! Each file is read the way docker reads its config (podman's `auth.json` is the same
//! format). For a registry, in this order (docker CLI's `GetCredentialsStore`):
//!
//! 1. `credHelpers[registry]`: that credential helper. An empty name there means "no
//!    helper for this registry": step 3, even if `credsStore` is set.
//! 2. `credsStore`: the default credential helper, for every registry without an entry
//!    in `credHelpers`.
//! 3. `auths[registry]`: an entry with `auth` (base64 `user:password`),
//!    `username`/`password`, `identitytoken` or `registrytoken`.
//!
//! When a helper is configured for the registry, `auths` is not used for it (docker
//! keeps only an entry's `registrytoken` then, and so does fnrun); a helper that has no
//! credentials for the registry means an anonymous pull. Helpers are run as
//! `docker-credential-<name> get` (see [`super::helper`]) with the server
//! address docker uses: `https://index.docker.io/v1/` for Docker Hub, `host[:port]`
//! otherwise. Unlike docker, which then goes on without credentials, a helper that is
//! missing or fails is an error naming it.
//!
//! Keys of `auths` and `credHelpers` are `host[:port]`, with or without a scheme and path
//! (`https://index.docker.io/v1/` and `docker.io` are Docker Hub); an exact key wins.
//! (docker matches `credHelpers` keys exactly, on `host[:port]` or, for Docker Hub,
//! `https://index.docker.io/v1/`; fnrun also takes the equivalent keys it takes in
//! `auths`.)
//!
//! Values of the file never appear in errors: the JSON is read as a `Value` and its
//! fields picked by hand, so no parser error can quote a secret.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::auth::Credentials;
use crate::digest::truncate;
use crate::reference::ImageRef;
use base64::Engine;
use serde_json::{Map, Value};

use super::helper::{self as credential_helper, HELPER_TIMEOUT, HelperError};

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Why the docker config file gives no credentials. Never contains a value of the file.
#[derive(Debug, thiserror::Error)]
pub enum DockerConfigError {
    #[error("cannot read {}: {err}", .path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{} is too large (more than {limit} bytes)", .path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    /// serde_json's syntax errors name a line and column, never the text.
    #[error("cannot parse {}: {err}", .path.display())]
    Parse {
        path: PathBuf,
        err: serde_json::Error,
    },
    #[error("{}: {err}", .path.display())]
    Setting { path: PathBuf, err: SettingError },
    #[error("{}: {origin}: {err}", .path.display())]
    Helper {
        path: PathBuf,
        /// The setting that chose the helper: `credsStore` or `credHelpers["key"]`.
        origin: String,
        err: HelperError,
    },
}

/// A setting of the config file that cannot be used; names it, never its value.
/// A key it quotes is cut to a few hundred bytes: a key with a scheme may carry
/// a path of any length and still name the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{0:?} is not an object")]
    NotAnObject(&'static str),
    #[error("{origin} is not a string")]
    HelperNotAString { origin: String },
    #[error("\"credsStore\" is not a string")]
    StoreNotAString,
    #[error("auths[{key:?}]: {err}")]
    Entry { key: String, err: EntryError },
}

/// An `auths` entry that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("the entry is not an object")]
    NotAnObject,
    #[error("{0:?} is not a string")]
    NotAString(&'static str),
    #[error("\"auth\" is not base64 of user:password")]
    BadAuth,
}

/// Names of Docker Hub in `auths` keys.
const DOCKER_HUB_ALIASES: &[&str] = &[
    "index.docker.io",
    "docker.io",
    "registry-1.docker.io",
    "registry.hub.docker.com",
];
/// The key `docker login` writes for Docker Hub.
const DOCKER_HUB_KEY: &str = "https://index.docker.io/v1/";

/// The docker config file: `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
fn config_path(docker_config: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    if let Some(dir) = docker_config.filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    home.filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// How credential helpers are found and bounded.
struct Helpers {
    /// The `PATH` they are looked up on.
    path: Option<OsString>,
    /// How long one may take to answer.
    timeout: Duration,
}

/// The files searched for credentials when no `--authfile` is given, in the
/// order of containers-image (podman, skopeo, buildah), whose logins are
/// read first, and docker's last:
///
/// 1. `$XDG_RUNTIME_DIR/containers/auth.json` (`podman login`'s file), or
///    `/run/containers/UID/auth.json` when `XDG_RUNTIME_DIR` is unset;
/// 2. `$XDG_CONFIG_HOME/containers/auth.json`, else
///    `~/.config/containers/auth.json`;
/// 3. docker's `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
#[derive(Debug, Default, Clone)]
struct SearchEnv {
    xdg_runtime_dir: Option<OsString>,
    xdg_config_home: Option<OsString>,
    docker_config: Option<OsString>,
    home: Option<OsString>,
    uid: u32,
}

impl SearchEnv {
    fn of_process() -> Self {
        Self {
            xdg_runtime_dir: std::env::var_os("XDG_RUNTIME_DIR"),
            xdg_config_home: std::env::var_os("XDG_CONFIG_HOME"),
            docker_config: std::env::var_os("DOCKER_CONFIG"),
            home: std::env::var_os("HOME"),
            uid: nix::unistd::getuid().as_raw(),
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        let set = |v: &Option<OsString>| v.clone().filter(|v| !v.is_empty());
        let mut files = vec![match set(&self.xdg_runtime_dir) {
            Some(dir) => PathBuf::from(dir).join("containers/auth.json"),
            None => PathBuf::from(format!("/run/containers/{}/auth.json", self.uid)),
        }];
        match (set(&self.xdg_config_home), set(&self.home)) {
            (Some(dir), _) => files.push(PathBuf::from(dir).join("containers/auth.json")),
            (None, Some(home)) => {
                files.push(PathBuf::from(home).join(".config/containers/auth.json"))
            }
            (None, None) => {}
        }
        files.extend(config_path(set(&self.docker_config), set(&self.home)));
        files
    }
}

/// Registry credentials for an image, and what to say of them when the
/// registry refuses them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// The credentials (anonymous when no file has any for the registry).
    pub credentials: Credentials,
    /// Where they came from, or which files were searched in vain, and what
    /// to do (`--authfile`, `podman login`): to be added to the message of a
    /// registry's refusal. `None` for images not in a registry.
    pub note: Option<String>,
}

/// Credentials for `image` (unqualified, it names `default_registry`: the
/// cache's): from `authfile` (`--authfile`, `REGISTRY_AUTH_FILE`) alone when
/// given, which must exist; else from the first of the files
/// `SearchEnv::files` lists that has credentials for the registry, as
/// containers-image searches them. Anonymous for `oci:` images and when no
/// file has any.
pub fn find_credentials(
    default_registry: &str,
    image: &str,
    authfile: Option<&Path>,
) -> Result<Found, DockerConfigError> {
    let helpers = Helpers {
        path: std::env::var_os("PATH"),
        timeout: HELPER_TIMEOUT,
    };
    find_in(
        default_registry,
        image,
        authfile,
        &SearchEnv::of_process(),
        &helpers,
    )
}

fn find_in(
    default_registry: &str,
    image: &str,
    authfile: Option<&Path>,
    env: &SearchEnv,
    helpers: &Helpers,
) -> Result<Found, DockerConfigError> {
    // A malformed reference is reported by the run or pull itself.
    let Ok(ImageRef::Registry { registry, .. }) = ImageRef::parse(image, default_registry) else {
        return Ok(Found::default());
    };
    let host = truncate(&registry);
    if let Some(path) = authfile {
        let credentials =
            credentials_from_named_file(default_registry, image, path, Some(helpers))?;
        let note = match credentials {
            Credentials::Anonymous => format!(
                "--authfile {} has no credentials for {host}",
                path.display()
            ),
            _ => format!(
                "the credentials for {host} came from --authfile {}",
                path.display()
            ),
        };
        return Ok(Found {
            credentials,
            note: Some(note),
        });
    }
    let files = env.files();
    for path in &files {
        let credentials = credentials_from_file(path, &registry, Some(helpers))?;
        if credentials != Credentials::Anonymous {
            return Ok(Found {
                credentials,
                note: Some(format!(
                    "the credentials for {host} came from {}",
                    path.display()
                )),
            });
        }
    }
    let searched: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    Ok(Found {
        credentials: Credentials::Anonymous,
        note: Some(format!(
            "no credentials for {host} in {} (log in with podman login or docker login, or give --authfile FILE)",
            searched.join(", ")
        )),
    })
}

/// Credentials for `image` (unqualified, it names `default_registry`: the
/// cache's) from the files of this process's environment, as
/// [`find_credentials`] without `--authfile`.
pub fn credentials_for_image(
    default_registry: &str,
    image: &str,
) -> Result<Credentials, DockerConfigError> {
    find_credentials(default_registry, image, None).map(|f| f.credentials)
}

/// Credentials for `image` from `authfile` (`--authfile`) when given, else
/// from the files of this process's environment ([`find_credentials`]).
pub fn credentials(
    default_registry: &str,
    image: &str,
    authfile: Option<&Path>,
) -> Result<Credentials, DockerConfigError> {
    find_credentials(default_registry, image, authfile).map(|f| f.credentials)
}

/// Credentials for `image` from the docker config file at `path` (`auths`,
/// `credHelpers`, `credsStore`); a missing file is an error.
pub fn credentials_from_docker_config(
    default_registry: &str,
    image: &str,
    path: &Path,
) -> Result<Credentials, DockerConfigError> {
    let helpers = Helpers {
        path: std::env::var_os("PATH"),
        timeout: HELPER_TIMEOUT,
    };
    credentials_from_named_file(default_registry, image, path, Some(&helpers))
}

/// Credentials for `image` from the `.dockerconfigjson` of a
/// `kubernetes.io/dockerconfigjson` Secret at `path`: its `auths` only, as the
/// kubelet reads a pull secret (no credential helper is run); a missing file
/// is an error.
pub fn credentials_from_pull_secret(
    default_registry: &str,
    image: &str,
    path: &Path,
) -> Result<Credentials, DockerConfigError> {
    credentials_from_named_file(default_registry, image, path, None)
}

/// Credentials for `image` from the `.dockerconfigjson` of a
/// `kubernetes.io/dockerconfigjson` Secret read through the API (`origin`
/// names it in errors, as `secret NAMESPACE/NAME`): its `auths`, as the
/// kubelet reads them, never a credential helper.
pub fn credentials_from_pull_secret_json(
    default_registry: &str,
    image: &str,
    origin: &str,
    bytes: &[u8],
) -> Result<Credentials, DockerConfigError> {
    let Ok(ImageRef::Registry { registry, .. }) = ImageRef::parse(image, default_registry) else {
        return Ok(Credentials::Anonymous);
    };
    let path = PathBuf::from(origin);
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(DockerConfigError::TooLarge {
            path,
            limit: MAX_CONFIG_BYTES,
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Credentials::Anonymous);
    }
    let json: Value = serde_json::from_slice(bytes).map_err(|err| DockerConfigError::Parse {
        path: path.clone(),
        err,
    })?;
    lookup_auths(&json, &registry).map_err(|err| DockerConfigError::Setting { path, err })
}

fn credentials_from_named_file(
    default_registry: &str,
    image: &str,
    path: &Path,
    helpers: Option<&Helpers>,
) -> Result<Credentials, DockerConfigError> {
    let Ok(ImageRef::Registry { registry, .. }) = ImageRef::parse(image, default_registry) else {
        return Ok(Credentials::Anonymous);
    };
    if let Err(err) = std::fs::metadata(path) {
        return Err(DockerConfigError::Read {
            path: path.to_owned(),
            err,
        });
    }
    credentials_from_file(path, &registry, helpers)
}

/// Credentials for `registry` (`host[:port]`) from the config file at `path`, running
/// a credential helper if the file says so; with no `helpers`, from `auths` only.
fn credentials_from_file(
    path: &Path,
    registry: &str,
    helpers: Option<&Helpers>,
) -> Result<Credentials, DockerConfigError> {
    use std::io::Read;
    let read = |err| DockerConfigError::Read {
        path: path.to_owned(),
        err,
    };
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => f
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::Anonymous),
        Err(e) => return Err(read(e)),
    };
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(DockerConfigError::TooLarge {
            path: path.to_owned(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Credentials::Anonymous);
    }
    let json: Value = serde_json::from_slice(&bytes).map_err(|err| DockerConfigError::Parse {
        path: path.to_owned(),
        err,
    })?;
    let found = match helpers {
        Some(_) => lookup(&json, registry),
        None => lookup_auths(&json, registry).map(Lookup::Found),
    }
    .map_err(|err| DockerConfigError::Setting {
        path: path.to_owned(),
        err,
    })?;
    match (found, helpers) {
        (Lookup::Found(creds), _) => Ok(creds),
        (Lookup::Helper { .. }, None) => Ok(Credentials::Anonymous),
        (
            Lookup::Helper {
                helper,
                server,
                origin,
            },
            Some(helpers),
        ) => credential_helper::get(&helper, &server, helpers.path.as_deref(), helpers.timeout)
            .map_err(|err| DockerConfigError::Helper {
                path: path.to_owned(),
                origin,
                err,
            }),
    }
}

/// The host[:port] of an `auths` key: no scheme, no path, lower case.
fn normalize_key(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or("").to_ascii_lowercase()
}

fn is_docker_hub(host: &str) -> bool {
    DOCKER_HUB_ALIASES.contains(&host)
}

/// What the config file says about a registry's credentials.
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    /// These (anonymous if nothing is configured).
    Found(Credentials),
    /// Ask credential helper `helper` for `server`; `origin` is the setting that named it.
    Helper {
        helper: String,
        server: String,
        origin: String,
    },
}

/// The entry of `map` (`auths` or `credHelpers`) for `registry`: an exact key first, then
/// docker login's Docker Hub key, then any equivalent key.
fn find_entry<'a>(map: &'a Map<String, Value>, registry: &str) -> Option<(&'a str, &'a Value)> {
    let wanted = registry.to_ascii_lowercase();
    let hub = is_docker_hub(&wanted);
    let matches = |key: &str| {
        let host = normalize_key(key);
        host == wanted || (hub && is_docker_hub(&host))
    };
    map.get_key_value(registry)
        .or_else(|| hub.then(|| map.get_key_value(DOCKER_HUB_KEY)).flatten())
        .or_else(|| map.iter().find(|(k, _)| matches(k)))
        .map(|(k, e)| (k.as_str(), e))
}

/// The object `name` of the file, if it is there.
fn object<'a>(
    json: &'a Value,
    name: &'static str,
) -> Result<Option<&'a Map<String, Value>>, SettingError> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(SettingError::NotAnObject(name)),
    }
}

/// The credentials of the `auths` entry for `registry` (anonymous without one).
fn lookup_auths(json: &Value, registry: &str) -> Result<Credentials, SettingError> {
    match object(json, "auths")?.and_then(|auths| find_entry(auths, registry)) {
        Some((key, entry)) => entry_credentials(entry).map_err(|err| SettingError::Entry {
            key: truncate(key),
            err,
        }),
        None => Ok(Credentials::Anonymous),
    }
}

/// Where the credentials for `registry` come from, in docker's order (module doc).
fn lookup(json: &Value, registry: &str) -> Result<Lookup, SettingError> {
    let entry = object(json, "auths")?.and_then(|auths| find_entry(auths, registry));
    let entry_error = |key: &str, err| SettingError::Entry {
        key: truncate(key),
        err,
    };
    let from_auths = || match entry {
        Some((key, entry)) => entry_credentials(entry)
            .map(Lookup::Found)
            .map_err(|err| entry_error(key, err)),
        None => Ok(Lookup::Found(Credentials::Anonymous)),
    };
    let from_helper = |name: &str, origin: String| {
        // docker keeps an entry's registry token when a helper answers for the registry.
        if let Some((key, entry)) = entry {
            match entry.get("registrytoken") {
                None | Some(Value::Null) => {}
                Some(Value::String(token)) if token.is_empty() => {}
                Some(Value::String(token)) => {
                    return Ok(Lookup::Found(Credentials::Bearer {
                        token: token.clone(),
                    }));
                }
                Some(_) => {
                    return Err(entry_error(key, EntryError::NotAString("registrytoken")));
                }
            }
        }
        let server = match is_docker_hub(&registry.to_ascii_lowercase()) {
            true => DOCKER_HUB_KEY.to_owned(),
            false => registry.to_owned(),
        };
        Ok(Lookup::Helper {
            helper: name.to_owned(),
            server,
            origin,
        })
    };

    // 1. credHelpers: this registry's helper, or "" for none (then auths, not credsStore).
    if let Some(helpers) = object(json, "credHelpers")?
        && let Some((key, name)) = find_entry(helpers, registry)
    {
        let origin = format!("credHelpers[{:?}]", truncate(key));
        return match name.as_str() {
            Some("") => from_auths(),
            Some(name) => from_helper(name, origin),
            None => Err(SettingError::HelperNotAString { origin }),
        };
    }
    // 2. credsStore: the default helper.
    match json.get("credsStore") {
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if name.is_empty() => {}
        Some(Value::String(name)) => return from_helper(name, "credsStore".to_owned()),
        Some(_) => return Err(SettingError::StoreNotAString),
    }
    // 3. auths.
    from_auths()
}

/// Credentials of one `auths` entry, in the order docker uses them.
fn entry_credentials(entry: &Value) -> Result<Credentials, EntryError> {
    if !entry.is_object() {
        return Err(EntryError::NotAnObject);
    }
    let field = |name: &'static str| -> Result<&str, EntryError> {
        match entry.get(name) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(EntryError::NotAString(name)),
        }
    };
    let registry_token = field("registrytoken")?;
    if !registry_token.is_empty() {
        return Ok(Credentials::Bearer {
            token: registry_token.to_owned(),
        });
    }
    let identity_token = field("identitytoken")?;
    if !identity_token.is_empty() {
        return Ok(Credentials::IdentityToken {
            token: identity_token.to_owned(),
        });
    }
    let auth = field("auth")?.trim();
    if !auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or(EntryError::BadAuth)?;
        let (username, password) = decoded.split_once(':').ok_or(EntryError::BadAuth)?;
        return Ok(Credentials::Basic {
            username: username.to_owned(),
            password: password.to_owned(),
        });
    }
    let (username, password) = (field("username")?, field("password")?);
    if !username.is_empty() || !password.is_empty() {
        return Ok(Credentials::Basic {
            username: username.to_owned(),
            password: password.to_owned(),
        });
    }
    Ok(Credentials::Anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn basic(u: &str, p: &str) -> Credentials {
        Credentials::Basic {
            username: u.into(),
            password: p.into(),
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn no_helpers() -> Helpers {
        Helpers {
            path: None,
            timeout: HELPER_TIMEOUT,
        }
    }

    /// The credentials [`lookup`] finds in the file itself (no helper).
    fn creds(json: &Value, registry: &str) -> Result<Credentials, SettingError> {
        match lookup(json, registry)? {
            Lookup::Found(c) => Ok(c),
            helper => panic!("{registry}: unexpected {helper:?}"),
        }
    }

    #[test]
    fn config_path_honours_docker_config() {
        assert_eq!(
            config_path(Some("/d".into()), Some("/home/u".into())),
            Some(PathBuf::from("/d/config.json"))
        );
        assert_eq!(
            config_path(Some("".into()), Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.docker/config.json"))
        );
        assert_eq!(config_path(None, None), None);
    }

    #[test]
    fn searches_podmans_files_before_dockers() {
        let dir = tempfile::tempdir().unwrap();
        let at = |p: &str| dir.path().join(p);
        let env = SearchEnv {
            xdg_runtime_dir: Some(at("run").into()),
            xdg_config_home: None,
            docker_config: None,
            home: Some(at("home").into()),
            uid: 1000,
        };
        assert_eq!(
            env.files(),
            [
                at("run/containers/auth.json"),
                at("home/.config/containers/auth.json"),
                at("home/.docker/config.json"),
            ]
        );
        let others = SearchEnv {
            xdg_config_home: Some("/cfg".into()),
            docker_config: Some("/dc".into()),
            ..SearchEnv::default()
        };
        assert_eq!(
            others.files(),
            [
                PathBuf::from("/run/containers/0/auth.json"),
                PathBuf::from("/cfg/containers/auth.json"),
                PathBuf::from("/dc/config.json"),
            ]
        );

        let write = |p: &str, user: &str| {
            let path = at(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let json = json!({"auths": {"r.example:5000": {"auth": b64(&format!("{user}:pw"))}}});
            std::fs::write(path, json.to_string()).unwrap();
        };
        let find = |authfile: Option<&Path>| {
            find_in(
                "docker.io",
                "r.example:5000/fn:v1",
                authfile,
                &env,
                &no_helpers(),
            )
            .unwrap()
        };
        // None: anonymous, and the note names every file searched.
        let none = find(None);
        assert_eq!(none.credentials, Credentials::Anonymous);
        let note = none.note.unwrap();
        for file in env.files() {
            assert!(note.contains(&file.display().to_string()), "{note}");
        }
        assert!(note.contains("--authfile"), "{note}");
        // docker's, then podman's XDG_CONFIG_HOME file, then its runtime one win.
        write("home/.docker/config.json", "docker");
        assert_eq!(find(None).credentials, basic("docker", "pw"));
        write("home/.config/containers/auth.json", "config");
        assert_eq!(find(None).credentials, basic("config", "pw"));
        write("run/containers/auth.json", "runtime");
        let found = find(None);
        assert_eq!(found.credentials, basic("runtime", "pw"));
        assert_eq!(
            found.note.unwrap(),
            format!(
                "the credentials for r.example:5000 came from {}",
                at("run/containers/auth.json").display()
            )
        );
        // A file without an entry for the registry is passed over.
        std::fs::write(at("run/containers/auth.json"), r#"{"auths": {}}"#).unwrap();
        assert_eq!(find(None).credentials, basic("config", "pw"));
        // --authfile alone.
        let empty = at("empty.json");
        std::fs::write(&empty, "{}").unwrap();
        let given = find(Some(&empty));
        assert_eq!(given.credentials, Credentials::Anonymous);
        assert!(given.note.unwrap().starts_with("--authfile "));
        // Images not in a registry have none, and no note.
        let layout = find_in("docker.io", "oci:/x:v1", None, &env, &no_helpers()).unwrap();
        assert_eq!(layout, Found::default());
    }

    #[test]
    fn keys_with_and_without_scheme() {
        let config = json!({"auths": {
            "127.0.0.1:5000": {"auth": b64("a:pw:with:colons")},
            "https://ghcr.io": {"username": "b", "password": "pb"},
            "http://registry.example:8443/v2/": {"auth": b64("c:pc")},
            "Quay.IO": {"auth": b64("d:pd")},
        }});
        assert_eq!(
            creds(&config, "127.0.0.1:5000"),
            Ok(basic("a", "pw:with:colons"))
        );
        assert_eq!(creds(&config, "ghcr.io"), Ok(basic("b", "pb")));
        assert_eq!(
            creds(&config, "registry.example:8443"),
            Ok(basic("c", "pc"))
        );
        assert_eq!(creds(&config, "quay.io"), Ok(basic("d", "pd")));
        // Another port is another registry.
        assert_eq!(creds(&config, "127.0.0.1:5001"), Ok(Credentials::Anonymous));
        assert_eq!(
            creds(&config, "registry.example"),
            Ok(Credentials::Anonymous)
        );
        assert_eq!(creds(&json!({}), "ghcr.io"), Ok(Credentials::Anonymous));
    }

    #[test]
    fn docker_hub_aliases() {
        let login = json!({"auths": {DOCKER_HUB_KEY: {"auth": b64("hub:pw")}}});
        for r in ["index.docker.io", "docker.io", "registry-1.docker.io"] {
            assert_eq!(creds(&login, r), Ok(basic("hub", "pw")), "{r}");
        }
        assert_eq!(creds(&login, "ghcr.io"), Ok(Credentials::Anonymous));
        let plain = json!({"auths": {"docker.io": {"auth": b64("hub2:pw")}}});
        assert_eq!(creds(&plain, "index.docker.io"), Ok(basic("hub2", "pw")));
        // An exact key wins over the alias.
        let both = json!({"auths": {
            "docker.io": {"auth": b64("x:1")},
            "index.docker.io": {"auth": b64("y:2")},
        }});
        assert_eq!(creds(&both, "index.docker.io"), Ok(basic("y", "2")));
    }

    #[test]
    fn tokens_and_empty_entries() {
        let config = json!({"auths": {
            "id.example": {"username": "00000000-0000-0000-0000-000000000000", "identitytoken": "refresh"},
            "rt.example": {"registrytoken": "bearer", "auth": b64("u:p")},
            "store.example": {},
        }});
        assert_eq!(
            creds(&config, "id.example"),
            Ok(Credentials::IdentityToken {
                token: "refresh".into()
            })
        );
        assert_eq!(
            creds(&config, "rt.example"),
            Ok(Credentials::Bearer {
                token: "bearer".into()
            })
        );
        assert_eq!(creds(&config, "store.example"), Ok(Credentials::Anonymous));
    }

    #[test]
    fn errors_never_show_secrets() {
        for entry in [
            json!({"auth": "s3cret-not-base64!"}),
            json!({"auth": b64("s3cret-without-colon")}),
            json!({"password": 5, "username": "s3cret"}),
            json!("s3cret"),
        ] {
            let config = json!({"auths": {"r.example": entry}});
            let err = creds(&config, "r.example").unwrap_err().to_string();
            assert!(
                err.contains("r.example") && !err.contains("s3cret"),
                "{err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths": {"r.example": {"auth": "s3cret"#).unwrap();
        let err = credentials_from_file(&path, "r.example", Some(&no_helpers()))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        std::fs::write(&path, r#"{"auths": {"r.example": {"auth": s3cret}}}"#).unwrap();
        let err = credentials_from_file(&path, "r.example", Some(&no_helpers()))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        // A missing or empty file is no credentials.
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(
            credentials_from_file(&path, "r.example", Some(&no_helpers())).unwrap(),
            Credentials::Anonymous
        );
        assert_eq!(
            credentials_from_file(
                &dir.path().join("none.json"),
                "r.example",
                Some(&no_helpers())
            )
            .unwrap(),
            Credentials::Anonymous
        );
        std::fs::write(
            &path,
            json!({"auths": {"r.example": {"auth": b64("u:p")}}}).to_string(),
        )
        .unwrap();
        assert_eq!(
            credentials_from_file(&path, "r.example", Some(&no_helpers())).unwrap(),
            basic("u", "p")
        );
    }

    /// A key with a scheme names its registry whatever its path, so a key
    /// can be as long as the file: errors quote it cut short.
    #[test]
    fn errors_quote_a_huge_key_cut_short() {
        let key = format!("https://r.example/{}", "k".repeat(1 << 20));
        let bad_entry = json!({"auths": {&key: {"auth": "not base64!"}}});
        let bad_helper = json!({"credHelpers": {&key: 5}});
        let errors = [
            creds(&bad_entry, "r.example").unwrap_err(),
            lookup_auths(&bad_entry, "r.example").unwrap_err(),
            lookup(&bad_helper, "r.example").unwrap_err(),
        ];
        for err in errors {
            let message = err.to_string();
            assert!(message.len() < 1024, "{} bytes", message.len());
            assert!(message.contains("https://r.example/kkk"), "{message}");
        }
        // Through a file, as `fnrun pull --authfile` reads it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, bad_entry.to_string()).unwrap();
        let message = credentials_from_pull_secret(DOCKER_HUB_ALIASES[0], "r.example/fn", &path)
            .unwrap_err()
            .to_string();
        assert!(message.len() < 1024 + path.as_os_str().len(), "{message}");
    }

    fn helper(name: &str, server: &str, origin: &str) -> Result<Lookup, SettingError> {
        Ok(Lookup::Helper {
            helper: name.into(),
            server: server.into(),
            origin: origin.into(),
        })
    }

    #[test]
    fn helpers_come_first_in_dockers_order() {
        let config = json!({
            "auths": {
                "127.0.0.1:5000": {"auth": b64("a:pa")},
                "plain.example": {"auth": b64("p:pp")},
                "opt-out.example": {"auth": b64("o:po")},
                "tok.example": {"registrytoken": "rt", "auth": b64("t:pt")},
                DOCKER_HUB_KEY: {"auth": b64("hub:pw")},
            },
            "credsStore": "desktop",
            "credHelpers": {
                "127.0.0.1:5000": "local",
                "https://gcr.io": "gcloud",
                "opt-out.example": "",
            },
        });
        // credHelpers over credsStore over auths.
        assert_eq!(
            lookup(&config, "127.0.0.1:5000"),
            helper(
                "local",
                "127.0.0.1:5000",
                r#"credHelpers["127.0.0.1:5000"]"#
            )
        );
        assert_eq!(
            lookup(&config, "gcr.io"),
            helper("gcloud", "gcr.io", r#"credHelpers["https://gcr.io"]"#)
        );
        assert_eq!(
            lookup(&config, "plain.example"),
            helper("desktop", "plain.example", "credsStore")
        );
        assert_eq!(
            lookup(&config, "other.example:8443"),
            helper("desktop", "other.example:8443", "credsStore")
        );
        // Docker Hub's helper key is the index URL, whatever the reference said.
        for hub in ["index.docker.io", "docker.io"] {
            assert_eq!(
                lookup(&config, hub),
                helper("desktop", DOCKER_HUB_KEY, "credsStore"),
                "{hub}"
            );
        }
        // An empty helper name: auths, not the store.
        assert_eq!(creds(&config, "opt-out.example"), Ok(basic("o", "po")));
        // docker keeps a registry token next to a helper.
        assert_eq!(
            creds(&config, "tok.example"),
            Ok(Credentials::Bearer { token: "rt".into() })
        );
        // Docker Hub in credHelpers under any of its names.
        let hub = json!({"credHelpers": {"docker.io": "hub"}});
        assert_eq!(
            lookup(&hub, "index.docker.io"),
            helper("hub", DOCKER_HUB_KEY, r#"credHelpers["docker.io"]"#)
        );
        // Without a store, auths as before; an empty store is no store.
        let no_store = json!({"credsStore": "", "auths": {"plain.example": {"auth": b64("p:pp")}}});
        assert_eq!(creds(&no_store, "plain.example"), Ok(basic("p", "pp")));
        for bad in [
            json!({"credsStore": 5}),
            json!({"credHelpers": ["x"]}),
            json!({"credHelpers": {"r.example": true}}),
            json!({"credsStore": "s", "auths": {"r.example": {"registrytoken": 1}}}),
        ] {
            assert!(lookup(&bad, "r.example").is_err(), "{bad}");
        }
    }

    #[test]
    fn a_pull_secret_gives_its_auths_and_runs_no_helper() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".dockerconfigjson");
        let auths = json!({"r.example:5000": {"auth": b64("secret-user:s3cret")}});
        std::fs::write(
            &path,
            json!({"auths": auths, "credsStore": "would-run", "credHelpers": {"r.example:5000": "x"}})
                .to_string(),
        )
        .unwrap();
        assert_eq!(
            credentials_from_file(&path, "r.example:5000", None).unwrap(),
            basic("secret-user", "s3cret")
        );
        assert_eq!(
            credentials_from_file(&path, "other.example", None).unwrap(),
            Credentials::Anonymous
        );
        std::fs::write(
            &path,
            json!({"auths": {"r.example:5000": {"auth": "%"}}}).to_string(),
        )
        .unwrap();
        let err = credentials_from_file(&path, "r.example:5000", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not base64"), "{err}");
    }

    #[test]
    fn a_pull_secret_read_through_the_api_gives_its_auths_only() {
        let json = json!({
            "auths": {"r.example:5000": {"auth": b64("secret-user:s3cret")}},
            "credsStore": "would-run",
        })
        .to_string();
        let origin = "secret crossplane-system/pull";
        let creds = |image: &str, bytes: &[u8]| {
            credentials_from_pull_secret_json("index.docker.io", image, origin, bytes)
        };
        assert_eq!(
            creds("r.example:5000/fns/f:v1", json.as_bytes()).unwrap(),
            basic("secret-user", "s3cret")
        );
        assert_eq!(
            creds("other.example/fns/f:v1", json.as_bytes()).unwrap(),
            Credentials::Anonymous
        );
        assert_eq!(
            creds("r.example:5000/f:v1", b" \n").unwrap(),
            Credentials::Anonymous
        );
        let err = creds("r.example:5000/f:v1", b"{").unwrap_err().to_string();
        assert!(
            err.starts_with("cannot parse secret crossplane-system/pull"),
            "{err}"
        );
        let huge = vec![b' '; usize::try_from(MAX_CONFIG_BYTES).unwrap() + 1];
        let err = creds("r.example:5000/f:v1", &huge).unwrap_err().to_string();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn helpers_are_run_for_the_registry() {
        use crate::credentials::helper::tests::install;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        install(
            &bin,
            "test",
            r#"[ "$(cat)" = "r.example:5000" ] || exit 1
echo '{"ServerURL":"r.example:5000","Username":"helper-user","Secret":"helper-s3cret"}'"#,
        );
        install(
            &bin,
            "empty",
            "echo 'credentials not found in native keychain'; exit 1",
        );
        let helpers = Helpers {
            path: Some(bin.clone().into_os_string()),
            timeout: Duration::from_secs(10),
        };
        let path = dir.path().join("config.json");
        let write = |config: Value| std::fs::write(&path, config.to_string()).unwrap();
        let auths = json!({"r.example:5000": {"auth": b64("file-user:file-s3cret")}});

        write(json!({"auths": auths, "credHelpers": {"r.example:5000": "test"}}));
        assert_eq!(
            credentials_from_file(&path, "r.example:5000", Some(&helpers)).unwrap(),
            basic("helper-user", "helper-s3cret")
        );
        // A store without credentials for the registry: anonymous, as docker does, even
        // with credentials in auths.
        write(json!({"auths": auths, "credsStore": "empty"}));
        assert_eq!(
            credentials_from_file(&path, "r.example:5000", Some(&helpers)).unwrap(),
            Credentials::Anonymous
        );
        // A missing helper is an error naming it and the setting.
        write(json!({"auths": auths, "credsStore": "gone"}));
        let err = credentials_from_file(&path, "r.example:5000", Some(&helpers))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("docker-credential-gone")
                && err.contains("credsStore")
                && err.contains(&path.display().to_string())
                && !err.contains("s3cret"),
            "{err}"
        );
    }
}
