//! Server certificates of the functions listener, one per function:
//!
//! - minted by fnrun from a CA (`--functions-ca-cert`, `--functions-ca-key`)
//!   as Crossplane's own runtime mints them from `crossplane-root-ca`:
//!   SANs `NAME`, `NAME.NAMESPACE`, `NAME.NAMESPACE.svc`, extended key usage
//!   server auth, an ECDSA P-256 key of its own, valid for a year and minted
//!   again at every reload and once a day; the CA is read again each time
//!   and refused unless it is a CA, valid now, and the key is its own;
//! - or read from `--functions-certs-dir DIR`: `DIR/NAME/tls.crt` and
//!   `DIR/NAME/tls.key` (a `kubernetes.io/tls` Secret per function), read
//!   again at every reload.
//!
//! A client that sends no server name is given a certificate for every
//! function's names: minted, or `DIR/tls.crt` and `DIR/tls.key` if they
//! exist (else its handshake is refused); its calls are routed by
//! `:authority`.
//!
//! The CA key may be PKCS#8, PKCS#1 RSA (what Crossplane's
//! `crossplane-root-ca` holds) or SEC1 EC: rcgen signs with ring, which
//! reads PKCS#8 only, so the others are wrapped into PKCS#8 first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::routing::server_names;

/// How long a minted certificate is valid.
const MINTED_VALIDITY: time::Duration = time::Duration::days(365);
/// Largest certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why certificates cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {}: {err}", .path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{} is larger than {MAX_PEM_BYTES} bytes", .path.display())]
    TooLarge { path: PathBuf },
    #[error("{} has no PEM certificate", .path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} has no PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)", .path.display())]
    NoKey { path: PathBuf },
    #[error("{}: the private key cannot be used: {err}", .path.display())]
    Key { path: PathBuf, err: String },
    #[error("{}: the CA certificate cannot be used: {err}", .path.display())]
    CaCertificate { path: PathBuf, err: rcgen::Error },
    #[error("{}: {why}", .path.display())]
    NotUsableCa { path: PathBuf, why: String },
    #[error(
        "the CA key {} does not belong to the CA certificate {}: their public keys differ",
        .key.display(),
        .cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("cannot mint a certificate for {name}: {err}")]
    Mint { name: String, err: String },
}

/// Where server certificates come from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// Minted from the CA of these files, read again (and checked) at
    /// every reload, so that a rotated CA is taken and an expired one
    /// refused.
    Mint {
        cert: PathBuf,
        key: PathBuf,
    },
    Dir(PathBuf),
}

/// The certificates for the functions of one catalogue, by server name.
#[derive(Debug, Default)]
pub struct CertSet {
    by_name: HashMap<String, Arc<CertifiedKey>>,
    no_sni: Option<Arc<CertifiedKey>>,
    /// The CA they were minted from, and their namespace: a name that could
    /// be a function's but is none gets a certificate minted when asked
    /// ([`CertSet::mint_unknown`]).
    minter: Option<(Arc<Minter>, String)>,
}

impl CertSet {
    /// The certificate for server name `name` (lower case).
    pub fn get(&self, name: &str) -> Option<&Arc<CertifiedKey>> {
        self.by_name.get(name)
    }

    /// A certificate for `name` (lower case), which is none of the set's,
    /// if the set was minted and `name` could be a function's in its
    /// namespace (`NAME`, `NAME.NAMESPACE`, `NAME.NAMESPACE.svc`): its
    /// client then reaches the function host, which answers NOT_FOUND with
    /// the functions that exist, rather than a handshake that fails.
    pub fn mint_unknown(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let (minter, _) = self.minter.as_ref()?;
        if !self.may_mint(name) {
            return None;
        }
        minter.mint(name, vec![name.to_owned()]).ok()
    }

    /// Whether [`CertSet::mint_unknown`] would mint for `name`.
    pub fn may_mint(&self, name: &str) -> bool {
        let Some((_, namespace)) = &self.minter else {
            return false;
        };
        super::routing::function_name(name, namespace)
            .is_some_and(|label| super::catalogue::check_dns_label(&label).is_ok())
    }

    /// The certificate for a client that sends no server name.
    pub fn without_sni(&self) -> Option<&Arc<CertifiedKey>> {
        self.no_sni.as_ref()
    }
}

