//! OCI and Docker schema 2 manifests, indexes (manifest lists) and image configs.
//!
//! Parsed with small lenient serde structs instead of oci-spec's strict types so that
//! images written by older tools (missing optional fields, unusual `created` dates)
//! still load; every digest is validated into [`Digest`] here.

use std::collections::HashMap;

use serde::Deserialize;

use crate::digest::{Digest, DigestError, truncate};
use crate::kind::ErrorKind;

/// Size cap for manifests, indexes, index.json and image configs.
pub const MAX_METADATA_BYTES: u64 = 4 << 20;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// The `Accept` list sent to registries.
pub const ACCEPTED_MANIFESTS: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// The annotation an OCI layout's index.json uses for tags.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// A manifest, index or config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{what} {digest} is not valid JSON: {err}")]
    Json {
        what: &'static str,
        digest: String,
        err: serde_json::Error,
    },
    #[error("{what} {digest} is invalid: {reason}")]
    Invalid {
        what: &'static str,
        digest: String,
        reason: InvalidManifest,
    },
    #[error("{what} {digest} has an invalid digest: {err}")]
    BadDigest {
        what: &'static str,
        digest: String,
        err: DigestError,
    },
    #[error("manifest {digest} is not supported: {reason}")]
    Unsupported {
        digest: String,
        reason: UnsupportedManifest,
    },
    #[error("index {digest} has no image for {wanted} (available: {available})")]
    NoPlatform {
        digest: String,
        wanted: String,
        available: String,
    },
    #[error("image {digest} is built for {os}, not linux")]
    WrongOs { digest: String, os: String },
}

/// What makes a manifest, index or config invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidManifest {
    #[error("descriptor {0} has a negative size")]
    NegativeSize(String),
    #[error("schemaVersion is {0:?}, expected 2")]
    SchemaVersion(Option<i64>),
    #[error("it has no config")]
    NoConfig,
    #[error("its config is {0} bytes, more than the {MAX_METADATA_BYTES} byte limit")]
    ConfigTooLarge(u64),
    #[error("rootfs.type is \"{0}\", expected \"layers\"")]
    RootfsType(String),
    #[error("it lists {diff_ids} diff_ids but the manifest has {layers} layers")]
    LayerCount { diff_ids: usize, layers: usize },
    #[error("indexes nested more than one level deep are not supported")]
    NestedIndex,
}

/// What makes a manifest one fnrun does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedManifest {
    #[error("docker schema 1 manifests are not supported")]
    SchemaOne,
    #[error("unsupported media type \"{0}\"")]
    MediaType(String),
    #[error("it is not a container image (config media type \"{0}\")")]
    NotAnImage(String),
    #[error("layer {layer}: unsupported layer media type \"{media_type}\"")]
    LayerMediaType { layer: String, media_type: String },
    #[error("an index entry for this platform is itself an index")]
    NestedIndex,
}

impl ManifestError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ManifestError::NoPlatform { .. } | ManifestError::WrongOs { .. } => ErrorKind::NotFound,
            _ => ErrorKind::Corrupt,
        }
    }
}

/// The parts of an image config a run needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env` (`NAME=value`).
    pub env: Vec<String>,
    /// `WorkingDir` (empty: `/`).
    pub working_dir: String,
    /// `User` (`uid[:gid]` or names; empty: root).
    pub user: String,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    media_type: Option<String>,
    digest: String,
    size: i64,
    #[serde(default)]
    platform: Option<Platform>,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize, Default, PartialEq, Eq)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    schema_version: Option<i64>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<RawDescriptor>,
    #[serde(default)]
    layers: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    manifests: Option<Vec<RawDescriptor>>,
}

/// A validated content descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    pub platform: Option<Platform>,
    pub annotations: HashMap<String, String>,
}

/// A single-platform image manifest.
#[derive(Debug, Clone)]
pub struct ImageManifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// An image index or Docker manifest list (also the shape of an OCI layout's index.json).
#[derive(Debug, Clone)]
pub struct Index {
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone)]
pub enum Manifest {
    Image(ImageManifest),
    Index(Index),
}

/// Layer compression, from the layer media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

