//! Cache-level tests: OCI layouts built here, overlay semantics of the unpacked tree,
//! rootless unpacking, and (when the tools exist) a real registry.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::unpack::testutil::{Member, TarBuilder, gzip};
use fnrun_registry::digest::Digest;
use fnrun_registry::manifest::{
    self, Manifest, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST, REF_NAME_ANNOTATION, host_arch,
};
use fnrun_registry::{Credentials, DOCKER_HUB, ErrorKind, ImageRef, RegistryError};

const GZ_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Writes a blob into an OCI layout; returns its descriptor JSON.
fn put_blob(layout: &Path, media_type: &str, bytes: &[u8], extra: &str) -> (Digest, String) {
    let d = Digest::of(bytes);
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(layout.join("blobs/sha256").join(d.hex()), bytes).unwrap();
    let desc = format!(
        r#"{{"mediaType":"{media_type}","digest":"{d}","size":{}{extra}}}"#,
        bytes.len()
    );
    (d, desc)
}

/// A test image: its layer tars (bottom first) and the layout it was written to.
struct TestImage {
    layout: PathBuf,
    manifest: Digest,
    diff_ids: Vec<Digest>,
    layer_blobs: Vec<Digest>,
}

fn base_layer() -> Vec<u8> {
    TarBuilder::new()
        .add(Member::Dir(b"bin/", 0o755))
        .add(Member::File(b"bin/fn", b"#!/bin/sh\necho hello\n", 0o755))
        .add(Member::File(b"etc/keep", b"keep", 0o644))
        .add(Member::File(b"etc/removed", b"gone", 0o644))
        .add(Member::File(b"opaque/old", b"old", 0o644))
        .add(Member::Dir(b"ro/", 0o555))
        .add(Member::File(b"ro/file", b"read-only dir content", 0o444))
        .tar()
}

fn top_layer() -> Vec<u8> {
    TarBuilder::new()
        .add(Member::File(b"etc/.wh.removed", b"", 0o644))
        .add(Member::Dir(b"opaque/", 0o755))
        .add(Member::File(b"opaque/.wh..wh..opq", b"", 0o644))
        .add(Member::File(b"opaque/new", b"new", 0o644))
        .tar()
}

/// Writes an image with `layers` to `layout` under `tag`; with `multi`, the tag points
/// to an index with an s390x entry and a host entry.
fn write_layout(layout: &Path, layers: &[Vec<u8>], tag: &str, multi: bool) -> TestImage {
    std::fs::create_dir_all(layout).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let mut layer_descs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut layer_blobs = Vec::new();
    for tar in layers {
        let gz = gzip(tar);
        let (d, desc) = put_blob(layout, GZ_LAYER, &gz, "");
        layer_descs.push(desc);
        layer_blobs.push(d);
        diff_ids.push(Digest::of(tar));
    }
    let diff_json: Vec<String> = diff_ids.iter().map(|d| format!("\"{d}\"")).collect();
    let config = format!(
        r#"{{"architecture":"{}","os":"linux","config":{{"Entrypoint":["/bin/fn"],"Cmd":["--flag"],"Env":["PATH=/bin","A=b"],"WorkingDir":"/work","User":"65532:65532"}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
        host_arch(),
        diff_json.join(",")
    );
    let (_, config_desc) = put_blob(layout, OCI_CONFIG, config.as_bytes(), "");
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{config_desc},"layers":[{}]}}"#,
        layer_descs.join(",")
    );
    let annotation = format!(r#","annotations":{{"{REF_NAME_ANNOTATION}":"{tag}"}}"#);
    let (manifest_digest, top_desc) = if multi {
        let platform =
            |arch: &str| format!(r#","platform":{{"architecture":"{arch}","os":"linux"}}"#);
        let (d, host_desc) = put_blob(
            layout,
            OCI_MANIFEST,
            manifest.as_bytes(),
            &platform(host_arch()),
        );
        // Another platform's manifest (same content, different bytes).
        let other = manifest.replace(
            "\"schemaVersion\":2",
            "\"schemaVersion\":2,\"annotations\":{\"x\":\"y\"}",
        );
        let (_, other_desc) = put_blob(layout, OCI_MANIFEST, other.as_bytes(), &platform("s390x"));
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{other_desc},{host_desc}]}}"#
        );
        let (_, index_desc) = put_blob(layout, OCI_INDEX, index.as_bytes(), &annotation);
        (d, index_desc)
    } else {
        put_blob(layout, OCI_MANIFEST, manifest.as_bytes(), &annotation)
    };
    // Keep other tags already in index.json.
    let mut entries: Vec<String> = Vec::new();
    if let Ok(old) = std::fs::read(layout.join("index.json")) {
        let v: serde_json::Value = serde_json::from_slice(&old).unwrap();
        for m in v["manifests"].as_array().unwrap() {
            if m["annotations"][REF_NAME_ANNOTATION] != tag {
                entries.push(m.to_string());
            }
        }
    }
    entries.push(top_desc);
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
        entries.join(",")
    );
    std::fs::write(layout.join("index.json"), index).unwrap();
    TestImage {
        layout: layout.to_owned(),
        manifest: manifest_digest,
        diff_ids,
        layer_blobs,
    }
}

