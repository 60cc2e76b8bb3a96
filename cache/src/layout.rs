//! OCI image layout directories (`oci:PATH[:TAG]`): read and verified on every use,
//! never copied into the blob store (only their layers are unpacked, once).

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use fnrun_registry::digest::{Digest, truncate};
use fnrun_registry::manifest::{
    self, Descriptor, ImageManifest, MAX_METADATA_BYTES, Manifest, REF_NAME_ANNOTATION,
};

/// An OCI layout that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path} is not an OCI image layout: {reason}")]
    NotLayout { path: PathBuf, reason: NotLayout },
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
        reason: BadBlob,
    },
    #[error("OCI layout {path}: {err}")]
    Manifest {
        path: PathBuf,
        err: manifest::ManifestError,
    },
    #[error("failed to read {path}: {err}")]
    Io { path: PathBuf, err: io::Error },
}

/// Why a path is not an OCI image layout (or archive of one) that can be read.
#[derive(Debug, thiserror::Error)]
pub enum NotLayout {
    #[error("invalid oci-layout file: {0}")]
    Marker(serde_json::Error),
    #[error("the oci-layout file has no imageLayoutVersion")]
    NoVersion,
    #[error("the oci-layout file is too large")]
    MarkerTooLarge,
    #[error("it has no oci-layout file")]
    NoMarker,
    #[error("no such directory")]
    NoDirectory,
    #[error("no such file")]
    NoFile,
    #[error("index.json is too large")]
    IndexTooLarge,
    #[error("it has no index.json")]
    NoIndex,
    #[error("index.json lists no manifests")]
    EmptyIndex,
    #[error("not a usable oci-archive: {0}")]
    Archive(BadArchive),
}

/// Why an `oci-archive:` tar cannot be extracted as a layout.
#[derive(Debug, thiserror::Error)]
pub enum BadArchive {
    #[error("it is a directory (use oci:PATH for a layout directory)")]
    Directory,
    #[error("cannot read the tar: {0}")]
    Tar(io::Error),
    #[error("a member name is not UTF-8")]
    NotUtf8,
    #[error("member {0:?} leads out of the archive")]
    LeadsOut(String),
    #[error("it holds more than {0} bytes")]
    TooLarge(u64),
    #[error("{0} appears twice")]
    Twice(String),
    #[error("cannot read {name}: {err}")]
    Member { name: String, err: io::Error },
    #[error("{0} is truncated")]
    Truncated(String),
    #[error("it has no oci-layout, index.json or blobs")]
    Empty,
}

/// What is wrong with a blob of a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBlob {
    #[error("is missing")]
    Missing,
    #[error("is larger than {MAX_METADATA_BYTES} bytes")]
    TooLarge,
    #[error("does not match its digest (got {0})")]
    Mismatch(String),
}

impl LayoutError {
    pub(crate) fn kind(&self) -> fnrun_registry::ErrorKind {
        use fnrun_registry::ErrorKind as K;
        match self {
            LayoutError::NotLayout { .. } | LayoutError::TagNotFound { .. } => K::NotFound,
            LayoutError::Ambiguous { .. } => K::InvalidReference,
            LayoutError::Blob { .. } => K::Corrupt,
            LayoutError::Manifest { err, .. } => err.kind(),
            LayoutError::Io { .. } => K::Internal,
        }
    }
}

