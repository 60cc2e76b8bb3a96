//! TLS of the functions listener: a certificate per function chosen by the
//! client's server name (SNI), client certificates required and verified
//! against `--functions-client-ca` (mTLS), ALPN `h2` only.
//!
//! A server name that is no function's: when the certificates are minted
//! (fnrun holds the CA key) and the name could be a function's (`NAME`,
//! `NAME.NAMESPACE`, `NAME.NAMESPACE.svc`), a certificate is minted for it
//! and its calls are answered NOT_FOUND with the functions that exist (and
//! logged); otherwise the handshake is refused with the alert
//! `unrecognized_name` ([`SniResolver::refusal`], sent by
//! [`fnrun_transport::tls_accept`], which logs and counts it): fnrun has no
//! certificate the client would accept for it, so a NOT_FOUND served over
//! TLS could not be read anyway.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use super::certs::CertSet;
use fnrun_transport::tls_accept::{Reason, Refusal};

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the client CA {}: {err}", .path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("the client CA {} has no PEM certificate", .path.display())]
    NoCertificate { path: PathBuf },
    #[error("the client CA {}: {err}", .path.display())]
    Verifier { path: PathBuf, err: String },
}

/// Chooses each connection's certificate by its server name; swapped whole
/// at a reload.
#[derive(Debug)]
pub struct SniResolver {
    certs: RwLock<Arc<CertSet>>,
    /// Certificates minted for names no function answers to (see
    /// [`CertSet::mint_unknown`]), at most [`MINTED_UNKNOWN_MAX`]; emptied
    /// when the certificates are replaced.
    unknown: std::sync::Mutex<std::collections::HashMap<String, Arc<CertifiedKey>>>,
}

/// Most certificates kept for names no function answers to: a client that
/// asks for ever new names gets new ones minted, and the oldest are dropped.
const MINTED_UNKNOWN_MAX: usize = 64;

