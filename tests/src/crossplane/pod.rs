//! The real Crossplane core as a user installs it into a cluster, on the
//! tests' Kubernetes node ([`Node`], with [`Options::controllers`]): an image
//! of the `crossplane` binary the tests build ([`crossplane_binary`], its
//! CRDs at `/crds` as Crossplane's image has them) imported into containerd,
//! then the objects of Crossplane's Helm chart (`cluster/charts/crossplane`
//! of the module, at [`CROSSPLANE_VERSION`]) with its default values, except:
//!
//! - no RBAC manager: the ServiceAccount `crossplane` is bound to the
//!   ClusterRole `cluster-admin` instead of the chart's ClusterRole
//!   `crossplane`, which the RBAC manager's aggregated ClusterRoles (one per
//!   XRD and per provider) extend at run time;
//! - webhooks off (`ENABLE_WEBHOOKS=false` in both containers, as the chart
//!   sets with `webhooks.enabled=false`), as [`super::Core`] runs it;
//! - the function runtime a parameter ([`Runtime`]):
//!   `--package-runtime=Function=External` (fnrun serves the Functions) or
//!   `Function=Deployment` (Crossplane's own: a Deployment and a headless
//!   Service per Function);
//! - the chart's resources (limits `500m`/`1024Mi`) left out: a test node is
//!   small, and `GOMAXPROCS`/`GOMEMLIMIT` are then Go's defaults.
//!
//! That is: the namespace `crossplane-system`, the ServiceAccount
//! `crossplane`, the empty Secrets `crossplane-root-ca`,
//! `crossplane-tls-server` and `crossplane-tls-client` (which `core init`
//! fills), and the Deployment `crossplane` (label `app: crossplane`, as
//! `deploy/crossplane/networkpolicy.yaml` expects): `crossplane core init` as
//! its init container (CRDs, the CA, the client and server certificates),
//! then `crossplane core start`, uid 65532, read-only root, the package cache
//! an emptyDir, the client certificate mounted from its Secret. Crossplane
//! reaches the API server through the `kubernetes` Service with its
//! ServiceAccount's token, and Functions through cluster DNS
//! (`dns:///NAME.crossplane-system:9443`, CoreDNS). Packages are pulled from
//! a test registry on the node's address: go-containerregistry speaks plain
//! HTTP to a private address (RFC 1918) without being told.
//!
//! ```no_run
//! use fnrun_tests::crossplane::pod::{Crossplane, Runtime};
//! use fnrun_tests::node::{Node, Options};
//!
//! let node = Node::start_with(Options { controllers: true }).unwrap();
//! let crossplane = Crossplane::install(&node, Runtime::External, &[]).unwrap();
//! println!("{}", crossplane.logs(&node));
//! ```

use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::kubernetes::{
    CLIENT_SECRET, CROSSPLANE_VERSION, NAMESPACE, ROOT_CA_SECRET, crds_dir, crossplane_binary,
};
use crate::image::TestImage;
use crate::node::Node;
#[cfg(doc)]
use crate::node::Options;

/// Crossplane's image in containerd.
pub const IMAGE_NAME: &str = "fnrun.test/crossplane";

/// The Deployment's name (and its pods' label `app`).
pub const DEPLOYMENT: &str = "crossplane";

/// The Secret `core init` fills with the webhooks' server certificate.
pub const SERVER_SECRET: &str = "crossplane-tls-server";

/// How long Crossplane may take to roll out (`core init` installs its CRDs).
const ROLLOUT: &str = "240s";

/// Who runs the Functions Crossplane installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `--package-runtime=Function=External`: another runtime (fnrun's
    /// Kubernetes mode) serves each Function at its revision's endpoint.
    External,
    /// `--package-runtime=Function=Deployment`: Crossplane's own, a
    /// Deployment and a Service per Function.
    Deployment,
}

