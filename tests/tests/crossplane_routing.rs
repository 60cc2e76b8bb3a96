//! Routing among functions: three Go functions behind one listener, each
//! call reaching the one its TLS server name (SNI) names, or its
//! `:authority` when there is no SNI (h2c); unknown names get NOT_FOUND
//! listing the functions there are (or, with TLS, a refused handshake).

use fnrun_tests::crossplane::{GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts, HostTls, NAMESPACE};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::user::require_root;

const NAMES: [&str; 3] = ["fn-alpha", "fn-beta", "fn-gamma"];

/// Each function labels with its own name, so the answer says who answered.
fn images() -> Vec<BuiltImage> {
    NAMES
        .iter()
        .map(|name| {
            GoFunction::new(Variant::Label)
                .name(name)
                .label("fnrun.dev/by", name)
                .image()
                .and_then(|i| i.build())
                .expect("the function image builds")
        })
        .collect()
}

fn entries(images: &[BuiltImage]) -> Vec<Entry> {
    NAMES
        .iter()
        .zip(images)
        .map(|(name, image)| Entry::new(name, &image.oci_ref()))
        .collect()
}

fn labelled_by(outcome: &fnrun_tests::crossplane::Outcome) -> String {
    assert!(outcome.is_ok(), "{outcome:?}");
    outcome.desired_resource("instance").expect("instance")["metadata"]["labels"]["fnrun.dev/by"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn h2c_calls_are_routed_by_authority_in_every_form() {
    if !require_root("h2c_calls_are_routed_by_authority_in_every_form") {
        return;
    }
    let images = images();
    let host = FunctionHost::start(HostOpts::insecure(entries(&images))).unwrap();
    for name in NAMES {
        for authority in [
            name.to_owned(),
            format!("{name}:9443"),
            format!("{name}.{NAMESPACE}:9443"),
            format!("{name}.{NAMESPACE}.svc"),
            format!("{name}.{NAMESPACE}.svc:9443"),
        ] {
            let outcome = host
                .call(name)
                .authority(&authority)
                .request(SAMPLE_REQUEST)
                .run()
                .unwrap();
            assert_eq!(labelled_by(&outcome), name, "{authority}");
            assert_eq!(outcome.version, "v1");
        }
    }
    // An unknown name: NOT_FOUND, and the names that exist.
    let outcome = host
        .call("fn-alpha")
        .authority("fn-delta.crossplane-system:9443")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("no function \"fn-delta.crossplane-system\" here (:authority); functions: fn-alpha, fn-beta, fn-gamma"),
        "{}",
        outcome.message
    );
    // Another namespace's name is not these functions'.
    let outcome = host
        .call("fn-alpha")
        .authority("fn-alpha.other:9443")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
}

#[test]
fn tls_connections_are_routed_by_sni_and_without_sni_by_authority() {
    if !require_root("tls_connections_are_routed_by_sni_and_without_sni_by_authority") {
        return;
    }
    let images = images();
    let host =
        FunctionHost::start(HostOpts::insecure(entries(&images)).tls(HostTls::Mint)).unwrap();
    for name in NAMES {
        for server_name in [
            name.to_owned(),
            format!("{name}.{NAMESPACE}"),
            format!("{name}.{NAMESPACE}.svc"),
        ] {
            // The :authority names another function: SNI decides.
            let outcome = host
                .call(name)
                .server_name(&server_name)
                .authority("fn-other:9443")
                .request(SAMPLE_REQUEST)
                .run()
                .unwrap();
            assert_eq!(labelled_by(&outcome), name, "{server_name}");
            let tls = outcome.tls.as_ref().expect("a TLS call");
            assert_eq!(tls.alpn, "h2");
            assert!(
                tls.peer_dns_names
                    .as_ref()
                    .is_some_and(|n| n.contains(&format!("{name}.{NAMESPACE}.svc"))),
                "{tls:?}"
            );
        }
    }
    // A server name that could be a function's but is none: fnrun holds the
    // CA key, so it mints a certificate for it, and the call is NOT_FOUND
    // with the functions that exist, logged with the name.
    let outcome = host
        .call("fn-alpha")
        .server_name("fn-delta.crossplane-system")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::NotFound, "{outcome:?}");
    assert!(
        outcome.message.contains("fn-delta.crossplane-system"),
        "{outcome:?}"
    );
    let log = host.log();
    assert!(
        log.lines().any(|l| l.contains("function call failed")
            && l.contains("fn-delta.crossplane-system")),
        "{log}"
    );
    // A name no function could have: the handshake is refused.
    let outcome = host
        .call("fn-alpha")
        .server_name("fn-delta.example")
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.code, tonic::Code::Unavailable, "{outcome:?}");
    host.wait_log(
        "no function answers to the server name \"fn-delta.example\"",
        1,
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    // Without a server name: the certificate names every function, and
    // :authority routes. grpc-go always sends one (the authority's host), so
    // this client is rustls with SNI off.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for name in NAMES {
        let response = runtime
            .block_on(call_without_sni(
                &host,
                name,
                &format!("{name}.{NAMESPACE}:9443"),
            ))
            .unwrap();
        let message = &response.results[0].message;
        assert!(message.starts_with(&format!("{name} (v1)")), "{message}");
    }
    let status = runtime
        .block_on(call_without_sni(&host, "fn-alpha", "fn-delta:9443"))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(
        status
            .message()
            .contains("functions: fn-alpha, fn-beta, fn-gamma"),
        "{status:?}"
    );
}

/// A v1 call over mTLS that sends no server name, verifying the server's
/// certificate as `verify_as`'s, with `:authority` `authority`.
async fn call_without_sni(
    host: &FunctionHost,
    verify_as: &str,
    authority: &str,
) -> Result<fnrun_api::v1::RunFunctionResponse, tonic::Status> {
    use std::sync::Arc;

    use fnrun_api::v1::function_runner_service_client::FunctionRunnerServiceClient;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(host.certs().ca_cert()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let client = host.client_cert();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&client.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&client.key).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    config.enable_sni = false;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let addr = host.addr().to_owned();
    let server_name = ServerName::try_from(verify_as.to_owned()).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let (connector, addr, server_name) =
                (connector.clone(), addr.clone(), server_name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let tls = connector.connect(server_name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    FunctionRunnerServiceClient::new(channel)
        .run_function(fnrun_api::v1::RunFunctionRequest::default())
        .await
        .map(tonic::Response::into_inner)
}

#[test]
fn a_certs_dir_gives_each_function_its_own_certificate() {
    if !require_root("a_certs_dir_gives_each_function_its_own_certificate") {
        return;
    }
    let images = images();
    let host =
        FunctionHost::start(HostOpts::insecure(entries(&images)).tls(HostTls::CertsDir)).unwrap();
    for name in NAMES {
        let outcome = host.call(name).request(SAMPLE_REQUEST).run().unwrap();
        assert_eq!(labelled_by(&outcome), name);
    }
}
