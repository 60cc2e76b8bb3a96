//! The fuzz targets' bodies. Each takes the fuzzer's bytes and asserts a
//! property, not only that nothing panics; `fuzz/libfuzzer/` wraps each in a
//! libFuzzer target (`scripts/fuzz`), and `tests/replay.rs` runs every file
//! of `corpus/NAME/` and `artifacts/NAME/` through it in `cargo test`.

use fnrun_api::v1::RunFunctionRequest;
use fnrun_api::yaml_bounds::{self, BoundsError};
use fnrun_api::{functionio, functionio_v1, quantity, resourcelist};
use prost::Message;

/// A target's body.
pub type Body = fn(&[u8]);

/// Every target: its name (the directory of its corpus and crashes, the
/// file of its libFuzzer target) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("yaml_bounds", yaml_bounds),
    ("functionio", functionio),
    ("resourcelist", resourcelist),
    ("v1_mapping", v1_mapping),
    ("quantity", quantity),
    ("reference", reference),
    ("functions_file", functions_file),
    ("semver", semver),
    ("duration", duration),
    ("authority", authority),
    ("docker_config", docker_config),
    ("spawner_codec", spawner_codec),
    ("manifest", manifest),
    ("layer", layer),
    ("cgroup_file", cgroup_file),
];

/// The YAML bounds check agrees with the parser: what it refuses for
/// nesting, recursion or a second document, serde_norway refuses too; what
/// it passes never reaches serde_norway's recursion limit.
pub fn yaml_bounds(data: &[u8]) {
    let parsed = serde_norway::from_slice::<serde_norway::Value>(data).map_err(|e| e.to_string());
    match yaml_bounds::check(data) {
        Ok(()) => {
            if let Err(e) = &parsed {
                assert!(!is_recursion_limit(e), "passed, but: {e}");
            }
        }
        // A policy of fnrun's, not the parser's.
        Err(BoundsError::AliasBudget { .. }) => {}
        Err(e) => assert!(parsed.is_err(), "refused ({e}), but the parser read it"),
    }
}