impl Runtime {
    /// The value of `--package-runtime`.
    pub fn flag(self) -> &'static str {
        match self {
            Runtime::External => "--package-runtime=Function=External",
            Runtime::Deployment => "--package-runtime=Function=Deployment",
        }
    }
}

/// Crossplane installed on a node; deleted with the node (its pods are
/// deleted at the node's stop).
pub struct Crossplane {
    pub runtime: Runtime,
}

impl Crossplane {
    /// Builds (once) Crossplane's image, imports it into the node's
    /// containerd, applies the chart's objects (see the module's
    /// documentation) with `runtime` and `args` after `core start`, and waits
    /// until the Deployment is rolled out (its startup probe passed) and
    /// Crossplane's kinds are served.
    pub fn install(node: &Node, runtime: Runtime, args: &[&str]) -> Result<Crossplane> {
        let image = TestImage::scratch()
            .tag(CROSSPLANE_VERSION)
            .binary(crossplane_binary()?, "/usr/local/bin/crossplane")
            .host_copy(crds_dir()?, "/crds")
            .dir("/tmp", 0o1777)
            .entrypoint(["/usr/local/bin/crossplane"])
            .user("65532:65532")
            .build()?;
        let reference = node.import_image(&image, IMAGE_NAME)?;
        node.cp().apply(&manifests(&reference, runtime, args))?;
        let out = node.kubectl(&[
            "rollout",
            "status",
            &format!("deployment/{DEPLOYMENT}"),
            "-n",
            NAMESPACE,
            &format!("--timeout={ROLLOUT}"),
        ]);
        let crossplane = Crossplane { runtime };
        if let Err(e) = out {
            bail!(
                "Crossplane did not roll out: {e:#}\n{}\n{}",
                crossplane.describe(node),
                node.log_tails()
            );
        }
        // The package manager's kinds, which fnrun watches.
        for _ in 0..120 {
            if node
                .kubectl(&["get", "functions.pkg.crossplane.io", "-o", "name"])
                .is_ok()
            {
                return Ok(crossplane);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!(
            "Crossplane's Function kind is not served:\n{}",
            crossplane.describe(node)
        )
    }

    /// Crossplane's log (both containers), through the API server and
    /// kubelet.
    pub fn logs(&self, node: &Node) -> String {
        node.kubectl(&[
            "logs",
            &format!("deployment/{DEPLOYMENT}"),
            "-n",
            NAMESPACE,
            "--all-containers",
            "--tail=200",
        ])
        .unwrap_or_else(|e| format!("(no log: {e:#})"))
    }

    /// Crossplane's pods as YAML, and its log: for a failure message.
    pub fn describe(&self, node: &Node) -> String {
        format!(
            "{}\n--- crossplane ---\n{}",
            node.kubectl(&[
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "app=crossplane",
                "-o",
                "yaml"
            ])
            .unwrap_or_default(),
            self.logs(node)
        )
    }

    /// Crossplane's client certificate, as `core init` wrote it into the
    /// Secret `crossplane-tls-client` (and its pod mounts it): written to
    /// files in `dir`, to call a function as Crossplane does.
    pub fn client_tls(&self, node: &Node, dir: &std::path::Path) -> Result<crate::certs::TlsFiles> {
        std::fs::create_dir_all(dir)?;
        for key in ["ca.crt", "tls.crt", "tls.key"] {
            let pem = node.kubectl(&[
                "get",
                "secret",
                CLIENT_SECRET,
                "-n",
                NAMESPACE,
                "-o",
                &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
            ])?;
            if !pem.contains("-----BEGIN") {
                bail!("{CLIENT_SECRET} has no {key}: {pem:?}");
            }
            std::fs::write(dir.join(key), pem).context("cannot write the client certificate")?;
        }
        Ok(crate::certs::TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
            dir: dir.to_owned(),
        })
    }
}

/// The Crossplane v1 release whose composition functions (alpha, v1.11 to
/// v1.13) call a v1alpha1 runner: `deploy/sidecar/`'s peer.
pub const V1_VERSION: &str = "v1.13.2";

/// Crossplane [`V1_VERSION`]'s core binary, built once from
/// `tests/go/upstream/crossplane-v1`, version-stamped.
pub fn v1_binary() -> Result<std::path::PathBuf> {
    crate::go::Toolchain::find()?.build_upstream_with(
        "crossplane-v1",
        "github.com/crossplane/crossplane/cmd/crossplane",
        "crossplane-v1",
        &format!("-X github.com/crossplane/crossplane/internal/version.version={V1_VERSION}"),
    )
}

impl Crossplane {
    /// Crossplane [`V1_VERSION`] as its v1.13 Helm chart installs it with
    /// `args` (`--enable-composition-functions`) and `xfn.enabled=false` (no
    /// runner of its own), webhooks off (no `WEBHOOK_TLS_SECRET_NAME`), the
    /// ServiceAccount bound to `cluster-admin` (no RBAC manager): `core init`
    /// as its init container, then `core start`; waits until it is rolled
    /// out.
    pub fn install_v1(node: &Node, args: &[&str]) -> Result<Crossplane> {
        let go = crate::go::Toolchain::find()?;
        let crds = go
            .module_dir("crossplane-v1", "github.com/crossplane/crossplane")?
            .join("cluster/crds");
        let image = TestImage::scratch()
            .tag(V1_VERSION)
            .binary(v1_binary()?, "/usr/local/bin/crossplane")
            .host_copy(crds, "/crds")
            .dir("/tmp", 0o1777)
            .entrypoint(["/usr/local/bin/crossplane"])
            .user("65532:65532")
            .build()?;
        let reference = node.import_image(&image, IMAGE_NAME)?;
        let mut start = vec!["core", "start"];
        start.extend_from_slice(args);
        let start = serde_json::to_string(&start).expect("strings serialise");
        let env = "
        - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: POD_SERVICE_ACCOUNT, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}";
        node.cp().apply(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: crossplane, namespace: {NAMESPACE}, labels: {{app: crossplane}}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: crossplane-cluster-admin, labels: {{app: crossplane}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}
subjects: [{{kind: ServiceAccount, name: crossplane, namespace: {NAMESPACE}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {DEPLOYMENT}
  namespace: {NAMESPACE}
  labels: {{app: crossplane, release: crossplane}}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: crossplane, release: crossplane}}
  strategy: {{type: RollingUpdate}}
  template:
    metadata:
      labels: {{app: crossplane, release: crossplane}}
    spec:
      serviceAccountName: crossplane
      terminationGracePeriodSeconds: 5
      initContainers:
      - name: crossplane-init
        image: {reference}
        imagePullPolicy: IfNotPresent
        args: [core, init]
        securityContext:
          runAsUser: 65532
          runAsGroup: 65532
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
        env:{env}
      containers:
      - name: crossplane
        image: {reference}
        imagePullPolicy: IfNotPresent
        args: {start}
        ports:
        - {{name: readyz, containerPort: 8081}}
        securityContext:
          runAsUser: 65532
          runAsGroup: 65532
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
        env:{env}
        - {{name: LEADER_ELECTION, value: "true"}}
        volumeMounts:
        - {{mountPath: /cache, name: package-cache}}
      volumes:
      - name: package-cache
        emptyDir: {{sizeLimit: 20Mi}}
"#
        ))?;
        let crossplane = Crossplane {
            runtime: Runtime::External,
        };
        crossplane.rolled_out(node)?;
        Ok(crossplane)
    }