impl SniResolver {
    pub fn new(certs: CertSet) -> SniResolver {
        SniResolver {
            certs: RwLock::new(Arc::new(certs)),
            unknown: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Makes `certs` the ones new handshakes get.
    pub fn replace(&self, certs: CertSet) {
        *self
            .certs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(certs);
        self.unknown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// The certificate minted for `name`, no function's (see
    /// [`CertSet::mint_unknown`]).
    fn unknown(&self, certs: &CertSet, name: &str) -> Option<Arc<CertifiedKey>> {
        let mut minted = self
            .unknown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(key) = minted.get(name) {
            return Some(key.clone());
        }
        let key = certs.mint_unknown(name)?;
        if minted.len() >= MINTED_UNKNOWN_MAX {
            minted.clear();
        }
        minted.insert(name.to_owned(), key.clone());
        Some(key)
    }

    fn current(&self) -> Arc<CertSet> {
        self.certs
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl SniResolver {
    /// Whether a client's server name (`None`: it sent none) is served: the
    /// functions listener refuses the others before the handshake goes on
    /// ([`fnrun_transport::tls_accept`]), with the alert `unrecognized_name`.
    pub fn refusal(&self, name: Option<&str>) -> Option<Refusal> {
        let certs = self.current();
        match name {
            Some(name) => {
                let name = normalize(name);
                // A name that could be a function's gets a minted
                // certificate, and its calls NOT_FOUND (logged there).
                (certs.get(&name).is_none() && !certs.may_mint(&name)).then(|| {
                    Refusal::new(
                        Reason::UnknownServerName,
                        format!(
                            "no function answers to the server name {}",
                            fnrun_api::Quoted::new(&name)
                        ),
                    )
                })
            }
            None => certs.without_sni().is_none().then(|| {
                Refusal::new(
                    Reason::NoServerName,
                    "the client sent no server name and there is no certificate for that",
                )
            }),
        }
    }
}

/// A server name as looked up: lower case, without a trailing dot.
fn normalize(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    match name.strip_suffix('.') {
        Some(stripped) => stripped.to_owned(),
        None => name,
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // Names were checked before ([`SniResolver::refusal`]); one that a
        // reload removed since gets no certificate (rustls: access_denied).
        let certs = self.current();
        match hello.server_name() {
            Some(name) => {
                let name = normalize(name);
                certs
                    .get(&name)
                    .cloned()
                    .or_else(|| self.unknown(&certs, &name))
            }
            None => certs.without_sni().cloned(),
        }
    }
}

/// The server config: certificates from `resolver`, client certificates
/// verified against the PEM bundle `client_ca`, ALPN `h2`.
pub fn server_config(
    resolver: Arc<SniResolver>,
    client_ca: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem = std::fs::read(client_ca).map_err(|err| TlsError::Read {
        path: client_ca.to_owned(),
        err,
    })?;
    let verifier = verifier(client_ca, &pem, provider.clone())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Verifier {
            path: client_ca.to_owned(),
            err: e.to_string(),
        })?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A client verifier whose trusted CA can be replaced while serving
/// (Kubernetes mode follows the `crossplane-root-ca` Secret). Until a CA is
/// set, every client certificate is refused.
///
/// It sends no root hints (the CA's subject in CertificateRequest): a hint
/// that may change between handshakes would have to be borrowed from the
/// current CA. Clients then offer their certificate whatever its issuer (Go's
/// crypto/tls does so when the server names no acceptable CA), and the
/// verification against the current CA decides.
#[derive(Debug)]
pub struct ClientCa {
    inner: RwLock<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl Default for ClientCa {
    fn default() -> Self {
        ClientCa {
            inner: RwLock::new(None),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        }
    }
}

impl ClientCa {
    /// Trusts the PEM certificates of `pem` (named `origin` in errors) from
    /// the next handshake on.
    pub fn replace(&self, origin: &Path, pem: &[u8]) -> Result<(), TlsError> {
        let verifier = verifier(origin, pem, self.provider.clone())?;
        *self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(verifier);
        Ok(())
    }

    fn current(
        &self,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, rustls::Error> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                rustls::Error::General(
                    "no client CA yet: client certificates cannot be verified".to_owned(),
                )
            })
    }
}

impl rustls::server::danger::ClientCertVerifier for ClientCa {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.current()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A verifier of client certificates signed by the PEM bundle `pem`.
fn verifier(
    origin: &Path,
    pem: &[u8],
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let failed = |err: String| TlsError::Verifier {
        path: origin.to_owned(),
        err,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem).filter_map(Result::ok) {
        roots.add(cert).map_err(|e| failed(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: origin.to_owned(),
        });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| failed(e.to_string()))
}

/// The server config of Kubernetes mode: certificates from `resolver`,
/// client certificates verified against `client_ca` (replaced when the CA
/// changes), ALPN `h2`.
pub fn server_config_following(
    resolver: Arc<SniResolver>,
    client_ca: Arc<ClientCa>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = client_ca.provider.clone();
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(client_ca)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod client_ca_tests {
    use super::*;
    use rustls::server::danger::ClientCertVerifier;

    #[test]
    fn a_client_ca_refuses_until_set_and_refuses_what_is_no_certificate() {
        let ca = ClientCa::default();
        let cert = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        let err = ca
            .verify_client_cert(&cert, &[], rustls::pki_types::UnixTime::now())
            .unwrap_err();
        assert!(err.to_string().contains("no client CA yet"), "{err}");
        assert!(ca.root_hint_subjects().is_empty());
        let origin = Path::new("secret crossplane-system/crossplane-root-ca tls.crt");
        let err = ca.replace(origin, b"not a PEM").unwrap_err().to_string();
        assert!(err.contains("crossplane-root-ca tls.crt"), "{err}");
        assert!(err.contains("no PEM certificate"), "{err}");
    }
}
