//! The store's directory and its files: blobs, layers, references and tmp/ sessions,
//! each written under `tmp/`, synced and renamed into place. [`Store`] and what the
//! other parts of the store share (its error, the reference record, locks and synced
//! writes); a leaf of the store, which [`super::lease`] and [`super::gc`] extend.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, RenameFlags, renameat2};
use serde::{Deserialize, Serialize};

use crate::unpack::{LayerStats, remove_tree};
use fnrun_registry::digest::{Digest, truncate};

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to {op} {path}: {err}")]
    Io {
        op: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    #[error("{what} digest mismatch: expected {expected}, got {actual}; nothing was stored")]
    DigestMismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("{what} {digest} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        digest: String,
        size: u64,
        limit: u64,
    },
    #[error("stored blob {digest} at {path} does not match its digest; it was removed")]
    CorruptBlob { digest: String, path: PathBuf },
    /// A command that only reads or tidies a cache was pointed at a
    /// directory that is not one (it is left as it was).
    #[error("{path} is not an fnrun cache: {why}")]
    NotACache { path: PathBuf, why: &'static str },
}

impl StoreError {
    pub(crate) fn kind(&self) -> fnrun_registry::ErrorKind {
        match self {
            StoreError::Io { .. } => fnrun_registry::ErrorKind::Internal,
            StoreError::NotACache { .. } => fnrun_registry::ErrorKind::NotFound,
            _ => fnrun_registry::ErrorKind::Corrupt,
        }
    }
}

/// A reference's last use is recorded at most this often (seconds).
pub(crate) const TOUCH_INTERVAL: u64 = 60;

pub(super) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_owned();
    move |err| StoreError::Io { op, path, err }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct RefFile {
    pub(crate) reference: String,
    pub(crate) digest: String,
    /// Last use, seconds since the epoch (absent in records of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_used: Option<u64>,
}

/// Seconds since the epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The store of one cache root for one layer owner.
#[derive(Debug)]
pub(crate) struct Store {
    root: PathBuf,
    blobs: PathBuf,
    layers: PathBuf,
    refs: PathBuf,
    pub(crate) leases: PathBuf,
    session: PathBuf,
    _session_lock: Flock<File>,
    counter: AtomicU64,
}

/// Creates `path` if missing and gives it `mode` (independent of the umask).
fn ensure_dir(path: &Path, mode: u32) -> Result<(), StoreError> {
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create directory", path)(e)),
    }
    let meta = fs::metadata(path).map_err(io_err("inspect", path))?;
    if !meta.is_dir() {
        return Err(io_err("use directory", path)(io::Error::from(
            io::ErrorKind::NotADirectory,
        )));
    }
    if meta.permissions().mode() & 0o7777 != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", path))?;
    }
    Ok(())
}

pub(crate) fn fsync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync directory", path))
}

