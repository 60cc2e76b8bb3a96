//! Writing a one-layer OCI image layout for a single static binary.
//!
//! The layout (image-spec v1.1 `image-layout.md`):
//! ```text
//! oci-layout                 {"imageLayoutVersion": "1.0.0"}
//! index.json                 one manifest, annotated with its tag
//! blobs/sha256/<hex>         layer (tar+gzip), config, manifest
//! ```
//! The layer holds `/function` (0755), a minimal `/etc/passwd` and `/etc/group`,
//! and a world-writable sticky `/tmp`. Everything is deterministic: the same
//! binary gives the same digests.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;
use sha2::{Digest, Sha256};

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The entrypoint of the image.
pub const ENTRYPOINT: &str = "/function";
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\n";
/// A fixed timestamp keeps the image reproducible.
const CREATED: &str = "1970-01-01T00:00:00Z";

/// The OCI architecture name (GOARCH) for a Rust `std::env::consts::ARCH`.
pub fn architecture(rust_arch: &str) -> Result<&'static str> {
    Ok(match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "x86" => "386",
        "riscv64" => "riscv64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "loongarch64" => "loong64",
        other => bail!("no OCI architecture name known for {other}"),
    })
}

/// A blob as referenced by a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// `sha256:<hex>`
    pub digest: String,
    pub size: u64,
}

/// What [`write_layout`] wrote.
#[derive(Debug, Clone)]
pub struct Image {
    pub manifest_digest: String,
    pub config: Blob,
    pub layer: Blob,
    /// `sha256:<hex>` of the uncompressed layer tar.
    pub diff_id: String,
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The uncompressed layer tar.
pub fn layer_tar(function: &[u8]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let entries: [(&str, tar::EntryType, u32, &[u8]); 5] = [
        ("etc/", tar::EntryType::Directory, 0o755, b""),
        (
            "etc/group",
            tar::EntryType::Regular,
            0o644,
            GROUP.as_bytes(),
        ),
        (
            "etc/passwd",
            tar::EntryType::Regular,
            0o644,
            PASSWD.as_bytes(),
        ),
        ("function", tar::EntryType::Regular, 0o755, function),
        ("tmp/", tar::EntryType::Directory, 0o1777, b""),
    ];
    for (path, kind, mode, data) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(u64::try_from(data.len())?);
        header.set_uid(0);
        header.set_gid(0);
        header.set_username("root")?;
        header.set_groupname("root")?;
        header.set_mtime(0);
        tar.append_data(&mut header, path, data)
            .with_context(|| format!("cannot add {path} to the layer"))?;
    }
    tar.into_inner().context("cannot finish the layer tar")
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    // GzEncoder writes a header with mtime 0 and no file name: reproducible.
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

fn write_blob(blobs: &Path, bytes: &[u8]) -> Result<Blob> {
    let digest = sha256_digest(bytes);
    let hex = digest.trim_start_matches("sha256:");
    let path = blobs.join(hex);
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Blob {
        digest,
        size: u64::try_from(bytes.len())?,
    })
}

fn json_bytes(value: &serde_json::Value) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

/// Writes an OCI image layout at `out` holding one image, tagged `tag`, whose
/// entrypoint `/function` is `function`. An existing layout at `out` is
/// replaced; any other existing non-empty directory is an error.
pub fn write_layout(out: &Path, function: &[u8], arch: &str, tag: &str) -> Result<Image> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out
        .file_name()
        .with_context(|| format!("{} has no file name", out.display()))?;
    let staging = parent.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    if staging.exists() {
        fs::remove_dir_all(&staging)
            .with_context(|| format!("cannot remove {}", staging.display()))?;
    }
    let image = write_layout_into(&staging, function, arch, tag)?;

    if out.exists() {
        let is_layout = out.join("oci-layout").is_file();
        let is_empty = fs::read_dir(out)
            .with_context(|| format!("cannot read {}", out.display()))?
            .next()
            .is_none();
        if !is_layout && !is_empty {
            fs::remove_dir_all(&staging).ok();
            bail!(
                "{} exists and is not an OCI image layout; not replacing it",
                out.display()
            );
        }
        fs::remove_dir_all(out).with_context(|| format!("cannot remove {}", out.display()))?;
    }
    fs::rename(&staging, out)
        .with_context(|| format!("cannot move {} to {}", staging.display(), out.display()))?;
    Ok(image)
}

