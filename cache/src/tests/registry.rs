//! Registry hardening: private CAs, single flight, lying registries, secrets in logs.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Entries of `dir` (sorted), empty if it does not exist.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Reads one request head (request line and headers); `None` at EOF or on garbage.
async fn read_head<R: AsyncBufReadExt + Unpin>(conn: &mut R) -> Option<Vec<String>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read_line(&mut line))
            .await
            .ok()?
            .ok()?;
        if n == 0 || head.len() > 100 {
            return None;
        }
        if line == "\r\n" {
            return Some(head);
        }
        head.push(line.trim_end().to_owned());
    }
}

/// A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key) PEM.
fn test_pki() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_registry_needs_the_ca_bundle() {
    // Bundles are checked when the cache opens.
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = CacheConfig::new(tmp.path().join("bad"));
    bad.ca_bundle = Some(b"not a certificate".to_vec());
    let err = open_cache(bad).unwrap_err();
    assert!(err.to_string().contains("CA bundle"), "{err}");

    let (ca, cert, key) = test_pki();
    let Some(reg) = start_registry_with(None, Some((&cert, &key))) else {
        return;
    };
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    push(&layout, "v1", &format!("{}/tls/fn:v1", reg.addr), None);
    let reference = format!("{}/tls/fn:v1", reg.addr);

    // A loopback registry that speaks TLS is verified: unknown CA, clear error.
    let cache = cache_at(&tmp.path().join("no-bundle"));
    let r = cache.parse_reference(&reference).unwrap();
    let err = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap_err();
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    assert!(entries(&cache.root().join("blobs/sha256")).is_empty());

    // With the CA bundle (other certificates around it are fine) it pulls.
    let (other_ca, _, _) = test_pki();
    let mut config = CacheConfig::new(tmp.path().join("bundle"));
    config.ca_bundle = Some(format!("# private CAs\n{other_ca}\n{ca}").into_bytes());
    let cache = open_cache(config).unwrap();
    let image = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);
}

/// A proxy to `upstream` that counts the GETs of each path, one request per connection.
async fn counting_proxy(upstream: String) -> (String, Arc<Mutex<HashMap<String, usize>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (upstream, counts) = (upstream.clone(), c.clone());
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let Some(head) = read_head(&mut conn).await else {
                    return;
                };
                let mut parts = head[0].split(' ');
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                if method == "GET" {
                    *counts.lock().unwrap().entry(path.to_owned()).or_insert(0) += 1;
                }
                // GETs and HEADs have no body; one request per connection.
                let mut request = head[0].clone() + "\r\n";
                for h in &head[1..] {
                    if !h.to_ascii_lowercase().starts_with("connection:") {
                        request += &format!("{h}\r\n");
                    }
                }
                request += "Connection: close\r\n\r\n";
                let Ok(mut up) = TcpStream::connect(&upstream).await else {
                    return;
                };
                if up.write_all(request.as_bytes()).await.is_err() {
                    return;
                }
                let mut conn = conn.into_inner();
                let _ = tokio::io::copy(&mut up, &mut conn).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_pulls_fetch_each_blob_once() {
    let Some(reg) = start_registry(None) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    push(&layout, "v1", &format!("{}/sf/fn:v1", reg.addr), None);
    let (proxy, counts) = counting_proxy(reg.addr.clone()).await;

    let cache = Arc::new(cache_at(&tmp.path().join("cache")));
    let r = cache.parse_reference(&format!("{proxy}/sf/fn:v1")).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (cache, r) = (cache.clone(), r.clone());
        tasks.push(tokio::spawn(async move {
            cache
                .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
                .await
        }));
    }
    let mut images = Vec::new();
    for task in tasks {
        images.push(task.await.unwrap().unwrap().image);
    }
    check_image(&cache, &images[0], &t);
    for image in &images {
        assert_eq!(image.layers, images[0].layers);
        assert_eq!(image.digest, images[0].digest);
    }
    assert_eq!(images.iter().filter(|i| i.pulled).count(), 1);

    let counts = counts.lock().unwrap().clone();
    let blobs: BTreeMap<&String, &usize> = counts
        .iter()
        .filter(|(p, _)| p.contains("/blobs/sha256:"))
        .collect();
    let config = std::fs::read(layout.join("blobs/sha256").join(t.manifest.hex())).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&config).unwrap();
    let mut expected = vec![manifest["config"]["digest"].as_str().unwrap().to_owned()];
    expected.extend(t.layer_blobs.iter().map(|d| d.to_string()));
    assert_eq!(blobs.len(), expected.len(), "{blobs:?}");
    for d in &expected {
        let path = format!("/v2/sf/fn/blobs/{d}");
        assert_eq!(counts.get(&path), Some(&1), "{path}: {blobs:?}");
    }
    let manifests: Vec<_> = counts
        .iter()
        .filter(|(p, _)| p.contains("/manifests/"))
        .collect();
    assert_eq!(manifests, vec![(&"/v2/sf/fn/manifests/v1".to_owned(), &1)]);
}