/// `len` bytes that do not compress.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn cache_at(root: &Path) -> Cache {
    open_cache(CacheConfig::new(root)).unwrap()
}

/// [`Cache::open`] with the crypto provider the binary installs.
fn open_cache(config: CacheConfig) -> Result<Cache, Error> {
    crate::install_test_crypto_provider();
    Cache::open(config)
}

fn oci_ref(layout: &Path, tag: Option<&str>) -> ImageRef {
    let s = match tag {
        Some(t) => format!("oci:{}:{t}", layout.display()),
        None => format!("oci:{}", layout.display()),
    };
    ImageRef::parse(&s, DOCKER_HUB).unwrap()
}

fn layer_dirs(cache: &Cache) -> Vec<String> {
    let dir = cache
        .root()
        .join("layers")
        .join(cache.inner.owner_tag.as_str())
        .join("sha256");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Files in this cache's tmp/ session, after giving detached unpack tasks (a layer that
/// was still unpacking when a sibling layer failed) a moment to finish.
fn session_files(cache: &Cache) -> usize {
    let dir = cache.inner.store.tmp_path("x").parent().unwrap().to_owned();
    let count = || std::fs::read_dir(&dir).unwrap().count();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    count()
}

/// Checks the image of [`base_layer`] + [`top_layer`] as returned by `get`.
fn check_image(cache: &Cache, image: &Image, t: &TestImage) {
    assert_eq!(image.digest, t.manifest.to_string());
    assert_eq!(image.layers.len(), 2);
    for (dir, diff_id) in image.layers.iter().zip(&t.diff_ids) {
        assert!(dir.is_absolute());
        assert!(dir.starts_with(cache.root()));
        assert_eq!(dir.file_name().unwrap().to_str().unwrap(), diff_id.hex());
    }
    assert_eq!(image.config.entrypoint, vec!["/bin/fn"]);
    assert_eq!(image.config.cmd, vec!["--flag"]);
    assert_eq!(image.config.env, vec!["PATH=/bin", "A=b"]);
    assert_eq!(image.config.working_dir, "/work");
    assert_eq!(image.config.user, "65532:65532");
    let bottom = &image.layers[0];
    assert_eq!(
        std::fs::read(bottom.join("ro/file")).unwrap(),
        b"read-only dir content"
    );
    assert_eq!(
        std::fs::metadata(bottom.join("ro"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o555
    );
    assert_eq!(
        std::fs::metadata(bottom).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let top = &image.layers[1];
    assert!(
        std::fs::symlink_metadata(top.join("etc/removed"))
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert_eq!(
        crate::unpack::testutil::read_xattr(&top.join("opaque"), "user.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
}

#[test]
fn cache_is_shareable_and_get_is_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<Cache>();
    send_sync::<Error>();
    let tmp = tempfile::tempdir().unwrap();
    let cache = cache_at(tmp.path());
    let r = cache.parse_reference("busybox").unwrap();
    let fut = cache.get(&r, GetOptions::new(PullPolicy::Never));
    send(&fut);
}

#[tokio::test]
async fn oci_layout_get_unpacks_once() {
    let tmp = tempfile::tempdir().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), top_layer()],
        "v1",
        false,
    );
    let cache = cache_at(&tmp.path().join("cache"));
    let reference = oci_ref(&t.layout, Some("v1"));
    let image = cache
        .get(&reference, GetOptions::new(PullPolicy::Never))
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);
    assert_eq!(image.reference, format!("oci:{}:v1", t.layout.display()));
    // Layer blobs are not copied into the store; the manifest and config are,
    // and the reference is recorded: listed and inspected as a registry
    // image is (#37).
    assert_eq!(
        std::fs::read_dir(cache.root().join("blobs/sha256"))
            .unwrap()
            .count(),
        2
    );
    let listed = cache.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].reference, image.reference);
    let details = cache.inspect(&image.reference).await.unwrap().unwrap();
    assert!(details.layers.iter().all(|l| l.unpacked), "{details:?}");

    let ino = std::fs::metadata(&image.layers[0]).unwrap().ino();
    let again = cache
        .get(&reference, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap()
        .image;
    assert_eq!(again, image);
    assert_eq!(
        std::fs::metadata(&image.layers[0]).unwrap().ino(),
        ino,
        "a layer must be unpacked once"
    );

    // With no tag and a single manifest, that one.
    let untagged = cache
        .get(
            &oci_ref(&t.layout, None),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap()
        .image;
    assert_eq!(untagged.layers, image.layers);
    assert_eq!(session_files(&cache), 0, "nothing may be left in tmp/");
}

/// The warm path (everything cached, one blocking call) must still see what changed
/// since the last get: a tag moved to another image, a layer removed by a prune in
/// another process.
#[tokio::test]
async fn warm_gets_follow_a_moved_tag_and_a_removed_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let first = write_layout(&layout, &[base_layer()], "v1", false);
    let cache = cache_at(&tmp.path().join("cache"));
    let reference = oci_ref(&layout, Some("v1"));
    let get = || get_leased(&cache, &reference);
    let (image, lease) = get().await.unwrap();
    assert_eq!(image.digest, first.manifest.to_string());
    drop(lease);
    let (again, lease) = get().await.unwrap();
    assert_eq!(again, image, "a warm get returns the same image");
    drop(lease);

    // The tag now names an image with one more layer.
    let second = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    let (moved, lease) = get().await.unwrap();
    assert_eq!(moved.digest, second.manifest.to_string());
    assert_eq!(moved.layers.len(), 2);
    check_image(&cache, &moved, &second);
    drop(lease);

    // A layer removed behind the cache's back (as a prune elsewhere would) is
    // unpacked again rather than handed to a run.
    let top = moved.layers[1].clone();
    unpack::remove_tree(&top).unwrap();
    let (repaired, _lease) = get().await.unwrap();
    assert_eq!(repaired, moved);
    assert!(top.join("opaque/new").exists());
    check_image(&cache, &repaired, &second);
}

/// A leased get with `IfNotPresent`: the image and its lease.
async fn get_leased(
    cache: &Cache,
    reference: &ImageRef,
) -> Result<(Image, Arc<crate::Lease>), Error> {
    let options = GetOptions::new(PullPolicy::IfNotPresent).leased();
    let got = cache.get(reference, options).await?;
    Ok((got.image, got.lease.expect("a lease")))
}

/// While this process holds an image's lease, another get of the same
/// reference shares it and finds the image without the store; once the
/// reference moves, it resolves again.
#[tokio::test]
async fn warm_gets_share_a_held_lease_until_the_reference_moves() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let first = write_layout(&layout, &[base_layer()], "v1", false);
    let cache = cache_at(&tmp.path().join("cache"));
    let reference = oci_ref(&layout, Some("v1"));
    let get = || async { get_leased(&cache, &reference).await.unwrap() };
    let (pulled, lease) = get().await;
    drop(lease);
    // Found on the warm path, then remembered while leased.
    let (image, held) = get().await;
    assert_eq!(image.digest, first.manifest.to_string());
    assert!(!image.pulled);
    let (again, shared) = get().await;
    assert_eq!(again, image);
    assert_eq!(again.layers, pulled.layers);
    assert!(Arc::ptr_eq(&held, &shared), "a second lease was taken");
    // One lease file for the two holders; it ends with the last of them.
    let leases = || {
        std::fs::read_dir(cache.root().join("leases"))
            .unwrap()
            .count()
    };
    assert_eq!(leases(), 1);
    drop(shared);
    assert_eq!(leases(), 1);

    // The tag now names another image: resolved again, with its own lease.
    let second = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    let (moved, other) = get().await;
    assert_eq!(moved.digest, second.manifest.to_string());
    check_image(&cache, &moved, &second);
    assert!(!Arc::ptr_eq(&held, &other));
    drop((held, other));
    assert_eq!(leases(), 0);

    // With no holder left, nothing is remembered: a layer removed behind
    // the cache's back is unpacked again.
    let top = moved.layers[1].clone();
    unpack::remove_tree(&top).unwrap();
    let (repaired, _lease) = get().await;
    assert_eq!(repaired, moved);
    assert!(top.join("opaque/new").exists());
}

