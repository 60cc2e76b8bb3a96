//! What a registry request can fail with, and how oci-client's errors and a
//! registry's answers map to it. Messages never include credentials.

use std::path::PathBuf;

use oci_client::errors::{OciDistributionError, OciEnvelope, OciErrorCode};

use super::repo::Repo;
use crate::digest::truncate;

/// A registry request that failed. Messages never include credentials.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{reference}: {what} not found in the registry ({detail})")]
    NotFound {
        reference: String,
        what: &'static str,
        detail: String,
    },
    #[error(
        "{reference}: the registry refused access; the credentials are missing or wrong, or the repository does not exist ({detail})"
    )]
    Unauthorized { reference: String, detail: String },
    #[error("{reference}: registry {registry} is unavailable: {detail}")]
    Unavailable {
        reference: String,
        registry: String,
        detail: String,
    },
    #[error("{reference}: the registry sent an invalid {what}: {detail}")]
    Invalid {
        reference: String,
        what: &'static str,
        detail: String,
    },
    #[error(
        "{reference}: {what} digest mismatch: expected {expected}, got {actual}; nothing was stored"
    )]
    DigestMismatch {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("{reference}: {what} {digest} is larger than {limit} bytes")]
    TooLarge {
        reference: String,
        what: &'static str,
        digest: String,
        limit: u64,
    },
    #[error("{reference}: {what} {digest} is {actual} bytes but its descriptor says {expected}")]
    SizeMismatch {
        reference: String,
        what: &'static str,
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "no rustls crypto provider is installed in this process: install one (e.g. rustls::crypto::ring::default_provider().install_default()) before opening the cache"
    )]
    NoCryptoProvider,
    #[error("invalid CA bundle: {0}")]
    CaBundle(#[from] CaBundleError),
    #[error("failed to {op} {path}: {err}")]
    Io {
        op: &'static str,
        path: PathBuf,
        err: std::io::Error,
    },
}

/// A `--ca-bundle` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    #[error("the file is not PEM text")]
    NotText,
    #[error("certificate {index} has no END line")]
    Unterminated { index: usize },
    #[error("certificate {index} is invalid: {err}")]
    Invalid { index: usize, err: reqwest::Error },
    #[error("no PEM certificate (BEGIN CERTIFICATE) found")]
    Empty,
}

impl RegistryError {
    /// Its class.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            RegistryError::NotFound { .. } => K::NotFound,
            RegistryError::Unauthorized { .. } => K::Unauthorized,
            RegistryError::Unavailable { .. } => K::Unavailable,
            RegistryError::Io { .. }
            | RegistryError::CaBundle(_)
            | RegistryError::NoCryptoProvider => K::Internal,
            RegistryError::Invalid { .. }
            | RegistryError::DigestMismatch { .. }
            | RegistryError::TooLarge { .. }
            | RegistryError::SizeMismatch { .. } => K::Corrupt,
        }
    }
}

/// Renders an error with its sources, shortened.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let m = src.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = src.source();
    }
    truncate(&s)
}

/// The error oci-client makes of a response with `status` other than 200 and `body`,
/// for [`map_error`].
pub(super) fn response_error(
    status: reqwest::StatusCode,
    body: &[u8],
    url: &str,
) -> OciDistributionError {
    let url = url.to_owned();
    match status {
        reqwest::StatusCode::UNAUTHORIZED => OciDistributionError::UnauthorizedError { url },
        s if s.is_success() => {
            OciDistributionError::SpecViolationError(format!("expected HTTP status 200, got {s}"))
        }
        s => match serde_json::from_slice::<OciEnvelope>(body) {
            Ok(envelope) if s.is_client_error() => {
                OciDistributionError::RegistryError { envelope, url }
            }
            _ => OciDistributionError::ServerError {
                code: s.as_u16(),
                url,
                message: String::from_utf8_lossy(body).into_owned(),
            },
        },
    }
}

pub(super) fn map_error(e: OciDistributionError, repo: &Repo, what: &'static str) -> RegistryError {
    let reference = repo.reference.clone();
    let unavailable = |detail: String| RegistryError::Unavailable {
        reference: repo.reference.clone(),
        registry: repo.registry.clone(),
        detail,
    };
    match e {
        OciDistributionError::UnauthorizedError { .. } => RegistryError::Unauthorized {
            reference,
            detail: "HTTP 401".into(),
        },
        OciDistributionError::AuthenticationFailure(reason) => RegistryError::Unauthorized {
            reference,
            detail: format!("token request refused: {}", truncate(reason.trim())),
        },
        OciDistributionError::RegistryError { envelope, .. } => {
            let detail = truncate(
                &envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}: {}", e.code, e.message))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            let has = |f: fn(&OciErrorCode) -> bool| envelope.errors.iter().any(|e| f(&e.code));
            if has(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                RegistryError::Unauthorized { reference, detail }
            } else if has(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                        | OciErrorCode::NameInvalid
                        | OciErrorCode::TagInvalid
                )
            }) {
                RegistryError::NotFound {
                    reference,
                    what,
                    detail,
                }
            } else if has(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestInvalid | OciErrorCode::DigestInvalid
                )
            }) {
                RegistryError::Invalid {
                    reference,
                    what,
                    detail,
                }
            } else {
                unavailable(detail)
            }
        }
        OciDistributionError::ServerError { code, message, .. } => {
            let detail = format!("HTTP {code}: {}", truncate(message.trim()));
            match code {
                404 => RegistryError::NotFound {
                    reference,
                    what,
                    detail,
                },
                401 | 403 => RegistryError::Unauthorized { reference, detail },
                _ => unavailable(detail),
            }
        }
        OciDistributionError::ImageManifestNotFoundError(m) => RegistryError::NotFound {
            reference,
            what,
            detail: truncate(&m),
        },
        OciDistributionError::DigestError(d) => RegistryError::Invalid {
            reference,
            what,
            detail: format!("digest verification failed: {}", chain(&d)),
        },
        e @ (OciDistributionError::ManifestParsingError(_)
        | OciDistributionError::VersionedParsingError(_)
        | OciDistributionError::UnsupportedMediaTypeError(_)
        | OciDistributionError::UnsupportedSchemaVersionError(_)
        | OciDistributionError::SpecViolationError(_)
        | OciDistributionError::ManifestEncodingError(_)
        | OciDistributionError::JsonError(_)) => RegistryError::Invalid {
            reference,
            what,
            detail: chain(&e),
        },
        e => unavailable(chain(&e)),
    }
}
