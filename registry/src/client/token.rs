//! Identity tokens: the OAuth2 refresh-token exchange docker does for `identitytoken`.
//!
//! oci-client only knows anonymous/basic token requests (GET on the realm) and ready-made
//! bearer tokens, so the exchange happens here: `GET /v2/` for the `Bearer` challenge,
//! then `POST realm` with `grant_type=refresh_token`, the refresh token, `service`,
//! `scope=repository:REPO:pull` and `client_id`, as the distribution token spec and
//! docker do. The access token it returns is then used as [`RegistryAuth::Bearer`].
//! Neither token is ever logged or put into an error.
//!
//! [`RegistryAuth::Bearer`]: oci_client::secrets::RegistryAuth::Bearer

use std::time::Duration;

use super::error::RegistryError;
use super::protocol::plain_http_allowed;
use super::repo::Repo;
use crate::digest::truncate;

/// `client_id` sent with token requests.
const CLIENT_ID: &str = "fnrun";
/// Largest token response read.
const MAX_TOKEN_RESPONSE: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(30);

/// A `WWW-Authenticate: Bearer` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub realm: String,
    pub service: Option<String>,
}

/// Parses `Bearer realm="...",service="...",scope="..."` (other schemes: `None`).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().trim_start_matches(',').trim();
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        match key.to_ascii_lowercase().as_str() {
            "realm" => realm = Some(value.to_owned()),
            "service" => service = Some(value.to_owned()),
            _ => {}
        }
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge {
        realm: realm.filter(|r| !r.is_empty())?,
        service,
    })
}

/// `application/x-www-form-urlencoded` encoding of one value.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(b as char);
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The form body of a refresh-token request.
pub(crate) fn refresh_form(refresh_token: &str, service: Option<&str>, scope: &str) -> String {
    let mut fields = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh_token),
        ("client_id", CLIENT_ID),
        ("scope", scope),
    ];
    if let Some(s) = service {
        fields.push(("service", s));
    }
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", form_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The `host[:port]` part of an http(s) URL and whether it is https.
fn url_host(url: &str) -> Option<(bool, &str)> {
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        (false, url.strip_prefix("http://")?)
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    (!host.is_empty() && !host.contains('@')).then_some((https, host))
}

/// Exchanges `refresh_token` for an access token that may pull `repo` from the
/// registry's API `host` (as oci-client resolves it). `plain`: the registry is
/// spoken to over plain HTTP; `roots`: extra trusted CA certificates.
pub(crate) async fn exchange(
    repo: &Repo,
    host: &str,
    refresh_token: &str,
    insecure: &[String],
    plain: bool,
    roots: Vec<reqwest::Certificate>,
) -> Result<String, RegistryError> {
    let refused = |detail: String| RegistryError::Unauthorized {
        reference: repo.reference.clone(),
        detail,
    };
    let unavailable = |detail: String| RegistryError::Unavailable {
        reference: repo.reference.clone(),
        registry: repo.registry.clone(),
        detail,
    };
    let scheme = if plain { "http" } else { "https" };
    let client = reqwest::Client::builder()
        .tls_certs_merge(roots)
        .connect_timeout(TIMEOUT)
        .timeout(TIMEOUT)
        // A token request is never redirected to another host with the token.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| unavailable(format!("cannot set up the HTTP client: {e}")))?;

    let ping = client
        .get(format!("{scheme}://{host}/v2/"))
        .send()
        .await
        .map_err(|e| unavailable(format!("GET /v2/ failed: {}", e.without_url())))?;
    let challenge = ping
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(parse_challenge)
        .ok_or_else(|| {
            refused(format!(
                "the registry does not use bearer token authentication (HTTP {} on /v2/), \
                 so an identity token cannot be used",
                ping.status().as_u16()
            ))
        })?;

    // The refresh token goes to the realm only over HTTPS, or plain HTTP where the
    // registry itself may be spoken to over it.
    let (https, realm_host) = url_host(&challenge.realm).ok_or_else(|| {
        refused(format!(
            "the registry's token realm \"{}\" is not an http(s) URL",
            truncate(&challenge.realm)
        ))
    })?;
    if !https && !plain_http_allowed(realm_host, insecure) {
        return Err(refused(format!(
            "the registry's token realm {} is plain HTTP; the identity token is only sent over HTTPS",
            truncate(&challenge.realm)
        )));
    }

    let scope = format!("repository:{}:pull", repo.repository);
    tracing::debug!(reference = %repo.reference, realm = %challenge.realm, "exchanging an identity token");
    let mut resp = client
        .post(&challenge.realm)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(refresh_form(
            refresh_token,
            challenge.service.as_deref(),
            &scope,
        ))
        .send()
        .await
        .map_err(|e| unavailable(format!("token request failed: {}", e.without_url())))?;
    let status = resp.status();
    if status.is_client_error() {
        return Err(refused(format!(
            "the token endpoint refused the identity token (HTTP {})",
            status.as_u16()
        )));
    }
    if !status.is_success() {
        return Err(unavailable(format!(
            "the token endpoint answered HTTP {}",
            status.as_u16()
        )));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| unavailable(format!("token response failed: {}", e.without_url())))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_TOKEN_RESPONSE {
            return Err(unavailable("the token response is too large".into()));
        }
    }
    // Read the fields by hand: serde errors could quote a token.
    let json: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|_| unavailable("the token response is not JSON".into()))?;
    ["access_token", "token"]
        .iter()
        .find_map(|k| json.get(k).and_then(serde_json::Value::as_str))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| unavailable("the token response has no access_token".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull""#
            ),
            Some(Challenge {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
            })
        );
        assert_eq!(
            parse_challenge("bearer realm=http://127.0.0.1:1/t"),
            Some(Challenge {
                realm: "http://127.0.0.1:1/t".into(),
                service: None,
            })
        );
        assert_eq!(parse_challenge(r#"Basic realm="registry""#), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
        assert_eq!(parse_challenge(r#"Bearer realm="unterminated"#), None);
    }

    #[test]
    fn refresh_form_is_encoded() {
        assert_eq!(
            refresh_form("a+b/c=", Some("svc one"), "repository:x/y:pull"),
            "grant_type=refresh_token&refresh_token=a%2Bb%2Fc%3D&client_id=fnrun\
             &scope=repository%3Ax%2Fy%3Apull&service=svc+one"
        );
    }

    #[test]
    fn realm_hosts() {
        assert_eq!(
            url_host("https://auth.example/token?x=1"),
            Some((true, "auth.example"))
        );
        assert_eq!(
            url_host("http://127.0.0.1:5000/t"),
            Some((false, "127.0.0.1:5000"))
        );
        assert_eq!(url_host("ftp://x/"), None);
        assert_eq!(url_host("https://user@evil/"), None);
    }
}
