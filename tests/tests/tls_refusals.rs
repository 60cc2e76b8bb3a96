//! Refused TLS handshakes, on the functions listener and on a TLS `--listen`:
//! the client gets the alert or answer that says what happened (an unknown
//! server name is `unrecognized_name`, not `access_denied`; plaintext HTTP/2
//! gets a GOAWAY that says the listener requires TLS), and the server logs
//! each refusal with the peer and the reason and counts it in
//! `fnrun_tls_handshakes_refused_total{listener,reason}`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fnrun_tests::certs::{Certs, TlsFiles};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, NAMESPACE};
use fnrun_tests::registry::{free_port, http_get};
use rustls::AlertDescription;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TLS client's handshake with `addr` for `server_name`, trusting `ca`,
/// with `client` as its certificate if any; then one read, since with TLS
/// 1.3 the server's verdict on a client certificate comes after the
/// client's half of the handshake. The alert the server sent, if any.
async fn alert_from(
    addr: &str,
    ca: &Path,
    client: Option<&TlsFiles>,
    server_name: &str,
) -> Option<AlertDescription> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match client {
        Some(files) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&files.cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(&files.key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    let alert = |e: std::io::Error| match e.get_ref().and_then(|i| i.downcast_ref()) {
        Some(rustls::Error::AlertReceived(alert)) => Some(*alert),
        _ => panic!("{server_name}: not an alert: {e}"),
    };
    let mut tls = match connector.connect(name, tcp).await {
        Ok(tls) => tls,
        Err(e) => return alert(e),
    };
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .ok();
    let mut byte = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut byte))
        .await
        .expect("the server answers or refuses")
    {
        Ok(_) => None,
        Err(e) => alert(e),
    }
}

