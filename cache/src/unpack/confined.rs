//! Confined writes into a layer directory. Every entry is created with `*at` calls on a
//! directory descriptor opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
//! below the layer root, so neither `..` nor a symlink (of this layer or hostile) can
//! lead outside the layer directory; hard link targets resolve the same way, so they
//! only name files of this layer.
//!
//! Overlay conventions: a whiteout is a 0:0 character device (unprivileged users may
//! create those since Linux 5.8), an opaque directory gets `user.overlay.opaque=y`.
//! setuid/setgid bits are dropped. Directories are created 0700 and get their final
//! mode, owner and mtime in [`LayerTree::finish`], deepest first, so rootless unpacking
//! can fill a directory whose mode is 0555; the layer root keeps 0755.

use std::cmp::Reverse;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{
    FchmodatFlags, Mode, SFlag, UtimensatFlags, fchmod, fchmodat, fstatat, futimens, mkdirat,
    mknodat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};

use super::fail::{Fail, fs, lossy};
use super::meta::{Meta, join, normalize};
use super::reason::{CorruptLayer, HostileEntry};
use super::remove::remove_tree_at;
use crate::config::LayerOwner;

/// The whiteout device number.
const WHITEOUT_DEV: libc::dev_t = 0;
const OPAQUE_XATTR: &[u8] = b"user.overlay.opaque\0";

struct DeferredDir {
    path: Vec<Vec<u8>>,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: Option<i64>,
}

/// A layer directory being filled: its root, who owns what is written, and the
/// directories whose metadata is applied at the end.
pub(super) struct LayerTree {
    root: OwnedFd,
    owner: LayerOwner,
    dirs: Vec<DeferredDir>,
    /// The copy buffer of file contents.
    buf: Vec<u8>,
}

impl LayerTree {
    /// The empty layer directory `dest` (just created), filled as `owner`.
    pub(super) fn open(dest: &Path, owner: LayerOwner) -> Result<LayerTree, Errno> {
        let root = openat(
            nix::fcntl::AT_FDCWD,
            dest,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(LayerTree {
            root,
            owner,
            dirs: Vec::new(),
            buf: vec![0; 128 << 10],
        })
    }

    /// Opens `comps` (relative to the layer root) with `flags`, confined to the root.
    fn resolve(&self, comps: &[Vec<u8>], flags: OFlag) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(self.root.as_fd(), os(&join(comps)), how)
    }

    /// The directory `comps`, creating missing components (0755, like Docker) if `create`.
    fn dir_fd(&mut self, comps: &[Vec<u8>], create: bool) -> Result<OwnedFd, Fail> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        match self.resolve(comps, flags) {
            Err(Errno::ENOENT) if create => {}
            r => return r.map_err(fs("open parent directory of")),
        }
        let mut cur = self
            .resolve(&[], flags)
            .map_err(fs("open layer root for"))?;
        for i in 0..comps.len() {
            match self.resolve(&comps[..=i], flags) {
                Ok(fd) => {
                    cur = fd;
                    continue;
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(fs("open parent directory of")(e)),
            }
            match mkdirat(cur.as_fd(), os(&comps[i]), Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(fs("create parent directory of")(e)),
            }
            self.dirs.push(DeferredDir {
                path: comps[..=i].to_vec(),
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: None,
            });
            cur = self
                .resolve(&comps[..=i], flags)
                .map_err(fs("open parent directory of"))?;
        }
        Ok(cur)
    }

