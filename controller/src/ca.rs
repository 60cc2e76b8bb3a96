//! The CA of the listener: read from Crossplane's CA Secret (through a
//! store the controller watches), followed when it changes, and turned into
//! the minter of the functions' server certificates and the client CA.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use fnrun_host::certs::Minter;
use fnrun_host::tls::ClientCa;

use crate::Config;

/// The CA of the listener, from its Secret.
pub(crate) enum Ca {
    /// The listener serves h2c.
    NotUsed,
    /// Not read yet, or the Secret cannot be used: why.
    Unusable {
        version: Option<String>,
        why: String,
    },
    Ready {
        version: String,
        minter: Arc<Minter>,
    },
}

impl Ca {
    /// Before the Secret is read.
    pub(crate) fn new(config: &Config) -> Ca {
        match config.ca_secret {
            Some(_) => Ca::Unusable {
                version: None,
                why: "not read yet".into(),
            },
            None => Ca::NotUsed,
        }
    }

    /// The Secret version certificates are minted from.
    pub(crate) fn version(&self) -> Option<String> {
        match self {
            Ca::Ready { version, .. } => Some(version.clone()),
            _ => None,
        }
    }

    /// Why no function can be served over TLS, if so.
    pub(crate) fn problem(&self, config: &Config) -> Option<String> {
        match self {
            Ca::Unusable { why, .. } => Some(format!(
                "the CA Secret {}/{}: {why}",
                config.namespace,
                config.ca_secret.as_deref().unwrap_or_default()
            )),
            _ => None,
        }
    }

    /// Reads `secret` (the Secret as the store has it, `None`: there is
    /// none) again if it changed; its certificate becomes the client CA.
    pub(crate) fn refresh(
        &mut self,
        secret: Option<Arc<Secret>>,
        config: &Config,
        client_ca: Option<&Arc<ClientCa>>,
    ) {
        let Some(secret_name) = &config.ca_secret else {
            return;
        };
        let ns = &config.namespace;
        let version = secret.as_ref().and_then(|s| s.resource_version());
        let current = match self {
            Ca::Ready { version, .. } => Some(version.clone()),
            Ca::Unusable { version, .. } => version.clone(),
            Ca::NotUsed => return,
        };
        if version.is_some() && version == current {
            return;
        }
        let Some(secret) = secret else {
            if !matches!(self, Ca::Unusable { version: None, why } if why.starts_with("does not")) {
                tracing::error!(
                    secret = format!("{ns}/{secret_name}"),
                    "the CA Secret does not exist: no function can be served over TLS"
                );
            }
            *self = Ca::Unusable {
                version: None,
                why: "does not exist".into(),
            };
            return;
        };
        let version = version.unwrap_or_default();
        let key = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| b.0.clone())
                .unwrap_or_default()
        };
        let (cert, key_pem) = (key("tls.crt"), key("tls.key"));
        let origin = |k: &str| format!("secret {ns}/{secret_name} {k}");
        let cert_origin = origin("tls.crt");
        let minter = Minter::from_pem(
            Path::new(&cert_origin),
            &cert,
            Path::new(&origin("tls.key")),
            &key_pem,
        )
        .map_err(|e| e.to_string())
        .and_then(|minter| {
            if let Some(client_ca) = client_ca {
                client_ca
                    .replace(Path::new(&cert_origin), &cert)
                    .map_err(|e| e.to_string())?;
            }
            Ok(minter)
        });
        *self = match minter {
            Ok(minter) => {
                tracing::info!(
                    secret = format!("{ns}/{secret_name}"),
                    version,
                    "CA read: minting the functions' certificates from it"
                );
                Ca::Ready {
                    version,
                    minter: Arc::new(minter),
                }
            }
            Err(why) => {
                tracing::error!(
                    secret = format!("{ns}/{secret_name}"),
                    error = why,
                    "the CA Secret cannot be used: no function can be served over TLS"
                );
                Ca::Unusable {
                    version: Some(version),
                    why,
                }
            }
        };
    }
}
