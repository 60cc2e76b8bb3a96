//! Registry credentials from docker's config file, for `fnrun run` and `fnrun pull`.
//!
//! The file is `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`, read the way
//! docker, podman and skopeo read it: `auths` is keyed by `host[:port]`, with or without
//! a scheme and path (`https://index.docker.io/v1/` is Docker Hub); an entry has `auth`
//! (base64 `user:password`), `username`/`password`, `identitytoken` or `registrytoken`.
//! Credential helpers (`credsStore`, `credHelpers`) are not run.
//!
//! Values of the file never appear in errors: the JSON is read as a `Value` and its
//! fields picked by hand, so no parser error can quote a secret.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::Engine;
use fnrun_cache::{Cache, Credentials, ImageRef};
use serde_json::Value;

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

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

/// Credentials for `image` from the docker config file of this process's environment;
/// anonymous for `oci:` images, registries without an entry and when there is no file.
pub fn credentials_for_image(cache: &Cache, image: &str) -> Result<Credentials, String> {
    // A malformed reference is reported by the run or pull itself.
    let Ok(ImageRef::Registry { registry, .. }) = cache.parse_reference(image) else {
        return Ok(Credentials::Anonymous);
    };
    let Some(path) = config_path(std::env::var_os("DOCKER_CONFIG"), std::env::var_os("HOME"))
    else {
        return Ok(Credentials::Anonymous);
    };
    credentials_from_file(&path, &registry)
}

/// Credentials for `registry` (`host[:port]`) from the config file at `path`.
fn credentials_from_file(path: &Path, registry: &str) -> Result<Credentials, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => f
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::Anonymous),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("{} is too large", path.display()));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Credentials::Anonymous);
    }
    // serde_json's syntax errors name a line and column, never the text.
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
    lookup(&json, registry).map_err(|e| format!("{}: {e}", path.display()))
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

/// Credentials for `registry` in a parsed config file.
fn lookup(json: &Value, registry: &str) -> Result<Credentials, String> {
    let Some(auths) = json.get("auths") else {
        return Ok(Credentials::Anonymous);
    };
    let Some(auths) = auths.as_object() else {
        return Err("\"auths\" is not an object".into());
    };
    let wanted = registry.to_ascii_lowercase();
    let hub = is_docker_hub(&wanted);
    let matches = |key: &str| {
        let host = normalize_key(key);
        host == wanted || (hub && is_docker_hub(&host))
    };
    // An exact key first, then docker login's Docker Hub key, then any equivalent key.
    let entry = auths
        .get(registry)
        .map(|e| (registry, e))
        .or_else(|| {
            hub.then(|| auths.get(DOCKER_HUB_KEY).map(|e| (DOCKER_HUB_KEY, e)))
                .flatten()
        })
        .or_else(|| {
            auths
                .iter()
                .find(|(k, _)| matches(k))
                .map(|(k, e)| (k.as_str(), e))
        });
    match entry {
        Some((key, entry)) => entry_credentials(entry).map_err(|e| format!("auths[{key:?}]: {e}")),
        None => Ok(Credentials::Anonymous),
    }
}

/// Credentials of one `auths` entry, in the order docker uses them.
fn entry_credentials(entry: &Value) -> Result<Credentials, String> {
    if !entry.is_object() {
        return Err("the entry is not an object".into());
    }
    let field = |name: &str| -> Result<&str, String> {
        match entry.get(name) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(format!("{name:?} is not a string")),
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
            .ok_or_else(|| "\"auth\" is not base64 of user:password".to_owned())?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| "\"auth\" is not base64 of user:password".to_owned())?;
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
    fn keys_with_and_without_scheme() {
        let config = json!({"auths": {
            "127.0.0.1:5000": {"auth": b64("a:pw:with:colons")},
            "https://ghcr.io": {"username": "b", "password": "pb"},
            "http://registry.example:8443/v2/": {"auth": b64("c:pc")},
            "Quay.IO": {"auth": b64("d:pd")},
        }});
        assert_eq!(
            lookup(&config, "127.0.0.1:5000"),
            Ok(basic("a", "pw:with:colons"))
        );
        assert_eq!(lookup(&config, "ghcr.io"), Ok(basic("b", "pb")));
        assert_eq!(
            lookup(&config, "registry.example:8443"),
            Ok(basic("c", "pc"))
        );
        assert_eq!(lookup(&config, "quay.io"), Ok(basic("d", "pd")));
        // Another port is another registry.
        assert_eq!(
            lookup(&config, "127.0.0.1:5001"),
            Ok(Credentials::Anonymous)
        );
        assert_eq!(
            lookup(&config, "registry.example"),
            Ok(Credentials::Anonymous)
        );
        assert_eq!(lookup(&json!({}), "ghcr.io"), Ok(Credentials::Anonymous));
    }

    #[test]
    fn docker_hub_aliases() {
        let login = json!({"auths": {DOCKER_HUB_KEY: {"auth": b64("hub:pw")}}});
        for r in ["index.docker.io", "docker.io", "registry-1.docker.io"] {
            assert_eq!(lookup(&login, r), Ok(basic("hub", "pw")), "{r}");
        }
        assert_eq!(lookup(&login, "ghcr.io"), Ok(Credentials::Anonymous));
        let plain = json!({"auths": {"docker.io": {"auth": b64("hub2:pw")}}});
        assert_eq!(lookup(&plain, "index.docker.io"), Ok(basic("hub2", "pw")));
        // An exact key wins over the alias.
        let both = json!({"auths": {
            "docker.io": {"auth": b64("x:1")},
            "index.docker.io": {"auth": b64("y:2")},
        }});
        assert_eq!(lookup(&both, "index.docker.io"), Ok(basic("y", "2")));
    }

    #[test]
    fn tokens_and_empty_entries() {
        let config = json!({"auths": {
            "id.example": {"username": "00000000-0000-0000-0000-000000000000", "identitytoken": "refresh"},
            "rt.example": {"registrytoken": "bearer", "auth": b64("u:p")},
            "store.example": {},
        }, "credsStore": "desktop"});
        assert_eq!(
            lookup(&config, "id.example"),
            Ok(Credentials::IdentityToken {
                token: "refresh".into()
            })
        );
        assert_eq!(
            lookup(&config, "rt.example"),
            Ok(Credentials::Bearer {
                token: "bearer".into()
            })
        );
        assert_eq!(lookup(&config, "store.example"), Ok(Credentials::Anonymous));
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
            let err = lookup(&config, "r.example").unwrap_err();
            assert!(
                err.contains("r.example") && !err.contains("s3cret"),
                "{err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths": {"r.example": {"auth": "s3cret"#).unwrap();
        let err = credentials_from_file(&path, "r.example").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
        std::fs::write(&path, r#"{"auths": {"r.example": {"auth": s3cret}}}"#).unwrap();
        let err = credentials_from_file(&path, "r.example").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
        // A missing or empty file is no credentials.
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(
            credentials_from_file(&path, "r.example"),
            Ok(Credentials::Anonymous)
        );
        assert_eq!(
            credentials_from_file(&dir.path().join("none.json"), "r.example"),
            Ok(Credentials::Anonymous)
        );
        std::fs::write(
            &path,
            json!({"auths": {"r.example": {"auth": b64("u:p")}}}).to_string(),
        )
        .unwrap();
        assert_eq!(
            credentials_from_file(&path, "r.example"),
            Ok(basic("u", "p"))
        );
    }
}
