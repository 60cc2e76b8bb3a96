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
//!
//! A mint happens in the client's hello, before its certificate is seen (the
//! server's certificate comes first), so it is only for a client that has
//! shown one before: a peer (by IP address) with a handshake that succeeded
//! in the last hour. Others, and every peer past [`MINT_BURST`] mints at once
//! and then one a second, get `unrecognized_name`; minted certificates are
//! kept for 64 names (`MINTED_UNKNOWN_MAX`, the oldest dropped first) and
//! counted in `fnrun_tls_unknown_name_certificates_minted_total`.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use super::certs::CertSet;
use crate::metrics::FunctionMetrics;
use fnrun_transport::tls_accept::{Reason, Refusal, ServerNames};

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
    /// [`CertSet::mint_unknown`]), and what limits their minting; emptied
    /// when the certificates are replaced.
    unknown: Mutex<Unknown>,
    /// Peers whose handshake succeeded (so, on this listener, who showed a
    /// client certificate the CA signed), and when they last did.
    peers: Mutex<HashMap<IpAddr, Instant>>,
    metrics: Arc<FunctionMetrics>,
}

/// Most certificates kept for names no function answers to: the oldest is
/// dropped for a new one.
const MINTED_UNKNOWN_MAX: usize = 64;
/// Mints for names no function answers to at once; then one a second
/// (`MINT_EVERY`).
pub const MINT_BURST: u32 = 8;
const MINT_EVERY: Duration = Duration::from_secs(1);
/// How long a peer's successful handshake lets it have certificates minted.
const PEER_TRUSTED_FOR: Duration = Duration::from_secs(3600);
/// Most peers remembered.
const MAX_PEERS: usize = 4096;

/// The certificates minted for unknown names, oldest first, and the mints
/// left now.
#[derive(Debug)]
struct Unknown {
    keys: HashMap<String, Arc<CertifiedKey>>,
    order: VecDeque<String>,
    /// Mints left, refilled one per [`MINT_EVERY`] up to [`MINT_BURST`].
    left: u32,
    refilled: Instant,
}

impl Unknown {
    fn new() -> Unknown {
        Unknown {
            keys: HashMap::new(),
            order: VecDeque::new(),
            left: MINT_BURST,
            refilled: Instant::now(),
        }
    }

    /// Takes one mint if any is left.
    fn take(&mut self, now: Instant) -> bool {
        let refills = now.duration_since(self.refilled).as_secs() / MINT_EVERY.as_secs();
        if refills > 0 {
            let refills = u32::try_from(refills).unwrap_or(u32::MAX);
            self.left = self.left.saturating_add(refills).min(MINT_BURST);
            self.refilled = now;
        }
        match self.left {
            0 => false,
            _ => {
                self.left -= 1;
                true
            }
        }
    }

    fn insert(&mut self, name: String, key: Arc<CertifiedKey>) {
        while self.keys.len() >= MINTED_UNKNOWN_MAX {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.keys.remove(&oldest);
        }
        self.order.push_back(name.clone());
        self.keys.insert(name, key);
    }
}