#[tokio::test]
async fn oci_layout_index_and_tag_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "multi", true);
    write_layout(&layout, &[base_layer()], "single", false);
    let cache = cache_at(&tmp.path().join("cache"));

    let image = cache
        .get(
            &oci_ref(&layout, Some("multi")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);

    let err = cache
        .get(
            &oci_ref(&layout, Some("nope")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string().contains("multi") && err.to_string().contains("single"),
        "{err}"
    );

    let err = cache
        .get(
            &oci_ref(&layout, None),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::InvalidReference, "{err}");

    let err = cache
        .get(
            &oci_ref(&tmp.path().join("missing"), None),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn tampered_layer_is_refused_and_not_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), top_layer()],
        "v1",
        false,
    );
    // Replace the top layer's content, keeping its name (digest).
    let evil = TarBuilder::new()
        .add(Member::File(b"evil", b"x", 0o644))
        .tar();
    std::fs::write(
        t.layout.join("blobs/sha256").join(t.layer_blobs[1].hex()),
        gzip(&evil),
    )
    .unwrap();
    let cache = cache_at(&tmp.path().join("cache"));
    let err = cache
        .get(
            &oci_ref(&t.layout, Some("v1")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert!(
        !layer_dirs(&cache)
            .iter()
            .any(|n| n.starts_with(t.diff_ids[1].hex())),
        "a refused layer must not be stored"
    );
    assert_eq!(session_files(&cache), 0);

    // A tampered config is refused too.
    let t2 = write_layout(&tmp.path().join("layout2"), &[base_layer()], "v1", false);
    let manifest = std::fs::read(t2.layout.join("blobs/sha256").join(t2.manifest.hex())).unwrap();
    let Manifest::Image(m) = manifest::parse_manifest(&manifest, &t2.manifest).unwrap() else {
        panic!()
    };
    std::fs::write(
        t2.layout.join("blobs/sha256").join(m.config.digest.hex()),
        b"{}",
    )
    .unwrap();
    let err = cache
        .get(
            &oci_ref(&t2.layout, Some("v1")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

#[tokio::test]
async fn image_size_limit_fails_and_stores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut big = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(8 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    big.append_data(&mut h, "big", std::io::repeat(7).take(8 << 20))
        .unwrap();
    let big = big.into_inner().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), big],
        "v1",
        false,
    );
    let mut config = CacheConfig::new(tmp.path().join("cache"));
    config.max_image_bytes = 1 << 20;
    let cache = open_cache(config).unwrap();
    let err = cache
        .get(
            &oci_ref(&t.layout, Some("v1")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(
        err.to_string()
            .contains("exceeds the unpacked size limit of 1048576 bytes"),
        "{err}"
    );
    assert!(
        !layer_dirs(&cache)
            .iter()
            .any(|n| n.starts_with(t.diff_ids[1].hex()))
    );
    assert_eq!(session_files(&cache), 0);
}

#[tokio::test]
async fn never_policy_without_cache_is_not_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = cache_at(&tmp.path().join("cache"));
    // Port 1 on loopback: were the network used, this would be Unavailable instead.
    for r in [
        "127.0.0.1:1/fn:v1",
        "127.0.0.1:1/fn@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let image = cache.parse_reference(r).unwrap();
        let err = cache
            .get(&image, GetOptions::new(PullPolicy::Never))
            .await
            .unwrap_err();
        eprintln!("error: {err}");
        assert_eq!(err.kind(), ErrorKind::NotCached, "{err}");
    }
    let image = cache.parse_reference("127.0.0.1:1/fn:v1").unwrap();
    let err = cache
        .get(&image, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_gets_are_safe() {
    let tmp = tempfile::tempdir().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), top_layer()],
        "v1",
        false,
    );
    let cache = Arc::new(cache_at(&tmp.path().join("cache")));
    // A second cache (as another process would) on the same root.
    let other = Arc::new(cache_at(&tmp.path().join("cache")));
    let reference = oci_ref(&t.layout, Some("v1"));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let c = if i % 2 == 0 {
                cache.clone()
            } else {
                other.clone()
            };
            let r = reference.clone();
            tokio::spawn(async move { c.get(&r, GetOptions::new(PullPolicy::IfNotPresent)).await })
        })
        .collect();
    let mut images = Vec::new();
    for t in tasks {
        images.push(t.await.unwrap().unwrap().image);
    }
    assert!(images.windows(2).all(|w| w[0] == w[1]));
    check_image(&cache, &images[0], &t);
    assert_eq!(
        layer_dirs(&cache).len(),
        4,
        "two layer dirs and their size records"
    );
    assert_eq!(session_files(&cache), 0);
    assert_eq!(session_files(&other), 0);
}

