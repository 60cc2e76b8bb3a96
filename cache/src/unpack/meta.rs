//! Tar metadata: the fields of one member after GNU long names and PAX extended headers
//! (read with size caps), and its path split into components confined to the layer root.

use std::io::Read;

use tar::EntryType;

use super::fail::{Fail, lossy};
use super::reason::{CorruptLayer, HostileEntry, MAX_DEPTH};

/// Caps for GNU long name/link entries and PAX extended headers (read into memory).
pub(super) const MAX_LONG_NAME: u64 = 64 << 10;
pub(super) const MAX_PAX_HEADER: u64 = 1 << 20;
/// The fields of one tar member after applying GNU long names and PAX headers.
pub(super) struct Meta {
    pub(super) path: Vec<u8>,
    pub(super) link: Option<Vec<u8>>,
    pub(super) kind: EntryType,
    pub(super) size: u64,
    pub(super) mode: u32,
    pub(super) uid: u64,
    pub(super) gid: u64,
    pub(super) mtime: i64,
    /// Whether a PAX header carried extended attributes (which are ignored).
    pub(super) xattrs: bool,
}

#[derive(Default)]
pub(super) struct Extensions {
    pub(super) long_name: Option<Vec<u8>>,
    pub(super) long_link: Option<Vec<u8>>,
    pub(super) pax: Option<Vec<u8>>,
}

/// The fields of the member `header` with the long names and PAX header before it.
pub(super) fn parse(header: &tar::Header, ext: Extensions) -> Result<Meta, Fail> {
    let size = header
        .entry_size()
        .map_err(|e| Fail::Corrupt(CorruptLayer::HeaderSize(e)))?;
    // Like Go's archive/tar, an empty or unparsable numeric field reads as 0.
    let mut meta = Meta {
        path: ext
            .long_name
            .unwrap_or_else(|| header.path_bytes().into_owned()),
        link: ext
            .long_link
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned())),
        kind: header.entry_type(),
        size,
        mode: header.mode().unwrap_or(0),
        uid: header.uid().unwrap_or(0),
        gid: header.gid().unwrap_or(0),
        mtime: i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(i64::MAX),
        xattrs: false,
    };
    if let Some(pax) = ext.pax {
        for field in tar::PaxExtensions::new(&pax) {
            let field = field.map_err(|e| Fail::Corrupt(CorruptLayer::Pax(e)))?;
            let value = field.value_bytes();
            let number = || -> Result<u64, Fail> {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| Fail::Corrupt(CorruptLayer::PaxValue(lossy(field.key_bytes()))))
            };
            match field.key_bytes() {
                b"path" => meta.path = value.to_vec(),
                b"linkpath" => meta.link = Some(value.to_vec()),
                b"uid" => meta.uid = number()?,
                b"gid" => meta.gid = number()?,
                b"size" if number()? != size => {
                    return Err(Fail::Corrupt(CorruptLayer::PaxSize));
                }
                b"mtime" => {
                    let s = std::str::from_utf8(value).unwrap_or("");
                    let secs = s.split('.').next().unwrap_or("");
                    meta.mtime = secs.parse().unwrap_or(meta.mtime);
                }
                k if k.starts_with(b"SCHILY.xattr.") || k.starts_with(b"LIBARCHIVE.xattr.") => {
                    meta.xattrs = true;
                }
                _ => {}
            }
        }
    }
    Ok(meta)
}

/// Splits a tar path into components, dropping `.` and empty ones and applying `..`.
/// Absolute paths are relative to the layer root; a `..` above the root is refused.
pub(super) fn normalize(path: &[u8]) -> Result<Vec<Vec<u8>>, Fail> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err(Fail::Hostile(HostileEntry::LeavesRoot));
                }
            }
            c => {
                if c.contains(&0) {
                    return Err(Fail::Hostile(HostileEntry::NulByte));
                }
                out.push(c.to_vec());
            }
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(Fail::Hostile(HostileEntry::TooDeep));
    }
    Ok(out)
}

pub(super) fn join(comps: &[Vec<u8>]) -> Vec<u8> {
    if comps.is_empty() {
        return b".".to_vec();
    }
    comps.join(&b'/')
}