fn write_layout_into(dir: &Path, function: &[u8], arch: &str, tag: &str) -> Result<Image> {
    let blobs: PathBuf = dir.join("blobs").join("sha256");
    fs::create_dir_all(&blobs).with_context(|| format!("cannot create {}", blobs.display()))?;

    let tar = layer_tar(function)?;
    let diff_id = sha256_digest(&tar);
    let layer = write_blob(&blobs, &gzip(&tar)?)?;

    let config = json!({
        "created": CREATED,
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": [ENTRYPOINT],
            "Env": [PATH_ENV],
            "WorkingDir": "/",
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": [diff_id],
        },
        "history": [{
            "created": CREATED,
            "created_by": "cargo xtask demo-image",
        }],
    });
    let config = write_blob(&blobs, &json_bytes(&config)?)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": {
            "mediaType": MEDIA_TYPE_CONFIG,
            "digest": config.digest,
            "size": config.size,
        },
        "layers": [{
            "mediaType": MEDIA_TYPE_LAYER_GZIP,
            "digest": layer.digest,
            "size": layer.size,
        }],
    });
    let manifest = write_blob(&blobs, &json_bytes(&manifest)?)?;

    let index = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [{
            "mediaType": MEDIA_TYPE_MANIFEST,
            "digest": manifest.digest,
            "size": manifest.size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {ANNOTATION_REF_NAME: tag},
        }],
    });
    let path = dir.join("index.json");
    fs::write(&path, json_bytes(&index)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let path = dir.join("oci-layout");
    fs::write(&path, br#"{"imageLayoutVersion":"1.0.0"}"#)
        .with_context(|| format!("cannot write {}", path.display()))?;

    Ok(Image {
        manifest_digest: manifest.digest,
        config,
        layer,
        diff_id,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read;
    use std::process::Command;

    use super::*;

    const FUNCTION: &[u8] = b"#!/bin/sh\ncat\n";

    fn read_blob(layout: &Path, digest: &str, size: u64) -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        let bytes = fs::read(layout.join("blobs/sha256").join(hex)).expect("blob exists");
        assert_eq!(
            sha256_digest(&bytes),
            digest,
            "blob content matches its digest"
        );
        assert_eq!(bytes.len() as u64, size, "descriptor size of {digest}");
        bytes
    }

    fn descriptor(v: &serde_json::Value) -> (String, u64) {
        (
            v["digest"].as_str().expect("digest").to_owned(),
            v["size"].as_u64().expect("size"),
        )
    }

    fn tool(name: &str) -> bool {
        Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn is_root() -> bool {
        // `id -u` avoids an unsafe geteuid call in a test.
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
    }

    fn check(cmd: &mut Command) -> String {
        let out = cmd.output().expect("tool runs");
        assert!(
            out.status.success(),
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn maps_architectures() {
        assert_eq!(architecture("x86_64").expect("known"), "amd64");
        assert_eq!(architecture("aarch64").expect("known"), "arm64");
        assert!(architecture("m68k").is_err());
    }

    #[test]
    fn layout_is_consistent_and_reproducible() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tmp.path().join("oci");
        let image = write_layout(&out, FUNCTION, "amd64", "latest").expect("writes");

        let layout: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("oci-layout")).expect("oci-layout"))
                .expect("json");
        assert_eq!(layout["imageLayoutVersion"], "1.0.0");

        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("index.json")).expect("index"))
                .expect("json");
        assert_eq!(index["schemaVersion"], 2);
        let entry = &index["manifests"][0];
        assert_eq!(entry["mediaType"], MEDIA_TYPE_MANIFEST);
        assert_eq!(entry["annotations"][ANNOTATION_REF_NAME], "latest");
        let (digest, size) = descriptor(entry);
        assert_eq!(digest, image.manifest_digest);

        let manifest: serde_json::Value =
            serde_json::from_slice(&read_blob(&out, &digest, size)).expect("manifest json");
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["config"]["mediaType"], MEDIA_TYPE_CONFIG);
        let (config_digest, config_size) = descriptor(&manifest["config"]);
        assert_eq!(
            image.config,
            Blob {
                digest: config_digest.clone(),
                size: config_size
            }
        );
        let config: serde_json::Value =
            serde_json::from_slice(&read_blob(&out, &config_digest, config_size))
                .expect("config json");
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["os"], "linux");
        assert_eq!(config["config"]["Entrypoint"], json!(["/function"]));
        assert!(
            config["config"]["Env"][0]
                .as_str()
                .expect("env")
                .starts_with("PATH=/")
        );

        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0]["mediaType"], MEDIA_TYPE_LAYER_GZIP);
        let (layer_digest, layer_size) = descriptor(&layers[0]);
        let gz = read_blob(&out, &layer_digest, layer_size);
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(gz.as_slice())
            .read_to_end(&mut tar)
            .expect("gunzip");
        assert_eq!(config["rootfs"]["type"], "layers");
        assert_eq!(config["rootfs"]["diff_ids"], json!([sha256_digest(&tar)]));
        assert_eq!(image.diff_id, sha256_digest(&tar));

        let mut entries = BTreeMap::new();
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mode = entry.header().mode().expect("mode");
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("data");
            entries.insert(path, (mode, data));
        }
        assert_eq!(
            entries.keys().map(String::as_str).collect::<Vec<_>>(),
            ["etc/", "etc/group", "etc/passwd", "function", "tmp/"]
        );
        assert_eq!(entries["function"], (0o755, FUNCTION.to_vec()));
        assert_eq!(entries["tmp/"].0, 0o1777);
        assert!(String::from_utf8_lossy(&entries["etc/passwd"].1).starts_with("root:x:0:0:"));

        // Same input, same digests; rewriting replaces the old layout.
        let again = write_layout(&out, FUNCTION, "amd64", "latest").expect("rewrites");
        assert_eq!(again.manifest_digest, image.manifest_digest);
        assert_eq!(
            fs::read_dir(out.join("blobs/sha256"))
                .expect("blobs")
                .count(),
            3
        );
    }

    #[test]
    fn refuses_to_replace_other_directories() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join("precious"), "data").expect("write");
        let err = write_layout(tmp.path(), FUNCTION, "amd64", "latest").expect_err("refuses");
        assert!(err.to_string().contains("not an OCI image layout"), "{err}");
        assert!(tmp.path().join("precious").is_file());
    }

    #[test]
    fn umoci_and_skopeo_accept_the_layout() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tmp.path().join("oci");
        let image = write_layout(&out, FUNCTION, "amd64", "latest").expect("writes");
        let reference = format!("{}:latest", out.display());
        let mut checked = 0;
        if tool("umoci") {
            let stat = check(Command::new("umoci").args(["stat", "--image", &reference]));
            assert!(stat.contains("LAYER"), "umoci stat: {stat}");
            let bundle = tmp.path().join("bundle");
            let mut unpack = Command::new("umoci");
            unpack.arg("unpack");
            if !is_root() {
                unpack.arg("--rootless");
            }
            check(unpack.args(["--image", &reference]).arg(&bundle));
            let function = bundle.join("rootfs/function");
            assert_eq!(fs::read(&function).expect("unpacked /function"), FUNCTION);
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&function).expect("stat").permissions().mode();
            assert_eq!(mode & 0o7777, 0o755);
            assert!(bundle.join("rootfs/tmp").is_dir());
            checked += 1;
        }
        if tool("skopeo") {
            let inspect =
                check(Command::new("skopeo").args(["inspect", &format!("oci:{reference}")]));
            let inspect: serde_json::Value = serde_json::from_str(&inspect).expect("skopeo json");
            assert_eq!(inspect["Digest"], image.manifest_digest.as_str());
            assert_eq!(inspect["Architecture"], "amd64");
            assert_eq!(inspect["Os"], "linux");
            assert_eq!(inspect["Layers"], json!([image.layer.digest]));
            checked += 1;
        }
        if checked == 0 {
            eprintln!("skipped: neither umoci nor skopeo is installed");
        }
    }
}