/// Mounts the layers as an overlay (lower dirs only, `userxattr`) in a new user and
/// mount namespace and lists what the merged tree shows. `None` if that is impossible here.
fn overlay_listing(layers: &[PathBuf]) -> Option<String> {
    let probe = Command::new("unshare")
        .args(["-Urm", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipping overlay check: cannot create a user namespace with unshare");
        return None;
    }
    let mnt = tempfile::tempdir().unwrap();
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|p| p.display().to_string())
        .collect();
    let script = format!(
        "mount -t overlay overlay -o ro,userxattr,lowerdir={} {m} && ls -A {m}/etc && ls -A {m}/opaque && cat {m}/ro/file",
        lower.join(":"),
        m = mnt.path().display()
    );
    let out = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "overlay mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

fn assert_overlay_semantics(image: &Image) {
    if let Some(listing) = overlay_listing(&image.layers) {
        let lines: Vec<&str> = listing.lines().collect();
        // etc: the whiteout hides `removed`; opaque: the lower `old` is hidden.
        assert_eq!(
            lines,
            vec!["keep", "new", "read-only dir content"],
            "{listing}"
        );
    }
}

#[tokio::test]
async fn unpacked_layers_work_as_overlay_lower_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), top_layer()],
        "v1",
        false,
    );
    let cache = cache_at(&tmp.path().join("cache"));
    let image = cache
        .get(
            &oci_ref(&t.layout, Some("v1")),
            GetOptions::new(PullPolicy::IfNotPresent),
        )
        .await
        .unwrap()
        .image;
    assert_overlay_semantics(&image);
}

