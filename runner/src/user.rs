//! Resolving an image's `User` (`uid`, `name`, `uid:gid`, `name:group`) against
//! the image's own `/etc/passwd` and `/etc/group`, the way container runtimes do.
//!
//! The files are read from the image's merged root file system by the cache
//! ([`LayerStack::read_file`]), which resolves them as the function would see them
//! and never on the host; this module only parses them. A name needs its file; a
//! numeric id does not (a file the image breaks, such as a symlink loop, is then
//! ignored, as runc ignores it).

use fnrun_cache::{Image, LayerStack, RootfsError};
use fnrun_registry::ErrorKind;

/// The ids a function runs as, and its home directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// A `User` that cannot be resolved. Names from the image are shortened.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("image user {user:?}: no user {name:?} in the image's /etc/passwd")]
    NoUser { user: String, name: String },
    #[error("image user {user:?}: no group {name:?} in the image's /etc/group")]
    NoGroup { user: String, name: String },
    #[error("image user {user:?}: bad uid {uid:?} in the image's /etc/passwd")]
    BadUid { user: String, uid: String },
    #[error("image user {user:?}: {err}")]
    Read { user: String, err: RootfsError },
}

impl UserError {
    /// Whether the host, not the image, failed (reading the cached layers).
    pub fn is_internal(&self) -> bool {
        matches!(self, UserError::Read { err, .. } if err.kind() == ErrorKind::Internal)
    }
}

/// Most bytes read of `/etc/passwd` or `/etc/group`.
const MAX_DB_BYTES: u64 = 1 << 20;
/// Longest name from the image echoed in an error.
const MAX_NAME_CHARS: usize = 128;

fn short(s: &str) -> String {
    s.chars().take(MAX_NAME_CHARS).collect()
}

/// One of the image's user databases, if present. Needed (a name is looked up in it):
/// any failure to read it is an error. Not needed: only a failure of the host is; a
/// file the image breaks counts as absent.
fn read_db(rootfs: &LayerStack, path: &str, needed: bool, user: &str) -> Result<String, UserError> {
    match rootfs.read_file(path, MAX_DB_BYTES) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned()),
        Err(err) if needed || err.kind() == ErrorKind::Internal => Err(UserError::Read {
            user: short(user),
            err,
        }),
        Err(err) => {
            tracing::debug!(user, error = %err, "ignoring an unreadable user database");
            Ok(String::new())
        }
    }
}

/// Resolves the `User` of `image` against its own root file system.
pub fn for_image(image: &Image) -> Result<ExecUser, UserError> {
    let user = &image.config.user;
    let rootfs = image.rootfs().map_err(|err| UserError::Read {
        user: short(user),
        err,
    })?;
    resolve(user, &rootfs)
}

/// The image's `nobody`, for a KRM function run as kpt runs it: the entry of
/// that name in the image's `/etc/passwd`, else 65534:65534 with `/` as home
/// (an image without the file, or without the user).
pub fn nobody(image: &Image) -> Result<ExecUser, UserError> {
    let rootfs = image.rootfs().map_err(|err| UserError::Read {
        user: "nobody".to_owned(),
        err,
    })?;
    nobody_in(&rootfs)
}

fn nobody_in(rootfs: &LayerStack) -> Result<ExecUser, UserError> {
    let fallback = || ExecUser {
        uid: 65534,
        gid: 65534,
        groups: Vec::new(),
        home: "/".to_owned(),
    };
    match resolve("nobody", rootfs) {
        Ok(user) => Ok(user),
        Err(UserError::NoUser { .. }) => Ok(fallback()),
        Err(UserError::Read { err, .. }) if err.kind() != ErrorKind::Internal => Ok(fallback()),
        Err(e) => Err(e),
    }
}