impl LayoutError {
    /// The same error with paths under `from` (an extracted archive) shown under `to`
    /// (the archive), so that messages name what the user gave.
    pub(crate) fn relocated(mut self, from: &Path, to: &Path) -> LayoutError {
        let path = match &mut self {
            LayoutError::NotLayout { path, .. }
            | LayoutError::TagNotFound { path, .. }
            | LayoutError::Ambiguous { path, .. }
            | LayoutError::Blob { path, .. }
            | LayoutError::Manifest { path, .. }
            | LayoutError::Io { path, .. } => path,
        };
        if let Ok(rel) = path.strip_prefix(from) {
            *path = if rel.as_os_str().is_empty() {
                to.to_owned()
            } else {
                to.join(rel)
            };
        }
        self
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
    let blob_err = |reason: BadBlob| LayoutError::Blob {
        path: layout.to_owned(),
        digest: digest.to_string(),
        reason,
    };
    let bytes = match read_capped(&path, MAX_METADATA_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(blob_err(BadBlob::TooLarge));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(blob_err(BadBlob::Missing)),
        Err(err) => return Err(LayoutError::Io { path, err }),
    };
    let actual = Digest::of(&bytes);
    if actual != *digest {
        return Err(blob_err(BadBlob::Mismatch(actual.to_string())));
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
            reason: BadBlob::Missing,
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
    let not_layout = |reason: NotLayout| LayoutError::NotLayout {
        path: layout.to_owned(),
        reason,
    };
    let marker = layout.join("oci-layout");
    match read_capped(&marker, 4096) {
        Ok(Some(bytes)) => {
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(|e| not_layout(NotLayout::Marker(e)))?;
            if !v
                .get("imageLayoutVersion")
                .is_some_and(serde_json::Value::is_string)
            {
                return Err(not_layout(NotLayout::NoVersion));
            }
        }
        Ok(None) => return Err(not_layout(NotLayout::MarkerTooLarge)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_layout(match layout.is_dir() {
                true => NotLayout::NoMarker,
                false => NotLayout::NoDirectory,
            }));
        }
        Err(err) => return Err(LayoutError::Io { path: marker, err }),
    }
    let index_path = layout.join("index.json");
    let index_bytes = match read_capped(&index_path, MAX_METADATA_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(not_layout(NotLayout::IndexTooLarge)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_layout(NotLayout::NoIndex));
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
            let mut matching: Vec<Descriptor> = index
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
                1 => matching.swap_remove(0),
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
            0 => return Err(not_layout(NotLayout::EmptyIndex)),
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
        reason: manifest::InvalidManifest::NestedIndex,
    }))
}

/// Where an `oci-archive:` member goes, if anywhere.
enum Member {
    /// `oci-layout`, `index.json` or `blobs/sha256/<hex>`: extracted under this name.
    File(String),
    /// A directory or a file the layout does not need: skipped.
    Skip,
}

/// Classifies a member path of an `oci-archive:` tar. `..` is refused outright.
fn classify(raw: &[u8]) -> Result<Member, BadArchive> {
    let path = std::str::from_utf8(raw).map_err(|_| BadArchive::NotUtf8)?;
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.contains(&"..") {
        return Err(BadArchive::LeadsOut(truncate(path)));
    }
    Ok(match comps.as_slice() {
        ["oci-layout"] => Member::File("oci-layout".into()),
        ["index.json"] => Member::File("index.json".into()),
        ["blobs", "sha256", hex]
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Member::File(format!("blobs/sha256/{hex}"))
        }
        _ => Member::Skip,
    })
}

/// Extracts the OCI layout in the tar (optionally gzipped) `archive` into `dest`, which
/// must not exist yet, so that it can be read like an `oci:` layout.
///
/// Only the files a layout needs are extracted (`oci-layout`, `index.json`,
/// `blobs/sha256/<hex>`), as regular files under names built here, in a directory this
/// process just created: symlinks, hardlinks, devices and other members are skipped, and
/// `..` is refused, so nothing outside `dest` can be created or written through. At most
/// `limit` bytes are written. On error `dest` is removed.
pub(crate) fn extract_archive(archive: &Path, dest: &Path, limit: u64) -> Result<(), LayoutError> {
    let result = extract_into(archive, dest, limit);
    if result.is_err() {
        let _ = crate::unpack::remove_tree(dest);
    }
    result
}