const NO_PROVIDER_ENV: &str = "FNRUN_CACHE_TEST_NO_PROVIDER_CHILD";

/// The library installs no process-wide crypto provider: without one, opening a cache
/// fails with a clear error (instead of a panic in the first TLS client). Checked in
/// a child process of this test binary, where no test has installed one.
#[test]
fn opening_without_a_crypto_provider_fails_clearly() {
    if std::env::var_os(NO_PROVIDER_ENV).is_some() {
        return no_provider_child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::opening_without_a_crypto_provider_fails_clearly",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(NO_PROVIDER_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child failed or did not run:\n{stdout}\n{stderr}"
    );
}

/// The child's part of [`opening_without_a_crypto_provider_fails_clearly`].
fn no_provider_child() {
    assert_eq!(std::env::var(NO_PROVIDER_ENV).as_deref(), Ok("1"));
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    let tmp = tempfile::tempdir().unwrap();
    let err = Cache::open(CacheConfig::new(tmp.path())).unwrap_err();
    assert!(
        matches!(err, Error::Registry(RegistryError::NoCryptoProvider)),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(err.to_string().contains("crypto provider"), "{err}");
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_none(),
        "the library must not install one"
    );
}

const CHILD_ENV: &str = "FNRUN_CACHE_TEST_ROOTLESS_CHILD";

/// When run as root, runs [`rootless_child`] as uid/gid 65534 (what a rootless runner sees).
#[test]
fn rootless_unpack_as_unprivileged_user() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return rootless_child();
    }
    if !nix::unistd::geteuid().is_root() {
        // The whole suite already runs rootless.
        return;
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "tests::rootless_unpack_as_unprivileged_user",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("TMPDIR", std::env::temp_dir())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rootless child failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the child test did not run:\n{stdout}\n{stderr}"
    );
}