    /// Waits until the Deployment `crossplane` is rolled out.
    pub fn rolled_out(&self, node: &Node) -> Result<()> {
        let out = node.kubectl(&[
            "rollout",
            "status",
            &format!("deployment/{DEPLOYMENT}"),
            "-n",
            NAMESPACE,
            &format!("--timeout={ROLLOUT}"),
        ]);
        if let Err(e) = out {
            bail!(
                "Crossplane did not roll out: {e:#}\n{}\n{}",
                self.describe(node),
                node.log_tails()
            );
        }
        Ok(())
    }
}

/// The chart's objects for `image` (see the module's documentation).
pub fn manifests(image: &str, runtime: Runtime, args: &[&str]) -> String {
    let mut start_args = vec!["core", "start", runtime.flag()];
    start_args.extend_from_slice(args);
    let start_args = serde_json::to_string(&start_args).expect("strings serialise");
    let env = |container: &str| {
        format!(
            r#"
        - {{name: POD_NAMESPACE, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
        - {{name: POD_SERVICE_ACCOUNT, valueFrom: {{fieldRef: {{fieldPath: spec.serviceAccountName}}}}}}
        - {{name: ENABLE_WEBHOOKS, value: "false"}}
        - {{name: TLS_SERVER_SECRET_NAME, value: {SERVER_SECRET}}}
        - {{name: TLS_CLIENT_SECRET_NAME, value: {CLIENT_SECRET}}}{container}"#
        )
    };
    let init_env = env(&format!(
        "\n        - {{name: TLS_CA_SECRET_NAME, value: {ROOT_CA_SECRET}}}"
    ));
    let start_env = env("\n        - {name: LEADER_ELECTION, value: \"true\"}\
         \n        - {name: TLS_SERVER_CERTS_DIR, value: /tls/server}\
         \n        - {name: TLS_CLIENT_CERTS_DIR, value: /tls/client}");
    let secrets: String = [ROOT_CA_SECRET, SERVER_SECRET, CLIENT_SECRET]
        .iter()
        .map(|name| {
            format!(
                "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\ntype: Opaque\n"
            )
        })
        .collect();
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: crossplane, namespace: {NAMESPACE}, labels: {{app: crossplane}}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: crossplane-cluster-admin, labels: {{app: crossplane}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}
subjects: [{{kind: ServiceAccount, name: crossplane, namespace: {NAMESPACE}}}]
{secrets}---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {DEPLOYMENT}
  namespace: {NAMESPACE}
  labels: {{app: crossplane, release: crossplane}}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: crossplane, release: crossplane}}
  strategy: {{type: RollingUpdate}}
  template:
    metadata:
      labels: {{app: crossplane, release: crossplane}}
      annotations:
        prometheus.io/path: /metrics
        prometheus.io/port: "8080"
        prometheus.io/scrape: "true"
    spec:
      serviceAccountName: crossplane
      hostNetwork: false
      terminationGracePeriodSeconds: 5
      initContainers:
      - name: crossplane-init
        image: {image}
        imagePullPolicy: IfNotPresent
        args: [core, init]
        securityContext:
          runAsUser: 65532
          runAsGroup: 65532
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
        env:{init_env}
      containers:
      - name: crossplane
        image: {image}
        imagePullPolicy: IfNotPresent
        args: {start_args}
        startupProbe:
          failureThreshold: 30
          periodSeconds: 2
          tcpSocket: {{port: readyz}}
        ports:
        - {{name: readyz, containerPort: 8081}}
        - {{name: metrics, containerPort: 8080}}
        securityContext:
          runAsUser: 65532
          runAsGroup: 65532
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
        env:{start_env}
        volumeMounts:
        - {{mountPath: /cache/xpkg, name: package-cache}}
        - {{mountPath: /cache/xfn, name: function-cache}}
        - {{mountPath: /tls/server, name: tls-server-certs}}
        - {{mountPath: /tls/client, name: tls-client-certs}}
      volumes:
      - name: package-cache
        emptyDir: {{sizeLimit: 20Mi}}
      - name: function-cache
        emptyDir: {{sizeLimit: 512Mi}}
      - name: tls-server-certs
        secret: {{secretName: {SERVER_SECRET}}}
      - name: tls-client-certs
        secret: {{secretName: {CLIENT_SECRET}}}
"#
    )
}
