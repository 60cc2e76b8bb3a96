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
    /// Which limits this host can enforce, and what becomes of a Function
    /// whose runtime config asks for one it cannot.
    pub limits: LimitPolicy,
}

/// The limits this host can enforce (the runner's), and what to do with a
/// Function whose DeploymentRuntimeConfig asks for one it cannot: by
/// default its revision's `RuntimeHealthy` is False, saying why (reason
/// [`crate::status::REASON_UNENFORCEABLE`]), no trial start is made, and
/// its calls are refused with FAILED_PRECONDITION naming the limit; with
/// `--best-effort-limits` it runs without that limit, and its condition,
/// True, says so.
#[derive(Debug, Clone)]
pub struct LimitPolicy {
    pub support: fnrun_sandbox::LimitSupport,
    pub best_effort: bool,
}

impl LimitPolicy {
    /// What `requested` asks that this host cannot enforce, as a sentence;
    /// `None` when it can enforce all of it.
    pub fn unenforceable(&self, requested: &fnrun_sandbox::Limits) -> Option<String> {
        let missing = self.support.unenforceable(requested);
        if missing.is_empty() {
            return None;
        }
        let what: Vec<String> = missing
            .iter()
            .map(|(what, why)| format!("{what} ({why})"))
            .collect();
        Some(format!(
            "its DeploymentRuntimeConfig sets limits this fnrun cannot enforce: {}",
            what.join("; ")
        ))
    }
}
