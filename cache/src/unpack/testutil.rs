//! Test helpers for layers: tars with raw (hostile) headers, a test area around a
//! layer directory, and checks that nothing escaped it.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use tar::EntryType;

use super::{Budget, LayerStats, UnpackError, unpack_layer};
use crate::config::LayerOwner;
use fnrun_registry::digest::Digest;

/// Builds a tar with raw headers so hostile names reach the unpacker unmodified.
pub(crate) struct TarBuilder {
    data: Vec<u8>,
}

pub(crate) enum Member<'a> {
    File(&'a [u8], &'a [u8], u32),
    Dir(&'a [u8], u32),
    Symlink(&'a [u8], &'a [u8]),
    Hardlink(&'a [u8], &'a [u8]),
    Char(&'a [u8]),
    Fifo(&'a [u8]),
    /// A PAX extended header for the next member.
    Pax(&'a [(&'a str, &'a [u8])]),
}

fn pax_records(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let rest = k.len() + v.len() + 3; // ' ', '=', '\n'
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        out.extend_from_slice(format!("{len} {k}=").as_bytes());
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    out
}

impl TarBuilder {
    pub(crate) fn new() -> Self {
        TarBuilder { data: Vec::new() }
    }

    pub(crate) fn add(&mut self, m: Member<'_>) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        let pax;
        let (path, kind, body, mode, link): (&[u8], EntryType, &[u8], u32, Option<&[u8]>) = match m
        {
            Member::File(p, body, mode) => (p, EntryType::Regular, body, mode, None),
            Member::Dir(p, mode) => (p, EntryType::Directory, b"", mode, None),
            Member::Symlink(p, t) => (p, EntryType::Symlink, b"", 0o777, Some(t)),
            Member::Hardlink(p, t) => (p, EntryType::Link, b"", 0o644, Some(t)),
            Member::Char(p) => (p, EntryType::Char, b"", 0o666, None),
            Member::Fifo(p) => (p, EntryType::Fifo, b"", 0o640, None),
            Member::Pax(records) => {
                pax = pax_records(records);
                (
                    &b"PaxHeaders/x"[..],
                    EntryType::XHeader,
                    &pax[..],
                    0o644,
                    None,
                )
            }
        };
        // Raw name bytes: `set_path` would refuse `..` and absolute paths.
        let name = &mut h.as_old_mut().name;
        assert!(path.len() <= name.len());
        name[..path.len()].copy_from_slice(path);
        if let Some(link) = link {
            let l = &mut h.as_old_mut().linkname;
            l[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_size(body.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_600_000_000);
        if kind == EntryType::Char {
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
        }
        h.set_cksum();
        self.data.extend_from_slice(h.as_bytes());
        self.data.extend_from_slice(body);
        let pad = (512 - body.len() % 512) % 512;
        self.data.extend(std::iter::repeat_n(0, pad));
        self
    }

    pub(crate) fn tar(&self) -> Vec<u8> {
        let mut t = self.data.clone();
        t.extend(std::iter::repeat_n(0, 1024));
        t
    }
}

pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A test area: `base/layer` is the layer directory, `base/sentinel` a sibling that
/// hostile entries try to reach.
pub(crate) struct Area {
    pub _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub layer: PathBuf,
    pub blob: PathBuf,
}

pub(crate) fn area() -> Area {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().to_owned();
    std::fs::create_dir(base.join("sentinel")).unwrap();
    std::fs::write(base.join("sentinel/file"), b"keep").unwrap();
    Area {
        layer: base.join("layer"),
        blob: base.join("blob"),
        base,
        _tmp: tmp,
    }
}

impl Area {
    /// Unpacks `blob_bytes` whose digests are computed here (so only content is tested).
    pub(crate) fn unpack(
        &self,
        blob_bytes: &[u8],
        tar: &[u8],
        owner: LayerOwner,
        budget: &Budget,
    ) -> Result<LayerStats, UnpackError> {
        std::fs::write(&self.blob, blob_bytes).unwrap();
        unpack_layer(
            &self.blob,
            &Digest::of(blob_bytes),
            &Digest::of(tar),
            &self.layer,
            owner,
            budget,
        )
    }

    pub(crate) fn unpack_tar(&self, tar: &[u8]) -> Result<LayerStats, UnpackError> {
        self.unpack(&gzip(tar), tar, LayerOwner::Identity, &big_budget())
    }

    /// Nothing but `layer`, `blob` and the untouched sentinel exists around the layer.
    pub(crate) fn assert_contained(&self) {
        let mut names: Vec<String> = std::fs::read_dir(&self.base)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.retain(|n| n != "layer");
        assert_eq!(
            names,
            vec!["blob", "sentinel"],
            "unexpected files next to the layer"
        );
        let sentinel: Vec<_> = std::fs::read_dir(self.base.join("sentinel"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(sentinel, vec![std::ffi::OsString::from("file")]);
        assert_eq!(
            std::fs::read(self.base.join("sentinel/file")).unwrap(),
            b"keep"
        );
        assert!(!Path::new("/escape").exists() && !Path::new("/abs-escape").exists());
    }
}

pub(crate) fn big_budget() -> Budget {
    Budget::new(1 << 30, 1 << 20)
}

pub(crate) fn assert_refused(area: &Area, tar: &[u8]) -> UnpackError {
    let err = area
        .unpack_tar(tar)
        .expect_err("a hostile layer must be refused");
    assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt, "{err}");
    assert!(
        !area.layer.exists(),
        "a refused layer must not be left behind"
    );
    area.assert_contained();
    err
}

pub(crate) fn read_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: both strings are NUL-terminated CStrings alive for the call and `buf` is
    // a writable buffer of the length passed.
    let rc = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(rc).ok().map(|n| buf[..n].to_vec())
}
