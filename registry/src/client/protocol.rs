//! Which protocol a registry is spoken to with: HTTPS, verified against the system
//! roots and the `--ca-bundle` certificates, unless it is a loopback or
//! `--insecure-registry` registry that answers plain HTTP (probed once).

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::CaBundleError;

/// Time a plain-HTTP probe of a loopback or insecure registry may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `registry` (`host[:port]`) may be spoken to over plain HTTP.
pub(crate) fn plain_http_allowed(registry: &str, insecure: &[String]) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => registry.split(':').next().unwrap_or(""),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    loopback
        || insecure
            .iter()
            .any(|i| i.eq_ignore_ascii_case(registry) || i.eq_ignore_ascii_case(host))
}

/// The PEM certificates of a CA bundle, each checked; at least one.
pub(crate) fn parse_ca_bundle(pem: &[u8]) -> Result<Vec<Vec<u8>>, CaBundleError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = std::str::from_utf8(pem).map_err(|_| CaBundleError::NotText)?;
    let mut certs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let index = certs.len() + 1;
        let Some(len) = rest[start..].find(END) else {
            return Err(CaBundleError::Unterminated { index });
        };
        let block = &rest[start..start + len + END.len()];
        reqwest::Certificate::from_pem(block.as_bytes())
            .map_err(|err| CaBundleError::Invalid { index, err })?;
        certs.push(format!("{block}\n").into_bytes());
        rest = &rest[start + len + END.len()..];
    }
    if certs.is_empty() {
        return Err(CaBundleError::Empty);
    }
    Ok(certs)
}

/// Whether a registry answers plain HTTP: `GET /v2/` over TCP and a status line other than
/// `400` (TLS servers answer plain requests with an alert, a close or `400`). `None` if it
/// cannot be reached (nothing is decided then).
pub(super) async fn answers_plain_http(registry: &str) -> Option<bool> {
    let has_port = match registry.rfind(']') {
        Some(i) => registry[i..].contains(':'),
        None => registry.contains(':'),
    };
    let addr = match has_port {
        true => registry.to_owned(),
        false => format!("{registry}:80"),
    };
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.ok()?;
        // As on every TCP connection fnrun makes: no write waits for an ACK.
        let _ = conn.set_nodelay(true);
        let request = format!("GET /v2/ HTTP/1.1\r\nHost: {registry}\r\nConnection: close\r\n\r\n");
        if conn.write_all(request.as_bytes()).await.is_err() {
            return Some(false);
        }
        let mut head = [0u8; 12];
        let mut n = 0;
        while n < head.len() {
            match conn.read(&mut head[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        let head = &head[..n];
        Some(
            head.len() >= 12
                && head.starts_with(b"HTTP/1.")
                && head[9].is_ascii_digit()
                && &head[9..12] != b"400",
        )
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .unwrap_or(Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback_and_insecure() {
        let insecure = vec![
            "registry.internal:5000".to_owned(),
            "plain.example".to_owned(),
        ];
        for r in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "[::1]",
        ] {
            assert!(plain_http_allowed(r, &[]), "{r}");
        }
        for r in [
            "index.docker.io",
            "example.com:5000",
            "10.0.0.1:5000",
            "localhost.example.com",
            "[2001:db8::1]:5000",
        ] {
            assert!(!plain_http_allowed(r, &insecure), "{r}");
        }
        assert!(plain_http_allowed("registry.internal:5000", &insecure));
        assert!(!plain_http_allowed("registry.internal:5001", &insecure));
        assert!(plain_http_allowed("plain.example:443", &insecure));
    }
}
