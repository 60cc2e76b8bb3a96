//! mTLS on the functions listener, on by default: client certificates are
//! required and verified against `--functions-client-ca`; the server's own
//! chain verifies for the function's names only; ALPN is h2; flags that
//! would serve TLS without a CA or certificates, and a CA key that is not the
//! CA certificate's or a certificate that is no CA, are a clear startup error.

use fnrun_tests::certs::Certs;
use fnrun_tests::crossplane::{Call, GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, NAMESPACE};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::user::require_root;

/// The host and the image it serves (which must outlive it).
fn host() -> (FunctionHost, BuiltImage) {
    let image = GoFunction::new(Variant::Label)
        .image()
        .and_then(|i| i.build())
        .expect("the image builds");
    let host = FunctionHost::start(
        HostOpts::insecure(vec![Entry::new("fn-a", &image.oci_ref())]).tls(HostTls::Mint),
    )
    .unwrap();
    (host, image)
}

#[test]
fn clients_need_a_certificate_from_the_client_ca() {
    if !require_root("clients_need_a_certificate_from_the_client_ca") {
        return;
    }
    let (host, _image) = host();
    // Crossplane's client certificate: served, over TLS with ALPN h2.
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let tls = outcome.tls.expect("TLS");
    assert_eq!(tls.alpn, "h2");
    assert_eq!(tls.server_name, format!("fn-a.{NAMESPACE}"));

    // A function fnrun does not serve, asked for by a name that could be
    // one's (a Function installed but not yet served, say): fnrun holds the
    // CA key, so it mints a certificate for the name and answers NOT_FOUND
    // with the functions that exist, and logs the name.
    let outcome = host.call("fn-b").request(SAMPLE_REQUEST).run().unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
    assert!(outcome.message.contains("fn-b"), "{outcome:?}");
    assert!(
        outcome.message.contains("fn-a"),
        "the functions that exist: {outcome:?}"
    );
    assert_eq!(
        outcome.tls.expect("TLS").server_name,
        format!("fn-b.{NAMESPACE}")
    );
    let log = host.log();
    assert!(
        log.lines()
            .any(|l| l.contains("function call failed") && l.contains("fn-b")),
        "{log}"
    );

    // No client certificate: the handshake fails.
    let outcome = Call::mtls(host.addr(), &host.certs().ca_cert())
        .server_name(&format!("fn-a.{NAMESPACE}"))
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(outcome.response.is_none());

    // A client certificate from another CA: refused too.
    let stranger = host.certs().other_ca_client("stranger").unwrap();
    let outcome = Call::mtls(host.addr(), &host.certs().ca_cert())
        .client_cert(&stranger)
        .server_name(&format!("fn-a.{NAMESPACE}"))
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(outcome.response.is_none());

    // A client that trusts another CA does not accept fnrun's certificate.
    let outcome = Call::mtls(host.addr(), &host.certs().other_ca_cert())
        .client_cert(&host.client_cert())
        .server_name(&format!("fn-a.{NAMESPACE}"))
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("certificate signed by unknown authority"),
        "{outcome:?}"
    );

    // A plain-text client gets nothing from a TLS listener.
    let outcome = Call::insecure(host.addr())
        .authority("fn-a:9443")
        .request(SAMPLE_REQUEST)
        .timeout(std::time::Duration::from_secs(3))
        .run()
        .unwrap();
    assert!(!outcome.is_ok(), "{outcome:?}");
    // None of them started the function twice or killed the daemon.
    assert_eq!(host.server_pids("fn-a").len(), 1, "{}", host.log());
    let outcome = host.call("fn-a").request(SAMPLE_REQUEST).run().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// `fnrun serve` with these function flags (and one function) must refuse
/// to start with a message containing `wanted`.
fn refuses(args: &[&str], wanted: &str) {
    let mut opts = DaemonOpts::default()
        .arg("--function")
        .arg("fn-a=oci:/nowhere:v1")
        .arg("--functions-listen")
        .arg("127.0.0.1:0");
    for arg in args {
        opts = opts.arg(*arg);
    }
    let err = match Daemon::start(opts) {
        Ok(mut daemon) => {
            // Started: the main socket accepted before the functions host
            // failed; it must exit by itself.
            let status = daemon.wait_exit(std::time::Duration::from_secs(10));
            assert!(
                status.is_some_and(|s| !s.success()),
                "{args:?}: fnrun serve kept running: {}",
                daemon.log()
            );
            daemon.log()
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains(wanted), "{args:?}: {err}");
}

#[test]
fn tls_without_a_ca_or_certificates_is_a_startup_error() {
    if !require_root("tls_without_a_ca_or_certificates_is_a_startup_error") {
        return;
    }
    let certs = Certs::new().unwrap();
    let ca = certs.ca_cert().display().to_string();
    let key = certs.ca_key().display().to_string();
    refuses(
        &[],
        "serves TLS: give --functions-ca-cert and --functions-ca-key",
    );
    refuses(
        &["--functions-ca-cert", &ca, "--functions-ca-key", &key],
        "requires client certificates (mTLS): give --functions-client-ca FILE",
    );
    refuses(
        &["--functions-client-ca", &ca],
        "serves TLS: give --functions-ca-cert",
    );
    // A CA key that is not the certificate's key cannot sign: said at start.
    refuses(
        &[
            "--functions-ca-cert",
            &ca,
            "--functions-ca-key",
            &ca,
            "--functions-client-ca",
            &ca,
        ],
        "has no PEM private key",
    );
    refuses(
        &["--functions-insecure", "--functions-client-ca", &ca],
        "cannot be used with",
    );
    refuses(
        &[
            "--functions-insecure",
            "--functions-namespace",
            "Not_A_Label",
        ],
        "--functions-namespace \"Not_A_Label\" is not a DNS label",
    );
}

#[test]
fn a_ca_key_that_is_not_the_certificates_is_a_startup_error_naming_both() {
    if !require_root("a_ca_key_that_is_not_the_certificates_is_a_startup_error_naming_both") {
        return;
    }
    let certs = Certs::new().unwrap();
    let ca = certs.ca_cert().display().to_string();
    let other_key = certs.dir().join("other-ca.key");
    std::fs::write(&other_key, certs.other_ca().key_pem()).unwrap();
    let other_key = other_key.display().to_string();
    refuses(
        &[
            "--functions-ca-cert",
            &ca,
            "--functions-ca-key",
            &other_key,
            "--functions-client-ca",
            &ca,
        ],
        &format!("the CA key {other_key} does not belong to the CA certificate {ca}"),
    );
    // A server certificate is no CA to mint from.
    let server = certs.server("not-a-ca", &["x"]).unwrap();
    refuses(
        &[
            "--functions-ca-cert",
            &server.cert.display().to_string(),
            "--functions-ca-key",
            &server.key.display().to_string(),
            "--functions-client-ca",
            &ca,
        ],
        "not a CA certificate",
    );
}