/// Whether serde_norway's error `e` is its recursion limit: the message
/// whole, with only a location after it. Matching a part of it would match
/// an input that quotes the words in a path of another error.
fn is_recursion_limit(e: &str) -> bool {
    let Some(rest) = e.strip_prefix("recursion limit exceeded") else {
        return false;
    };
    rest.is_empty()
        || rest.strip_prefix(" at line ").is_some_and(|at| {
            at.split(" column ")
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// A FunctionIO the validator accepts is accepted again once written out,
/// and reads back the same.
pub fn functionio(data: &[u8]) {
    if let Ok(io) = functionio::validate(data) {
        let again = serde_norway::to_string(&io).expect("a FunctionIO serialises");
        let back = functionio::validate(again.as_bytes())
            .unwrap_or_else(|e| panic!("its own YAML is refused: {e}\n{again}"));
        assert_eq!(
            serde_norway::to_string(&back).expect("serialises"),
            again,
            "reads back differently"
        );
    }
}

/// A ResourceList the validator accepts: its own `to_yaml()` passes too,
/// and reads back equal.
pub fn resourcelist(data: &[u8]) {
    if let Ok(list) = resourcelist::validate_input(data) {
        let again = list.to_yaml().expect("a ResourceList serialises");
        let back = resourcelist::validate_input(again.as_bytes())
            .unwrap_or_else(|e| panic!("its own YAML is refused: {e}\n{again}"));
        assert_eq!(back, list, "reads back differently:\n{again}");
    }
    let _ = resourcelist::validate_output(data);
}

/// Any v1 request that the mapping takes (it refuses, as INVALID_ARGUMENT
/// in the daemon, one with a NaN or infinite number: JSON has none) maps to
/// a FunctionIO that the validator accepts; that
/// FunctionIO, returned as the function's output (a function that changes
/// nothing), maps to a response; and the response's desired state maps to
/// the same FunctionIO desired state again: the mapping round-trips the
/// desired state (connection details are strings in FunctionIO, so both
/// sides carry them as such).
pub fn v1_mapping(data: &[u8]) {
    let Ok(request) = RunFunctionRequest::decode(data) else {
        return;
    };
    let Ok(yaml) = functionio_v1::functionio_yaml_from_request(&request) else {
        return;
    };
    let io = functionio::validate(&yaml).unwrap_or_else(|e| {
        panic!(
            "the mapping's FunctionIO is refused: {e}\n{}",
            String::from_utf8_lossy(&yaml)
        )
    });
    let response = functionio_v1::response_from_functionio(&request, io.clone())
        .unwrap_or_else(|e| panic!("an unchanged FunctionIO maps to no response: {e}"));
    let again = RunFunctionRequest {
        desired: response.desired,
        ..request
    };
    let back = functionio_v1::functionio_from_request(&again);
    assert_eq!(back.desired, io.desired, "the desired state changed");
}

/// Quantities: a parsed memory size or CPU amount prints back to one that
/// parses to the same value; a limit is never below its floor.
pub fn quantity(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(bytes) = quantity::parse_memory(s) {
        assert_eq!(
            quantity::parse_memory(&bytes.to_string()),
            Ok(bytes),
            "{s:?}"
        );
    }
    if let Ok(millis) = quantity::parse_cpu_millis(s) {
        assert_eq!(
            quantity::parse_cpu_millis(&format!("{millis}m")),
            Ok(millis),
            "{s:?}"
        );
    }
    // Limits: never below the floor, and a number of bytes means bytes on
    // the command line too.
    for parse in [
        quantity::parse_memory_limit,
        quantity::parse_memory_limit_cli,
    ] {
        if let Ok(bytes) = parse(s) {
            assert!(bytes >= quantity::MIN_MEMORY_BYTES, "{s:?}: {bytes}");
            assert_eq!(parse(&bytes.to_string()), Ok(bytes), "{s:?}");
        }
    }
    if let Ok(millis) = quantity::parse_cpu_limit(s) {
        assert!(millis > 0, "{s:?}");
    }
}

/// Image references: a parsed reference prints to one that parses to the
/// same reference; and oci-spec's parser (which oci-client re-exports) reads
/// it the same, but for the kinds of input whose decision is a test of
/// `fnrun-registry`'s `reference::tests::oci_spec_disagreements`.
pub fn reference(data: &[u8]) {
    use fnrun_registry::{DOCKER_HUB, ImageRef};
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let ours = ImageRef::parse(s, DOCKER_HUB);
    if let Ok(parsed) = &ours {
        let printed = parsed.to_string();
        let again = ImageRef::parse(&printed, DOCKER_HUB)
            .unwrap_or_else(|e| panic!("{s:?} prints as {printed:?}, which is refused: {e}"));
        assert_eq!(&again, parsed, "{s:?} prints as {printed:?}");
    }
    if let Some(difference) = undecided_difference(s, &ours) {
        panic!("{s:?}: {difference}");
    }
}

/// How fnrun's reading of `s` (`ours`) differs from oci-spec's, unless a
/// decision covers it.
fn undecided_difference(
    s: &str,
    ours: &Result<fnrun_registry::ImageRef, fnrun_registry::ReferenceError>,
) -> Option<String> {
    use fnrun_registry::{DOCKER_HUB, ImageRef, ReferenceProblem, RegistryProblem};
    // skopeo's transports, which no reference grammar has.
    const TRANSPORTS: [&str; 7] = [
        "oci:",
        "oci-archive:",
        "docker://",
        "docker-archive:",
        "docker-daemon:",
        "containers-storage:",
        "dir:",
    ];
    if TRANSPORTS.iter().any(|t| s.starts_with(t)) {
        return None;
    }
    let theirs = oci_client::Reference::try_from(s);
    match (ours, theirs) {
        (Err(_), Err(_)) => None,
        // A bracketed IPv6 registry, which oci-spec's grammar lacks.
        (Ok(ImageRef::Registry { registry, .. }), Err(_)) if registry.starts_with('[') => None,
        (Ok(ours), Err(e)) => Some(format!("fnrun reads {ours:?}, oci-spec refuses it: {e}")),
        (Err(e), Ok(theirs)) => {
            let port_ok = |registry: &str| {
                registry
                    .rsplit_once(':')
                    .is_none_or(|(_, port)| matches!(port.parse::<u16>(), Ok(1..)))
            };
            let decided = match &e.reason {
                ReferenceProblem::Tag => theirs.tag().is_some_and(|t| !t.is_ascii()),
                ReferenceProblem::Digest => theirs
                    .digest()
                    .is_some_and(|d| d.bytes().any(|b| b.is_ascii_uppercase())),
                ReferenceProblem::DigestAlgorithm(_) => {
                    theirs.digest().is_some_and(|d| !d.starts_with("sha256:"))
                }
                ReferenceProblem::UpperCase => {
                    theirs.repository().bytes().any(|b| b.is_ascii_uppercase())
                }
                ReferenceProblem::Registry {
                    problem: RegistryProblem::Host,
                    ..
                } => theirs.registry().contains('_'),
                ReferenceProblem::Registry {
                    problem: RegistryProblem::Port,
                    ..
                } => !port_ok(theirs.registry()),
                _ => false,
            };
            (!decided).then(|| format!("fnrun refuses it ({e}), oci-spec reads {theirs:?}"))
        }
        (
            Ok(ImageRef::Registry {
                registry,
                repository,
                tag,
                digest,
                ..
            }),
            Ok(theirs),
        ) => {
            let their_registry = match theirs.registry() {
                "docker.io" => DOCKER_HUB,
                other => other,
            };
            let same = registry == their_registry
                && repository == theirs.repository()
                && tag.as_deref() == theirs.tag()
                && digest.as_deref() == theirs.digest();
            (!same).then(|| format!("fnrun reads {ours:?}, oci-spec {theirs:?}"))
        }
        (Ok(ours), Ok(theirs)) => Some(format!("fnrun reads {ours:?}, oci-spec {theirs:?}")),
    }
}

/// Functions files: whatever the bytes, a clear error or functions whose
/// names are DNS labels, each once.
pub fn functions_file(data: &[u8]) {
    use fnrun_host::catalogue::{self, Catalogue};
    let path = std::path::Path::new("/etc/fnrun/functions.yaml");
    if let Ok(defs) = catalogue::parse(path, data) {
        for def in &defs {
            assert!(
                catalogue::check_dns_label(&def.name).is_ok(),
                "{:?} passed as a name",
                def.name
            );
        }
    }
    if let Ok(catalogue) = Catalogue::from_contents(Some((path, data)), &[]) {
        let names: Vec<&str> = catalogue.names().collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique, "a name twice");
    }
}

/// Porch's semantic version tags: a version reads back as itself and is
/// equal to itself; a constraint decides every version without panicking.
pub fn semver(data: &[u8]) {
    use fnrun_evaluator::semver::{Constraint, Version};
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (left, right) = s.split_once('\n').unwrap_or((s, s));
    let version = Version::parse(left);
    if let Ok(v) = &version {
        let again = Version::parse(&v.to_string()).expect("a version reads back");
        assert_eq!(&again, v);
        assert_eq!(v.cmp_precedence(v), std::cmp::Ordering::Equal);
    }
    if let (Ok(constraint), Ok(v)) = (Constraint::parse(right), &version) {
        let _ = constraint.matches(v);
    }
}

/// Durations: what parses is at most a year, and what fnrun shows of it
/// parses back to within a millisecond (it shows milliseconds).
pub fn duration(data: &[u8]) {
    use fnrun_api::duration::{MAX_DURATION, format, parse};
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse(s) {
        assert!(d <= MAX_DURATION, "{s:?} is {d:?}");
        let shown = format(d);
        let back = parse(&shown).unwrap_or_else(|e| panic!("{s:?} shows as {shown:?}: {e}"));
        assert!(
            back.abs_diff(d) < std::time::Duration::from_millis(1),
            "{s:?} is {d:?}, shown {shown:?}, read back {back:?}"
        );
    }
}

/// The unix sockets' `:authority` rewriter: the first byte chooses the
/// sizes the connection's bytes arrive in; what the server reads does not
/// depend on them, and the rewriter never holds more than a block (which
/// `rewrite_chunked` asserts).
pub fn authority(data: &[u8]) {
    use fnrun_transport::authority::rewrite_chunked;
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunks = [usize::from(first % 17) + 1, 1, usize::from(first) * 7 + 1];
    let (whole, at_once) = rewrite_chunked(rest, &[]);
    let (pieces, chunked) = rewrite_chunked(rest, &chunks);
    assert_eq!(at_once.refusal(), chunked.refusal(), "refused differently");
    if at_once.refusal().is_none() {
        assert_eq!(whole, pieces, "read differently in pieces of {chunks:?}");
    }
}

/// Docker config files and pull secrets (which hold the same JSON): the
/// first line is the image asked for, the rest the file. Read as a pull
/// secret from a file and as one read through the API, the same bytes give
/// the same credentials or the same error (the file's path in place of the
/// Secret's name), and no error quotes a string value of the file (they may
/// be secrets): only its keys, which name registries. No credential helper
/// runs.
pub fn docker_config(data: &[u8]) {
    use fnrun_registry::credentials::docker_config::credentials_from_pull_secret_json;
    use fnrun_registry::credentials::{
        DockerConfigError, EntryError, SettingError, credentials_from_pull_secret,
    };
    const ORIGIN: &str = "secret fuzz/pull";
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (image, config) = text.split_once('\n').unwrap_or((text, ""));
    // The file is read by its name: one unnamed file per thread (unlinked
    // from the start), named through /proc, so that a run leaves nothing
    // behind however it ends.
    thread_local! {
        static FILE: std::fs::File = tempfile::tempfile().expect("a scratch file");
    }
    let path = FILE.with(|file| {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        file.set_len(0).expect("the scratch file truncated");
        file.write_all_at(config.as_bytes(), 0)
            .expect("the scratch file written");
        std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
    });
    let from_file = credentials_from_pull_secret(fnrun_registry::DOCKER_HUB, image, &path);
    let from_api = credentials_from_pull_secret_json(
        fnrun_registry::DOCKER_HUB,
        image,
        ORIGIN,
        config.as_bytes(),
    );
    let err = match (from_file, from_api) {
        (Ok(a), Ok(b)) => {
            assert!(a == b, "the file gives {a:?}, the API's bytes {b:?}");
            return;
        }
        (Err(a), Err(b)) => {
            let a = a
                .to_string()
                .replacen(&path.display().to_string(), ORIGIN, 1);
            assert_eq!(a, b.to_string(), "the file and the API's bytes disagree");
            b
        }
        (a, b) => panic!("the file gives {a:?}, the API's bytes {b:?}"),
    };
    // serde_json's syntax errors name a line and column, never the text.
    let DockerConfigError::Setting { .. } = err else {
        return;
    };
    let message = err.to_string();
    // serde_norway reads JSON's strings as serde_json does (JSON is YAML).
    let Ok(json) = serde_norway::from_str::<serde_norway::Value>(config) else {
        return;
    };
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    strings(&json, &mut keys, &mut values);
    // What the message may hold besides keys: the origin and fixed text.
    let fixed = [
        ORIGIN.to_owned(),
        SettingError::NotAnObject("auths").to_string(),
        SettingError::StoreNotAString.to_string(),
        SettingError::HelperNotAString {
            origin: String::new(),
        }
        .to_string(),
        EntryError::NotAnObject.to_string(),
        EntryError::BadAuth.to_string(),
        EntryError::NotAString("identitytoken registrytoken username password auth").to_string(),
    ]
    .join("\n");
    for value in values.iter().filter(|v| v.len() >= 6) {
        let explained = fixed.contains(value.as_str())
            || keys
                .iter()
                .any(|k| k.contains(value.as_str()) || format!("{k:?}").contains(value.as_str()));
        assert!(
            explained || !message.contains(value.as_str()),
            "the error quotes the value {value:?}: {message}"
        );
    }
}

/// Every key and every string value of `json`.
fn strings(json: &serde_norway::Value, keys: &mut Vec<String>, values: &mut Vec<String>) {
    use serde_norway::Value;
    match json {
        Value::String(s) => values.push(s.clone()),
        Value::Sequence(items) => items.iter().for_each(|v| strings(v, keys, values)),
        Value::Mapping(map) => {
            for (k, v) in map {
                match k {
                    Value::String(k) => keys.push(k.clone()),
                    other => strings(other, keys, values),
                }
                strings(v, keys, values);
            }
        }
        Value::Tagged(tagged) => strings(&tagged.value, keys, values),
        _ => {}
    }
}

/// The sandbox's spawner codec (postcard over a socket between the runner
/// and its spawner): the first byte picks the message (a launch request,
/// the hello, a reply). A message that decodes is encoded again no longer
/// than it came (postcard's encoding is the shortest), that encoding is a
/// fixed point (it decodes and encodes to itself), and a reply fits the
/// runner's receive buffer.
pub fn spawner_codec(data: &[u8]) {
    use fnrun_sandbox::spawner_codec::{self as codec, MAX_REPLY};
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    type Reencode = fn(&[u8]) -> Option<Vec<u8>>;
    let (name, decode): (&str, Reencode) = match which % 3 {
        0 => ("request", codec::request),
        1 => ("hello", codec::hello),
        _ => ("reply", codec::reply),
    };
    let Some(again) = decode(bytes) else {
        return;
    };
    assert!(
        again.len() <= bytes.len(),
        "a {name} of {} bytes encodes to {}",
        bytes.len(),
        again.len()
    );
    assert_eq!(
        decode(&again).as_deref(),
        Some(&again[..]),
        "a {name} encodes differently once decoded again"
    );
    if name == "reply" {
        assert!(again.len() <= MAX_REPLY, "a reply of {} bytes", again.len());
    }
}

/// Manifests, indexes (an OCI layout's index.json too) and image configs, as
/// a registry or a layout serves them: the first byte picks the parser and,
/// for a config, how many layers its manifest lists. Whatever the bytes, an
/// error quotes at most a few hundred bytes of the document; an image
/// manifest that is accepted has a config within the size cap and only
/// layers fnrun can unpack; a config that is accepted has one diff_id per
/// layer; choosing this host's image from an index that is accepted either
/// finds one or says which platforms there are, as briefly.
pub fn manifest(data: &[u8]) {
    use fnrun_registry::digest::Digest;
    use fnrun_registry::manifest::{self, MAX_METADATA_BYTES, Manifest};
    /// The longest error: a few quoted strings of at most 300 bytes each.
    const MAX_MESSAGE: usize = 1024;
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let bounded = |err: &dyn std::fmt::Display| assert_bounded(err, MAX_MESSAGE);
    let choose = |index: &manifest::Index| {
        if let Err(err) = manifest::select_platform(index, "fuzz") {
            bounded(&err);
        }
    };
    let digest = Digest::of(bytes);
    match which % 3 {
        0 => match manifest::parse_manifest(bytes, &digest) {
            Ok(Manifest::Image(image)) => {
                assert!(image.config.size <= MAX_METADATA_BYTES, "{image:?}");
                for layer in &image.layers {
                    assert!(
                        manifest::layer_compression(&layer.media_type).is_some(),
                        "{layer:?}"
                    );
                }
            }
            Ok(Manifest::Index(index)) => choose(&index),
            Err(err) => bounded(&err),
        },
        1 => match manifest::parse_index(bytes, "index.json") {
            Ok(index) => choose(&index),
            Err(err) => bounded(&err),
        },
        _ => {
            let layers = usize::from(which / 3);
            match manifest::parse_config(bytes, &digest, layers) {
                Ok(config) => assert_eq!(config.diff_ids.len(), layers),
                Err(err) => bounded(&err),
            }
        }
    }
}

/// Layers: the first byte says whether the rest is unpacked as it is (a
/// tar whose header checksums are mostly wrong once mutated) or with each
/// header's checksum set as a writer would, so that mutations of names,
/// types, sizes and links reach the unpacker. Whatever the tar:
/// - nothing outside the layer's directory is created or changed, and a
///   refused layer leaves no directory behind;
/// - a refusal is the layer's fault (never a host error), said in at most
///   a few hundred bytes;
/// - an unpacked layer is within its budget and holds only directories,
///   regular files, symlinks, fifos and whiteouts (0:0 character devices),
///   none of them setuid or setgid.
pub fn layer(data: &[u8]) {
    use fnrun_registry::ErrorKind;
    /// The budget left for the layer: small, so a run cannot fill a disk.
    const MAX_BYTES: u64 = 4 << 20;
    const MAX_ENTRIES: u64 = 256;
    /// The longest refusal: the layer's digest, an entry's name cut to 300
    /// bytes and a reason.
    const MAX_MESSAGE: usize = 1024;
    let Some((&how, tar)) = data.split_first() else {
        return;
    };
    let mut tar = tar.to_vec();
    if how % 2 == 1 {
        set_tar_checksums(&mut tar);
    }
    let area = tempfile::tempdir().expect("a temp dir");
    let base = area.path();
    std::fs::create_dir(base.join("sentinel")).expect("the sentinel");
    std::fs::write(base.join("sentinel/file"), b"keep").expect("the sentinel");
    let blob = base.join("blob");
    std::fs::write(&blob, &tar).expect("the blob");
    let dest = base.join("layer");

    let result = fnrun_cache::unpack_tar_for_fuzzing(&blob, &dest, MAX_BYTES, MAX_ENTRIES);

    let mut around: Vec<String> = std::fs::read_dir(base)
        .expect("the area")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    around.sort();
    let sentinel: Vec<_> = std::fs::read_dir(base.join("sentinel"))
        .expect("the sentinel")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(sentinel, ["file"], "the sentinel's directory changed");
    assert_eq!(
        std::fs::read(base.join("sentinel/file")).expect("the sentinel"),
        b"keep"
    );
    match result {
        Ok((bytes, entries)) => {
            assert_eq!(around, ["blob", "layer", "sentinel"]);
            assert!(
                bytes <= MAX_BYTES && entries <= MAX_ENTRIES,
                "{bytes} {entries}"
            );
            let mut files = std::collections::HashMap::new();
            check_layer_tree(&dest, &mut files);
            let sizes: u64 = files.values().sum();
            assert!(
                sizes <= bytes,
                "{sizes} bytes of files from a tar of {bytes}"
            );
        }
        Err((err, kind)) => {
            assert_eq!(around, ["blob", "sentinel"], "after {err}");
            assert_eq!(
                kind,
                ErrorKind::Corrupt,
                "a host error for a layer's content: {err}"
            );
            assert_bounded(&err, MAX_MESSAGE);
        }
    }
}

/// `err` says what it says in at most `max` bytes.
fn assert_bounded(err: &dyn std::fmt::Display, max: usize) {
    let message = err.to_string();
    assert!(
        message.len() <= max,
        "an error of {} bytes: {}...",
        message.len(),
        message.chars().take(200).collect::<String>()
    );
}

/// Sets the checksum of every header of `tar`, as far as its sizes can be
/// read, as a tar writer would (POSIX: the sum of the header's bytes with
/// the checksum field as spaces, in six octal digits, a NUL and a space).
fn set_tar_checksums(tar: &mut [u8]) {
    let mut at = 0;
    while at + 512 <= tar.len() {
        let header = &mut tar[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            at += 512;
            continue;
        }
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let size = std::str::from_utf8(&header[124..136])
            .ok()
            .map(|s| s.trim_matches(|c| c == '\0' || c == ' '))
            .and_then(|s| u64::from_str_radix(s, 8).ok());
        let Some(size) = size else {
            return;
        };
        let Some(next) = usize::try_from(size.div_ceil(512).saturating_mul(512))
            .ok()
            .and_then(|data| (at + 512).checked_add(data))
        else {
            return;
        };
        at = next;
    }
}

/// Checks every entry under `dir` (not following symlinks): its type and
/// mode; records each regular file's size by inode in `files`.
fn check_layer_tree(dir: &std::path::Path, files: &mut std::collections::HashMap<u64, u64>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A directory of mode 0 read by someone other than root.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return,
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    for entry in entries {
        let path = entry.expect("an entry").path();
        let meta = std::fs::symlink_metadata(&path).expect("an entry's metadata");
        let kind = meta.file_type();
        assert_eq!(
            meta.mode() & 0o6000,
            0,
            "{} is setuid or setgid",
            path.display()
        );
        if kind.is_dir() {
            check_layer_tree(&path, files);
        } else if kind.is_file() {
            files.insert(meta.ino(), meta.len());
        } else if kind.is_char_device() {
            assert_eq!(meta.rdev(), 0, "{} is a device", path.display());
        } else {
            assert!(
                kind.is_symlink() || kind.is_fifo(),
                "{} is a {kind:?}",
                path.display()
            );
        }
    }
}

/// A cgroupfs interface file as the cgroup drivers read it: read whole from
/// its start, whatever its length against the 512-byte reads, and the same
/// when read again through the same descriptor; refused as not UTF-8 only
/// when it is not. Its pids and keyed values are what its lines say.
pub fn cgroup_file(data: &[u8]) {
    use fnrun_sandbox::cgroup_files;
    use std::io::Write;
    let mut file = tempfile::tempfile().expect("a temporary file");
    file.write_all(data).expect("the file written");
    for read in 0..2 {
        let whole = cgroup_files::read_whole(&file);
        match std::str::from_utf8(data) {
            Ok(text) => assert_eq!(
                whole.as_deref().ok(),
                Some(text),
                "read {read} of {} bytes",
                data.len()
            ),
            Err(_) => assert_eq!(
                whole.map_err(|e| e.kind()).err(),
                Some(std::io::ErrorKind::InvalidData),
                "{} bytes not UTF-8",
                data.len()
            ),
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let pids = cgroup_files::pids(text);
    assert!(pids.len() <= words.len());
    for pid in &pids {
        assert!(
            words.iter().any(|w| w.parse::<i32>() == Ok(*pid)),
            "{pid} is no word of the file"
        );
    }
    // A key of the file's own (its first word), and one of the kernel's.
    for key in words.first().copied().into_iter().chain(["oom_kill"]) {
        if let Some(value) = cgroup_files::keyed(text, key) {
            assert!(
                text.lines().any(|l| l
                    .split_once(' ')
                    .is_some_and(|(k, v)| k == key && v.trim().parse() == Ok(value))),
                "{key} {value} is on no line"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_recursion_limit, set_tar_checksums};

    /// The seeds of the `layer` target that are unpacked as they are were
    /// written by a tar writer (Python's tarfile): setting their checksums
    /// changes nothing, and a changed name gets a checksum again.
    #[test]
    fn tar_checksums_are_set_as_a_writer_sets_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/layer");
        let mut seen = 0;
        for seed in ["seed-tree", "seed-whiteouts", "seed-gnu-long", "seed-pax"] {
            let data = std::fs::read(dir.join(seed)).expect("a seed");
            let (&how, tar) = data.split_first().expect("a selector");
            assert_eq!(how % 2, 0, "{seed} is unpacked as it is");
            let mut summed = tar.to_vec();
            set_tar_checksums(&mut summed);
            assert!(summed == tar, "{seed}: checksums changed");
            summed[0] ^= 1;
            set_tar_checksums(&mut summed);
            assert_ne!(summed[148..156], tar[148..156], "{seed}");
            seen += 1;
        }
        assert_eq!(seen, 4);
    }

    #[test]
    fn the_recursion_limit_is_told_by_the_whole_message() {
        assert!(is_recursion_limit("recursion limit exceeded"));
        assert!(is_recursion_limit(
            "recursion limit exceeded at line 1 column 129"
        ));
        // The second fuzz finding of yaml_bounds: another error whose path
        // quotes the words.
        assert!(!is_recursion_limit(
            "recursion limit# config[1][0]: invalid type: integer `4444` as u128, expected any YAML value at line 1 column 40"
        ));
        assert!(!is_recursion_limit(
            "recursion limit exceeded at line 1 column 2: and more"
        ));
    }
}