impl CertSource {
    /// The certificates of functions `names` in `namespace`.
    pub fn cert_set(&self, names: &[String], namespace: &str) -> Result<CertSet, CertError> {
        let dir = match self {
            CertSource::Mint { cert, key } => {
                return Arc::new(Minter::load(cert, key)?).cert_set(names, namespace);
            }
            CertSource::Dir(dir) => dir,
        };
        let mut set = CertSet::default();
        for name in names {
            let key = read_pair(&dir.join(name))?;
            for server_name in server_names(name, namespace) {
                set.by_name.insert(server_name, key.clone());
            }
        }
        if dir.join("tls.crt").exists() || dir.join("tls.key").exists() {
            set.no_sni = Some(read_pair(dir)?);
        }
        Ok(set)
    }
}

/// Mints server certificates signed by a CA.
pub struct Minter {
    ca: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Minter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minter").finish_non_exhaustive()
    }
}

impl Minter {
    /// The CA of the PEM files `cert` and `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Minter, CertError> {
        Minter::from_pem(cert, &read(cert)?, key, &read(key)?)
    }

    /// The CA of PEM `cert_pem` and `key_pem`, named `cert` and `key` in
    /// errors (files, or a Secret's keys read through the Kubernetes API).
    pub fn from_pem(
        cert: &Path,
        cert_pem: &[u8],
        key: &Path,
        key_pem: &[u8],
    ) -> Result<Minter, CertError> {
        for (path, pem) in [(cert, cert_pem), (key, key_pem)] {
            if pem.len() as u64 > MAX_PEM_BYTES {
                return Err(CertError::TooLarge {
                    path: path.to_owned(),
                });
            }
        }
        let ca = CertificateDer::pem_slice_iter(cert_pem)
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| CertError::NoCertificate {
                path: cert.to_owned(),
            })?;
        let key_pair = ca_key_pair(key, key_pem)?;
        check_ca(cert, &ca, key, &key_pair)?;
        let issuer =
            Issuer::from_ca_cert_der(&ca, key_pair).map_err(|err| CertError::CaCertificate {
                path: cert.to_owned(),
                err,
            })?;
        Ok(Minter { ca, issuer })
    }

    /// A certificate for each of functions `names` in `namespace`, and one
    /// for all of them (clients that send no server name).
    pub fn cert_set(
        self: &Arc<Self>,
        names: &[String],
        namespace: &str,
    ) -> Result<CertSet, CertError> {
        let mut set = CertSet {
            minter: Some((self.clone(), namespace.to_owned())),
            ..CertSet::default()
        };
        for name in names {
            let key = self.mint(name, server_names(name, namespace).to_vec())?;
            for server_name in server_names(name, namespace) {
                set.by_name.insert(server_name, key.clone());
            }
        }
        if !names.is_empty() {
            let all: Vec<String> = names
                .iter()
                .flat_map(|n| server_names(n, namespace))
                .collect();
            set.no_sni = Some(self.mint("fnrun functions", all)?);
        }
        Ok(set)
    }

    /// The CA certificate.
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca
    }

    /// A certificate for `sans`, with common name `cn`, and its chain (the
    /// certificate, then the CA).
    fn mint(&self, cn: &str, sans: Vec<String>) -> Result<Arc<CertifiedKey>, CertError> {
        let failed = |err: &dyn std::fmt::Display| CertError::Mint {
            name: cn.to_owned(),
            err: err.to_string(),
        };
        let mut params = CertificateParams::new(sans).map_err(|e| failed(&e))?;
        params.distinguished_name.push(DnType::CommonName, cn);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + MINTED_VALIDITY;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(|e| failed(&e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| failed(&e))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing =
            rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| failed(&e))?;
        Ok(Arc::new(CertifiedKey::new(
            vec![cert.der().clone(), self.ca.clone()],
            signing,
        )))
    }
}

/// Checks that the certificate `ca` (from file `cert_path`) is a CA that is
/// valid now, allowed to sign certificates, and that `key` (from
/// `key_path`) is its key: any of these wrong, every handshake would fail
/// on the client's side with nothing said on fnrun's.
fn check_ca(
    cert_path: &Path,
    ca: &CertificateDer<'_>,
    key_path: &Path,
    key: &KeyPair,
) -> Result<(), CertError> {
    use rcgen::PublicKeyData;
    let not_usable = |why: String| CertError::NotUsableCa {
        path: cert_path.to_owned(),
        why,
    };
    let (_, cert) = x509_parser::parse_x509_certificate(ca)
        .map_err(|e| not_usable(format!("not an X.509 certificate: {e}")))?;
    if !cert.is_ca() {
        return Err(not_usable(
            "not a CA certificate (basic constraints without CA:TRUE): it cannot sign the functions' certificates"
                .to_owned(),
        ));
    }
    if let Ok(Some(usage)) = cert.key_usage()
        && !usage.value.key_cert_sign()
    {
        return Err(not_usable(
            "its key usage does not allow signing certificates (keyCertSign)".to_owned(),
        ));
    }
    let validity = cert.validity();
    if !validity.is_valid() {
        return Err(not_usable(format!(
            "not valid now: valid from {} to {}",
            validity.not_before, validity.not_after
        )));
    }
    if cert.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
        return Err(CertError::KeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
        });
    }
    Ok(())
}