impl SniResolver {
    /// Mints for unknown names are counted in `metrics`.
    pub fn new(certs: CertSet, metrics: Arc<FunctionMetrics>) -> SniResolver {
        SniResolver {
            certs: RwLock::new(Arc::new(certs)),
            unknown: Mutex::new(Unknown::new()),
            peers: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Makes `certs` the ones new handshakes get.
    pub fn replace(&self, certs: CertSet) {
        *self.certs.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(certs);
        let mut unknown = self.unknown.lock().unwrap_or_else(PoisonError::into_inner);
        unknown.keys.clear();
        unknown.order.clear();
    }

    /// The certificate minted for `name`, no function's, if there is one.
    fn minted(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.unknown
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys
            .get(name)
            .cloned()
    }

    /// Whether `peer` has had a handshake succeed lately.
    fn trusted(&self, peer: IpAddr, now: Instant) -> bool {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer)
            .is_some_and(|at| now.duration_since(*at) < PEER_TRUSTED_FOR)
    }

    /// Mints a certificate for `name`, which could be a function's but is
    /// none (see [`CertSet::mint_unknown`]), if one is left to mint now; the
    /// refusal otherwise.
    fn mint(&self, certs: &CertSet, name: &str) -> Result<(), String> {
        let mut unknown = self.unknown.lock().unwrap_or_else(PoisonError::into_inner);
        if unknown.keys.contains_key(name) {
            return Ok(());
        }
        if !unknown.take(Instant::now()) {
            return Err(format!(
                "too many certificates minted for names no function answers to (at most {MINT_BURST} at once, then one a second)"
            ));
        }
        // Minted under the lock: mints are few, and a name asked for twice at
        // once is minted once.
        let key = certs
            .mint_unknown(name)
            .ok_or_else(|| "its certificate could not be minted".to_owned())?;
        self.metrics.unknown_name_mints.fetch_add(1, Relaxed);
        unknown.insert(name.to_owned(), key);
        Ok(())
    }

    fn current(&self) -> Arc<CertSet> {
        self.certs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether a client's server name (`None`: it sent none) is served: the
    /// functions listener refuses the others before the handshake goes on
    /// ([`fnrun_transport::tls_accept`]), with the alert `unrecognized_name`.
    /// A name that could be a function's but is none gets its certificate
    /// minted here, if `peer` may have one (see the module's doc).
    pub fn refusal(&self, name: Option<&str>, peer: SocketAddr) -> Option<Refusal> {
        let certs = self.current();
        let Some(name) = name else {
            return certs.without_sni().is_none().then(|| {
                Refusal::new(
                    Reason::NoServerName,
                    "the client sent no server name and there is no certificate for that",
                )
            });
        };
        let name = normalize(name);
        if certs.get(&name).is_some() {
            return None;
        }
        let unknown = |why: Option<String>| {
            let quoted = fnrun_api::Quoted::new(&name);
            let detail = match why {
                None => format!("no function answers to the server name {quoted}"),
                Some(why) => format!(
                    "no function answers to the server name {quoted}, and no certificate is minted for it: {why}"
                ),
            };
            Some(Refusal::new(Reason::UnknownServerName, detail))
        };
        // A name that could be a function's gets a minted certificate, and
        // its calls NOT_FOUND (logged there).
        if !certs.may_mint(&name) {
            return unknown(None);
        }
        if self.minted(&name).is_some() {
            return None;
        }
        if !self.trusted(peer.ip(), Instant::now()) {
            return unknown(Some(
                "the client has not shown a client certificate in an earlier handshake".into(),
            ));
        }
        match self.mint(&certs, &name) {
            Ok(()) => None,
            Err(why) => unknown(Some(why)),
        }
    }

    /// Remembers that `peer`'s handshake succeeded.
    pub fn accepted(&self, peer: SocketAddr) {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer.ip()) {
            peers.retain(|_, at| now.duration_since(*at) < PEER_TRUSTED_FOR);
            if peers.len() >= MAX_PEERS
                && let Some(oldest) = peers.iter().min_by_key(|(_, at)| **at).map(|(ip, _)| *ip)
            {
                peers.remove(&oldest);
            }
        }
        peers.insert(peer.ip(), now);
    }
}

impl ServerNames for SniResolver {
    fn refusal(&self, name: Option<&str>, peer: SocketAddr) -> Option<Refusal> {
        SniResolver::refusal(self, name, peer)
    }

    fn accepted(&self, peer: SocketAddr) {
        SniResolver::accepted(self, peer);
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
        // Names were checked, and unknown ones minted for, before
        // ([`SniResolver::refusal`]); one that a reload removed since gets no
        // certificate (rustls: access_denied). Nothing is minted here.
        let certs = self.current();
        match hello.server_name() {
            Some(name) => {
                let name = normalize(name);
                certs.get(&name).cloned().or_else(|| self.minted(&name))
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
mod mint_limit_tests {
    use super::*;

    #[test]
    fn mints_for_unknown_names_are_a_burst_then_one_a_second() {
        let mut unknown = Unknown::new();
        let t0 = unknown.refilled;
        for _ in 0..MINT_BURST {
            assert!(unknown.take(t0));
        }
        assert!(!unknown.take(t0));
        assert!(!unknown.take(t0 + Duration::from_millis(999)));
        assert!(unknown.take(t0 + Duration::from_secs(1)));
        assert!(!unknown.take(t0 + Duration::from_secs(1)));
        // A long pause refills no more than the burst.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..MINT_BURST {
            assert!(unknown.take(later));
        }
        assert!(!unknown.take(later));
    }
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
