use std::time::SystemTime;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{ServerName, UnixTime};

use super::*;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/certs/testdata")
        .join(name)
}

fn verifier(ca: &Path) -> Arc<WebPkiServerVerifier> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap()
}

/// Whether `key`'s chain verifies for `name` against the CA at `ca`.
fn verifies(ca: &Path, key: &CertifiedKey, name: &str) -> Result<(), rustls::Error> {
    verifier(ca)
        .verify_server_cert(
            &key.cert[0],
            &key.cert[1..],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::since_unix_epoch(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap(),
            ),
        )
        .map(|_| ())
}

#[test]
fn minted_certificates_verify_for_the_three_names_of_their_function() {
    // Crossplane's root CA is RSA with a PKCS#1 key; a SEC1 EC CA works too.
    for (cert, key) in [("rsa-ca.crt", "rsa-ca.key"), ("ec-ca.crt", "ec-ca.key")] {
        let ca = testdata(cert);
        let source = CertSource::Mint {
            cert: ca.clone(),
            key: testdata(key),
        };
        let names = ["fn-a".to_owned(), "fn-b".to_owned()];
        let set = source.cert_set(&names, "crossplane-system").unwrap();
        for server_name in [
            "fn-a",
            "fn-a.crossplane-system",
            "fn-a.crossplane-system.svc",
        ] {
            let key = set.get(server_name).unwrap();
            verifies(&ca, key, server_name).unwrap();
            // Each function has its own key.
            assert_ne!(key.cert[0], set.get("fn-b").unwrap().cert[0]);
        }
        let a = set.get("fn-a").unwrap();
        let err = verifies(&ca, a, "fn-b").unwrap_err();
        assert!(err.to_string().contains("not valid for name"), "{err}");
        assert!(set.get("fn-c").is_none());
        // A client without a server name gets every function's names.
        let all = set.without_sni().unwrap();
        for server_name in ["fn-a", "fn-b.crossplane-system.svc"] {
            verifies(&ca, all, server_name).unwrap();
        }
        // Another CA does not vouch for them.
        let other = if cert.starts_with("rsa") {
            "ec-ca.crt"
        } else {
            "rsa-ca.crt"
        };
        assert!(verifies(&testdata(other), a, "fn-a").is_err());
    }
}

#[test]
fn a_name_that_could_be_a_function_gets_a_minted_certificate() {
    let ca = testdata("rsa-ca.crt");
    let source = CertSource::Mint {
        cert: ca.clone(),
        key: testdata("rsa-ca.key"),
    };
    let set = source
        .cert_set(&["fn-a".to_owned()], "crossplane-system")
        .unwrap();
    for name in [
        "fn-b",
        "fn-b.crossplane-system",
        "fn-b.crossplane-system.svc",
    ] {
        assert!(set.may_mint(name), "{name}");
        let key = set.mint_unknown(name).unwrap();
        verifies(&ca, &key, name).unwrap();
    }
    // Names no function of the namespace could have: refused as before.
    for name in [
        "nobody.example",
        "fn-b.other-ns.svc",
        "a.b.crossplane-system",
        "127.0.0.1",
    ] {
        assert!(!set.may_mint(name), "{name}");
        assert!(set.mint_unknown(name).is_none(), "{name}");
    }
    // Certificates read from a directory: fnrun holds no CA key.
    let dir = tempfile::tempdir().unwrap();
    let set = CertSource::Dir(dir.path().to_owned())
        .cert_set(&[], "crossplane-system")
        .unwrap();
    assert!(!set.may_mint("fn-b"));
}

