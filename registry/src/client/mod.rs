//! Registry transport on oci-client: manifests and blobs, every byte verified here.
//!
//! oci-client keeps one credential per registry for the life of a client and caches
//! tokens per repository, so clients are kept per (registry, credentials): a request
//! never runs with another request's credentials. Descriptor `urls` (foreign layers)
//! are never followed: blobs come from the registry named by the reference only.
//!
//! Protocol: registries are spoken to over HTTPS, verified against the system roots plus
//! the `--ca-bundle` certificates. A loopback registry or an `--insecure-registry` may be
//! plain HTTP: it is probed once (`GET /v2/` in plain HTTP) and used over plain HTTP if it
//! answers plain HTTP, over HTTPS otherwise (a TLS server answers with a TLS alert, a close
//! or `400`), so a loopback registry with TLS is verified like any other.
//!
//! `error` maps failures to [`RegistryError`]; `protocol` chooses HTTPS or plain HTTP.
//! This module is the client's three requests (manifests, tag lists, blobs)
//! around the client cache they share.

mod error;
mod protocol;
mod repo;
mod token;

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::{
    BlobResponse, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use tokio::io::AsyncWriteExt;

pub use self::error::{CaBundleError, RegistryError};
use self::error::{chain, map_error, response_error};
use self::protocol::{answers_plain_http, parse_ca_bundle, plain_http_allowed};
pub use self::repo::Repo;
use crate::auth::Credentials;
use crate::digest::{Digest, Hasher};
use crate::manifest::{ACCEPTED_MANIFESTS, Descriptor, MAX_METADATA_BYTES};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on cached clients (one per registry and credentials).
const MAX_CLIENTS: usize = 64;
/// Tags asked for per page of a tag list.
const TAGS_PAGE: usize = 1000;
/// The most tags of one repository listed.
pub(crate) const MAX_TAGS: usize = 100_000;

/// A request to the registry made here (see [`Registries::direct`]).
struct Direct {
    /// The bearer token, if the registry asked for one.
    token: Option<String>,
    /// The credentials, used as they are when there is no token.
    auth: RegistryAuth,
    scheme: &'static str,
}

fn unavailable(repo: &Repo, detail: String) -> RegistryError {
    RegistryError::Unavailable {
        reference: repo.reference.clone(),
        registry: repo.registry.clone(),
        detail,
    }
}

/// The most of an error answer's body that is read: only for its message.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// `request` with the registry's token, or else the basic credentials.
fn authorize(
    request: reqwest::RequestBuilder,
    token: Option<&str>,
    auth: &RegistryAuth,
) -> reqwest::RequestBuilder {
    match (token, auth) {
        (Some(token), _) => request.bearer_auth(token),
        (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
        (None, _) => request,
    }
}

/// A metadata answer's body (a manifest, a page of tags), read no further
/// than [`MAX_METADATA_BYTES`], or [`MAX_ERROR_BODY`] for an error answer.
struct Body {
    bytes: Vec<u8>,
    /// Whether the body ended within the bound; if not, `bytes` is its head.
    complete: bool,
}

async fn bounded_body(response: &mut reqwest::Response) -> Result<Body, reqwest::Error> {
    let cap = match response.status() == reqwest::StatusCode::OK {
        true => MAX_METADATA_BYTES,
        false => MAX_ERROR_BODY,
    };
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if (bytes.len() + chunk.len()) as u64 > cap {
            return Ok(Body {
                bytes,
                complete: false,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body {
        bytes,
        complete: true,
    })
}

/// Whether `s` is a tag (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`).
fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c))
}

/// The oci-client authentication for `creds`, and the secret that keys its client.
/// Identity tokens must have been exchanged first ([`Registries::exchange`]).
pub(crate) fn registry_auth(
    repo: &Repo,
    creds: &Credentials,
) -> Result<(RegistryAuth, String), RegistryError> {
    Ok(match creds {
        Credentials::Anonymous => (RegistryAuth::Anonymous, String::new()),
        Credentials::Basic { username, password } => (
            RegistryAuth::Basic(username.clone(), password.clone()),
            format!("basic\0{username}\0{password}"),
        ),
        Credentials::Bearer { token } => (
            RegistryAuth::Bearer(token.clone()),
            format!("bearer\0{token}"),
        ),
        Credentials::IdentityToken { .. } => {
            return Err(RegistryError::Unauthorized {
                reference: repo.reference.clone(),
                detail: "internal error: the identity token was not exchanged".into(),
            });
        }
    })
}

/// Clients per (registry, credentials).
pub struct Registries {
    clients: Mutex<HashMap<String, Client>>,
    insecure: Vec<String>,
    /// Extra root certificates (PEM, one each).
    roots: Vec<Vec<u8>>,
    /// Probed protocol of loopback and insecure registries: `true` for plain HTTP.
    plain: Mutex<HashMap<String, bool>>,
    /// The HTTP client of manifest requests (see [`Registries::manifest`]).
    http: std::sync::OnceLock<reqwest::Client>,
}

impl Registries {
    /// `ca_bundle`: PEM certificates trusted in addition to the system roots.
    pub fn new(
        insecure: Vec<String>,
        ca_bundle: Option<&[u8]>,
    ) -> Result<Registries, RegistryError> {
        // reqwest (here and in oci-client) panics when it builds a TLS client
        // without one: refuse here, where it can be said clearly.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            return Err(RegistryError::NoCryptoProvider);
        }
        Ok(Registries {
            clients: Mutex::new(HashMap::new()),
            insecure,
            roots: ca_bundle
                .map(parse_ca_bundle)
                .transpose()?
                .unwrap_or_default(),
            plain: Mutex::new(HashMap::new()),
            http: std::sync::OnceLock::new(),
        })
    }

    /// The extra root certificates, for other HTTP clients (token requests).
    pub(crate) fn reqwest_roots(&self) -> Vec<reqwest::Certificate> {
        self.roots
            .iter()
            .filter_map(|pem| reqwest::Certificate::from_pem(pem).ok())
            .collect()
    }

    /// Whether `registry` (`host[:port]`) is spoken to over plain HTTP: only a loopback or
    /// insecure registry, and only if it answers plain HTTP (probed once).
    pub(crate) async fn plain_http(&self, registry: &str) -> bool {
        if !plain_http_allowed(registry, &self.insecure) {
            return false;
        }
        let key = registry.to_ascii_lowercase();
        let known = self
            .plain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .copied();
        if let Some(plain) = known {
            return plain;
        }
        match answers_plain_http(registry).await {
            Some(plain) => {
                tracing::debug!(registry, plain_http = plain, "probed registry protocol");
                let mut map = self.plain.lock().unwrap_or_else(PoisonError::into_inner);
                if map.len() >= MAX_CLIENTS {
                    map.clear();
                }
                map.insert(key, plain);
                plain
            }
            // Unreachable: plain HTTP, as before, and the request reports the failure.
            None => true,
        }
    }

    async fn client(
        &self,
        repo: &Repo,
        creds: &Credentials,
    ) -> Result<(Client, RegistryAuth), RegistryError> {
        let (auth, secret) = registry_auth(repo, creds)?;
        let plain = self.plain_http(&repo.registry).await;
        // Only a hash of the credentials is kept as the key.
        let key = format!(
            "{}\0{plain}\0{}",
            repo.registry,
            Digest::of(secret.as_bytes()).hex()
        );
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = clients.get(&key) {
            return Ok((c.clone(), auth));
        }
        let protocol = match plain {
            true => ClientProtocol::Http,
            false => ClientProtocol::Https,
        };
        let config = ClientConfig {
            protocol,
            extra_root_certificates: self
                .roots
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        };
        let client = Client::try_from(config).map_err(|e| RegistryError::Unavailable {
            reference: repo.reference.clone(),
            registry: repo.registry.clone(),
            detail: format!("cannot set up the HTTP client: {}", chain(&e)),
        })?;
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok((client, auth))
    }

    /// Credentials the registry requests can use: an identity token is exchanged for a
    /// bearer access token scoped to `repo`; everything else is returned as is.
    pub async fn exchange(
        &self,
        repo: &Repo,
        creds: &Credentials,
    ) -> Result<Credentials, RegistryError> {
        match creds {
            Credentials::IdentityToken { token } => {
                // Docker Hub's API host, as oci-client resolves it.
                let host = Reference::with_tag(
                    repo.registry.clone(),
                    repo.repository.clone(),
                    "latest".into(),
                )
                .resolve_registry()
                .to_owned();
                let plain = self.plain_http(&host).await;
                let roots = self.reqwest_roots();
                Ok(Credentials::Bearer {
                    token: token::exchange(repo, &host, token, &self.insecure, plain, roots)
                        .await?,
                })
            }
            other => Ok(other.clone()),
        }
    }

    /// What a request made here rather than by oci-client needs: oci-client
    /// authenticates for `reference` (and caches the token for the blob
    /// requests that follow).
    async fn direct(
        &self,
        repo: &Repo,
        creds: &Credentials,
        reference: &Reference,
        what: &'static str,
    ) -> Result<Direct, RegistryError> {
        let (client, auth) = self.client(repo, creds).await?;
        let token = client
            .auth(reference, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| map_error(e, repo, what))?;
        let scheme = match self.plain_http(&repo.registry).await {
            true => "http",
            false => "https",
        };
        Ok(Direct {
            token,
            auth,
            scheme,
        })
    }

    /// Fetches a manifest or index by tag or digest and verifies it against a pinned digest.
    ///
    /// oci-client authenticates (and caches the token for the blob requests that
    /// follow), but the request is made here: oci-client reads a manifest's whole body
    /// into memory, and a registry could send gigabytes. Here a body past
    /// [`MAX_METADATA_BYTES`] is refused as soon as it is, whatever `Content-Length`
    /// says.
    pub async fn manifest(
        &self,
        repo: &Repo,
        creds: &Credentials,
        tag: Option<&str>,
        digest: Option<&Digest>,
    ) -> Result<(Vec<u8>, Digest), RegistryError> {
        let reference = match digest {
            Some(d) => Reference::with_digest(
                repo.registry.clone(),
                repo.repository.clone(),
                d.to_string(),
            ),
            None => Reference::with_tag(
                repo.registry.clone(),
                repo.repository.clone(),
                tag.unwrap_or("latest").to_owned(),
            ),
        };
        tracing::debug!(reference = %repo.reference, manifest = %reference, "fetching manifest");
        let Direct {
            token,
            auth,
            scheme,
        } = self.direct(repo, creds, &reference, "manifest").await?;
        let unavailable = |detail| unavailable(repo, detail);
        let url = format!(
            "{scheme}://{}/v2/{}/manifests/{}",
            reference.resolve_registry(),
            reference.repository(),
            digest.map_or_else(|| tag.unwrap_or("latest").to_owned(), ToString::to_string),
        );
        let request = self
            .http()
            .map_err(|e| unavailable(format!("cannot set up the HTTP client: {e}")))?
            .get(&url)
            .header(reqwest::header::ACCEPT, ACCEPTED_MANIFESTS.join(", "));
        let request = authorize(request, token.as_deref(), &auth);
        let mut response = request.send().await.map_err(|e| {
            unavailable(format!("GET manifest failed: {}", chain(&e.without_url())))
        })?;
        let status = response.status();
        let ok = status == reqwest::StatusCode::OK;
        // What the registry says the manifest's digest is, checked like a pinned one.
        let claimed = response
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        let too_large = || RegistryError::TooLarge {
            reference: repo.reference.clone(),
            what: "manifest",
            digest: digest.map_or_else(|| reference.to_string(), ToString::to_string),
            limit: MAX_METADATA_BYTES,
        };
        if ok
            && response
                .content_length()
                .is_some_and(|len| len > MAX_METADATA_BYTES)
        {
            return Err(too_large());
        }
        let body = bounded_body(&mut response).await.map_err(|e| {
            unavailable(format!(
                "download of manifest failed: {}",
                chain(&e.without_url())
            ))
        })?;
        if !ok {
            return Err(map_error(
                response_error(status, &body.bytes, &url),
                repo,
                "manifest",
            ));
        }
        if !body.complete {
            return Err(too_large());
        }
        let bytes = body.bytes;
        let actual = Digest::of(&bytes);
        if let Some(expected) = digest.or(claimed.as_ref())
            && *expected != actual
        {
            return Err(RegistryError::DigestMismatch {
                reference: repo.reference.clone(),
                what: "manifest",
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok((bytes, actual))
    }

    /// The tags of `repo`, in the registry's order (`GET /v2/<name>/tags/list`),
    /// at most `MAX_TAGS`, page after page of `TAGS_PAGE` (`n` and `last`,
    /// as the distribution spec pages them). Each page's body is bounded as a
    /// manifest's is; names that are not tags are dropped.
    pub async fn tags(
        &self,
        repo: &Repo,
        creds: &Credentials,
    ) -> Result<Vec<String>, RegistryError> {
        let reference = Reference::with_tag(
            repo.registry.clone(),
            repo.repository.clone(),
            "latest".to_owned(),
        );
        let Direct {
            token,
            auth,
            scheme,
        } = self.direct(repo, creds, &reference, "tag list").await?;
        let unavailable = |detail| unavailable(repo, detail);
        let invalid = |detail: String| RegistryError::Invalid {
            reference: repo.reference.clone(),
            what: "tag list",
            detail,
        };
        let base = format!(
            "{scheme}://{}/v2/{}/tags/list?n={TAGS_PAGE}",
            reference.resolve_registry(),
            reference.repository(),
        );
        let http = self
            .http()
            .map_err(|e| unavailable(format!("cannot set up the HTTP client: {e}")))?;
        let mut tags: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut last: Option<String> = None;
        loop {
            let url = match &last {
                Some(last) => format!("{base}&last={last}"),
                None => base.clone(),
            };
            let request = authorize(http.get(&url), token.as_deref(), &auth);
            let mut response = request.send().await.map_err(|e| {
                unavailable(format!("GET tag list failed: {}", chain(&e.without_url())))
            })?;
            let status = response.status();
            let body = bounded_body(&mut response).await.map_err(|e| {
                unavailable(format!(
                    "download of the tag list failed: {}",
                    chain(&e.without_url())
                ))
            })?;
            if status != reqwest::StatusCode::OK {
                return Err(map_error(
                    response_error(status, &body.bytes, &url),
                    repo,
                    "tag list",
                ));
            }
            let bytes = body.bytes;
            if !body.complete {
                return Err(RegistryError::TooLarge {
                    reference: repo.reference.clone(),
                    what: "tag list",
                    digest: format!("page {}", tags.len() / TAGS_PAGE + 1),
                    limit: MAX_METADATA_BYTES,
                });
            }
            #[derive(serde::Deserialize)]
            struct TagList {
                tags: Option<Vec<String>>,
            }
            let page: TagList = serde_json::from_slice(&bytes)
                .map_err(|e| invalid(format!("not a tag list: {e}")))?;
            let page = page.tags.unwrap_or_default();
            // A registry that ignores `n` sends everything at once; one that
            // ignores `last` sends the same page again.
            let more = page.len() == TAGS_PAGE;
            let mut new = 0;
            for tag in page {
                if is_tag(&tag) && seen.insert(tag.clone()) {
                    last = Some(tag.clone());
                    tags.push(tag);
                    new += 1;
                }
            }
            if !more || new == 0 || tags.len() >= MAX_TAGS {
                tags.truncate(MAX_TAGS);
                return Ok(tags);
            }
        }
    }

    /// The HTTP client of manifest requests: the timeouts and extra roots of
    /// oci-client's, and the same redirect policy (followed, credentials dropped
    /// on a change of host).
    fn http(&self) -> Result<&reqwest::Client, reqwest::Error> {
        if let Some(client) = self.http.get() {
            return Ok(client);
        }
        let client = reqwest::Client::builder()
            .tls_certs_merge(self.reqwest_roots())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()?;
        Ok(self.http.get_or_init(|| client))
    }

    /// Downloads the blob of descriptor `blob` into the new file `dest`, verifying size
    /// and digest while writing, and syncs it. On error `dest` is removed. `on_bytes` is
    /// told the length of each chunk written (progress; the blob is verified at its end).
    pub async fn blob(
        &self,
        repo: &Repo,
        creds: &Credentials,
        what: &'static str,
        blob: &Descriptor,
        dest: &Path,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<(), RegistryError> {
        // Also removed if this future is dropped (a sibling download failed).
        let mut guard = RemoveOnDrop(Some(dest.to_owned()));
        let result = self
            .blob_inner(repo, creds, what, blob, dest, on_bytes)
            .await;
        if result.is_ok() {
            guard.0 = None;
        }
        result
    }

    async fn blob_inner(
        &self,
        repo: &Repo,
        creds: &Credentials,
        what: &'static str,
        blob: &Descriptor,
        dest: &Path,
        on_bytes: &(dyn Fn(u64) + Sync),
    ) -> Result<(), RegistryError> {
        let (digest, size) = (&blob.digest, blob.size);
        let (client, auth) = self.client(repo, creds).await?;
        let reference = Reference::with_digest(
            repo.registry.clone(),
            repo.repository.clone(),
            digest.to_string(),
        );
        client
            .store_auth_if_needed(reference.resolve_registry(), &auth)
            .await;
        let digest_str = digest.to_string();
        tracing::debug!(reference = %repo.reference, blob = %digest_str, size, "fetching blob");
        // A bare digest as the descriptor: no `urls`, so only this registry is contacted.
        // Asked as the range `bytes=0-`: a registry that serves ranges answers 206, which
        // oci-client passes through as it comes, where for a 200 it hashes the whole blob
        // as well. The size and digest are checked here either way, so one hash suffices
        // (on a cold pull, hashing was a third of the CPU time).
        let mut stream = match client
            .pull_blob_stream_partial(&reference, digest_str.as_str(), 0, None)
            .await
            .map_err(|e| map_error(e, repo, what))?
        {
            BlobResponse::Full(stream) | BlobResponse::Partial(stream) => stream,
        };
        let too_large = |actual: u64| RegistryError::SizeMismatch {
            reference: repo.reference.clone(),
            what,
            digest: digest_str.clone(),
            expected: size,
            actual,
        };
        if let Some(len) = stream.content_length
            && len > size
        {
            return Err(too_large(len));
        }
        let io = |op: &'static str| {
            let path = dest.to_owned();
            move |err| RegistryError::Io { op, path, err }
        };
        // Created here, not on the blocking pool: a create still queued there when this
        // future is dropped would run after `RemoveOnDrop` and leave the file behind.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(dest)
            .map_err(io("create"))?;
        let mut file = tokio::fs::File::from_std(file);
        let mut hasher = Hasher::default();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    // oci-client's own verification fails the stream at its end.
                    let is_digest = e
                        .get_ref()
                        .is_some_and(|i| i.is::<oci_client::errors::DigestError>());
                    if is_digest {
                        return Err(RegistryError::DigestMismatch {
                            reference: repo.reference.clone(),
                            what,
                            expected: digest_str.clone(),
                            actual: hasher.finish().to_string(),
                        });
                    }
                    return Err(RegistryError::Unavailable {
                        reference: repo.reference.clone(),
                        registry: repo.registry.clone(),
                        detail: format!("download of {what} {digest_str} failed: {}", chain(&e)),
                    });
                }
            };
            hasher.update(&chunk);
            if hasher.len() > size {
                return Err(too_large(hasher.len()));
            }
            file.write_all(&chunk).await.map_err(io("write"))?;
            on_bytes(chunk.len() as u64);
        }
        if hasher.len() != size {
            return Err(too_large(hasher.len()));
        }
        let actual = hasher.finish();
        if actual != *digest {
            return Err(RegistryError::DigestMismatch {
                reference: repo.reference.clone(),
                what,
                expected: digest_str,
                actual: actual.to_string(),
            });
        }
        file.sync_all().await.map_err(io("sync"))?;
        Ok(())
    }
}

