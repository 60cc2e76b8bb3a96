//! A test PKI: certificate authorities, and server and client certificates
//! they sign, as PEM in memory and as files in a temp dir for fnrun's TLS
//! flags, function servers (`--tls-certs-dir`) and the Go client.
//!
//! [`Certs`] is the usual entry point: a CA (as Crossplane's, which signs the
//! function servers' certificates and Crossplane's client certificate) and a
//! second, unrelated CA for "certificate from another CA" cases.
//!
//! ```no_run
//! use fnrun_tests::certs::Certs;
//!
//! let certs = Certs::new().unwrap();
//! // A function server's --tls-certs-dir: tls.crt, tls.key, ca.crt.
//! let server = certs.server("function-label", &["function-label.crossplane-system"]).unwrap();
//! // Crossplane's client certificate.
//! let client = certs.client("crossplane").unwrap();
//! // One the function must refuse.
//! let stranger = certs.other_ca_client("stranger").unwrap();
//! # let _ = (server, client, stranger);
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)
            .with_context(|| format!("cannot make the CA {common_name}"))?;
        Ok(Ca { issuer })
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's private key, PEM (for fnrun's `--functions-ca-key`).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses), the first
    /// also its common name.
    pub fn server(&self, names: &[&str]) -> Result<Pair> {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `name` (its common name and DNS name).
    pub fn client(&self, name: &str) -> Result<Pair> {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Result<Pair> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())
            .with_context(|| format!("bad certificate names {names:?}"))?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(DnType::CommonName, first.as_str());
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("cannot sign a certificate for {names:?}"))?;
        Ok(Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate, its key and a CA certificate written to a directory as
/// `tls.crt`, `tls.key` and `ca.crt`: the layout of a Kubernetes TLS Secret,
/// of Crossplane's function certificates, and of `--tls-certs-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate of the CA that signed `cert`: what its holder trusts
    /// to verify its peer.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// Writes `pair` and `ca_pem` into `dir` (made if missing).
    pub fn write(dir: &Path, pair: &Pair, ca_pem: &str) -> Result<TlsFiles> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let files = TlsFiles {
            dir: dir.to_path_buf(),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        };
        for (path, pem) in [
            (&files.cert, pair.cert_pem.as_str()),
            (&files.key, pair.key_pem.as_str()),
            (&files.ca, ca_pem),
        ] {
            std::fs::write(path, pem)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(files)
    }
}

/// A CA, an unrelated second CA, and the files of the certificates they sign,
/// in a temp dir removed on drop.
pub struct Certs {
    dir: TempDir,
    ca: Ca,
    other_ca: Ca,
}

impl Certs {
    /// Two fresh CAs; writes `ca.crt` and `ca.key` (the CA's) and
    /// `other-ca.crt`.
    pub fn new() -> Result<Certs> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-certs-")
            .tempdir()
            .context("cannot create the certificates' temp dir")?;
        let certs = Certs {
            dir,
            ca: Ca::new("fnrun test CA")?,
            other_ca: Ca::new("another CA")?,
        };
        for (name, pem) in [
            ("ca.crt", certs.ca.cert_pem()),
            ("ca.key", certs.ca.key_pem()),
            ("other-ca.crt", certs.other_ca.cert_pem()),
        ] {
            let path = certs.dir.path().join(name);
            std::fs::write(&path, pem)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(certs)
    }

    /// The directory everything is written to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The unrelated CA.
    pub fn other_ca(&self) -> &Ca {
        &self.other_ca
    }

    /// The CA's certificate file.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The CA's private key file.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.path().join("ca.key")
    }

    /// The unrelated CA's certificate file.
    pub fn other_ca_cert(&self) -> PathBuf {
        self.dir.path().join("other-ca.crt")
    }

    /// A server certificate for `names` signed by the CA, in `server-<label>/`
    /// with the CA as `ca.crt` (which verifies clients): a function's
    /// `--tls-certs-dir`.
    pub fn server(&self, label: &str, names: &[&str]) -> Result<TlsFiles> {
        self.write(&format!("server-{label}"), &self.ca, self.ca.server(names)?)
    }

    /// A client certificate for `name` signed by the CA, in `client-<name>/`
    /// with the CA as `ca.crt` (which verifies servers): Crossplane's.
    pub fn client(&self, name: &str) -> Result<TlsFiles> {
        self.write(&format!("client-{name}"), &self.ca, self.ca.client(name)?)
    }

    /// A server certificate for `names` signed by the other CA, in
    /// `other-server-<label>/`.
    pub fn other_ca_server(&self, label: &str, names: &[&str]) -> Result<TlsFiles> {
        self.write(
            &format!("other-server-{label}"),
            &self.other_ca,
            self.other_ca.server(names)?,
        )
    }

    /// A client certificate for `name` signed by the other CA, in
    /// `other-client-<name>/`.
    pub fn other_ca_client(&self, name: &str) -> Result<TlsFiles> {
        self.write(
            &format!("other-client-{name}"),
            &self.other_ca,
            self.other_ca.client(name)?,
        )
    }

    fn write(&self, name: &str, ca: &Ca, pair: Pair) -> Result<TlsFiles> {
        TlsFiles::write(&self.dir.path().join(name), &pair, &ca.cert_pem())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_where_they_are_said_to_be() {
        let certs = Certs::new().unwrap();
        for path in [certs.ca_cert(), certs.ca_key(), certs.other_ca_cert()] {
            assert!(
                path.starts_with(certs.dir()) && path.is_file(),
                "{}",
                path.display()
            );
        }
        assert_ne!(certs.ca().cert_pem(), certs.other_ca().cert_pem());
        let server = certs.server("fn", &["fn.ns", "127.0.0.1"]).unwrap();
        assert_eq!(server.dir, certs.dir().join("server-fn"));
        let stranger = certs.other_ca_client("x").unwrap();
        for (files, ca) in [(&server, certs.ca()), (&stranger, certs.other_ca())] {
            assert_eq!(std::fs::read_to_string(&files.ca).unwrap(), ca.cert_pem());
            let cert = std::fs::read_to_string(&files.cert).unwrap();
            let key = std::fs::read_to_string(&files.key).unwrap();
            assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
            assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        }
    }
}