#[test]
fn a_certs_dir_holds_one_pair_per_function() {
    let dir = tempfile::tempdir().unwrap();
    let write_pair = |sub: &Path, sans: Vec<String>| {
        std::fs::create_dir_all(sub).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(sub.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(sub.join("tls.key"), key.serialize_pem()).unwrap();
        cert
    };
    write_pair(&dir.path().join("fn-a"), vec!["fn-a".into()]);
    let source = CertSource::Dir(dir.path().to_owned());
    let set = source.cert_set(&["fn-a".to_owned()], "ns").unwrap();
    assert!(set.get("fn-a.ns.svc").is_some());
    assert!(set.without_sni().is_none());

    // A function without its pair: the error names the file.
    let e = source
        .cert_set(&["fn-a".to_owned(), "fn-b".to_owned()], "ns")
        .unwrap_err()
        .to_string();
    assert!(e.contains("fn-b/tls.crt"), "{e}");

    // A key that is not the certificate's.
    let b = dir.path().join("fn-b");
    write_pair(&b, vec!["fn-b".into()]);
    std::fs::write(
        b.join("tls.key"),
        KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    let e = source
        .cert_set(&["fn-b".to_owned()], "ns")
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match the certificate"), "{e}");

    // Garbage.
    std::fs::write(b.join("tls.crt"), "not PEM").unwrap();
    let e = source
        .cert_set(&["fn-b".to_owned()], "ns")
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no PEM certificate"), "{e}");

    // The pair for clients without a server name.
    write_pair(dir.path(), vec!["fn-a".into()]);
    let set = source.cert_set(&["fn-a".to_owned()], "ns").unwrap();
    assert!(set.without_sni().is_some());
}

#[test]
fn a_ca_that_cannot_sign_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("ca.key");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = Minter::load(&testdata("rsa-ca.crt"), &key)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("the private key cannot be used"), "{e}");
    std::fs::write(&key, "nothing").unwrap();
    let e = Minter::load(&testdata("rsa-ca.crt"), &key)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("has no PEM private key"), "{e}");
    let e = Minter::load(&dir.path().join("missing.crt"), &key)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("cannot read"), "{e}");
}

/// A CA made with rcgen: its certificate and key, PEM.
fn rcgen_ca(edit: impl FnOnce(&mut CertificateParams)) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    edit(&mut params);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_ca_key_that_is_not_the_certificates_is_refused_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let other_key = dir.path().join("other.key");
    // Another CA's key, RSA and EC, for each CA.
    for (cert, key) in [("rsa-ca.crt", "ec-ca.key"), ("ec-ca.crt", "rsa-ca.key")] {
        let e = Minter::load(&testdata(cert), &testdata(key))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("does not belong to the CA certificate"), "{e}");
        assert!(e.contains(cert) && e.contains(key), "{e}");
    }
    let (_, key) = rcgen_ca(|_| {});
    std::fs::write(&other_key, key).unwrap();
    let e = Minter::load(&testdata("ec-ca.crt"), &other_key)
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("other.key") && e.contains("ec-ca.crt") && e.contains("public keys differ"),
        "{e}"
    );
    // And a reload reads the files again: a key swapped meanwhile is refused.
    std::fs::copy(testdata("ec-ca.key"), &other_key).unwrap();
    let source = CertSource::Mint {
        cert: testdata("ec-ca.crt"),
        key: other_key.clone(),
    };
    source.cert_set(&["fn-a".to_owned()], "ns").unwrap();
    let (_, key) = rcgen_ca(|_| {});
    std::fs::write(&other_key, key).unwrap();
    let e = match source.cert_set(&["fn-a".to_owned()], "ns") {
        Ok(_) => panic!("a swapped key is taken at reload"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("does not belong"), "{e}");
}

#[test]
fn a_certificate_that_is_no_valid_ca_now_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    let now = time::OffsetDateTime::now_utc();
    type Edit = Box<dyn FnOnce(&mut CertificateParams)>;
    let cases: [(&str, Edit); 4] = [
        (
            "not a CA certificate",
            Box::new(|p| p.is_ca = rcgen::IsCa::NoCa),
        ),
        (
            "does not allow signing certificates",
            Box::new(|p| p.key_usages = vec![KeyUsagePurpose::DigitalSignature]),
        ),
        (
            "not valid now",
            Box::new(move |p| {
                p.not_before = now - time::Duration::days(10);
                p.not_after = now - time::Duration::days(1);
            }),
        ),
        (
            "not valid now",
            Box::new(move |p| {
                p.not_before = now + time::Duration::days(1);
                p.not_after = now + time::Duration::days(10);
            }),
        ),
    ];
    for (says, edit) in cases {
        let (cert_pem, key_pem) = rcgen_ca(edit);
        std::fs::write(&cert, cert_pem).unwrap();
        std::fs::write(&key, key_pem).unwrap();
        let e = Minter::load(&cert, &key).expect_err("refused").to_string();
        assert!(e.contains(says) && e.contains("ca.crt"), "{says}: {e}");
    }
    // The same, valid now, is taken.
    let (cert_pem, key_pem) = rcgen_ca(|_| {});
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    Minter::load(&cert, &key).unwrap();
}
