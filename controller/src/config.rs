//! How Kubernetes mode runs, and the names it uses: a leaf module, which
//! every other one may use.

use std::collections::BTreeMap;

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
    /// it, [`crate::run`] fails, naming what it could not read and why.
    pub start_timeout: std::time::Duration,
}