    /// Removes whatever is at `dir/name`, except a directory when `keep_dir`.
    /// Returns whether a directory was kept.
    fn clear(&self, dir: BorrowedFd<'_>, name: &[u8], keep_dir: bool) -> Result<bool, Fail> {
        match fstatat(dir, os(name), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(fs("inspect")(e)),
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                if keep_dir {
                    return Ok(true);
                }
                remove_tree_at(dir, os(name)).map_err(|e| Fail::Fs("replace", e, false))?;
                Ok(false)
            }
            Ok(_) => {
                unlinkat(dir, os(name), UnlinkatFlags::NoRemoveDir).map_err(fs("replace"))?;
                Ok(false)
            }
        }
    }

    fn ids(&self, uid: u64, gid: u64) -> Option<(Uid, Gid)> {
        match self.owner {
            LayerOwner::Identity => None,
            LayerOwner::Shift {
                uid: base_uid,
                gid: base_gid,
                size,
            } => {
                let overflow = 65534u32.min(size.saturating_sub(1));
                let map = |base: u32, id: u64| {
                    // Below `size`, a u32: ids past the range map to the overflow id.
                    let off = u32::try_from(id)
                        .ok()
                        .filter(|&id| id < size)
                        .unwrap_or(overflow);
                    base.saturating_add(off)
                };
                Some((
                    Uid::from_raw(map(base_uid, uid)),
                    Gid::from_raw(map(base_gid, gid)),
                ))
            }
        }
    }

    fn chown_fd(&self, fd: BorrowedFd<'_>, uid: u64, gid: u64) -> Result<(), Fail> {
        if let Some((u, g)) = self.ids(uid, gid) {
            fchown(fd, Some(u), Some(g)).map_err(|e| Fail::Fs("chown", e.into(), false))?;
        }
        Ok(())
    }

    fn chown_at(&self, dir: BorrowedFd<'_>, name: &[u8], uid: u64, gid: u64) -> Result<(), Fail> {
        if let Some((u, g)) = self.ids(uid, gid) {
            fchownat(
                dir,
                os(name),
                Some(u),
                Some(g),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| Fail::Fs("chown", e.into(), false))?;
        }
        Ok(())
    }

    pub(super) fn whiteout(&mut self, parent: &[Vec<u8>], target: &[u8]) -> Result<(), Fail> {
        if target == b".wh..opq" {
            let dir = self.dir_fd(parent, true)?;
            return self.set_opaque(dir.as_fd());
        }
        if target.starts_with(b".wh.") {
            // Other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs): not needed by overlayfs.
            return Ok(());
        }
        if target.is_empty() || target == b"." || target == b".." {
            return Err(Fail::Hostile(HostileEntry::WhiteoutName));
        }
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), target, false)?;
        mknodat(
            dir.as_fd(),
            os(target),
            SFlag::S_IFCHR,
            Mode::empty(),
            WHITEOUT_DEV,
        )
        .map_err(|e| Fail::Fs("create whiteout", e.into(), false))?;
        self.chown_at(dir.as_fd(), target, 0, 0)
    }

    fn set_opaque(&self, dir: BorrowedFd<'_>) -> Result<(), Fail> {
        // fsetxattr needs a real (not O_PATH) fd; reopen the directory through ".".
        let fd = openat(
            dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Fail::Fs("open opaque directory", e.into(), false))?;
        // SAFETY: `fd` is an open directory fd owned by this function; the name is a
        // NUL-terminated static string and the value pointer/length describe a live
        // 1-byte slice. fsetxattr does not retain either pointer.
        let rc = unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                OPAQUE_XATTR.as_ptr().cast(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        if rc != 0 {
            return Err(Fail::Fs(
                "mark opaque directory",
                io::Error::last_os_error(),
                false,
            ));
        }
        Ok(())
    }

    pub(super) fn file<R: Read>(
        &mut self,
        parent: &[Vec<u8>],
        name: &[u8],
        data: &mut R,
        meta: &Meta,
    ) -> Result<(), Fail> {
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        let fd = openat(
            dir.as_fd(),
            os(name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(fs("create"))?;
        let mut file = File::from(fd);
        let mut written = 0u64;
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fail::Stream(e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| Fail::Fs("write", e, false))?;
            written += n as u64;
        }
        if written != meta.size {
            return Err(Fail::Corrupt(CorruptLayer::Truncated {
                written,
                size: meta.size,
            }));
        }
        self.chown_fd(file.as_fd(), meta.uid, meta.gid)?;
        fchmod(file.as_fd(), Mode::from_bits_truncate(meta.mode & 0o1777))
            .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
        let t = timespec(meta.mtime);
        futimens(file.as_fd(), &t, &t).map_err(|e| Fail::Fs("set mtime of", e.into(), false))?;
        Ok(())
    }

    pub(super) fn dir(&mut self, comps: &[Vec<u8>], meta: &Meta) -> Result<(), Fail> {
        let Some((name, parent)) = comps.split_last() else {
            return Ok(());
        };
        let dir = self.dir_fd(parent, true)?;
        if !self.clear(dir.as_fd(), name, true)? {
            mkdirat(dir.as_fd(), os(name), Mode::from_bits_truncate(0o700))
                .map_err(fs("create directory"))?;
        }
        self.dirs.push(DeferredDir {
            path: comps.to_vec(),
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            mtime: Some(meta.mtime),
        });
        Ok(())
    }

    pub(super) fn symlink(
        &mut self,
        parent: &[Vec<u8>],
        name: &[u8],
        meta: &Meta,
    ) -> Result<(), Fail> {
        let target = match &meta.link {
            Some(t) if !t.is_empty() && !t.contains(&0) => t.clone(),
            _ => return Err(Fail::Corrupt(CorruptLayer::SymlinkTarget)),
        };
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        symlinkat(os(&target), dir.as_fd(), os(name)).map_err(fs("create symlink"))?;
        self.chown_at(dir.as_fd(), name, meta.uid, meta.gid)?;
        set_mtime_at(dir.as_fd(), name, meta.mtime)
    }

    pub(super) fn hardlink(&mut self, comps: &[Vec<u8>], meta: &Meta) -> Result<(), Fail> {
        let Some(link) = &meta.link else {
            return Err(Fail::Corrupt(CorruptLayer::LinkTarget));
        };
        let target = normalize(link)?;
        let Some((target_name, target_parent)) = target.split_last() else {
            return Err(Fail::Hostile(HostileEntry::LinkToRoot));
        };
        if target == comps {
            return Ok(());
        }
        let Some((name, parent)) = comps.split_last() else {
            return Err(Fail::Hostile(HostileEntry::LinkNamedRoot));
        };
        let target_dir = match self.dir_fd(target_parent, false) {
            Ok(fd) => fd,
            Err(Fail::Fs(_, e, _)) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(Fail::Hostile(HostileEntry::LinkOutside(lossy(link))));
            }
            Err(f) => return Err(f),
        };
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        match linkat(
            target_dir.as_fd(),
            os(target_name),
            dir.as_fd(),
            os(name),
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::ENOENT) => Err(Fail::Hostile(HostileEntry::LinkOutside(lossy(link)))),
            Err(Errno::EPERM) => Err(Fail::Hostile(HostileEntry::LinkToDirectory(lossy(link)))),
            Err(e) => Err(fs("create hard link")(e)),
        }
    }

    pub(super) fn fifo(
        &mut self,
        parent: &[Vec<u8>],
        name: &[u8],
        meta: &Meta,
    ) -> Result<(), Fail> {
        let dir = self.dir_fd(parent, true)?;
        self.clear(dir.as_fd(), name, false)?;
        let mode = Mode::from_bits_truncate(meta.mode & 0o1777);
        mknodat(dir.as_fd(), os(name), SFlag::S_IFIFO, mode, 0).map_err(fs("create fifo"))?;
        self.chown_at(dir.as_fd(), name, meta.uid, meta.gid)?;
        // mknodat applied the umask; set the exact mode (a fifo is never a symlink).
        fchmodat(dir.as_fd(), os(name), mode, FchmodatFlags::FollowSymlink)
            .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
        set_mtime_at(dir.as_fd(), name, meta.mtime)
    }

    /// Applies directory metadata deepest first, fixes the root, and syncs the tree.
    pub(super) fn finish(&mut self) -> Result<(), (Vec<u8>, Fail)> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|d| Reverse(d.path.len()));
        for d in &dirs {
            let fd = match self.resolve(
                &d.path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            ) {
                Ok(fd) => fd,
                // Replaced by a later entry (or reachable only through a directory that
                // already has its final, restrictive mode): nothing to apply.
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR | Errno::EACCES) => continue,
                Err(e) => return Err((join(&d.path), fs("open directory")(e))),
            };
            let apply = || -> Result<(), Fail> {
                self.chown_fd(fd.as_fd(), d.uid, d.gid)?;
                fchmod(fd.as_fd(), Mode::from_bits_truncate(d.mode & 0o1777))
                    .map_err(|e| Fail::Fs("chmod", e.into(), false))?;
                if let Some(mtime) = d.mtime {
                    let t = timespec(mtime);
                    futimens(fd.as_fd(), &t, &t)
                        .map_err(|e| Fail::Fs("set mtime of", e.into(), false))?;
                }
                Ok(())
            };
            apply().map_err(|f| (join(&d.path), f))?;
        }
        let root = self.root.as_fd();
        self.chown_fd(root, 0, 0).map_err(|f| (b".".to_vec(), f))?;
        fchmod(root, Mode::from_bits_truncate(0o755))
            .map_err(|e| (b".".to_vec(), Fail::Fs("chmod", e.into(), false)))?;
        nix::unistd::syncfs(root)
            .map_err(|e| (b".".to_vec(), Fail::Fs("sync", e.into(), false)))?;
        Ok(())
    }
}