/// The certificate chain and key of `dir/tls.crt` and `dir/tls.key`.
fn read_pair(dir: &Path) -> Result<Arc<CertifiedKey>, CertError> {
    let cert_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");
    let cert_pem = read(&cert_path)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(CertError::NoCertificate { path: cert_path });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&key_path)?).map_err(|_| CertError::NoKey {
        path: key_path.clone(),
    })?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| CertError::Key {
            path: key_path.clone(),
            err: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| CertError::Key {
        path: key_path,
        err: format!(
            "it does not match the certificate in {}: {e}",
            cert_path.display()
        ),
    })?;
    Ok(Arc::new(certified))
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    use std::io::Read;
    let failed = |err| CertError::Read {
        path: path.to_owned(),
        err,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(failed)?
        .take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(CertError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

/// The CA's key pair, from PKCS#8, PKCS#1 RSA or SEC1 EC PEM.
fn ca_key_pair(path: &Path, pem: &[u8]) -> Result<KeyPair, CertError> {
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| CertError::NoKey {
        path: path.to_owned(),
    })?;
    let unusable = |err: rcgen::Error| CertError::Key {
        path: path.to_owned(),
        err: err.to_string(),
    };
    let candidates: Vec<Vec<u8>> = match &key {
        PrivateKeyDer::Pkcs8(k) => vec![k.secret_pkcs8_der().to_vec()],
        PrivateKeyDer::Pkcs1(k) => vec![pkcs8::wrap(pkcs8::RSA, k.secret_pkcs1_der())],
        PrivateKeyDer::Sec1(k) => vec![
            pkcs8::wrap(pkcs8::EC_P256, k.secret_sec1_der()),
            pkcs8::wrap(pkcs8::EC_P384, k.secret_sec1_der()),
        ],
        _ => {
            return Err(CertError::NoKey {
                path: path.to_owned(),
            });
        }
    };
    let mut last = rcgen::Error::CouldNotParseKeyPair;
    for der in candidates {
        match KeyPair::try_from(&PrivatePkcs8KeyDer::from(der)) {
            Ok(pair) => return Ok(pair),
            Err(e) => last = e,
        }
    }
    Err(unusable(last))
}

/// PKCS#8 `PrivateKeyInfo` around a PKCS#1 or SEC1 key (RFC 5208, 5915).
mod pkcs8 {
    /// `AlgorithmIdentifier { rsaEncryption, NULL }`.
    pub const RSA: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    /// `AlgorithmIdentifier { id-ecPublicKey, prime256v1 }`.
    pub const EC_P256: &[u8] = &[
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    /// `AlgorithmIdentifier { id-ecPublicKey, secp384r1 }`.
    pub const EC_P384: &[u8] = &[
        0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81,
        0x04, 0x00, 0x22,
    ];

    /// `SEQUENCE { INTEGER 0, algorithm, OCTET STRING key }`.
    pub fn wrap(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
        let mut body = vec![0x02, 0x01, 0x00];
        body.extend_from_slice(algorithm);
        body.push(0x04);
        push_len(&mut body, key.len());
        body.extend_from_slice(key);
        let mut out = vec![0x30];
        push_len(&mut out, body.len());
        out.extend_from_slice(&body);
        out
    }

    /// A DER length.
    fn push_len(out: &mut Vec<u8>, len: usize) {
        if let Ok(short) = u8::try_from(len)
            && short < 0x80
        {
            out.push(short);
            return;
        }
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        // At most 8 length bytes: 0x81 to 0x88.
        let count = u8::try_from(bytes.len() - skip).expect("a usize has at most 8 bytes");
        out.push(0x80 | count);
        out.extend_from_slice(&bytes[skip..]);
    }

    #[cfg(test)]
    #[test]
    fn lengths() {
        let mut out = Vec::new();
        push_len(&mut out, 5);
        push_len(&mut out, 0x80);
        push_len(&mut out, 0x1234);
        assert_eq!(out, [5, 0x81, 0x80, 0x82, 0x12, 0x34]);
    }
}

#[cfg(test)]
mod tests;