/// The child's part of [`rootless_unpack_as_unprivileged_user`].
fn rootless_child() {
    assert_eq!(std::env::var(CHILD_ENV).as_deref(), Ok("1"));
    assert!(!nix::unistd::geteuid().is_root());
    let tmp = tempfile::tempdir().unwrap();
    let t = write_layout(
        &tmp.path().join("layout"),
        &[base_layer(), top_layer()],
        "v1",
        false,
    );
    let root = tmp.path().join("cache");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let image = rt.block_on(async {
        let cache = cache_at(&root);
        let image = cache
            .get(
                &oci_ref(&t.layout, Some("v1")),
                GetOptions::new(PullPolicy::IfNotPresent),
            )
            .await
            .unwrap()
            .image;
        check_image(&cache, &image, &t);
        image
    });
    let me = nix::unistd::geteuid().as_raw();
    assert_eq!(
        std::fs::metadata(image.layers[0].join("ro/file"))
            .unwrap()
            .uid(),
        me
    );
    assert_overlay_semantics(&image);
    // A 0555 directory must not stop cleanup.
    crate::unpack::remove_tree(&root).unwrap();
}

/// A docker-registry process on a free loopback port, killed on drop.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have(tool: &str) -> bool {
    Path::new("/usr/bin").join(tool).exists()
}

fn start_registry(htpasswd: Option<(&str, &str)>) -> Option<Registry> {
    start_registry_with(htpasswd, None)
}

/// [`start_registry`], serving HTTPS with `tls` (certificate and key PEM) if given.
fn start_registry_with(
    htpasswd: Option<(&str, &str)>,
    tls: Option<(&str, &str)>,
) -> Option<Registry> {
    if !have("docker-registry") || !have("skopeo") {
        eprintln!("skipping registry test: docker-registry or skopeo is missing");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let auth = match htpasswd {
        Some((user, pass)) => {
            let file = dir.path().join("htpasswd");
            let ok = Command::new("htpasswd")
                .args(["-Bbc", file.to_str().unwrap(), user, pass])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("skipping registry auth test: htpasswd failed");
                return None;
            }
            format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            )
        }
        None => String::new(),
    };
    let tls = match tls {
        Some((cert, key)) => {
            std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
            std::fs::write(dir.path().join("key.pem"), key).unwrap();
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("cert.pem").display(),
                dir.path().join("key.pem").display()
            )
        }
        None => String::new(),
    };
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n{tls}{auth}",
        dir.path().join("data").display()
    );
    let config_path = dir.path().join("config.yml");
    std::fs::File::create(&config_path)
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    let child = Command::new("docker-registry")
        .args(["serve", config_path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Registry {
        child,
        addr,
        _dir: dir,
    })
}