/// How the lying registry lies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Lie {
    Honest,
    /// The first layer's bytes differ from its digest (same size).
    Mismatch,
    /// The first layer is cut in half: full Content-Length, then close.
    Truncated,
    /// The manifest is larger than the manifest cap.
    HugeManifest,
    /// The manifest says it is a schema 1 manifest.
    ManifestMediaType,
    /// A layer has an unknown media type.
    LayerMediaType,
    /// The manifest has no length and does not end (up to [`ENDLESS_BYTES`]).
    EndlessManifest,
}

/// How much of an endless manifest the lying registry sends at most.
const ENDLESS_BYTES: u64 = 1 << 30;

/// Blobs the lying registry has sent as a range (206).
static PARTIAL_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of endless manifests the lying registry has sent.
static ENDLESS_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A registry at 127.0.0.1 serving `lie/fn:v1` (and the same image as `lie/fn:v2`) from
/// `blobs` and `manifest`, lying as `mode` says.
async fn lying_registry(
    manifest: Vec<u8>,
    blobs: HashMap<String, Vec<u8>>,
    bad_layer: String,
    mode: Arc<AtomicU8>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (manifest, blobs) = (Arc::new(manifest), Arc::new(blobs));
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (manifest, blobs, bad_layer, mode) = (
                manifest.clone(),
                blobs.clone(),
                bad_layer.clone(),
                mode.clone(),
            );
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let Some(head) = read_head(&mut conn).await else {
                    return;
                };
                let lie = match mode.load(Ordering::SeqCst) {
                    1 => Lie::Mismatch,
                    2 => Lie::Truncated,
                    3 => Lie::HugeManifest,
                    4 => Lie::ManifestMediaType,
                    5 => Lie::LayerMediaType,
                    6 => Lie::EndlessManifest,
                    _ => Lie::Honest,
                };
                let path = head[0].split(' ').nth(1).unwrap_or("").to_owned();
                if lie == Lie::EndlessManifest && path.contains("/manifests/") {
                    let mut conn = conn.into_inner();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {OCI_MANIFEST}\r\nConnection: close\r\n\r\n{{\"schemaVersion\":2,\"annotations\":{{\"pad\":\""
                    );
                    let pad = vec![b'x'; 64 << 10];
                    let mut ok = conn.write_all(head.as_bytes()).await.is_ok();
                    while ok && ENDLESS_SENT.load(Ordering::SeqCst) < ENDLESS_BYTES {
                        ok = conn.write_all(&pad).await.is_ok();
                        ENDLESS_SENT.fetch_add(pad.len() as u64, Ordering::SeqCst);
                    }
                    return;
                }
                let mut content_type = "application/octet-stream".to_owned();
                let (status, mut body) = if path == "/v2/" {
                    ("200 OK", b"{}".to_vec())
                } else if path == "/v2/lie/fn/manifests/v1" || path == "/v2/lie/fn/manifests/v2" {
                    content_type = OCI_MANIFEST.to_owned();
                    let text = String::from_utf8(manifest.to_vec()).unwrap();
                    let body = match lie {
                        Lie::HugeManifest => text.replacen(
                            "\"schemaVersion\":2",
                            &format!(
                                "\"schemaVersion\":2,\"annotations\":{{\"pad\":\"{}\"}}",
                                "x".repeat(5 << 20)
                            ),
                            1,
                        ),
                        Lie::ManifestMediaType => {
                            content_type =
                                "application/vnd.docker.distribution.manifest.v1+prettyjws".into();
                            text.replace(OCI_MANIFEST, &content_type)
                        }
                        Lie::LayerMediaType => text.replacen(GZ_LAYER, "application/x-evil", 1),
                        _ => text,
                    };
                    ("200 OK", body.into_bytes())
                } else if let Some(d) = path.strip_prefix("/v2/lie/fn/blobs/")
                    && let Some(b) = blobs.get(d)
                {
                    let mut b = b.clone();
                    if lie == Lie::Mismatch && d == bad_layer {
                        let last = b.len() - 1;
                        b[last] ^= 0xff;
                    }
                    // Ranges are served, as docker-registry does: a whole blob asked
                    // as `bytes=0-` comes back as 206, which oci-client does not hash.
                    let ranged = head
                        .iter()
                        .any(|h| h.to_ascii_lowercase().starts_with("range: bytes=0-"));
                    if ranged && !b.is_empty() {
                        PARTIAL_SENT.fetch_add(1, Ordering::SeqCst);
                        content_type = format!(
                            "application/octet-stream\r\nContent-Range: bytes 0-{}/{}",
                            b.len() - 1,
                            b.len()
                        );
                        ("206 Partial Content", b)
                    } else {
                        ("200 OK", b)
                    }
                } else {
                    (
                        "404 Not Found",
                        br#"{"errors":[{"code":"NOT_FOUND","message":"no"}]}"#.to_vec(),
                    )
                };
                let len = body.len();
                if lie == Lie::Truncated && path.ends_with(&bad_layer) {
                    body.truncate(len / 2);
                }
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nDocker-Distribution-Api-Version: registry/2.0\r\nConnection: close\r\n\r\n"
                );
                let mut conn = conn.into_inner();
                if conn.write_all(resp.as_bytes()).await.is_ok() {
                    let _ = conn.write_all(&body).await;
                }
                let _ = conn.shutdown().await;
                // Drain what is left so the close is not a reset.
                let mut rest = [0u8; 1024];
                let _ =
                    tokio::time::timeout(Duration::from_millis(100), conn.read(&mut rest)).await;
            });
        }
    });
    addr
}