pub(super) fn trim_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

pub(super) fn read_capped<R: Read>(
    r: &mut R,
    cap: u64,
    what: &'static str,
) -> Result<Vec<u8>, Fail> {
    let mut v = Vec::new();
    r.take(cap + 1).read_to_end(&mut v).map_err(Fail::Stream)?;
    if v.len() as u64 > cap {
        return Err(Fail::Corrupt(CorruptLayer::Oversized { what, limit: cap }));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use crate::config::LayerOwner;
    use crate::unpack::testutil::{
        Member, TarBuilder, area, assert_refused, big_budget, read_xattr,
    };
    use crate::unpack::{HostileEntry, UnpackError, remove_tree};

    #[test]
    fn refuses_dotdot_escape() {
        let a = area();
        let err = assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"../escape", b"x", 0o644))
                .tar(),
        );
        assert!(err.to_string().contains("leaves the layer root"), "{err}");
        assert!(
            matches!(
                err,
                UnpackError::Hostile {
                    reason: HostileEntry::LeavesRoot,
                    ..
                }
            ),
            "{err}"
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::File(b"a/../../sentinel/file", b"x", 0o644))
                .tar(),
        );
        assert_refused(
            &a,
            &TarBuilder::new()
                .add(Member::Dir(b"../sentinel/newdir/", 0o755))
                .tar(),
        );
    }

    #[test]
    fn absolute_paths_stay_inside() {
        let a = area();
        let abs = format!("{}/abs-escape", a.base.display());
        let tar = TarBuilder::new()
            .add(Member::File(b"/abs-escape", b"x", 0o644))
            .add(Member::File(abs.as_bytes(), b"y", 0o644))
            .tar();
        a.unpack_tar(&tar).unwrap();
        assert_eq!(std::fs::read(a.layer.join("abs-escape")).unwrap(), b"x");
        let inner = a.layer.join(abs.trim_start_matches('/'));
        assert_eq!(std::fs::read(inner).unwrap(), b"y");
        a.assert_contained();
    }

    #[test]
    fn pax_headers_apply_but_xattrs_do_not() {
        let a = area();
        let tar = TarBuilder::new()
            .add(Member::Pax(&[
                ("path", b"pax/real-name"),
                ("mtime", b"1700000000.5"),
            ]))
            .add(Member::File(b"ignored-name", b"p", 0o644))
            .add(Member::Pax(&[("SCHILY.xattr.user.overlay.opaque", b"y")]))
            .add(Member::Dir(b"not-opaque/", 0o755))
            .tar();
        a.unpack_tar(&tar).unwrap();
        let f = a.layer.join("pax/real-name");
        assert_eq!(std::fs::read(&f).unwrap(), b"p");
        assert_eq!(std::fs::metadata(&f).unwrap().mtime(), 1_700_000_000);
        assert!(!a.layer.join("ignored-name").exists());
        assert!(read_xattr(&a.layer.join("not-opaque"), "user.overlay.opaque").is_none());
        remove_tree(&a.layer).unwrap();

        let escape = TarBuilder::new()
            .add(Member::Pax(&[("path", b"../escape")]))
            .add(Member::File(b"innocent", b"x", 0o644))
            .tar();
        assert_refused(&a, &escape);
        let link_escape = TarBuilder::new()
            .add(Member::File(b"f", b"x", 0o644))
            .add(Member::Pax(&[("linkpath", b"../sentinel/file")]))
            .add(Member::Hardlink(b"l", b"f"))
            .tar();
        assert_refused(&a, &link_escape);
        let huge = vec![b'a'; 2 << 20];
        let oversized = TarBuilder::new()
            .add(Member::Pax(&[("comment", &huge)]))
            .add(Member::File(b"f", b"x", 0o644))
            .tar();
        assert_refused(&a, &oversized);
    }

    #[test]
    fn uncompressed_layers_and_long_names() {
        let a = area();
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/file", "d".repeat(200));
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        a.unpack(&tar, &tar, LayerOwner::Identity, &big_budget())
            .unwrap();
        assert_eq!(std::fs::read(a.layer.join(&long)).unwrap(), b"hi");
    }
}