fn extract_into(archive: &Path, dest: &Path, limit: u64) -> Result<(), LayoutError> {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

    let bad = |reason: BadArchive| LayoutError::NotLayout {
        path: archive.to_owned(),
        reason: NotLayout::Archive(reason),
    };
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |err| LayoutError::Io { path, err }
    };
    let file = match File::open(archive) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LayoutError::NotLayout {
                path: archive.to_owned(),
                reason: NotLayout::NoFile,
            });
        }
        Err(e) => return Err(io_err(archive)(e)),
    };
    if file.metadata().map_err(io_err(archive))?.is_dir() {
        return Err(bad(BadArchive::Directory));
    }
    let mut reader = BufReader::new(file);
    let gzip = reader
        .fill_buf()
        .map_err(io_err(archive))?
        .starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::bufread::MultiGzDecoder::new(reader))
    } else {
        Box::new(reader)
    };

    let mut dirs = std::fs::DirBuilder::new();
    dirs.mode(0o700);
    dirs.create(dest).map_err(io_err(dest))?;
    dirs.recursive(true)
        .create(dest.join("blobs/sha256"))
        .map_err(io_err(dest))?;

    let mut tar = tar::Archive::new(reader);
    let mut written: u64 = 0;
    let mut files = 0usize;
    let entries = tar.entries().map_err(|e| bad(BadArchive::Tar(e)))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(BadArchive::Tar(e)))?;
        let name = match classify(&entry.path_bytes()).map_err(bad)? {
            Member::File(name) => name,
            Member::Skip => continue,
        };
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            // A link or device under a layout name is not followed: the file is missing.
            tracing::debug!(member = %name, "skipping a non-regular oci-archive member");
            continue;
        }
        let size = entry.size();
        written = written.saturating_add(size);
        if written > limit {
            return Err(bad(BadArchive::TooLarge(limit)));
        }
        let path = dest.join(&name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    bad(BadArchive::Twice(name.clone()))
                } else {
                    io_err(&path)(e)
                }
            })?;
        let copied = io::copy(&mut (&mut entry).take(size), &mut out).map_err(|err| {
            bad(BadArchive::Member {
                name: name.clone(),
                err,
            })
        })?;
        if copied != size {
            return Err(bad(BadArchive::Truncated(name)));
        }
        files += 1;
    }
    if files == 0 {
        return Err(bad(BadArchive::Empty));
    }
    Ok(())
}

#[cfg(test)]
mod archive_tests {
    use super::*;

    fn tar_of(members: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in members {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            // set_path refuses `..`; write the raw name like a hostile tool would.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn extracts_only_layout_files_and_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        let hex = "a".repeat(64);
        let blob = format!("./blobs/sha256/{hex}");
        let tar = tar_of(&[
            ("./", tar::EntryType::Directory, b"", ""),
            (
                "./oci-layout",
                tar::EntryType::Regular,
                br#"{"imageLayoutVersion":"1.0.0"}"#,
                "",
            ),
            ("./index.json", tar::EntryType::Regular, b"{}", ""),
            (&blob, tar::EntryType::Regular, b"blob", ""),
            (
                "./blobs/sha256/evil",
                tar::EntryType::Symlink,
                b"",
                "/etc/passwd",
            ),
            ("./blobs/sha256/bbbb", tar::EntryType::Regular, b"x", ""),
            ("./other/file", tar::EntryType::Regular, b"x", ""),
            ("./dev", tar::EntryType::Char, b"", ""),
        ]);
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, tar).unwrap();
        let dest = dir.path().join("out");
        extract_archive(&archive, &dest, 1 << 20).unwrap();
        assert_eq!(std::fs::read(dest.join("index.json")).unwrap(), b"{}");
        assert_eq!(
            std::fs::read(dest.join("blobs/sha256").join(&hex)).unwrap(),
            b"blob"
        );
        let mut names: Vec<_> = std::fs::read_dir(dest.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, vec![std::ffi::OsString::from(&hex)]);
        assert!(!dest.join("other").exists() && !dest.join("dev").exists());
    }

    #[test]
    fn refuses_traversal_duplicates_and_oversize() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar");
        let outside = dir.path().join("index.json");
        for (tar, limit, what) in [
            (
                tar_of(&[("../index.json", tar::EntryType::Regular, b"{}", "")]),
                1 << 20,
                "leads out",
            ),
            (
                tar_of(&[
                    ("index.json", tar::EntryType::Regular, b"{}", ""),
                    ("./index.json", tar::EntryType::Regular, b"{}", ""),
                ]),
                1 << 20,
                "twice",
            ),
            (
                tar_of(&[("index.json", tar::EntryType::Regular, b"0123456789", "")]),
                4,
                "more than",
            ),
            (
                b"not a tar at all, just text".repeat(40),
                1 << 20,
                "oci-archive",
            ),
        ] {
            std::fs::write(&archive, tar).unwrap();
            let dest = dir.path().join("out");
            let err = extract_archive(&archive, &dest, limit).unwrap_err();
            assert!(err.to_string().contains(what), "{what}: {err}");
            assert!(!dest.exists(), "{what}: the partial extraction is removed");
            assert!(!outside.exists(), "{what}");
        }
    }
}