/// The blobs of an OCI layout by digest (`sha256:...`).
fn layout_blobs(layout: &Path) -> HashMap<String, Vec<u8>> {
    let blob_dir = layout.join("blobs/sha256");
    let mut blobs = HashMap::new();
    for name in entries(&blob_dir) {
        blobs.insert(
            format!("sha256:{name}"),
            std::fs::read(blob_dir.join(&name)).unwrap(),
        );
    }
    blobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_registry_is_refused_and_nothing_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = write_layout(&layout, &[base_layer(), top_layer()], "v1", false);
    let blobs = layout_blobs(&layout);
    let manifest = blobs[&t.manifest.to_string()].clone();
    let config_digest =
        serde_json::from_slice::<serde_json::Value>(&manifest).unwrap()["config"]["digest"]
            .as_str()
            .unwrap()
            .to_owned();
    let bad = t.layer_blobs[0].to_string();
    let mode = Arc::new(AtomicU8::new(0));
    let addr = lying_registry(manifest, blobs, bad.clone(), mode.clone()).await;

    let cache = cache_at(&tmp.path().join("cache"));
    let r = cache.parse_reference(&format!("{addr}/lie/fn:v1")).unwrap();
    let blobs_dir = cache.root().join("blobs/sha256");
    let cases = [
        (Lie::Mismatch, ErrorKind::Corrupt, "digest mismatch"),
        (Lie::Truncated, ErrorKind::Unavailable, "download of layer"),
        (Lie::HugeManifest, ErrorKind::Corrupt, "larger than"),
        (Lie::EndlessManifest, ErrorKind::Corrupt, "larger than"),
        (Lie::ManifestMediaType, ErrorKind::Corrupt, "media type"),
        (
            Lie::LayerMediaType,
            ErrorKind::Corrupt,
            "application/x-evil",
        ),
    ];
    let session = cache.inner.store.tmp_path("x").parent().unwrap().to_owned();
    for (lie, kind, text) in cases {
        mode.store(lie as u8, Ordering::SeqCst);
        let (blobs_before, layers_before) = (entries(&blobs_dir), layer_dirs(&cache));
        let err = cache
            .get(&r, GetOptions::new(PullPolicy::Always))
            .await
            .unwrap_err();
        eprintln!("{lie:?}: {err}");
        assert_eq!(err.kind(), kind, "{lie:?}: {err}");
        assert!(err.to_string().contains(text), "{lie:?}: {err}");
        if lie == Lie::Mismatch {
            // The lie was found by fnrun's own check: the blobs came as ranges,
            // which oci-client passes through unhashed.
            assert!(PARTIAL_SENT.load(Ordering::SeqCst) > 0);
        }
        if lie == Lie::EndlessManifest {
            // Refused once past the cap, not read to its end: what was sent is the
            // cap and what the sockets buffer.
            let sent = ENDLESS_SENT.load(Ordering::SeqCst);
            assert!(sent < 64 << 20, "{sent} bytes of the manifest were read");
        }
        // A failed pull has finished all its work when it returns: no partial file,
        // nothing still unpacking.
        assert!(
            entries(&session).is_empty(),
            "{lie:?}: {:?}",
            entries(&session)
        );
        // Only documents that were verified may be stored; never the lying
        // layer. The honest layer downloads (and unpacks) alongside it and
        // may be done and verified before the lie is found.
        let stored = entries(&blobs_dir);
        assert!(
            !stored.contains(&t.layer_blobs[0].hex().to_owned()),
            "{lie:?}"
        );
        for name in &stored {
            assert!(
                *name == t.manifest.hex()
                    || format!("sha256:{name}") == config_digest
                    || t.layer_blobs[1..].iter().any(|d| d.hex() == name),
                "{lie:?}: unexpected blob {name}"
            );
        }
        if matches!(
            lie,
            Lie::HugeManifest | Lie::EndlessManifest | Lie::ManifestMediaType | Lie::LayerMediaType
        ) {
            // Refused before anything else was fetched: nothing new.
            assert_eq!(stored, blobs_before, "{lie:?}");
            assert_eq!(layer_dirs(&cache), layers_before, "{lie:?}");
        }
        for dir in layer_dirs(&cache) {
            // A layer's directory, or its size record beside it.
            let hex = dir.strip_suffix(".json").unwrap_or(&dir);
            assert!(
                t.diff_ids[1..].iter().any(|d| d.hex() == hex),
                "{lie:?}: layer {dir} was unpacked"
            );
        }
        assert!(
            std::fs::read_dir(cache.root().join("refs"))
                .unwrap()
                .next()
                .is_none()
        );
        // Nothing turns up later either.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            entries(&session).is_empty(),
            "{lie:?}: {:?}",
            entries(&session)
        );
        assert_eq!(entries(&blobs_dir), stored, "{lie:?}");
    }

    // Nothing at all was stored by the lies that fail before the manifest is verified.
    let fresh = cache_at(&tmp.path().join("fresh"));
    for lie in [
        Lie::HugeManifest,
        Lie::ManifestMediaType,
        Lie::LayerMediaType,
    ] {
        mode.store(lie as u8, Ordering::SeqCst);
        fresh
            .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
            .await
            .unwrap_err();
        assert!(
            entries(&fresh.root().join("blobs/sha256")).is_empty(),
            "{lie:?}"
        );
        assert!(layer_dirs(&fresh).is_empty(), "{lie:?}");
    }

    // An honest pull of the same image works afterwards.
    mode.store(Lie::Honest as u8, Ordering::SeqCst);
    let image = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    check_image(&cache, &image, &t);
    let image = fresh
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap()
        .image;
    check_image(&fresh, &image, &t);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn credentials_never_appear_in_logs_or_errors() {
    if !have("htpasswd") {
        eprintln!("skipping: htpasswd is missing");
        return;
    }
    let Some(reg) = start_registry(Some(("alice", "wonderland-secret"))) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    write_layout(&layout, &[base_layer()], "v1", false);
    push(
        &layout,
        "v1",
        &format!("{}/private/fn:v1", reg.addr),
        Some("alice:wonderland-secret"),
    );
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let cache = cache_at(&tmp.path().join("cache"));
    let secrets = [
        "wonderland-secret",
        "hunter2-password",
        "tok-s3cret-value",
        // base64 of the user:password pairs, as sent in Authorization: Basic.
        "YWxpY2U6d29uZGVybGFuZC1zZWNyZXQ",
        "YWxpY2U6aHVudGVyMi1wYXNzd29yZA",
    ];
    let mut errors = Vec::new();
    let wrong = Credentials::Basic {
        username: "alice".into(),
        password: "hunter2-password".into(),
    };
    let right = Credentials::Basic {
        username: "alice".into(),
        password: "wonderland-secret".into(),
    };
    let bearer = Credentials::Bearer {
        token: "tok-s3cret-value".into(),
    };
    for (tag, creds) in [("v1", &wrong), ("nope", &right), ("v1", &bearer)] {
        let r = cache
            .parse_reference(&format!("{}/private/fn:{tag}", reg.addr))
            .unwrap();
        let err = cache
            .get(
                &r,
                GetOptions::new(PullPolicy::Always).credentials(creds.clone()),
            )
            .await
            .unwrap_err();
        errors.push(format!("{err} {err:?} {creds:?}"));
    }
    drop(_guard);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("pulling image"),
        "logs were not captured: {logs}"
    );
    for secret in secrets {
        assert!(!logs.contains(secret), "{secret} in logs:\n{logs}");
        for e in &errors {
            assert!(!e.contains(secret), "{secret} in error: {e}");
        }
    }
}

