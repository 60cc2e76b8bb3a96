//! Real test parts for fnrun's Crossplane v1 function host: Function package
//! servers, the way Crossplane calls them, certificates and sample requests.
//!
//! - [`GoFunction`]: composition functions on grpc-go (`tests/go/crossplanefn`),
//!   the normal `function-label` and misbehaving [`Variant`]s, run on the host
//!   ([`GoFunction::start`]) or packaged as an image ([`GoFunction::image`]:
//!   busybox, the static binary at `/function`, `User: 65532`).
//! - [`UpstreamFunction`]: released functions ([`PATCH_AND_TRANSFORM`],
//!   [`AUTO_READY`]) built
//!   from their module sources and packaged as Crossplane packages, with the
//!   `package.yaml` layer Crossplane's package manager reads
//!   ([`package_image`], the one packaging harness).
//! - [`render`]: the real `crossplane render` (the CLI and the core's render
//!   engine), built from their modules.
//! - [`Core`]: the real Crossplane core ([`CROSSPLANE_VERSION`], built from
//!   its module) out of cluster on the tests' Kubernetes control plane
//!   ([`crate::kube::ControlPlane`]), with the External function runtime.
//! - [`pod::Crossplane`]: the same core as a user installs it into a cluster
//!   (the Helm chart's objects), as a pod on the tests' Kubernetes node
//!   ([`crate::node::Node`]), with the External or the Deployment function
//!   runtime.
//! - [`python_sdk_image`]: a function written with the real
//!   `crossplane-function-sdk-python`, packaged with its interpreter, stdlib,
//!   packages and shared libraries in an image without busybox, cached.
//! - [`Call`]: a call as Crossplane's function runner makes it, with grpc-go
//!   (`tests/go/crossplaneclient`): mTLS with SNI and `:authority` of the
//!   function's service, ALPN h2 required, v1 then v1beta1 on UNIMPLEMENTED;
//!   or h2c. [`Call::bench`] makes many calls at once and reports latencies.
//! - [`Certs`](crate::certs::Certs): the CA that signs function servers' and
//!   Crossplane's certificates, and an unrelated CA.
//! - [`SAMPLE_REQUEST`]: a realistic v1 `RunFunctionRequest`.
//!
//! ```no_run
//! use std::time::Duration;
//! use fnrun_tests::certs::Certs;
//! use fnrun_tests::crossplane::{Call, GoFunction, ServerTls, Variant, service_names};
//! use fnrun_tests::crossplane::{SAMPLE_REQUEST, python_sdk_image};
//!
//! // A function on the host, over mTLS, called as Crossplane calls it.
//! let certs = Certs::new().unwrap();
//! let names = service_names("function-label", "crossplane-system");
//! let names: Vec<&str> = names.iter().map(String::as_str).collect();
//! let server = certs.server("function-label", &names).unwrap();
//! let function = GoFunction::new(Variant::Label)
//!     .start(&ServerTls::Mtls(server.dir.clone()))
//!     .unwrap();
//! let outcome = Call::mtls(function.addr(), &certs.ca_cert())
//!     .client_cert(&certs.client("crossplane").unwrap())
//!     .server_name("function-label.crossplane-system")
//!     .authority("function-label.crossplane-system:9443")
//!     .request(SAMPLE_REQUEST)
//!     .run()
//!     .unwrap();
//! assert!(outcome.is_ok(), "{outcome:?}");
//! assert_eq!(outcome.version, "v1");
//! let labels = &outcome.desired_resource("instance").unwrap()["metadata"]["labels"];
//! assert_eq!(labels["fnrun.dev/touched"], "true");
//!
//! // Images for fnrun: push them, or run them from their OCI layout.
//! let hog = GoFunction::new(Variant::MemoryHog).image().unwrap().build().unwrap();
//! let python = python_sdk_image().unwrap();
//! let bench = Call::insecure(function.addr())
//!     .request(SAMPLE_REQUEST)
//!     .timeout(Duration::from_secs(10))
//!     .bench(200, 8)
//!     .unwrap();
//! # let _ = (hog, python, bench);
//! ```
//!
//! What a runtime hosting these images should know (all shown by
//! `tests/tests/harness_crossplane.rs`):
//! - Both start as Crossplane's runtime starts a Function package: the
//!   entrypoint, then `--insecure` (or `--tls-certs-dir DIR`, or
//!   `$TLS_SERVER_CERTS_DIR`), listening on `:9443` (`0.0.0.0:9443` for the
//!   Python SDK) unless given `--address`. The Go functions serve
//!   `grpc.health.v1` (the v1 and v1beta1 service names and `""`); the Python
//!   SDK serves no health service, only reflection.
//! - Never give the Python SDK both `--insecure` and TLS certificates: it
//!   then opens two listeners on the same port (SO_REUSEPORT), one plain, one
//!   TLS, and calls land on either at random.
//! - grpc's C core (the Python SDK) aborts at start without `/dev/urandom`.
//! - The Python SDK logs JSON lines to stdout; the Go functions write to
//!   stderr only.