fn timespec(secs: i64) -> TimeSpec {
    TimeSpec::new(secs as libc::time_t, 0)
}

/// Sets the mtime (and atime) of `dir/name` itself, never of what a symlink names.
fn set_mtime_at(dir: BorrowedFd<'_>, name: &[u8], mtime: i64) -> Result<(), Fail> {
    let t = timespec(mtime);
    utimensat(dir, os(name), &t, &t, UtimensatFlags::NoFollowSymlink)
        .map_err(|e| Fail::Fs("set mtime of", e.into(), false))
}

/// A name from the tar as the `OsStr` the `*at` calls take.
fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::path::Path;

    use crate::config::LayerOwner;
    use crate::unpack::testutil::{
        Member, TarBuilder, area, assert_refused, big_budget, gzip, read_xattr,
    };

    #[test]
    fn whiteouts_and_opaque_dirs() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::File(b"etc/.wh.removed", b"", 0o644))
            .add(Member::Dir(b"opaque/", 0o755))
            .add(Member::File(b"opaque/.wh..wh..opq", b"", 0o644))
            .add(Member::File(b"opaque/kept", b"k", 0o644))
            .add(Member::File(b".wh..wh.plnk", b"", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let wh = std::fs::symlink_metadata(a.layer.join("etc/removed")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        assert!(!a.layer.join("etc/.wh.removed").exists());
        assert!(!a.layer.join(".wh..wh.plnk").exists());
        assert!(!a.layer.join("opaque/.wh..wh..opq").exists());
        assert_eq!(
            read_xattr(&a.layer.join("opaque"), "user.overlay.opaque").as_deref(),
            Some(&b"y"[..])
        );
        assert!(read_xattr(&a.layer.join("etc"), "user.overlay.opaque").is_none());
        a.assert_contained();
    }

    #[test]
    fn symlinks_cannot_lead_out() {
        let a = area();
        let sentinel = a.base.join("sentinel");
        let sentinel = sentinel.to_str().unwrap().as_bytes();
        // Writing through a symlink resolves it inside the layer root; where that target
        // does not exist in the layer, the layer is refused.
        let refused: [(&[u8], &[u8], &[u8]); 4] = [
            (b"etc", b"/etc", b"etc/escape-passwd"),
            (b"abs", sentinel, b"abs/file"),
            (b"rel", b"../sentinel", b"rel/new"),
            (b"d", b"../../sentinel", b"d/file"),
        ];
        for (link, target, file) in refused {
            let tar = TarBuilder::new()
                .add(Member::Symlink(link, target))
                .add(Member::File(file, b"x", 0o644))
                .tar();
            assert_refused(&a, &tar);
        }
        assert!(!Path::new("/etc/escape-passwd").exists());

        let tar = TarBuilder::new()
            .add(Member::Dir(b"etc/", 0o755))
            .add(Member::Symlink(b"sys-etc", b"/etc"))
            .add(Member::File(b"sys-etc/escape-passwd", b"x", 0o644))
            .add(Member::Symlink(b"up", b"../.."))
            .add(Member::File(b"up/escape", b"y", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        assert!(!Path::new("/etc/escape-passwd").exists());
        assert_eq!(
            std::fs::read(a.layer.join("etc/escape-passwd")).unwrap(),
            b"x"
        );
        assert_eq!(std::fs::read(a.layer.join("escape")).unwrap(), b"y");
        a.assert_contained();
    }

    #[test]
    fn symlink_replacing_directory_does_not_redirect_later_entries() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Dir(b"d/", 0o755))
            .add(Member::Symlink(b"d", b"../sentinel"))
            .add(Member::File(b"d/file", b"x", 0o644))
            .tar();
        assert_refused(&a, &tar);
    }

    #[test]
    fn hardlinks_cannot_lead_out() {
        let a = area();
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"passwd", b"/etc/passwd"))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"x", b"../sentinel/file"))
                .tar(),
        );
        let outside = format!("{}/sentinel/file", a.base.display());
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Hardlink(b"x", outside.as_bytes()))
                .tar(),
        );
        // Through a symlink that points out: resolved inside the root, where nothing is.
        let tar = TarBuilder::new()
            .add(Member::Symlink(b"s", b"../sentinel"))
            .add(Member::Hardlink(b"x", b"s/file"))
            .tar();
        assert_refused(&a, &tar);
        let tar = TarBuilder::new()
            .add(Member::Dir(b"d/", 0o755))
            .add(Member::Hardlink(b"x", b"d"))
            .tar();
        assert_refused(&a, &tar);
        assert!(
            std::fs::metadata(a.base.join("sentinel/file"))
                .unwrap()
                .nlink()
                == 1
        );
    }

    #[test]
    fn whiteouts_with_traversal_are_refused() {
        let a = area();
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"../.wh.sentinel", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"a/.wh..", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b".wh...", b"", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"x/.wh.", b"", 0o644))
                .tar(),
        );
        // A whiteout through a symlink resolves inside the layer, where nothing is.
        let tar = TarBuilder::new()
            .add(Member::Symlink(b"s", b"../sentinel"))
            .add(Member::File(b"s/.wh.file", b"", 0o644))
            .tar();
        assert_refused(&a, &tar);
        assert!(a.base.join("sentinel/file").exists());
    }

    #[test]
    fn setuid_and_setgid_are_stripped() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::File(b"suid", b"x", 0o4755))
            .add(Member::File(b"sgid", b"x", 0o2755))
            .add(Member::Dir(b"sgiddir/", 0o2775))
            .add(Member::Dir(b"sticky/", 0o1777))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(a.layer.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("suid"), 0o755);
        assert_eq!(mode("sgid"), 0o755);
        assert_eq!(mode("sgiddir"), 0o775);
        assert_eq!(mode("sticky"), 0o1777);
    }

    #[test]
    fn shift_owner_maps_ids() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let a = area();
        let mut b = tar::Builder::new(Vec::new());
        for (name, uid) in [("root", 0u64), ("user", 1000), ("huge", 1 << 20)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o644);
            h.set_uid(uid);
            h.set_gid(uid);
            b.append_data(&mut h, name, &b""[..]).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let owner = LayerOwner::Shift {
            uid: 100_000,
            gid: 200_000,
            size: 65536,
        };
        a.unpack(&gzip(&tar), &tar, owner, &big_budget()).unwrap();
        let ids = |p: &str| {
            let m = std::fs::metadata(a.layer.join(p)).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(ids("root"), (100_000, 200_000));
        assert_eq!(ids("user"), (101_000, 201_000));
        assert_eq!(ids("huge"), (165_534, 265_534));
        assert_eq!(ids(""), (100_000, 200_000));
    }
}
