//! TLS of the functions listener: a certificate per function chosen by the
//! client's server name (SNI), client certificates required and verified
//! against `--functions-client-ca` (mTLS), ALPN `h2` only.
//!
//! A server name that is no function's refuses the handshake (alert
//! `unrecognized_name` from rustls): fnrun has no certificate the client
//! would accept for it, so a NOT_FOUND served over TLS could not be read
//! anyway. The refusal is logged with the names that exist.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use super::certs::CertSet;

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
}

impl SniResolver {
    pub fn new(certs: CertSet) -> SniResolver {
        SniResolver {
            certs: RwLock::new(Arc::new(certs)),
        }
    }

    /// Makes `certs` the ones new handshakes get.
    pub fn replace(&self, certs: CertSet) {
        *self
            .certs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(certs);
    }

    fn current(&self) -> Arc<CertSet> {
        self.certs
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let certs = self.current();
        match hello.server_name() {
            Some(name) => {
                let name = name.to_ascii_lowercase();
                let name = name.strip_suffix('.').unwrap_or(&name);
                let found = certs.get(name).cloned();
                if found.is_none() {
                    tracing::info!(
                        server_name = %fnrun_api::Quoted::new(name),
                        "functions listener: TLS handshake refused: no function answers to this server name"
                    );
                }
                found
            }
            None => {
                let found = certs.without_sni().cloned();
                if found.is_none() {
                    tracing::info!(
                        "functions listener: TLS handshake refused: the client sent no server name and there is no certificate for that"
                    );
                }
                found
            }
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
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok) {
        roots.add(cert).map_err(|e| TlsError::Verifier {
            path: client_ca.to_owned(),
            err: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: client_ca.to_owned(),
        });
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Verifier {
            path: client_ca.to_owned(),
            err: e.to_string(),
        })?;
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