pub(crate) fn lock(
    file: File,
    arg: FlockArg,
    path: &Path,
) -> Result<Option<Flock<File>>, StoreError> {
    match Flock::lock(file, arg) {
        Ok(l) => Ok(Some(l)),
        Err((_, Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(io_err("lock", path)(e.into())),
    }
}

/// Opens (creating if needed) the lock file `path` and takes a blocking lock on it.
fn lock_file(path: &Path, arg: FlockArg) -> Result<Flock<File>, StoreError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open", path))?;
    lock(file, arg, path)?
        .ok_or_else(|| io_err("lock", path)(io::Error::from(io::ErrorKind::WouldBlock)))
}

impl Store {
    /// Opens (creating if needed) the store at `root` for layers unpacked as `owner_tag`,
    /// and removes the tmp/ leftovers of processes that are gone.
    /// Fails with [`StoreError::NotACache`], creating nothing, unless `root`
    /// holds a cache's own directories (`blobs/sha256`, `layers`, `refs`).
    pub(crate) fn check_existing(root: &Path) -> Result<(), StoreError> {
        let not = |why| StoreError::NotACache {
            path: root.to_owned(),
            why,
        };
        match fs::metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(not("it is not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(not("it does not exist"));
            }
            Err(e) => return Err(io_err("inspect", root)(e)),
        }
        let has = |dir: &str| fs::metadata(root.join(dir)).is_ok_and(|m| m.is_dir());
        if ["blobs/sha256", "layers", "refs"].into_iter().all(has) {
            Ok(())
        } else {
            Err(not("it has no blobs/, layers/ and refs/ directories"))
        }
    }

    pub(crate) fn open(root: &Path, owner_tag: &str) -> Result<Store, StoreError> {
        let existed = root.exists();
        fs::create_dir_all(root).map_err(io_err("create cache directory", root))?;
        let root = fs::canonicalize(root).map_err(io_err("resolve cache directory", root))?;
        // The sandbox reads layer directories as another (mapped) uid: the path down to
        // them must be traversable by others. A directory given to us is not chmod-ed
        // (it could be /tmp); only the store's own directories are.
        let root_mode = fs::metadata(&root)
            .map_err(io_err("inspect", &root))?
            .permissions()
            .mode();
        if !existed {
            fs::set_permissions(&root, fs::Permissions::from_mode(0o755))
                .map_err(io_err("chmod", &root))?;
        } else if root_mode & 0o011 != 0o011 {
            tracing::warn!(path = %root.display(), mode = format!("{:o}", root_mode & 0o7777), "cache directory is not traversable by other users; a sandbox with shifted ids cannot read its layers");
        }
        for (dir, mode) in [
            (root.join("blobs"), 0o755),
            (root.join("blobs/sha256"), 0o755),
            (root.join("layers"), 0o755),
            (root.join("layers").join(owner_tag), 0o755),
            (root.join("layers").join(owner_tag).join("sha256"), 0o755),
            (root.join("refs"), 0o755),
            (root.join("leases"), 0o700),
            (root.join("tmp"), 0o700),
        ] {
            ensure_dir(&dir, mode)?;
        }

        let tmp = root.join("tmp");
        // Creating our session and sweeping dead ones happen under one exclusive lock, so a
        // sweeper never sees a session directory before its owner has locked it.
        let sweep_lock = lock_file(&tmp.join(".sweep.lock"), FlockArg::LockExclusive)?;
        static OPENED: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = OPENED.fetch_add(1, Ordering::Relaxed);
        let session = tmp.join(format!("{}-{nanos}-{n}", std::process::id()));
        ensure_dir(&session, 0o700)?;
        let session_file = File::open(&session).map_err(io_err("open", &session))?;
        let session_lock = lock(session_file, FlockArg::LockExclusiveNonblock, &session)?
            .ok_or_else(|| io_err("lock", &session)(io::Error::from(io::ErrorKind::WouldBlock)))?;
        sweep(&tmp, &session)?;
        drop(sweep_lock);

        Ok(Store {
            blobs: root.join("blobs/sha256"),
            layers: root.join("layers").join(owner_tag).join("sha256"),
            refs: root.join("refs"),
            leases: root.join("leases"),
            root,
            session,
            _session_lock: session_lock,
            counter: AtomicU64::new(0),
        })
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    pub(crate) fn refs_dir(&self) -> &Path {
        &self.refs
    }

    /// Removes dead sessions and stray files from tmp/; returns how many.
    pub(crate) fn sweep_tmp(&self) -> Result<usize, StoreError> {
        let tmp = self.root.join("tmp");
        let _lock = lock_file(&tmp.join(".sweep.lock"), FlockArg::LockExclusive)?;
        sweep(&tmp, &self.session)
    }

    /// The cache-wide GC lock: shared while an image is being materialized (until it
    /// is leased), exclusive while pruning or verifying, across processes.
    pub(crate) fn gc_lock(&self, exclusive: bool) -> Result<Flock<File>, StoreError> {
        let arg = match exclusive {
            true => FlockArg::LockExclusive,
            false => FlockArg::LockShared,
        };
        lock_file(&self.root.join("tmp/.gc.lock"), arg)
    }

    /// A fresh path in this process's tmp directory.
    pub(crate) fn tmp_path(&self, what: &str) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.session.join(format!("{what}-{n}"))
    }

    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    pub(crate) fn has_blob(&self, digest: &Digest) -> bool {
        fs::symlink_metadata(self.blob_path(digest)).is_ok_and(|m| m.is_file())
    }

    /// Reads a stored blob of at most `max` bytes and verifies it. A blob that does not
    /// match its digest is removed (so the next pull fetches it again).
    pub(crate) fn read_blob(
        &self,
        digest: &Digest,
        what: &'static str,
        max: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let path = self.blob_path(digest);
        let file = File::open(&path).map_err(io_err("open", &path))?;
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err("read", &path))?;
        if bytes.len() as u64 > max {
            return Err(StoreError::TooLarge {
                what,
                digest: digest.to_string(),
                size: bytes.len() as u64,
                limit: max,
            });
        }
        if Digest::of(&bytes) != *digest {
            let _ = fs::remove_file(&path);
            return Err(StoreError::CorruptBlob {
                digest: digest.to_string(),
                path,
            });
        }
        Ok(bytes)
    }

    /// Verifies `bytes` against `digest` and stores them.
    pub(crate) fn write_blob(
        &self,
        digest: &Digest,
        what: &'static str,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let actual = Digest::of(bytes);
        if actual != *digest {
            return Err(StoreError::DigestMismatch {
                what,
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        if self.has_blob(digest) {
            return Ok(());
        }
        let tmp = self.tmp_path("blob");
        write_synced(&tmp, bytes)?;
        self.commit_blob(&tmp, digest)
    }

    /// Moves a verified, synced file from tmp/ into the blob store.
    pub(crate) fn commit_blob(&self, tmp: &Path, digest: &Digest) -> Result<(), StoreError> {
        let dest = self.blob_path(digest);
        fs::rename(tmp, &dest).map_err(io_err("store blob", &dest))?;
        fsync_dir(&self.blobs)
    }

    pub(crate) fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.layers.join(diff_id.hex())
    }

    pub(crate) fn layer_stats_path(&self, diff_id: &Digest) -> PathBuf {
        self.layers.join(format!("{}.json", diff_id.hex()))
    }

    /// The cost of an unpacked layer, or `None` if it is not unpacked.
    pub(crate) fn layer_stats(&self, diff_id: &Digest) -> Option<LayerStats> {
        if !fs::symlink_metadata(self.layer_dir(diff_id)).is_ok_and(|m| m.is_dir()) {
            return None;
        }
        let path = self.layer_stats_path(diff_id);
        match fs::read(&path).map(|b| serde_json::from_slice::<LayerStats>(&b)) {
            Ok(Ok(stats)) => Some(stats),
            _ => {
                tracing::warn!(path = %path.display(), "unpacked layer has no readable size record; counting it as empty");
                Some(LayerStats {
                    bytes: 0,
                    entries: 0,
                })
            }
        }
    }

    /// Moves an unpacked tree from tmp/ into place. Returns false (and removes `tmp`) if
    /// another task or process got there first.
    pub(crate) fn commit_layer(
        &self,
        tmp: &Path,
        diff_id: &Digest,
        stats: LayerStats,
    ) -> Result<bool, StoreError> {
        // The size record goes first: a layer directory never exists without one.
        let stats_tmp = self.tmp_path("layer-stats");
        let json = serde_json::to_vec(&stats).unwrap_or_default();
        write_synced(&stats_tmp, &json)?;
        let stats_path = self.layer_stats_path(diff_id);
        fs::rename(&stats_tmp, &stats_path).map_err(io_err("store", &stats_path))?;

        let dest = self.layer_dir(diff_id);
        let cwd = nix::fcntl::AT_FDCWD;
        match renameat2(cwd, tmp, cwd, &dest, RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => {
                fsync_dir(&self.layers)?;
                Ok(true)
            }
            Err(Errno::EEXIST | Errno::ENOTEMPTY) => {
                if let Err(e) = remove_tree(tmp) {
                    tracing::warn!(path = %tmp.display(), error = %e, "failed to remove a duplicate unpacked layer");
                }
                Ok(false)
            }
            Err(e) => Err(io_err("store layer", &dest)(e.into())),
        }
    }

    pub(crate) fn ref_path(&self, reference: &str) -> PathBuf {
        self.refs.join(Digest::of(reference.as_bytes()).hex())
    }

    /// The manifest digest recorded for a normalized reference.
    pub(crate) fn read_ref(&self, reference: &str) -> Option<Digest> {
        let path = self.ref_path(reference);
        let bytes = fs::read(&path).ok()?;
        match serde_json::from_slice::<RefFile>(&bytes) {
            Ok(r) if r.reference == reference => Digest::parse(&r.digest).ok(),
            _ => {
                tracing::warn!(path = %path.display(), "ignoring unreadable reference record");
                None
            }
        }
    }

    /// Records (atomically) that `reference` resolves to `digest`, used now.
    pub(crate) fn write_ref(&self, reference: &str, digest: &Digest) -> Result<(), StoreError> {
        self.write_ref_file(&RefFile {
            reference: reference.to_owned(),
            digest: digest.to_string(),
            last_used: Some(now_secs()),
        })
    }

    /// Records the use of `reference` now, unless it was recorded less than
    /// `min_interval` seconds ago. Returns whether the record was rewritten.
    pub(crate) fn touch_ref(&self, reference: &str, min_interval: u64) -> Result<bool, StoreError> {
        let path = self.ref_path(reference);
        let Ok(bytes) = fs::read(&path) else {
            return Ok(false);
        };
        let Ok(mut record) = serde_json::from_slice::<RefFile>(&bytes) else {
            return Ok(false);
        };
        let now = now_secs();
        if record.reference != reference
            || record
                .last_used
                .is_some_and(|t| now.saturating_sub(t) < min_interval)
        {
            return Ok(false);
        }
        record.last_used = Some(now);
        self.write_ref_file(&record)?;
        Ok(true)
    }

    /// Writes a reference record atomically (tmp, fsync, rename, fsync dir).
    pub(crate) fn write_ref_file(&self, record: &RefFile) -> Result<(), StoreError> {
        let reference = record.reference.as_str();
        let json = serde_json::to_vec(record).unwrap_or_default();
        let tmp = self.tmp_path("ref");
        write_synced(&tmp, &json)?;
        let dest = self.ref_path(reference);
        fs::rename(&tmp, &dest).map_err(io_err("store reference", &dest))?;
        fsync_dir(&self.refs)
    }
}

/// Writes a new 0644 file and syncs it.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_new(path, bytes)?
        .sync_all()
        .map_err(io_err("sync", path))
}

/// Writes `bytes` to the new file `path` (not synced); returns the open file.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> Result<File, StoreError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(io_err("create", path))?;
    f.write_all(bytes).map_err(io_err("write", path))?;
    Ok(f)
}