/// A [`PullProgress`] that records every call as (method, digest, number).
#[derive(Default)]
struct Recorder(Mutex<Vec<(&'static str, String, u64)>>);

impl Recorder {
    fn push(&self, method: &'static str, digest: &str, n: u64) {
        self.0.lock().unwrap().push((method, digest.to_owned(), n));
    }

    /// The calls for `digest` in order, consecutive `bytes` calls summed into one.
    fn calls(&self, digest: &str) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = Vec::new();
        for (method, d, n) in self.0.lock().unwrap().iter() {
            if d != digest {
                continue;
            }
            match out.last_mut() {
                Some(("bytes", sum)) if *method == "bytes" => *sum += n,
                _ => out.push((method, *n)),
            }
        }
        out
    }

    /// Every digest reported, sorted.
    fn digests(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.lock().unwrap().iter().map(|c| c.1.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

impl PullProgress for Recorder {
    fn layer_started(&self, digest: &str, total_bytes: u64) {
        self.push("started", digest, total_bytes);
    }
    fn layer_bytes(&self, digest: &str, n: u64) {
        self.push("bytes", digest, n);
    }
    fn layer_downloaded(&self, digest: &str) {
        self.push("downloaded", digest, 0);
    }
    fn layer_unpacking(&self, digest: &str) {
        self.push("unpacking", digest, 0);
    }
    fn layer_done(&self, digest: &str) {
        self.push("done", digest, 0);
    }
    fn layer_cached(&self, digest: &str, total_bytes: u64) {
        self.push("cached", digest, total_bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_progress_reports_every_layer_to_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    // A layer of 2 MiB that does not compress arrives in many chunks.
    let noise = noise(2 << 20);
    let big = TarBuilder::new()
        .add(Member::File(b"noise", &noise, 0o644))
        .tar();
    let t = write_layout(&layout, &[base_layer(), big], "v1", false);
    let blobs = layout_blobs(&layout);
    let manifest = blobs[&t.manifest.to_string()].clone();
    let layers: Vec<(String, u64)> = t
        .layer_blobs
        .iter()
        .map(|d| (d.to_string(), blobs[&d.to_string()].len() as u64))
        .collect();
    let mut layer_digests: Vec<String> = layers.iter().map(|l| l.0.clone()).collect();
    layer_digests.sort();
    let honest = Arc::new(AtomicU8::new(Lie::Honest as u8));
    let addr = lying_registry(manifest, blobs, String::new(), honest).await;

    // A first pull downloads and unpacks every layer, byte by byte; the config and the
    // manifest are not reported.
    let cache = cache_at(&tmp.path().join("cache"));
    let v1 = cache.parse_reference(&format!("{addr}/lie/fn:v1")).unwrap();
    let rec = Arc::new(Recorder::default());
    let image = cache
        .get(
            &v1,
            GetOptions::new(PullPolicy::IfNotPresent).progress(rec.clone()),
        )
        .await
        .unwrap()
        .image;
    assert!(image.pulled);
    assert_eq!(rec.digests(), layer_digests);
    for (digest, size) in &layers {
        assert_eq!(
            rec.calls(digest),
            vec![
                ("started", *size),
                ("bytes", *size),
                ("downloaded", 0),
                ("unpacking", 0),
                ("done", 0)
            ],
            "{digest}"
        );
    }
    let chunks = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.0 == "bytes")
        .count();
    assert!(chunks > layers.len(), "the big layer came in one chunk");

    // Pulled again: every layer is there already.
    let rec = Arc::new(Recorder::default());
    cache
        .get(
            &v1,
            GetOptions::new(PullPolicy::Always).progress(rec.clone()),
        )
        .await
        .unwrap();
    for (digest, size) in &layers {
        assert_eq!(rec.calls(digest), vec![("cached", *size)], "{digest}");
    }
    // From the local index: nothing is pulled, nothing reported.
    let rec = Arc::new(Recorder::default());
    cache
        .get(
            &v1,
            GetOptions::new(PullPolicy::IfNotPresent).progress(rec.clone()),
        )
        .await
        .unwrap();
    assert!(rec.digests().is_empty());

    // Two pulls at once (two tags of one image) into a fresh cache: each blob is
    // downloaded and unpacked once, by one of them, and every layer each pull started
    // ends, whoever did the work.
    let fresh = Arc::new(cache_at(&tmp.path().join("fresh")));
    let mut tasks = Vec::new();
    for tag in ["v1", "v2"] {
        let r = fresh
            .parse_reference(&format!("{addr}/lie/fn:{tag}"))
            .unwrap();
        let (fresh, rec) = (fresh.clone(), Arc::new(Recorder::default()));
        let progress = rec.clone();
        tasks.push(tokio::spawn(async move {
            fresh
                .get(
                    &r,
                    GetOptions::new(PullPolicy::IfNotPresent).progress(progress),
                )
                .await
                .map(|_| rec)
        }));
    }
    let mut recs = Vec::new();
    for task in tasks {
        recs.push(task.await.unwrap().unwrap());
    }
    for (digest, size) in &layers {
        let (mut bytes, mut unpacks) = (0, 0);
        for rec in &recs {
            let calls = rec.calls(digest);
            bytes += calls
                .iter()
                .filter(|c| c.0 == "bytes")
                .map(|c| c.1)
                .sum::<u64>();
            unpacks += calls.iter().filter(|c| c.0 == "unpacking").count();
            if calls == [("cached", *size)] {
                continue;
            }
            assert_eq!(
                calls.first(),
                Some(&("started", *size)),
                "{digest}: {calls:?}"
            );
            assert!(calls.contains(&("downloaded", 0)), "{digest}: {calls:?}");
            assert_eq!(calls.last(), Some(&("done", 0)), "{digest}: {calls:?}");
        }
        assert_eq!(bytes, *size, "{digest}: downloaded once");
        assert_eq!(unpacks, 1, "{digest}: unpacked once");
    }
}

/// How [`tag_registry`] answers `GET /v2/<repo>/tags/list`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TagLister {
    /// Pages of `n` after `last`, as the distribution spec says.
    Paged,
    /// Every tag at once, whatever `n` says.
    All,
    /// The first page again, whatever `last` says.
    Stuck,
    /// A body larger than any tag list.
    Huge,
}

/// A registry at 127.0.0.1 that lists `tags` of repository `fns/tagged`
/// (404 for any other) as `mode` says; counts the requests.
async fn tag_registry(
    tags: Vec<String>,
    mode: TagLister,
    requests: Arc<std::sync::atomic::AtomicUsize>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tags = Arc::new(tags);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (tags, requests) = (tags.clone(), requests.clone());
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let Some(head) = read_head(&mut conn).await else {
                    return;
                };
                let target = head[0].split(' ').nth(1).unwrap_or("").to_owned();
                let (path, query) = target.split_once('?').unwrap_or((&target, ""));
                let param = |key: &str| {
                    query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                        .map(str::to_owned)
                };
                let (status, body) = if path == "/v2/" {
                    ("200 OK", "{}".to_owned())
                } else if path == "/v2/fns/tagged/tags/list" {
                    requests.fetch_add(1, Ordering::SeqCst);
                    let n: usize = param("n")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(usize::MAX);
                    let after = param("last");
                    let page: Vec<&String> = match mode {
                        TagLister::All => tags.iter().collect(),
                        TagLister::Stuck => tags.iter().take(n).collect(),
                        TagLister::Paged | TagLister::Huge => tags
                            .iter()
                            .skip_while(|t| after.as_ref().is_some_and(|a| *t <= a))
                            .take(n)
                            .collect(),
                    };
                    let json = serde_json::json!({"name": "fns/tagged", "tags": page}).to_string();
                    let json = match mode {
                        TagLister::Huge => format!("{json}{}", " ".repeat(5 << 20)),
                        _ => json,
                    };
                    ("200 OK", json)
                } else {
                    (
                        "404 Not Found",
                        r#"{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry"}]}"#
                            .to_owned(),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nDocker-Distribution-Api-Version: registry/2.0\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let mut conn = conn.into_inner();
                let _ = conn.write_all(resp.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn tags_are_listed_page_by_page_and_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = cache_at(tmp.path());
    // Sorted as a registry lists them; names that are not tags are dropped.
    let mut tags: Vec<String> = (0..2500).map(|i| format!("v1.{i:04}.0")).collect();
    tags.push("latest".to_owned());
    tags.push("-not-a-tag".to_owned());
    tags.sort();
    let want: Vec<String> = tags
        .iter()
        .filter(|t| *t != "-not-a-tag")
        .cloned()
        .collect();
    for mode in [TagLister::Paged, TagLister::All, TagLister::Stuck] {
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let addr = tag_registry(tags.clone(), mode, requests.clone()).await;
        // The tag and digest of the reference do not matter.
        let reference = cache
            .parse_reference(&format!("{addr}/fns/tagged:v9@sha256:{}", "a".repeat(64)))
            .unwrap();
        let listed = cache
            .list_tags(&reference, &Credentials::Anonymous)
            .await
            .unwrap();
        match mode {
            TagLister::Paged => {
                assert!(listed == want, "{} tags listed", listed.len());
                assert_eq!(requests.load(Ordering::SeqCst), 3);
            }
            TagLister::All => {
                assert!(listed == want, "{} tags listed", listed.len());
                assert_eq!(requests.load(Ordering::SeqCst), 1);
            }
            // The same page again ends the listing.
            _ => {
                assert_eq!(listed.len(), 999);
                assert_eq!(requests.load(Ordering::SeqCst), 2);
            }
        }
    }
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addr = tag_registry(tags.clone(), TagLister::Huge, requests).await;
    let reference = cache
        .parse_reference(&format!("{addr}/fns/tagged"))
        .unwrap();
    let err = cache
        .list_tags(&reference, &Credentials::Anonymous)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
    let reference = cache.parse_reference(&format!("{addr}/fns/other")).unwrap();
    let err = cache
        .list_tags(&reference, &Credentials::Anonymous)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let layout = cache.parse_reference("oci:/some/layout:v1").unwrap();
    let err = cache
        .list_tags(&layout, &Credentials::Anonymous)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidReference, "{err}");
    assert!(err.to_string().contains("not a registry image"), "{err}");
}

/// A proxy to `upstream` that forwards requests as they come and answers at most
/// `chunk` bytes every `pause`: a slow registry.
async fn trickling_proxy(upstream: String, chunk: usize, pause: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut conn_read, mut conn_write) = conn.into_split();
                let (mut up_read, mut up_write) = up.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut conn_read, &mut up_write).await;
                    let _ = up_write.shutdown().await;
                });
                let mut buf = vec![0u8; chunk];
                loop {
                    let n = match up_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if conn_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                }
                let _ = conn_write.shutdown().await;
            });
        }
    });
    addr
}