/// What the listener at `addr` answers to a plaintext HTTP/2 client.
async fn plaintext_answer(addr: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the listener closes the connection")
        .ok();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The value of the refusal counter for `listener` and `reason`.
fn refused(metrics: &str, listener: &str, reason: &str) -> u64 {
    let (status, body) = http_get(metrics, "/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    let series = format!(
        "fnrun_tls_handshakes_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
    );
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("{series} missing in\n{body}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_listener_says_why_it_refuses_a_handshake() {
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let host = FunctionHost::start(
        HostOpts::insecure(vec![Entry::new("fn-a", "127.0.0.1:1/fns/a:v1")])
            .tls(HostTls::Mint)
            .arg("--metrics-listen")
            .arg(&metrics),
    )
    .expect("the host starts");
    let ca = host.certs().ca_cert();
    let client = host.client_cert();
    let known = format!("fn-a.{NAMESPACE}");

    // A known name with Crossplane's certificate: no alert.
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&client), &known).await,
        None
    );
    // A name no function answers to.
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&client), "nobody.example").await,
        Some(AlertDescription::UnrecognisedName)
    );
    // A name that could be a function's: fnrun holds the CA key, so a
    // certificate is minted for it (its calls are NOT_FOUND), and the
    // handshake is no refusal.
    assert_eq!(
        alert_from(
            host.addr(),
            &ca,
            Some(&client),
            &format!("fn-b.{NAMESPACE}")
        )
        .await,
        None
    );
    // No client certificate, and one from another CA.
    assert_eq!(
        alert_from(host.addr(), &ca, None, &known).await,
        Some(AlertDescription::CertificateRequired)
    );
    let stranger = host.certs().other_ca_client("stranger").unwrap();
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&stranger), &known).await,
        Some(AlertDescription::UnknownCA)
    );
    // Plaintext HTTP/2: a GOAWAY that says why.
    let answer = plaintext_answer(host.addr()).await;
    assert!(answer.contains("this listener requires TLS"), "{answer:?}");
    // A TCP probe that sends nothing is no refusal.
    drop(std::net::TcpStream::connect(host.addr()).unwrap());

    let log = host
        .wait_log("TLS handshake refused", 4, Duration::from_secs(10))
        .unwrap();
    for (reason, says) in [
        (
            "unknown_server_name",
            "no function answers to the server name",
        ),
        ("no_client_certificate", "the client sent no certificate"),
        (
            "bad_client_certificate",
            "the client's certificate was refused",
        ),
        ("not_tls", "plaintext HTTP/2 (h2c)"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains("TLS handshake refused") && l.contains(reason))
            .unwrap_or_else(|| panic!("no refusal logged for {reason}:\n{log}"));
        assert!(line.contains(says), "{line}");
        assert!(line.contains("peer=127.0.0.1:"), "{line}");
        assert!(
            line.contains("listener=\"functions\"") || line.contains("listener=functions"),
            "{line}"
        );
        assert_eq!(refused(&metrics, "functions", reason), 1, "{reason}");
    }
    assert_eq!(log.matches("TLS handshake refused").count(), 4, "{log}");
    assert_eq!(refused(&metrics, "functions", "other"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listen_address_says_why_it_refuses_a_handshake() {
    let certs = Certs::new().unwrap();
    let server = certs.server("daemon", &["localhost"]).unwrap();
    let client = certs.client("client").unwrap();
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let mut daemon = Daemon::start(
        DaemonOpts::default()
            .tls_listen(&listen, &server)
            .arg("--tls-client-ca")
            .arg(certs.ca_cert().display().to_string())
            .arg("--metrics-listen")
            .arg(&metrics),
    )
    .expect("fnrun serve starts");
    daemon.wait_tcp(&listen).unwrap();
    let ca = certs.ca_cert();
    assert_eq!(
        alert_from(&listen, &ca, Some(&client), "localhost").await,
        None
    );
    assert_eq!(
        alert_from(&listen, &ca, None, "localhost").await,
        Some(AlertDescription::CertificateRequired)
    );
    let answer = plaintext_answer(&listen).await;
    assert!(answer.contains("this listener requires TLS"), "{answer:?}");
    let log = fnrun_tests::wait_for(Duration::from_secs(10), || {
        let log = daemon.log();
        (log.matches("TLS handshake refused").count() >= 2).then_some(log)
    })
    .expect("both refusals are logged");
    for reason in ["no_client_certificate", "not_tls"] {
        assert!(
            log.lines()
                .any(|l| l.contains("TLS handshake refused") && l.contains(reason)),
            "{reason}:\n{log}"
        );
        assert_eq!(refused(&metrics, "runner", reason), 1, "{reason}");
    }
}

/// `fnrun_tls_unknown_name_certificates_minted_total`.
fn minted(metrics: &str) -> u64 {
    let (status, body) = http_get(metrics, "/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix("fnrun_tls_unknown_name_certificates_minted_total "))
        .unwrap_or_else(|| panic!("the mint counter is missing in\n{body}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_no_function_answers_to_mint_nothing_before_a_client_certificate() {
    let metrics = format!("127.0.0.1:{}", free_port().unwrap());
    let host = FunctionHost::start(
        HostOpts::insecure(vec![Entry::new("fn-a", "127.0.0.1:1/fns/a:v1")])
            .tls(HostTls::Mint)
            .arg("--metrics-listen")
            .arg(&metrics),
    )
    .expect("the host starts");
    let ca = host.certs().ca_cert();
    let client = host.client_cert();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let random = |i: usize| format!("r{stamp:x}-{i}.{NAMESPACE}");

    // Names that could be functions', from a peer that has shown no client
    // certificate yet, with none or with Crossplane's: refused before any
    // mint, each refusal naming the server name asked for. (8 of them: the
    // log takes 10 refusals a minute, and two more are looked for below.)
    for i in 0..8 {
        let cert = (i % 2 == 1).then_some(&client);
        assert_eq!(
            alert_from(host.addr(), &ca, cert, &random(i)).await,
            Some(AlertDescription::UnrecognisedName),
            "{}",
            random(i)
        );
    }
    assert_eq!(minted(&metrics), 0);
    assert_eq!(refused(&metrics, "functions", "unknown_server_name"), 8);
    let log = host
        .wait_log("TLS handshake refused", 8, Duration::from_secs(10))
        .unwrap();
    for i in 0..8 {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("server_name=\"{}\"", random(i))))
            .unwrap_or_else(|| panic!("no refusal names {}:\n{log}", random(i)));
        assert!(line.contains("TLS handshake refused"), "{line}");
        assert!(
            line.contains("has not shown a client certificate"),
            "{line}"
        );
    }

    // The known name still works, and so the peer has shown its certificate.
    let known = format!("fn-a.{NAMESPACE}");
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&client), &known).await,
        None
    );
    // A refusal after the hello names the server name too.
    assert_eq!(
        alert_from(host.addr(), &ca, None, &known).await,
        Some(AlertDescription::CertificateRequired)
    );
    host.wait_log(
        &format!("server_name=\"{known}\""),
        1,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(minted(&metrics), 0);

    // Now an unknown name gets its certificate minted (its calls are
    // NOT_FOUND), once: asked again, it is the same one.
    let started = std::time::Instant::now();
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&client), &random(100)).await,
        None
    );
    assert_eq!(
        alert_from(host.addr(), &ca, Some(&client), &random(100)).await,
        None
    );
    assert_eq!(minted(&metrics), 1);
    // Many new names: a few at once, then one a second; the rest refused.
    let mut served = 0;
    for i in 101..141 {
        if alert_from(host.addr(), &ca, Some(&client), &random(i))
            .await
            .is_none()
        {
            served += 1;
        }
    }
    let most = 8 + started.elapsed().as_secs() + 1;
    let mints = minted(&metrics);
    assert!(mints <= most, "{mints} mints, at most {most}");
    assert_eq!(mints, served + 1);
    assert!(served < 40, "every new name got a certificate");
    let log = host.log();
    assert!(
        log.lines()
            .any(|l| l.contains("TLS handshake refused")
                && l.contains("too many certificates minted")),
        "{log}"
    );
}