fn descriptor(
    what: &'static str,
    ctx: &str,
    raw: RawDescriptor,
) -> Result<Descriptor, ManifestError> {
    let digest = Digest::parse(&raw.digest).map_err(|err| ManifestError::BadDigest {
        what,
        digest: ctx.to_owned(),
        err,
    })?;
    let size = u64::try_from(raw.size).map_err(|_| ManifestError::Invalid {
        what,
        digest: ctx.to_owned(),
        reason: InvalidManifest::NegativeSize(digest.to_string()),
    })?;
    Ok(Descriptor {
        media_type: raw.media_type.unwrap_or_default(),
        digest,
        size,
        platform: raw.platform,
        annotations: raw.annotations.unwrap_or_default(),
    })
}

/// Parses a manifest or index whose bytes have already been verified against `digest`.
pub fn parse_manifest(bytes: &[u8], digest: &Digest) -> Result<Manifest, ManifestError> {
    let ctx = digest.to_string();
    let raw: RawManifest = serde_json::from_slice(bytes).map_err(|err| ManifestError::Json {
        what: "manifest",
        digest: ctx.clone(),
        err,
    })?;
    if raw.schema_version == Some(1) {
        return Err(ManifestError::Unsupported {
            digest: ctx,
            reason: UnsupportedManifest::SchemaOne,
        });
    }
    if raw.schema_version != Some(2) {
        return Err(ManifestError::Invalid {
            what: "manifest",
            digest: ctx,
            reason: InvalidManifest::SchemaVersion(raw.schema_version),
        });
    }
    let is_index = match raw.media_type.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => true,
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
        Some(other) => {
            return Err(ManifestError::Unsupported {
                digest: ctx,
                reason: UnsupportedManifest::MediaType(truncate(other)),
            });
        }
        None => raw.manifests.is_some() && raw.config.is_none(),
    };
    if is_index {
        return Ok(Manifest::Index(parse_index_raw(
            "index",
            &ctx,
            raw.manifests,
        )?));
    }
    let config = raw.config.ok_or_else(|| ManifestError::Invalid {
        what: "manifest",
        digest: ctx.clone(),
        reason: InvalidManifest::NoConfig,
    })?;
    let config = descriptor("manifest", &ctx, config)?;
    if config.media_type != OCI_CONFIG && config.media_type != DOCKER_CONFIG {
        return Err(ManifestError::Unsupported {
            digest: ctx,
            reason: UnsupportedManifest::NotAnImage(truncate(&config.media_type)),
        });
    }
    if config.size > MAX_METADATA_BYTES {
        return Err(ManifestError::Invalid {
            what: "manifest",
            digest: ctx,
            reason: InvalidManifest::ConfigTooLarge(config.size),
        });
    }
    let layers = raw
        .layers
        .unwrap_or_default()
        .into_iter()
        .map(|l| descriptor("manifest", &ctx, l))
        .collect::<Result<Vec<_>, _>>()?;
    for layer in &layers {
        if layer_compression(&layer.media_type).is_none() {
            return Err(ManifestError::Unsupported {
                digest: ctx.clone(),
                reason: UnsupportedManifest::LayerMediaType {
                    layer: layer.digest.to_string(),
                    media_type: truncate(&layer.media_type),
                },
            });
        }
    }
    Ok(Manifest::Image(ImageManifest { config, layers }))
}

/// Parses an OCI layout's index.json (no digest of its own: `ctx` names the file).
pub fn parse_index(bytes: &[u8], ctx: &str) -> Result<Index, ManifestError> {
    let raw: RawManifest = serde_json::from_slice(bytes).map_err(|err| ManifestError::Json {
        what: "index",
        digest: ctx.to_owned(),
        err,
    })?;
    if raw.schema_version != Some(2) {
        return Err(ManifestError::Invalid {
            what: "index",
            digest: ctx.to_owned(),
            reason: InvalidManifest::SchemaVersion(raw.schema_version),
        });
    }
    parse_index_raw("index", ctx, raw.manifests)
}

fn parse_index_raw(
    what: &'static str,
    ctx: &str,
    manifests: Option<Vec<RawDescriptor>>,
) -> Result<Index, ManifestError> {
    let manifests = manifests
        .unwrap_or_default()
        .into_iter()
        .map(|d| descriptor(what, ctx, d))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Index { manifests })
}