/// Resolves `user` against the image's root file system `rootfs`.
pub fn resolve(user: &str, rootfs: &LayerStack) -> Result<ExecUser, UserError> {
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let by_name = !u.is_empty() && u.parse::<u32>().is_err();
    let group_by_name = g.is_some_and(|g| g.parse::<u32>().is_err());
    let passwd = match u.is_empty() {
        true => String::new(),
        false => read_db(rootfs, "/etc/passwd", by_name, user)?,
    };
    let group = read_db(rootfs, "/etc/group", group_by_name, user)?;
    let pw_entry = |pred: &dyn Fn(&[&str]) -> bool| {
        passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 7 && pred(f))
    };

    let (uid, mut gid, name, home) = if u.is_empty() {
        (0, 0, Some("root".to_owned()), "/root".to_owned())
    } else if let Ok(uid) = u.parse::<u32>() {
        match pw_entry(&|f| f[2] == u) {
            Some(f) => (
                uid,
                f[3].parse().unwrap_or(0),
                Some(f[0].to_owned()),
                f[5].to_owned(),
            ),
            None => (uid, 0, None, "/".to_owned()),
        }
    } else {
        let f = pw_entry(&|f| f[0] == u).ok_or_else(|| UserError::NoUser {
            user: short(user),
            name: short(u),
        })?;
        let uid = f[2].parse().map_err(|_| UserError::BadUid {
            user: short(user),
            uid: short(f[2]),
        })?;
        (
            uid,
            f[3].parse().unwrap_or(0),
            Some(u.to_owned()),
            f[5].to_owned(),
        )
    };
    let gr_entries: Vec<Vec<&str>> = group
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| f.len() >= 4)
        .collect();
    if let Some(g) = g {
        gid = match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => gr_entries
                .iter()
                .find(|f| f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| UserError::NoGroup {
                    user: short(user),
                    name: short(g),
                })?,
        };
    }
    let mut groups: Vec<u32> = match &name {
        Some(name) => gr_entries
            .iter()
            .filter(|f| f[3].split(',').any(|m| m == name))
            .filter_map(|f| f[2].parse().ok())
            .filter(|g| *g != gid)
            .collect(),
        None => Vec::new(),
    };
    groups.sort_unstable();
    groups.dedup();
    Ok(ExecUser {
        uid,
        gid,
        groups,
        home: if home.is_empty() {
            "/".to_owned()
        } else {
            home
        },
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn resolve(user: &str, layers: &[PathBuf]) -> Result<ExecUser, UserError> {
        super::resolve(user, &LayerStack::open(layers).unwrap())
    }

    fn layers(files: &[(&str, &str)]) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("l0");
        std::fs::create_dir_all(layer.join("etc")).unwrap();
        for (name, content) in files {
            std::fs::write(layer.join(name), content).unwrap();
        }
        (dir, vec![layer])
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nfn:x:1000:1001:fn:/home/fn:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n";
    const GROUP: &str = "root:x:0:\nfn:x:1001:\nwheel:x:10:fn,root\nextra:x:20:fn\n";

    #[test]
    fn nobody_is_the_images_own_or_65534() {
        let (_d, l) = layers(&[("etc/passwd", PASSWD), ("etc/group", GROUP)]);
        let own = super::nobody_in(&LayerStack::open(&l).unwrap()).unwrap();
        assert_eq!((own.uid, own.gid, own.home.as_str()), (65534, 65534, "/"));
        let custom = "nobody:x:99:98::/home/nobody:/bin/false\n";
        let (_d, l) = layers(&[("etc/passwd", custom)]);
        let own = super::nobody_in(&LayerStack::open(&l).unwrap()).unwrap();
        assert_eq!(
            (own.uid, own.gid, own.home.as_str()),
            (99, 98, "/home/nobody")
        );
        for files in [
            &[][..],
            &[("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")][..],
        ] {
            let (_d, l) = layers(files);
            let fallback = super::nobody_in(&LayerStack::open(&l).unwrap()).unwrap();
            assert_eq!(
                fallback,
                ExecUser {
                    uid: 65534,
                    gid: 65534,
                    groups: vec![],
                    home: "/".into()
                }
            );
        }
    }

    #[test]
    fn resolves_names_numbers_and_groups() {
        let (_d, l) = layers(&[("etc/passwd", PASSWD), ("etc/group", GROUP)]);
        let fnuser = resolve("fn", &l).unwrap();
        assert_eq!(
            fnuser,
            ExecUser {
                uid: 1000,
                gid: 1001,
                groups: vec![10, 20],
                home: "/home/fn".into()
            }
        );
        assert_eq!(resolve("", &l).unwrap().uid, 0);
        assert_eq!(resolve("1000", &l).unwrap().gid, 1001);
        let odd = resolve("4242", &l).unwrap();
        assert_eq!((odd.uid, odd.gid, odd.home.as_str()), (4242, 0, "/"));
        let ug = resolve("fn:wheel", &l).unwrap();
        assert_eq!((ug.uid, ug.gid), (1000, 10));
        assert_eq!(resolve("65534:65534", &l).unwrap().gid, 65534);
        assert!(
            resolve("ghost", &l)
                .unwrap_err()
                .to_string()
                .contains("no user \"ghost\"")
        );
        assert!(
            resolve("fn:ghosts", &l)
                .unwrap_err()
                .to_string()
                .contains("no group")
        );
    }

    #[test]
    fn numeric_user_works_without_passwd() {
        let dir = tempfile::tempdir().unwrap();
        let u = resolve("65532:65532", &[dir.path().to_path_buf()]).unwrap();
        assert_eq!((u.uid, u.gid), (65532, 65532));
        assert!(resolve("nonroot", &[dir.path().to_path_buf()]).is_err());
    }

    /// Layer directories (bottom first) built the way the cache unpacks them:
    /// whiteouts are 0:0 character devices, opaque directories carry
    /// `user.overlay.opaque=y`.
    struct Stack {
        dir: tempfile::TempDir,
        layers: Vec<PathBuf>,
    }

    impl Stack {
        fn new(count: usize) -> Stack {
            let dir = tempfile::tempdir().unwrap();
            let layers: Vec<PathBuf> = (0..count)
                .map(|i| dir.path().join("layers").join(format!("l{i}")))
                .collect();
            for l in &layers {
                std::fs::create_dir_all(l).unwrap();
            }
            Stack { dir, layers }
        }

        /// `path` (relative, inside the image) in layer `layer`; parents are created.
        fn at(&self, layer: usize, path: &str) -> PathBuf {
            let p = self.layers[layer].join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            p
        }

        fn file(&self, layer: usize, path: &str, contents: &str) -> &Self {
            std::fs::write(self.at(layer, path), contents).unwrap();
            self
        }

        fn dir(&self, layer: usize, path: &str) -> &Self {
            std::fs::create_dir_all(self.at(layer, path)).unwrap();
            self
        }

        fn symlink(&self, layer: usize, path: &str, target: &str) -> &Self {
            std::os::unix::fs::symlink(target, self.at(layer, path)).unwrap();
            self
        }

        fn whiteout(&self, layer: usize, path: &str) -> &Self {
            use nix::sys::stat::{Mode, SFlag, mknod};
            mknod(&self.at(layer, path), SFlag::S_IFCHR, Mode::empty(), 0).unwrap();
            self
        }

        fn opaque(&self, layer: usize, path: &str) -> &Self {
            let dir = self.at(layer, path);
            std::fs::create_dir_all(&dir).unwrap();
            let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: both strings are NUL-terminated and the value is a live 1-byte slice.
            let rc = unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    c"user.overlay.opaque".as_ptr(),
                    b"y".as_ptr().cast(),
                    1,
                    0,
                )
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            self
        }

        /// A directory outside every layer (the host, as far as the image goes).
        fn host(&self, path: &str, contents: &str) -> PathBuf {
            let p = self.dir.path().join("host").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, contents).unwrap();
            p
        }

        fn resolve(&self, user: &str) -> Result<ExecUser, UserError> {
            resolve(user, &self.layers)
        }
    }

    const PROBE: &str = "probeuser:x:4242:4242::/:/bin/sh\n";

    #[test]
    fn an_absolute_etc_symlink_resolves_in_the_image_not_on_the_host() {
        let s = Stack::new(1);
        let host_passwd = s.host("etc/passwd", PROBE);
        let host_etc = host_passwd.parent().unwrap().to_str().unwrap().to_owned();
        s.symlink(0, "etc", &host_etc).file(0, "bin/sh", "");
        let err = s.resolve("probeuser").unwrap_err();
        assert!(err.to_string().contains("no user \"probeuser\""), "{err}");
        let numeric = s.resolve("4242").unwrap();
        assert_eq!(
            (numeric.uid, numeric.gid),
            (4242, 0),
            "no passwd entry applies"
        );

        // The same target inside the image is followed.
        let inside = host_etc.trim_start_matches('/');
        s.file(
            0,
            &format!("{inside}/passwd"),
            "probeuser:x:7:8::/home/p:/bin/sh\n",
        );
        let u = s.resolve("probeuser").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (7, 8, "/home/p"));

        // And an image-side directory of another name.
        let s = Stack::new(1);
        s.symlink(0, "etc", "/private/etc").file(
            0,
            "private/etc/passwd",
            "probeuser:x:9:9::/:/bin/sh\n",
        );
        assert_eq!(s.resolve("probeuser").unwrap().uid, 9);
    }

    #[test]
    fn a_passwd_symlink_climbing_out_stays_in_the_image() {
        let s = Stack::new(1);
        // On the host, ../../../passwd-outside from <layer>/etc is next to layers/.
        s.host("../passwd-outside", PROBE);
        s.symlink(0, "etc/passwd", "../../../passwd-outside").file(
            0,
            "passwd-outside",
            "probeuser:x:7:7::/:/bin/sh\n",
        );
        let on_host = std::fs::read_to_string(s.layers[0].join("etc/passwd")).unwrap();
        assert_eq!(
            on_host, PROBE,
            "the host would resolve it outside the layer"
        );
        assert_eq!(s.resolve("probeuser").unwrap().uid, 7);
        let s = Stack::new(1);
        s.host("../passwd-outside", PROBE);
        s.symlink(0, "etc/passwd", "../../../passwd-outside");
        assert!(s.resolve("probeuser").is_err());
    }

    #[test]
    fn a_whiteout_hides_a_lower_passwd_or_etc() {
        let s = Stack::new(2);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .whiteout(1, "etc/passwd");
        assert!(s.resolve("a").is_err());
        let s = Stack::new(3);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .whiteout(1, "etc")
            .file(2, "etc/group", "g:x:5:\n");
        assert!(s.resolve("a").is_err());
        // Above the whiteout, a new file counts.
        let s = Stack::new(3);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .whiteout(1, "etc")
            .file(2, "etc/passwd", "a:x:3:3::/:/bin/sh\n");
        assert_eq!(s.resolve("a").unwrap().uid, 3);
    }

    #[test]
    fn an_opaque_directory_or_a_file_hides_what_is_below() {
        let s = Stack::new(2);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .opaque(1, "etc")
            .file(1, "etc/group", "g:x:5:\n");
        assert!(s.resolve("a").is_err());
        // An opaque directory further up the path hides the whole lower tree.
        let s = Stack::new(2);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .file(1, "etc/group", "a:x:5:\n")
            .symlink(1, "etc/passwd", "/usr/lib/passwd")
            .file(0, "usr/lib/passwd", "a:x:2:2::/:/bin/sh\n")
            .opaque(1, "usr")
            .dir(1, "usr/lib");
        assert!(s.resolve("a").is_err());
        // A non-directory hides a directory of the same name below it.
        let s = Stack::new(2);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .file(1, "etc", "not a directory");
        assert!(s.resolve("a").is_err());
        // Without either, the directories merge.
        let s = Stack::new(2);
        s.file(0, "etc/passwd", "a:x:1:1::/:/bin/sh\n")
            .file(1, "etc/group", "g:x:5:a\n");
        assert_eq!(s.resolve("a").unwrap().groups, vec![5]);
    }

    #[test]
    fn a_symlink_in_an_upper_layer_reaches_a_lower_file() {
        for target in ["/usr/share/base/passwd", "../usr/share/base/passwd"] {
            let s = Stack::new(2);
            s.file(0, "usr/share/base/passwd", "a:x:5:6::/:/bin/sh\n")
                .dir(0, "etc")
                .symlink(1, "etc/passwd", target);
            let u = s.resolve("a").unwrap_or_else(|e| panic!("{target}: {e}"));
            assert_eq!((u.uid, u.gid), (5, 6), "{target}");
        }
    }

    #[test]
    fn symlink_loops_are_an_error() {
        let s = Stack::new(1);
        s.symlink(0, "etc/passwd", "passwd2")
            .symlink(0, "etc/passwd2", "/etc/passwd");
        let err = s.resolve("a").unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");
        let s = Stack::new(1);
        s.symlink(0, "etc", "etc");
        let err = s.resolve("a").unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");
        // A numeric user does not need the file at all.
        let u = s.resolve("1000:1000").unwrap();
        assert_eq!((u.uid, u.gid, u.groups.len()), (1000, 1000, 0));
    }

    #[test]
    fn upper_layers_win() {
        let dir = tempfile::tempdir().unwrap();
        let low = dir.path().join("low");
        let high = dir.path().join("high");
        std::fs::create_dir_all(low.join("etc")).unwrap();
        std::fs::create_dir_all(high.join("etc")).unwrap();
        std::fs::write(low.join("etc/passwd"), "a:x:1:1::/:/bin/sh\n").unwrap();
        std::fs::write(high.join("etc/passwd"), "a:x:2:2::/:/bin/sh\n").unwrap();
        assert_eq!(resolve("a", &[low.clone(), high.clone()]).unwrap().uid, 2);
        assert_eq!(resolve("a", &[high, low]).unwrap().uid, 1);
    }
}
