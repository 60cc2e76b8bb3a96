//! The flags of `fnrun serve` for the function host, turned into its
//! [`FunctionsConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use fnrun_host::daemon::{ExternalConfig, FunctionsConfig};

/// Crossplane v1 functions (Function packages), served as Crossplane's
/// External function runtime.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Crossplane v1 functions")]
pub struct FunctionsArgs {
    /// Functions file (YAML; see docs/crossplane.md). SIGHUP reloads it.
    #[arg(long = "functions", value_name = "FILE", value_parser = crate::config::parse_path)]
    pub functions_file: Option<PathBuf>,
    /// A function with every default. Repeatable.
    #[arg(long = "function", value_name = "NAME=IMAGE")]
    pub function: Vec<String>,
    /// Where functions are served: HOST:PORT, unix:PATH or unix-abstract:NAME.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9443")]
    pub functions_listen: String,
    /// The namespace of the functions' Services: NAME answers to NAME,
    /// NAME.NAMESPACE and NAME.NAMESPACE.svc.
    #[arg(long, value_name = "NS", default_value = "crossplane-system")]
    pub functions_namespace: String,
    /// CA bundle (PEM) that client certificates must be signed by (mTLS).
    #[arg(long, value_name = "FILE", value_parser = crate::config::parse_path)]
    pub functions_client_ca: Option<PathBuf>,
    /// CA certificate (PEM) to mint each function's server certificate from.
    #[arg(
        long,
        value_name = "FILE",
        requires = "functions_ca_key",
        conflicts_with = "functions_certs_dir",
        value_parser = crate::config::parse_path,
    )]
    pub functions_ca_cert: Option<PathBuf>,
    /// The CA's private key (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[arg(long, value_name = "FILE", requires = "functions_ca_cert", value_parser = crate::config::parse_path)]
    pub functions_ca_key: Option<PathBuf>,
    /// A directory with DIR/NAME/tls.crt and DIR/NAME/tls.key per function.
    #[arg(long, value_name = "DIR", value_parser = crate::config::parse_path)]
    pub functions_certs_dir: Option<PathBuf>,
    /// How often the functions file is checked for changes, which are then
    /// applied as SIGHUP applies them (a mounted ConfigMap changes so); 0:
    /// only on SIGHUP.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = fnrun_api::duration::parse)]
    pub functions_check_interval: std::time::Duration,
    /// Serve plain h2c, without TLS (local use only).
    #[arg(
        long,
        conflicts_with_all = ["functions_client_ca", "functions_ca_cert", "functions_certs_dir"]
    )]
    pub functions_insecure: bool,
    /// Kubernetes mode: serve every Function installed in Crossplane (started
    /// with --package-runtime=Function=External), read from the API server
    /// (in a pod: its service account; else KUBECONFIG), with a Service per
    /// Function, certificates minted from Crossplane's CA Secret, and the
    /// revisions' runtime status written (docs/crossplane.md).
    #[arg(
        long,
        conflicts_with_all = [
            "functions_file", "function", "functions_client_ca", "functions_ca_cert",
            "functions_ca_key", "functions_certs_dir",
        ]
    )]
    pub functions_kubernetes: bool,
    /// Kubernetes mode: the Secret (in --functions-namespace) holding
    /// Crossplane's CA (tls.crt, tls.key).
    #[arg(long, value_name = "NAME", default_value = fnrun_controller::DEFAULT_CA_SECRET)]
    pub functions_ca_secret: String,
    /// Kubernetes mode: the labels of fnrun's pods, which each function's
    /// Service selects.
    #[arg(
        long,
        value_name = "KEY=VALUE,...",
        default_value = "app.kubernetes.io/name=fnrun,app.kubernetes.io/component=functions"
    )]
    pub functions_service_selector: String,
    /// Kubernetes mode: the Lease (in --functions-namespace) the replicas
    /// elect the one that writes with.
    #[arg(long, value_name = "NAME", default_value = fnrun_controller::DEFAULT_LEASE)]
    pub functions_lease: String,
    /// Kubernetes mode: this replica's name in the Lease (default: the host
    /// name, a pod's name).
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub functions_identity: Option<String>,
    /// Kubernetes mode: how long a function's warm instance (started by its
    /// trial or a call) stays without calls; 0: until the function goes.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = fnrun_api::duration::parse)]
    pub functions_idle_timeout: std::time::Duration,
    /// Kubernetes mode: how long the start may take to read Functions, their
    /// revisions, runtime configs, ImageConfigs, Services and the CA Secret
    /// through the API; past it, fnrun exits, naming what it could not read
    /// and why (a permission rbac.yaml lacks, say).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = fnrun_api::duration::parse)]
    pub functions_start_timeout: std::time::Duration,
}

impl FunctionsArgs {
    /// Whether any function is configured: the host runs only then.
    pub fn enabled(&self) -> bool {
        self.functions_kubernetes || self.config().enabled()
    }

    /// Kubernetes mode's settings, if it is on.
    pub fn kubernetes(
        &self,
        limits: fnrun_controller::LimitPolicy,
    ) -> anyhow::Result<Option<(ExternalConfig, fnrun_controller::Config)>> {
        if !self.functions_kubernetes {
            return Ok(None);
        }
        let service_selector = parse_selector(&self.functions_service_selector)
            .map_err(|e| anyhow::anyhow!("--functions-service-selector: {e}"))?;
        let identity = match &self.functions_identity {
            Some(identity) if !identity.is_empty() => identity.clone(),
            _ => nix::unistd::gethostname()
                .map_err(|e| anyhow::anyhow!("--functions-identity: no host name to take: {e}"))?
                .to_string_lossy()
                .into_owned(),
        };
        let listener = ExternalConfig {
            listen: self.functions_listen.clone(),
            namespace: self.functions_namespace.clone(),
            insecure: self.functions_insecure,
        };
        let controller = fnrun_controller::Config {
            namespace: self.functions_namespace.clone(),
            ca_secret: (!self.functions_insecure).then(|| self.functions_ca_secret.clone()),
            identity,
            lease: self.functions_lease.clone(),
            service_selector,
            idle_timeout: (!self.functions_idle_timeout.is_zero())
                .then_some(self.functions_idle_timeout),
            start_timeout: self.functions_start_timeout,
            limits,
        };
        Ok(Some((listener, controller)))
    }

    /// The flags as the function host's configuration.
    pub fn config(&self) -> FunctionsConfig {
        FunctionsConfig {
            functions_file: self.functions_file.clone(),
            function: self.function.clone(),
            functions_listen: self.functions_listen.clone(),
            functions_namespace: self.functions_namespace.clone(),
            functions_client_ca: self.functions_client_ca.clone(),
            functions_ca_cert: self.functions_ca_cert.clone(),
            functions_ca_key: self.functions_ca_key.clone(),
            functions_certs_dir: self.functions_certs_dir.clone(),
            functions_check_interval: self.functions_check_interval,
            functions_insecure: self.functions_insecure,
        }
    }
}

/// The labels of a selector flag, `K=V,K=V`.
pub fn parse_selector(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not KEY=VALUE"))?;
        if k.is_empty() || k.len() > 317 || v.len() > 63 {
            return Err(format!("{pair:?} is not a label"));
        }
        labels.insert(k.to_owned(), v.to_owned());
    }
    if labels.is_empty() {
        return Err("no label".to_owned());
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_key_value_pairs() {
        let labels = parse_selector("a=b,c.d/e=f").unwrap();
        assert_eq!(labels.len(), 2);
        assert_eq!(labels["c.d/e"], "f");
        assert!(parse_selector("").is_err());
        assert!(parse_selector("a").is_err());
    }
}