mod client;
pub mod controller;
mod go_function;
mod kubernetes;
mod package;
pub mod pod;
mod python_sdk;
pub mod render;
pub mod xr;

use std::path::PathBuf;

use anyhow::{Context, Result};

pub use self::client::{Api, Bench, Call, Latency, Outcome, TlsSeen, client_binary};
pub use self::go_function::{
    FUNCTION_PATH, FUNCTION_USER, GoFunction, RunningFunction, ServerTls, Variant, function_binary,
    go_function_image,
};
pub use self::kubernetes::{
    CLIENT_SECRET, CROSSPLANE_VERSION, Core, NAMESPACE, ROOT_CA_SECRET, crds_dir,
    crossplane_binary, loopback_ip,
};
pub use self::package::{
    AUTO_READY, CROSSPLANE_CONSTRAINT, PATCH_AND_TRANSFORM, UpstreamFunction, XPKG_ANNOTATION,
    package_image, package_yaml,
};
pub use self::python_sdk::{
    PYTHON_SDK_ANNOTATION, PYTHON_SDK_ENTRYPOINT, PYTHON_SDK_NAME, PYTHON_SDK_TAG, python_sdk_image,
};

/// A realistic v1 `RunFunctionRequest` in protojson, written as YAML
/// (`tests/data/crossplane/run_function_request.yaml`): an observed XPostgres
/// with two composed resources and connection details, the desired state of
/// an earlier step with three (`instance`, `subnet-group`, `security-group`),
/// `input`, `context` and `meta.tag` ([`SAMPLE_TAG`]).
pub const SAMPLE_REQUEST: &str = include_str!("../data/crossplane/run_function_request.yaml");

/// The `meta.tag` of [`SAMPLE_REQUEST`].
pub const SAMPLE_TAG: &str = "79f25aa4d9a91ec7e79899220dabe2c82672faa835946b605002a4d27c280767";

/// The names of the desired composed resources in [`SAMPLE_REQUEST`].
pub const SAMPLE_DESIRED_RESOURCES: &[&str] = &["instance", "security-group", "subnet-group"];

/// [`SAMPLE_REQUEST`]'s file.
pub fn sample_request_path() -> PathBuf {
    crate::workspace_root().join("tests/data/crossplane/run_function_request.yaml")
}

/// [`SAMPLE_REQUEST`] as protojson JSON.
pub fn sample_request_json() -> Result<String> {
    let value: serde_json::Value =
        serde_norway::from_str(SAMPLE_REQUEST).context("the sample request is not YAML")?;
    Ok(serde_json::to_string(&value)?)
}

/// The names a function's server certificate carries, as Crossplane makes
/// them for the function's Service: `NAME`, `NAME.NS`, `NAME.NS.svc` and
/// `NAME.NS.svc.cluster.local`. Crossplane dials `NAME.NS:9443`.
pub fn service_names(name: &str, namespace: &str) -> Vec<String> {
    vec![
        name.to_owned(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// A DeploymentRuntimeConfig `limited`: `FNRUN_TEST_SETTING=from-drc` and a
/// memory limit of 200Mi for the `package-runtime` container.
pub const LIMITED_RUNTIME_CONFIG: &str = r#"
apiVersion: pkg.crossplane.io/v1beta1
kind: DeploymentRuntimeConfig
metadata:
  name: limited
spec:
  deploymentTemplate:
    spec:
      selector: {}
      template:
        spec:
          containers:
            - name: package-runtime
              env:
                - name: FNRUN_TEST_SETTING
                  value: from-drc
              resources:
                limits:
                  memory: 200Mi
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_request_is_what_its_constants_say() {
        let request: serde_json::Value =
            serde_json::from_str(&sample_request_json().unwrap()).unwrap();
        assert_eq!(request["meta"]["tag"], SAMPLE_TAG);
        let desired: Vec<&str> = request["desired"]["resources"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(desired, SAMPLE_DESIRED_RESOURCES);
        assert_eq!(
            std::fs::read_to_string(sample_request_path()).unwrap(),
            SAMPLE_REQUEST
        );
        // The docs' example (examples/run-function-request.yaml) is this
        // request, which the tests send.
        assert_eq!(
            std::fs::read_to_string(
                crate::workspace_root().join("examples/run-function-request.yaml")
            )
            .unwrap(),
            SAMPLE_REQUEST
        );
    }

    #[test]
    fn service_names_are_crossplanes() {
        assert_eq!(
            service_names("fn-a", "crossplane-system"),
            [
                "fn-a",
                "fn-a.crossplane-system",
                "fn-a.crossplane-system.svc",
                "fn-a.crossplane-system.svc.cluster.local"
            ]
        );
    }
}
