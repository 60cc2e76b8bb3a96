//! TLS and mTLS on TCP listeners, with certificates generated here.

use std::path::Path;
use std::time::Duration;

use fnrun_api::v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient;
use fnrun_tests::client::{self, Run};
use fnrun_tests::daemon::{Daemon, DaemonOpts};
use fnrun_tests::functionio::SAMPLE;
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::{Registry, free_port};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
    stranger: (String, String),
}

fn pki() -> Pki {
    let ca_params = {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p
    };
    let ca = CertifiedIssuer::self_signed(ca_params.clone(), KeyPair::generate().unwrap()).unwrap();
    let other_ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>, issuer: &CertifiedIssuer<'_, KeyPair>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf(vec!["localhost".into(), "127.0.0.1".into()], &ca),
        client: leaf(vec!["crossplane".into()], &ca),
        stranger: leaf(vec!["stranger".into()], &other_ca),
    }
}

fn write(dir: &Path, name: &str, data: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path.display().to_string()
}

async fn tls_client(
    addr: &str,
    ca: &str,
    identity: Option<&(String, String)>,
) -> Result<ContainerizedFunctionRunnerServiceClient<Channel>, tonic::transport::Error> {
    // Make ring the process default explicitly, whatever features unify.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(ContainerizedFunctionRunnerServiceClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_serves_tls_and_requires_client_certificates_with_a_client_ca() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let addr = format!("127.0.0.1:{}", free_port().unwrap());
    let daemon = Daemon::start(
        DaemonOpts::default()
            .arg("--listen")
            .arg(&addr)
            .arg("--tls-cert")
            .arg(write(dir.path(), "server.pem", &pki.server.0))
            .arg("--tls-key")
            .arg(write(dir.path(), "server.key", &pki.server.1))
            .arg("--tls-client-ca")
            .arg(write(dir.path(), "ca.pem", &pki.ca)),
    )
    .expect("fnrun serve starts");

    // A client with a certificate from the trusted CA runs functions.
    let mut client = tls_client(&addr, &pki.ca, Some(&pki.client))
        .await
        .expect("mTLS connects");
    let out = client::run_function(&mut client, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs over mTLS");
    assert!(!out.output.is_empty());

    // Without a client certificate, or with one from another CA: refused.
    for identity in [None, Some(&pki.stranger)] {
        let refused = match tls_client(&addr, &pki.ca, identity).await {
            Err(_) => true,
            Ok(mut c) => client::run_function(&mut c, Run::new(&image, SAMPLE).build())
                .await
                .is_err(),
        };
        assert!(
            refused,
            "a client without a trusted certificate got through"
        );
    }

    // Plain HTTP/2 to the TLS port does not work either.
    let plain = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut c = ContainerizedFunctionRunnerServiceClient::new(channel);
        assert!(
            client::run_function(&mut c, Run::new(&image, SAMPLE).build())
                .await
                .is_err()
        );
    }

    // The unix socket stays plain for node-local callers.
    let mut local = daemon.client().await.expect("unix socket connects");
    client::run_function(&mut local, Run::new(&image, SAMPLE).build())
        .await
        .expect("runs over the unix socket");
}
