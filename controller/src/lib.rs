//! Kubernetes mode: fnrun as Crossplane's function runtime, with no manual
//! step. Crossplane started with `--package-runtime=Function=External`
//! installs Function packages and activates their revisions; this controller
//! does the rest of what its Deployment runtime would:
//!
//! - every Function whose active FunctionRevision exists is served: its image
//!   (`status.resolvedImage`, else `spec.image`), pull secrets
//!   (`spec.packagePullSecrets` and the ImageConfig pull secrets Crossplane
//!   applied) and runtime config ([`desired`]) become a function of the
//!   host's catalogue, as a functions file would;
//! - server certificates are minted from the `crossplane-root-ca` Secret,
//!   read through the API and followed when it changes, and client
//!   certificates are verified against it;
//! - a trial start when a revision becomes Active: the image is pulled and
//!   its server answers once before `RuntimeHealthy` turns True;
//! - the leader (a `coordination.k8s.io` Lease) writes a Service per
//!   Function (owned by it), the revisions' `status.endpoint`,
//!   `tlsServerSecretName`, `RuntimeHealthy` and `RuntimeActive` (server-side
//!   apply on the status subresource), and Events. Every replica serves
//!   every function. A Service of a Function's name that fnrun did not make
//!   ([`status::made_by_fnrun`]) is never written nor deleted: the revision
//!   says why instead, and has no endpoint;
//! - the host's readiness (`/readyz`, and every TLS handshake refused as
//!   not ready until then) turns ready once the API is read, every Function
//!   with an active revision tried once and the certificates minted.
//!
//! [`run`] watches with kube-rs reflectors and drives a `Controller` of
//! Functions; everything it reads or writes is in [`resources`] and
//! [`status`].

pub mod desired;
mod reconcile;
pub mod resources;
pub mod status;

use std::collections::BTreeMap;

pub use reconcile::run;

/// The default name of the Secret holding Crossplane's CA.
pub const DEFAULT_CA_SECRET: &str = "crossplane-root-ca";
/// The default name of the Lease the replicas elect their leader with.
pub const DEFAULT_LEASE: &str = "fnrun-functions";
/// The field manager of everything fnrun writes.
pub const FIELD_MANAGER: &str = "fnrun";
/// The port of every function's Service and endpoint, as Crossplane's
/// Deployment runtime has it.
pub const SERVICE_PORT: u16 = 9443;

/// How Kubernetes mode runs (from `fnrun serve --functions-kubernetes`'s
/// flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// Crossplane's namespace: the Services, the CA Secret, pull secrets and
    /// the Lease are there.
    pub namespace: String,
    /// The Secret holding Crossplane's CA (`tls.crt`, `tls.key`); `None`:
    /// the listener serves h2c and needs none.
    pub ca_secret: Option<String>,
    /// This replica's name in the Lease (the pod's name).
    pub identity: String,
    pub lease: String,
    /// The labels of fnrun's pods, which each function's Service selects.
    pub service_selector: BTreeMap<String, String>,
    /// How long a function's warm instance stays without calls; `None`:
    /// until the function goes.
    pub idle_timeout: Option<std::time::Duration>,
    /// How long the start may take to read every object it watches; past
    /// it, [`run`] fails, naming what it could not read and why.
    pub start_timeout: std::time::Duration,
}