/// Removes everything in `tmp` except `keep`, the sweep lock, and sessions still locked
/// by a live process.
fn sweep(tmp: &Path, keep: &Path) -> Result<usize, StoreError> {
    let mut removed = 0;
    let entries = fs::read_dir(tmp).map_err(io_err("list", tmp))?;
    for entry in entries {
        let entry = entry.map_err(io_err("list", tmp))?;
        let path = entry.path();
        if path == keep || entry.file_name() == ".sweep.lock" || entry.file_name() == ".gc.lock" {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            let Ok(f) = File::open(&path) else { continue };
            match lock(f, FlockArg::LockExclusiveNonblock, &path) {
                Ok(Some(_held)) => {}
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check a tmp/ session");
                    continue;
                }
            }
        }
        tracing::debug!(path = %path.display(), "removing leftover from tmp/");
        if let Err(e) = remove_tree(&path) {
            tracing::warn!(path = %path.display(), error = %truncate(&e.to_string()), "failed to remove a tmp/ leftover");
        } else {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cache_is_an_existing_cache_and_checking_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        let err = Store::check_existing(&missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} is not an fnrun cache: it does not exist",
                missing.display()
            )
        );
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::NotFound);
        assert!(!missing.exists());
        let unrelated = tmp.path().join("home");
        fs::create_dir(&unrelated).unwrap();
        fs::write(unrelated.join("notes.txt"), b"mine").unwrap();
        let err = Store::check_existing(&unrelated).unwrap_err();
        assert!(
            err.to_string().ends_with(
                "is not an fnrun cache: it has no blobs/, layers/ and refs/ directories"
            ),
            "{err}"
        );
        let left: Vec<_> = fs::read_dir(&unrelated)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["notes.txt"]);
        let file = unrelated.join("notes.txt");
        assert!(
            Store::check_existing(&file)
                .unwrap_err()
                .to_string()
                .ends_with("it is not a directory")
        );
        let cache = tmp.path().join("cache");
        Store::open(&cache, "id").unwrap();
        Store::check_existing(&cache).unwrap();
    }

    #[test]
    fn blobs_are_verified_and_refs_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("cache"), "id").unwrap();
        let d = Digest::of(b"hello");
        let wrong = Digest::of(b"other");
        let err = store.write_blob(&wrong, "blob", b"hello").unwrap_err();
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt);
        assert!(!store.has_blob(&wrong));
        store.write_blob(&d, "blob", b"hello").unwrap();
        assert_eq!(store.read_blob(&d, "blob", 100).unwrap(), b"hello");
        assert!(matches!(
            store.read_blob(&d, "blob", 2),
            Err(StoreError::TooLarge { .. })
        ));

        // Corruption on disk is detected and the blob dropped.
        fs::write(store.blob_path(&d), b"tampered").unwrap();
        assert!(matches!(
            store.read_blob(&d, "blob", 100),
            Err(StoreError::CorruptBlob { .. })
        ));
        assert!(!store.has_blob(&d));

        assert_eq!(store.read_ref("r/x:1"), None);
        store.write_ref("r/x:1", &d).unwrap();
        assert_eq!(store.read_ref("r/x:1"), Some(d));
        let mode = fs::metadata(store.root().join("layers/id/sha256"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::metadata(store.root()).unwrap().permissions().mode() & 0o777,
            0o755
        );

        // An existing directory given as the root keeps its mode (it could be /tmp).
        let shared = tmp.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        Store::open(&shared, "id").unwrap();
        assert_eq!(
            fs::metadata(&shared).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
    }

    #[test]
    fn open_sweeps_dead_sessions_but_not_live_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let first = Store::open(&root, "id").unwrap();
        let live = first.tmp_path("blob");
        fs::write(&live, b"in progress").unwrap();
        // A dead session (no lock holder) with a read-only directory inside.
        let dead = root.join("tmp/1-1");
        fs::create_dir_all(dead.join("layer/ro")).unwrap();
        fs::set_permissions(dead.join("layer/ro"), fs::Permissions::from_mode(0o555)).unwrap();
        fs::write(root.join("tmp/stray"), b"x").unwrap();

        let second = Store::open(&root, "id").unwrap();
        assert!(!dead.exists());
        assert!(!root.join("tmp/stray").exists());
        assert!(live.exists(), "a live session must not be swept");
        drop(first);
        drop(second);
        let _third = Store::open(&root, "id").unwrap();
        assert!(!live.exists());
    }
}
