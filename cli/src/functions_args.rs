//! The flags of `fnrun serve` for the function host, turned into its
//! [`FunctionsConfig`].

use std::path::PathBuf;

use clap::Args;
use fnrun_host::daemon::FunctionsConfig;

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
}

impl FunctionsArgs {
    /// Whether any function is configured: the host runs only then.
    pub fn enabled(&self) -> bool {
        self.config().enabled()
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
