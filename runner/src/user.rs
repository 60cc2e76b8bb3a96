//! Resolving an image's `User` (`uid`, `name`, `uid:gid`, `name:group`) against
//! the image's own `/etc/passwd` and `/etc/group`, the way container runtimes do.

use std::path::{Path, PathBuf};

/// The ids a function runs as, and its home directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// A `User` that cannot be resolved.
#[derive(Debug, thiserror::Error)]
#[error("image user {user:?}: {reason}")]
pub struct UserError {
    user: String,
    reason: String,
}

/// Most bytes read of `/etc/passwd` or `/etc/group`.
const MAX_DB_BYTES: u64 = 1 << 20;

/// Resolves `user` against the files of `layers` (bottom to top).
pub fn resolve(user: &str, layers: &[PathBuf]) -> Result<ExecUser, UserError> {
    let err = |reason: String| UserError {
        user: user.to_owned(),
        reason,
    };
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_image_file(layers, "etc/passwd").unwrap_or_default();
    let group = read_image_file(layers, "etc/group").unwrap_or_default();
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
        let f = pw_entry(&|f| f[0] == u)
            .ok_or_else(|| err(format!("no user {u:?} in the image's /etc/passwd")))?;
        let uid = f[2]
            .parse()
            .map_err(|_| err(format!("bad uid {:?} in /etc/passwd", f[2])))?;
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
                .ok_or_else(|| err(format!("no group {g:?} in the image's /etc/group")))?,
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

/// Reads a file from the merged view of `layers`, honouring overlay whiteouts
/// (a 0:0 character device) and opaque directories in upper layers.
pub fn read_image_file(layers: &[PathBuf], rel: &str) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    for layer in layers.iter().rev() {
        let path = layer.join(rel);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => return None,
            Ok(m) if m.is_file() => return read_capped(&path),
            Ok(_) => return None,
            Err(_) => {}
        }
        if let Some(parent) = Path::new(rel).parent() {
            if is_opaque(&layer.join(parent)) {
                return None;
            }
        }
    }
    None
}

fn read_capped(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_DB_BYTES)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

fn is_opaque(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut buf = [0u8; 2];
    // SAFETY: both strings are NUL-terminated and buf is valid for its length.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n == 1 && buf[0] == b'y'
}

#[cfg(test)]
mod tests {
    use super::*;

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