/// How a layer is compressed, from its media type; `None` for a media type that is not
/// a layer fnrun can unpack.
pub fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// The OCI architecture name of this host.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Chooses the linux manifest for this host's architecture from an index.
pub fn select_platform(index: &Index, ctx: &str) -> Result<Descriptor, ManifestError> {
    let arch = host_arch();
    let candidates: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| matches!(d.media_type.as_str(), OCI_MANIFEST | DOCKER_MANIFEST | ""))
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    // Prefer the baseline variant (none, or v8 on arm64); else take the first match.
    let preferred = candidates.iter().find(|d| {
        d.platform.as_ref().is_some_and(|p| {
            matches!(
                p.variant.as_deref(),
                None | Some("") | Some("v8") | Some("v1")
            )
        })
    });
    match preferred.or(candidates.first()) {
        Some(d) => Ok((*d).clone()),
        None => {
            let mut available: Vec<String> = index
                .manifests
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .filter(|p| p.os != "unknown")
                .map(|p| match &p.variant {
                    Some(v) if !v.is_empty() => format!("{}/{}/{}", p.os, p.architecture, v),
                    _ => format!("{}/{}", p.os, p.architecture),
                })
                .collect();
            available.dedup();
            Err(ManifestError::NoPlatform {
                digest: ctx.to_owned(),
                wanted: format!("linux/{arch}"),
                available: if available.is_empty() {
                    "none".into()
                } else {
                    truncate(&available.join(", "))
                },
            })
        }
    }
}