fn push(layout: &Path, tag: &str, dest: &str, creds: Option<&str>) {
    let mut cmd = Command::new("skopeo");
    cmd.args([
        "--insecure-policy",
        "copy",
        "--all",
        "--dest-tls-verify=false",
    ]);
    if let Some(c) = creds {
        cmd.args(["--dest-creds", c]);
    }
    let out = cmd
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_pull_and_policies() {
    let Some(reg) = start_registry(None) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "multi", true);
    push(&layout, "multi", &format!("{}/test/fn:v1", reg.addr), None);
    let cache = cache_at(&tmp.path().join("cache"));
    let r = cache
        .parse_reference(&format!("{}/test/fn:v1", reg.addr))
        .unwrap();

    let image = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);
    assert_eq!(image.reference, format!("{}/test/fn:v1", reg.addr));
    assert_eq!(session_files(&cache), 0);
    let again = cache
        .get(&r, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap()
        .image;
    assert_eq!(again, image);

    let missing = cache
        .parse_reference(&format!("{}/test/fn:nope", reg.addr))
        .unwrap();
    let err = cache
        .get(&missing, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let missing = cache
        .parse_reference(&format!("{}/test/other:v1", reg.addr))
        .unwrap();
    let err = cache
        .get(&missing, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // Pinned by the index digest and by the platform manifest digest.
    assert_eq!(
        std::fs::read_dir(cache.root().join("refs"))
            .unwrap()
            .count(),
        1
    );
    let by_digest = cache
        .parse_reference(&format!("{}/test/fn@{}", reg.addr, t.manifest))
        .unwrap();
    let pinned = cache
        .get(&by_digest, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    assert_eq!(pinned.layers, image.layers);

    // Without the registry: cached images need no network, Always does.
    drop(reg);
    let cached = cache
        .get(&r, GetOptions::new(PullPolicy::Never))
        .await
        .unwrap()
        .image;
    assert!(image.pulled, "the first get pulled");
    assert!(!cached.pulled, "a cached get does not pull");
    assert_eq!(
        cached,
        Image {
            pulled: false,
            ..image.clone()
        }
    );
    let cached_again = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    assert_eq!(cached_again, cached);
    // Leased gets of a tag and of a digest: a held lease is shared, by
    // reference.
    for reference in [&r, &by_digest] {
        let leased = || async {
            let got = cache
                .get(reference, GetOptions::new(PullPolicy::Never).leased())
                .await
                .unwrap();
            (got.image, got.lease.unwrap())
        };
        let (image, held) = leased().await;
        let (again, shared) = leased().await;
        assert_eq!(again, image);
        assert!(Arc::ptr_eq(&held, &shared), "{reference}");
    }
    let err = cache
        .get(&r, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // A fresh cache on the same root (a restarted daemon) still has it.
    drop(cache);
    let cache = cache_at(&tmp.path().join("cache"));
    let restarted = cache
        .get(&r, GetOptions::new(PullPolicy::Never))
        .await
        .unwrap()
        .image;
    assert_eq!(restarted, cached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_basic_auth() {
    if !have("htpasswd") {
        eprintln!("skipping registry auth test: htpasswd is missing");
        return;
    }
    let Some(reg) = start_registry(Some(("alice", "wonderland-secret"))) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    push(
        &layout,
        "v1",
        &format!("{}/private/fn:v1", reg.addr),
        Some("alice:wonderland-secret"),
    );
    let cache = cache_at(&tmp.path().join("cache"));
    let r = cache
        .parse_reference(&format!("{}/private/fn:v1", reg.addr))
        .unwrap();

    let err = cache
        .get(&r, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let wrong = Credentials::Basic {
        username: "alice".into(),
        password: "not-the-password".into(),
    };
    let err = cache
        .get(
            &r,
            GetOptions::new(PullPolicy::Always).credentials(wrong.clone()),
        )
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    assert!(!format!("{wrong:?}").contains("not-the-password"));

    let right = Credentials::Basic {
        username: "alice".into(),
        password: "wonderland-secret".into(),
    };
    let image = cache
        .get(
            &r,
            GetOptions::new(PullPolicy::Always).credentials(right.clone()),
        )
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);
    // Credentials of one request are not reused for another.
    let err = cache
        .get(&r, GetOptions::new(PullPolicy::Always))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
}

mod registry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_of_an_archive_dropped_while_extracting_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    // A layer that takes a while to extract.
    let big = TarBuilder::new()
        .add(Member::File(b"big", &noise(16 << 20), 0o644))
        .tar();
    write_layout(&layout, &[big], "v1", false);
    let archive = tmp.path().join("image.tar");
    let mut tar = tar::Builder::new(std::fs::File::create(&archive).unwrap());
    tar.append_dir_all(".", &layout).unwrap();
    tar.into_inner().unwrap();

    let cache = cache_at(&tmp.path().join("cache"));
    let r = cache
        .parse_reference(&format!("oci-archive:{}:v1", archive.display()))
        .unwrap();
    let session = cache.inner.store.tmp_path("x").parent().unwrap().to_owned();
    let extracting = async {
        while !std::fs::read_dir(&session).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("oci-archive")))
        }) {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    };
    // The pull is dropped once its extraction has started.
    tokio::select! {
        _ = cache.get(&r, GetOptions::new(PullPolicy::IfNotPresent)) => {
            panic!("the pull ended before it could be dropped")
        }
        () = extracting => {}
    }
    // The extraction finishes on its own, and nobody takes its result: it is removed.
    assert_eq!(session_files(&cache), 0);
    // And the image can be pulled afterwards.
    let image = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    assert_eq!(image.layers.len(), 1);
    assert_eq!(session_files(&cache), 0);
}
