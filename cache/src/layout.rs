//! OCI image layout directories (`oci:PATH[:TAG]`): read and verified on every use,
//! never copied into the blob store (only their layers are unpacked, once).

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::digest::{Digest, truncate};
use crate::manifest::{
    self, Descriptor, ImageManifest, MAX_METADATA_BYTES, Manifest, REF_NAME_ANNOTATION,
};

/// An OCI layout that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path} is not an OCI image layout: {reason}")]
    NotLayout { path: PathBuf, reason: String },
    #[error("tag \"{tag}\" not found in OCI layout {path} (tags: {available})")]
    TagNotFound {
        path: PathBuf,
        tag: String,
        available: String,
    },
    #[error(
        "OCI layout {path} has {count} manifests; choose one with oci:PATH:TAG (tags: {available})"
    )]
    Ambiguous {
        path: PathBuf,
        count: usize,
        available: String,
    },
    #[error("OCI layout {path}: blob {digest} {reason}")]
    Blob {
        path: PathBuf,
        digest: String,
        reason: String,
    },
    #[error("OCI layout {path}: {err}")]
    Manifest {
        path: PathBuf,
        err: manifest::ManifestError,
    },
    #[error("failed to read {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
}

impl LayoutError {
    pub(crate) fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            LayoutError::NotLayout { .. } | LayoutError::TagNotFound { .. } => K::NotFound,
            LayoutError::Ambiguous { .. } => K::InvalidReference,
            LayoutError::Blob { .. } => K::Corrupt,
            LayoutError::Manifest { err, .. } => err.kind(),
            LayoutError::Io { .. } => K::Internal,
        }
    }
}

fn read_capped(path: &Path, max: u64) -> Result<Option<Vec<u8>>, io::Error> {
    let file = File::open(path)?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

pub(crate) fn blob_path(layout: &Path, digest: &Digest) -> PathBuf {
    layout.join("blobs/sha256").join(digest.hex())
}

/// Reads and verifies a small blob (manifest, index, config) of the layout.
pub(crate) fn read_blob(layout: &Path, digest: &Digest) -> Result<Vec<u8>, LayoutError> {
    let path = blob_path(layout, digest);
    let blob_err = |reason: String| LayoutError::Blob {
        path: layout.to_owned(),
        digest: digest.to_string(),
        reason,
    };
    let bytes = match read_capped(&path, MAX_METADATA_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(blob_err(format!(
                "is larger than {MAX_METADATA_BYTES} bytes"
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(blob_err("is missing".into())),
        Err(err) => return Err(LayoutError::Io { path, err }),
    };
    let actual = Digest::of(&bytes);
    if actual != *digest {
        return Err(blob_err(format!(
            "does not match its digest (got {actual})"
        )));
    }
    Ok(bytes)
}

/// Fails unless the layout has the blob (layers are verified while unpacking).
pub(crate) fn check_blob(layout: &Path, digest: &Digest) -> Result<PathBuf, LayoutError> {
    let path = blob_path(layout, digest);
    if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
        Ok(path)
    } else {
        Err(LayoutError::Blob {
            path: layout.to_owned(),
            digest: digest.to_string(),
            reason: "is missing".into(),
        })
    }
}

fn tags(manifests: &[Descriptor]) -> String {
    let tags: Vec<&str> = manifests
        .iter()
        .filter_map(|d| d.annotations.get(REF_NAME_ANNOTATION).map(String::as_str))
        .collect();
    if tags.is_empty() {
        "none".into()
    } else {
        truncate(&tags.join(", "))
    }
}

/// Resolves `tag` (or the only manifest) in the layout to a single-platform manifest.
pub(crate) fn resolve(
    layout: &Path,
    tag: Option<&str>,
) -> Result<(Digest, ImageManifest), LayoutError> {
    let not_layout = |reason: String| LayoutError::NotLayout {
        path: layout.to_owned(),
        reason,
    };
    let marker = layout.join("oci-layout");
    match read_capped(&marker, 4096) {
        Ok(Some(bytes)) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| not_layout(format!("invalid oci-layout file: {e}")))?;
            if !v
                .get("imageLayoutVersion")
                .is_some_and(serde_json::Value::is_string)
            {
                return Err(not_layout(
                    "the oci-layout file has no imageLayoutVersion".into(),
                ));
            }
        }
        Ok(None) => return Err(not_layout("the oci-layout file is too large".into())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_layout(if layout.is_dir() {
                "it has no oci-layout file".into()
            } else {
                "no such directory".into()
            }));
        }
        Err(err) => return Err(LayoutError::Io { path: marker, err }),
    }
    let index_path = layout.join("index.json");
    let index_bytes = match read_capped(&index_path, MAX_METADATA_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(not_layout("index.json is too large".into())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_layout("it has no index.json".into()));
        }
        Err(err) => {
            return Err(LayoutError::Io {
                path: index_path,
                err,
            });
        }
    };
    let mf = |err| LayoutError::Manifest {
        path: layout.to_owned(),
        err,
    };
    let index = manifest::parse_index(&index_bytes, "index.json").map_err(mf)?;

    let chosen = match tag {
        Some(tag) => {
            let matching: Vec<Descriptor> = index
                .manifests
                .iter()
                .filter(|d| {
                    d.annotations
                        .get(REF_NAME_ANNOTATION)
                        .is_some_and(|t| t == tag)
                })
                .cloned()
                .collect();
            match matching.len() {
                0 => {
                    return Err(LayoutError::TagNotFound {
                        path: layout.to_owned(),
                        tag: tag.to_owned(),
                        available: tags(&index.manifests),
                    });
                }
                1 => matching
                    .into_iter()
                    .next()
                    .ok_or_else(|| not_layout("empty match".into()))?,
                // Several platforms under one tag: choose like an index.
                _ => manifest::select_platform(
                    &manifest::Index {
                        manifests: matching,
                    },
                    "index.json",
                )
                .map_err(mf)?,
            }
        }
        None => match index.manifests.len() {
            1 => index.manifests[0].clone(),
            0 => return Err(not_layout("index.json lists no manifests".into())),
            count => {
                return Err(LayoutError::Ambiguous {
                    path: layout.to_owned(),
                    count,
                    available: tags(&index.manifests),
                });
            }
        },
    };

    // Follow at most one level of nested index.
    let mut digest = chosen.digest;
    for _ in 0..2 {
        let bytes = read_blob(layout, &digest)?;
        match manifest::parse_manifest(&bytes, &digest).map_err(mf)? {
            Manifest::Image(m) => return Ok((digest, m)),
            Manifest::Index(i) => {
                digest = manifest::select_platform(&i, &digest.to_string())
                    .map_err(mf)?
                    .digest;
            }
        }
    }
    Err(mf(manifest::ManifestError::Invalid {
        what: "index",
        digest: digest.to_string(),
        reason: "indexes nested more than one level deep are not supported".into(),
    }))
}