/// An image of [`base_layer`] and a layer of `len` bytes that do not compress.
fn image_with_noise(layout: &Path, len: usize) -> TestImage {
    let big = noise(len);
    let noisy = TarBuilder::new()
        .add(Member::File(b"noise", &big, 0o644))
        .tar();
    write_layout(layout, &[base_layer(), noisy], "v1", false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_from_a_slow_registry_ends_at_its_deadline() {
    let Some(reg) = start_registry(None) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    // 8 MiB at 16 KiB per 100 ms: nearly a minute to download.
    let t = image_with_noise(&layout, 8 << 20);
    push(&layout, "v1", &format!("{}/slow/fn:v1", reg.addr), None);
    let proxy = trickling_proxy(reg.addr.clone(), 16 << 10, Duration::from_millis(100)).await;

    let mut config = CacheConfig::new(tmp.path().join("cache"));
    let timeout = Duration::from_secs(3);
    config.pull_timeout = Some(timeout);
    let cache = Arc::new(open_cache(config).unwrap());
    let reference = format!("{proxy}/slow/fn:v1");
    let r = cache.parse_reference(&reference).unwrap();
    let started = Instant::now();
    // A second `get` of the same reference waits for the first's pull, within
    // its own deadline.
    let waiter = {
        let (cache, r) = (cache.clone(), r.clone());
        tokio::spawn(async move {
            cache
                .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
                .await
        })
    };
    let err = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("after {took:?}: {err}");
    assert!(matches!(err, Error::PullTimeout { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&reference)
            && message.contains("3s")
            && message.contains("--pull-timeout"),
        "{message}"
    );
    // Not before the deadline, and well before the download could have ended.
    assert!(took >= timeout, "{took:?}");
    assert!(took < Duration::from_secs(40), "{took:?}");
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::PullTimeout { .. }), "{err}");

    // Nothing of the big layer is left: no partial download, no blob, no reference.
    let session = cache.inner.store.tmp_path("x").parent().unwrap().to_owned();
    assert!(entries(&session).is_empty(), "{:?}", entries(&session));
    let blobs = entries(&cache.root().join("blobs/sha256"));
    assert!(
        !blobs.contains(&t.layer_blobs[1].hex().to_owned()),
        "{blobs:?}"
    );
    assert!(entries(&cache.root().join("refs")).is_empty());

    // From the registry itself, the same cache directory pulls it (without a
    // deadline: a loaded machine may need more than 3 s for 8 MiB).
    let whole = cache_at(&tmp.path().join("cache"));
    let direct = whole
        .parse_reference(&format!("{}/slow/fn:v1", reg.addr))
        .unwrap();
    let got = whole
        .get(&direct, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap();
    assert!(got.image.pulled);
    assert_eq!(got.image.layers.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_over_the_size_limit_is_refused_before_its_layers_are_downloaded() {
    let Some(reg) = start_registry(None) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let t = image_with_noise(&layout, 4 << 20);
    push(&layout, "v1", &format!("{}/big/fn:v1", reg.addr), None);
    let (proxy, counts) = counting_proxy(reg.addr.clone()).await;

    let mut config = CacheConfig::new(tmp.path().join("cache"));
    config.max_image_bytes = 1 << 20;
    let cache = open_cache(config).unwrap();
    let r = cache
        .parse_reference(&format!("{proxy}/big/fn:v1"))
        .unwrap();
    let err = cache
        .get(&r, GetOptions::new(PullPolicy::IfNotPresent))
        .await
        .unwrap_err();
    eprintln!("{err}");
    assert!(
        matches!(err, Error::TooLarge { limit, .. } if limit == 1 << 20),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("exceeds the unpacked size limit of 1048576 bytes"),
        "{err}"
    );
    // The manifest and config were read; no layer was asked for.
    let counts = counts.lock().unwrap().clone();
    for d in &t.layer_blobs {
        let path = format!("/v2/big/fn/blobs/{d}");
        assert_eq!(counts.get(&path), None, "{path}: {counts:?}");
    }
    assert!(
        counts.keys().any(|p| p.contains("/manifests/")),
        "{counts:?}"
    );
    assert!(entries(&cache.root().join("refs")).is_empty());
}