#[derive(Debug, Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    config: Option<RawContainerConfig>,
    #[serde(default)]
    rootfs: Option<RawRootfs>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawContainerConfig {
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
struct RawRootfs {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// The parts of an image config fnrun uses.
#[derive(Debug, Clone)]
pub struct ParsedConfig {
    pub config: ImageConfig,
    pub diff_ids: Vec<Digest>,
}

/// Parses an image config whose bytes have already been verified against `digest`,
/// checking that it has one diff_id per manifest layer.
pub fn parse_config(
    bytes: &[u8],
    digest: &Digest,
    layer_count: usize,
) -> Result<ParsedConfig, ManifestError> {
    let ctx = digest.to_string();
    let raw: RawConfig = serde_json::from_slice(bytes).map_err(|err| ManifestError::Json {
        what: "image config",
        digest: ctx.clone(),
        err,
    })?;
    if let Some(os) = raw.os.as_deref()
        && !os.is_empty()
        && os != "linux"
    {
        return Err(ManifestError::WrongOs {
            digest: ctx,
            os: truncate(os),
        });
    }
    if let Some(arch) = raw.architecture.as_deref()
        && !arch.is_empty()
        && arch != host_arch()
    {
        tracing::warn!(config = %ctx, architecture = arch, host = host_arch(), "image architecture differs from the host");
    }
    let rootfs = raw.rootfs.unwrap_or_default();
    if rootfs.kind != "layers" {
        return Err(ManifestError::Invalid {
            what: "image config",
            digest: ctx,
            reason: InvalidManifest::RootfsType(truncate(&rootfs.kind)),
        });
    }
    let diff_ids = rootfs
        .diff_ids
        .iter()
        .map(|d| Digest::parse(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| ManifestError::BadDigest {
            what: "image config",
            digest: ctx.clone(),
            err,
        })?;
    if diff_ids.len() != layer_count {
        return Err(ManifestError::Invalid {
            what: "image config",
            digest: ctx,
            reason: InvalidManifest::LayerCount {
                diff_ids: diff_ids.len(),
                layers: layer_count,
            },
        });
    }
    let c = raw.config.unwrap_or_default();
    Ok(ParsedConfig {
        config: ImageConfig {
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            env: c.env.unwrap_or_default(),
            working_dir: c.working_dir.unwrap_or_default(),
            user: c.user.unwrap_or_default(),
        },
        diff_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> String {
        format!("sha256:{}", hex::encode([n; 32]))
    }

    #[test]
    fn parses_image_manifest() {
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}",
               "config":{{"mediaType":"{OCI_CONFIG}","digest":"{}","size":10}},
               "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":20}}]}}"#,
            d(1),
            d(2)
        );
        let Manifest::Image(img) = parse_manifest(m.as_bytes(), &Digest::of(m.as_bytes())).unwrap()
        else {
            panic!("expected an image manifest");
        };
        assert_eq!(img.config.digest.to_string(), d(1));
        assert_eq!(img.layers.len(), 1);
        assert_eq!(img.layers[0].size, 20);
    }

    #[test]
    fn refuses_hostile_or_unsupported_manifests() {
        let cases = [
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"sha256:../../etc","size":1}},"layers":[]}}"#
            ),
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"{}","size":-1}},"layers":[]}}"#,
                d(1)
            ),
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":"{}","size":1}},"layers":[]}}"#,
                d(1)
            ),
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"{}","size":1}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+lz4","digest":"{}","size":1}}]}}"#,
                d(1),
                d(2)
            ),
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"{}","size":99999999}},"layers":[]}}"#,
                d(1)
            ),
            r#"{"schemaVersion":1,"name":"x"}"#.to_owned(),
            "not json".to_owned(),
        ];
        for m in cases {
            let err = parse_manifest(m.as_bytes(), &Digest::of(m.as_bytes())).expect_err(&m);
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{m}: {err}");
        }
    }

    #[test]
    fn layer_media_types() {
        for (t, c) in [
            ("application/vnd.oci.image.layer.v1.tar", Compression::None),
            (
                "application/vnd.oci.image.layer.v1.tar+gzip",
                Compression::Gzip,
            ),
            (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                Compression::Gzip,
            ),
            (
                "application/vnd.oci.image.layer.v1.tar+zstd",
                Compression::Zstd,
            ),
        ] {
            assert_eq!(layer_compression(t), Some(c), "{t}");
        }
        assert!(layer_compression("application/vnd.oci.image.layer.v1.tar+lz4").is_none());
    }

    #[test]
    fn selects_host_platform() {
        let arch = host_arch();
        let m = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":1,"platform":{{"os":"linux","architecture":"s390x"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":1,"platform":{{"os":"unknown","architecture":"unknown"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":1,"platform":{{"os":"linux","architecture":"{arch}"}}}}]}}"#,
            d(1),
            d(2),
            d(3)
        );
        let Manifest::Index(index) =
            parse_manifest(m.as_bytes(), &Digest::of(m.as_bytes())).unwrap()
        else {
            panic!("expected an index");
        };
        assert_eq!(
            select_platform(&index, "x").unwrap().digest.to_string(),
            d(3)
        );

        let only_other = Index {
            manifests: index.manifests[..2].to_vec(),
        };
        let err = select_platform(&only_other, "idx").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("linux/{arch}")) && msg.contains("linux/s390x"),
            "{msg}"
        );
    }

    #[test]
    fn parses_config_and_checks_diff_ids() {
        let c = format!(
            r#"{{"architecture":"{}","os":"linux","config":{{"Entrypoint":["/fn"],"Cmd":null,"Env":["A=1"],"WorkingDir":"/w","User":"1000"}},
               "rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
            host_arch(),
            d(4)
        );
        let digest = Digest::of(c.as_bytes());
        let parsed = parse_config(c.as_bytes(), &digest, 1).unwrap();
        assert_eq!(parsed.config.entrypoint, vec!["/fn"]);
        assert!(parsed.config.cmd.is_empty());
        assert_eq!(parsed.config.env, vec!["A=1"]);
        assert_eq!(parsed.config.working_dir, "/w");
        assert_eq!(parsed.config.user, "1000");
        assert_eq!(parsed.diff_ids[0].to_string(), d(4));
        assert_eq!(
            parse_config(c.as_bytes(), &digest, 2).unwrap_err().kind(),
            ErrorKind::Corrupt
        );

        let windows = r#"{"os":"windows","rootfs":{"type":"layers","diff_ids":[]}}"#;
        assert!(matches!(
            parse_config(windows.as_bytes(), &digest, 0),
            Err(ManifestError::WrongOs { .. })
        ));
    }
}