/// Removes a partial download unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_registry_is_unavailable() {
        // Nothing listens on port 1 of loopback.
        crate::install_test_crypto_provider();
        let regs = Registries::new(Vec::new(), None).unwrap();
        let repo = Repo {
            registry: "127.0.0.1:1".into(),
            repository: "fn".into(),
            reference: "127.0.0.1:1/fn:latest".into(),
        };
        let creds = Credentials::Basic {
            username: "user".into(),
            password: "s3cret-password".into(),
        };
        let err = regs
            .manifest(&repo, &creds, Some("latest"), None)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unavailable, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("127.0.0.1:1/fn:latest") && !msg.contains("s3cret"),
            "{msg}"
        );
    }

    #[test]
    fn credentials_map_to_registry_auth() {
        let repo = Repo {
            registry: "r.example".into(),
            repository: "fn".into(),
            reference: "r.example/fn:latest".into(),
        };
        let (auth, key) = registry_auth(&repo, &Credentials::Anonymous).unwrap();
        assert_eq!(auth, RegistryAuth::Anonymous);
        assert!(key.is_empty());
        let basic = Credentials::Basic {
            username: "u".into(),
            password: "p".into(),
        };
        let (auth, basic_key) = registry_auth(&repo, &basic).unwrap();
        assert_eq!(auth, RegistryAuth::Basic("u".into(), "p".into()));
        let bearer = Credentials::Bearer { token: "p".into() };
        let (auth, bearer_key) = registry_auth(&repo, &bearer).unwrap();
        assert_eq!(auth, RegistryAuth::Bearer("p".into()));
        assert_ne!(
            basic_key, bearer_key,
            "clients differ per kind of credential"
        );
        // An identity token is never sent as is.
        let id = Credentials::IdentityToken {
            token: "refresh-s3cret".into(),
        };
        let err = registry_auth(&repo, &id).unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let dbg = format!(
            "{id:?} {:?}",
            Credentials::Bearer {
                token: "tok-s3cret".into()
            }
        );
        assert!(!dbg.contains("s3cret"), "{dbg}");
    }

    /// A registry that wants bearer tokens from its own token endpoint, which grants
    /// `ACCESS` for the refresh token `REFRESH` (and for nothing else).
    async fn token_registry() -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let realm = format!("http://{addr}/token");
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let realm = realm.clone();
                tokio::spawn(async move {
                    let mut conn = BufReader::new(conn);
                    loop {
                        let mut head = Vec::new();
                        loop {
                            let mut line = String::new();
                            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push(line.trim_end().to_owned());
                        }
                        let header = |name: &str| {
                            head.iter().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                            })
                        };
                        let len: usize = header("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let mut body = vec![0; len];
                        conn.read_exact(&mut body).await.unwrap();
                        let body = String::from_utf8_lossy(&body).into_owned();
                        let challenge = format!(
                            "WWW-Authenticate: Bearer realm=\"{realm}\",service=\"fake\"\r\n"
                        );
                        let (status, extra, answer) = match head[0].as_str() {
                            "GET /v2/ HTTP/1.1" => ("401 Unauthorized", challenge, "{}".into()),
                            "POST /token HTTP/1.1" => {
                                let fields: Vec<&str> = body.split('&').collect();
                                let ok = [
                                    "grant_type=refresh_token",
                                    "refresh_token=REFRESH",
                                    "service=fake",
                                    "scope=repository%3Afn%3Apull",
                                ]
                                .iter()
                                .all(|f| fields.contains(f));
                                if ok {
                                    (
                                        "200 OK",
                                        String::new(),
                                        r#"{"access_token":"ACCESS","expires_in":300}"#.into(),
                                    )
                                } else {
                                    ("401 Unauthorized", String::new(), "{}".into())
                                }
                            }
                            "GET /v2/fn/manifests/latest HTTP/1.1"
                                if header("authorization").as_deref() == Some("Bearer ACCESS") =>
                            {
                                (
                                    "200 OK",
                                    "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n"
                                        .into(),
                                    r#"{"schemaVersion":2}"#.to_owned(),
                                )
                            }
                            _ => (
                                "401 Unauthorized",
                                challenge,
                                r#"{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}"#.into(),
                            ),
                        };
                        let resp = format!(
                            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        if conn.get_mut().write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, task)
    }

    #[tokio::test]
    async fn identity_and_registry_tokens() {
        let (addr, task) = token_registry().await;
        crate::install_test_crypto_provider();
        let regs = Registries::new(Vec::new(), None).unwrap();
        let repo = Repo {
            registry: addr.clone(),
            repository: "fn".into(),
            reference: format!("{addr}/fn:latest"),
        };
        // The identity token is exchanged for the access token, which pulls.
        let id = Credentials::IdentityToken {
            token: "REFRESH".into(),
        };
        let creds = regs.exchange(&repo, &id).await.unwrap();
        assert_eq!(
            creds,
            Credentials::Bearer {
                token: "ACCESS".into()
            }
        );
        let (bytes, _) = regs
            .manifest(&repo, &creds, Some("latest"), None)
            .await
            .unwrap();
        assert_eq!(bytes, br#"{"schemaVersion":2}"#);
        // A registry token is used as is.
        let (bytes, _) = regs
            .manifest(
                &repo,
                &Credentials::Bearer {
                    token: "ACCESS".into(),
                },
                Some("latest"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(bytes, br#"{"schemaVersion":2}"#);
        // Wrong tokens are refused, and never shown.
        let err = regs
            .exchange(
                &repo,
                &Credentials::IdentityToken {
                    token: "WRONG-s3cret".into(),
                },
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unauthorized, "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let err = regs
            .manifest(
                &repo,
                &Credentials::Bearer {
                    token: "WRONG-s3cret".into(),
                },
                Some("latest"),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unauthorized, "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        task.abort();
    }
}
