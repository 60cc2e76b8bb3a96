//! Leases: an image's manifest, config, blobs and layers marked in use, across
//! processes, until the holder drops its [`Lease`].
//!
//! A lease is a file under `leases/` named by the hash of its content (the manifest
//! digest and the layer directories), which its holders keep `flock(LOCK_SH)`-ed. A
//! pruner ([`super::gc`]) tries `LOCK_EX|LOCK_NB` on every lease file: a lease it cannot
//! lock is in use (and everything it names is kept); one it can lock is stale and
//! removed. Leases therefore hold across processes (a CLI `prune` never removes what a
//! daemon is running) and vanish with their process. A lease is taken while the shared
//! GC lock is still held, so no prune can run between materializing an image and
//! leasing it.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, RenameFlags, renameat2};
use serde::{Deserialize, Serialize};

use super::dir::{Store, StoreError, io_err, lock, write_new};
use crate::image::Image;
use fnrun_registry::digest::Digest;

/// Marks an image's manifest, config, blobs and unpacked layers in use until dropped:
/// no prune (in this or another process) removes them meanwhile.
#[derive(Debug)]
pub struct Lease {
    lock: Flock<File>,
    path: PathBuf,
}

impl Drop for Lease {
    /// The last holder removes the lease file, the way a pruner removes a stale
    /// one: only under an exclusive lock, so a holder that opened the file
    /// meanwhile sees its inode gone after locking and starts a new one. Lease
    /// files therefore do not pile up, one per image ever run.
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: flock(2) on a descriptor this lease owns; no memory is involved.
        let last =
            unsafe { libc::flock(self.lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if last {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct LeaseFile {
    pub(super) digest: String,
    /// `<owner-tag>/<diff-id hex>`.
    pub(super) layers: Vec<String>,
}

impl Store {
    /// Takes a lease on `image` (see the module docs).
    pub(crate) fn lease_image(&self, image: &Image) -> Result<Lease, StoreError> {
        let layers: Vec<String> = image
            .layers
            .iter()
            .filter_map(|p| {
                let hex = p.file_name()?.to_str()?;
                let tag = p.parent()?.parent()?.file_name()?.to_str()?;
                Some(format!("{tag}/{hex}"))
            })
            .collect();
        let json = serde_json::to_vec(&LeaseFile {
            digest: image.digest.clone(),
            layers,
        })
        .unwrap_or_default();
        let path = self.leases.join(Digest::of(&json).hex());
        for _ in 0..100 {
            if fs::symlink_metadata(&path).is_err() {
                let tmp = self.tmp_path("lease");
                // Not synced: a lease means something only while its holder lives,
                // and after a crash nobody holds it, whatever it contains.
                write_new(&tmp, &json)?;
                let cwd = nix::fcntl::AT_FDCWD;
                match renameat2(cwd, &tmp, cwd, &path, RenameFlags::RENAME_NOREPLACE) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) => {
                        let _ = fs::remove_file(&tmp);
                    }
                    Err(e) => return Err(io_err("store lease", &path)(e.into())),
                }
            }
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("open", &path)(e)),
            };
            let held = lock(file, FlockArg::LockShared, &path)?
                .ok_or_else(|| io_err("lock", &path)(io::ErrorKind::WouldBlock.into()))?;
            // A pruner may have removed the file between our open and lock.
            let ours = held.metadata().map_err(io_err("inspect", &path))?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {
                    return Ok(Lease {
                        lock: held,
                        path: path.clone(),
                    });
                }
                _ => continue,
            }
        }
        Err(io_err("lease", &path)(io::Error::other(
            "the lease file keeps disappearing",
        )))
    }
}
