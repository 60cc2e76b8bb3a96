//! The layer blob as a tar stream: decompressed as its magic bytes say (gzip, zstd or
//! plain), hashed on both sides (the blob's digest and the diff_id) and charged to the
//! image's [`Budget`] as it is read, so a decompression bomb stops at the limit.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::reason::CorruptLayer;
use fnrun_registry::digest::{Digest, Hasher, HashingReader};

/// Unpacked bytes and entry limits shared by the layers of one image.
#[derive(Debug)]
pub(crate) struct Budget {
    max_bytes: u64,
    max_entries: u64,
    bytes: AtomicU64,
    entries: AtomicU64,
    exceeded: AtomicBool,
}

/// Which limit of a [`Budget`] was exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exceeded {
    Bytes(u64),
    Entries(u64),
}

impl Budget {
    pub(crate) fn new(max_bytes: u64, max_entries: u64) -> Budget {
        Budget {
            max_bytes,
            max_entries,
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            exceeded: AtomicBool::new(false),
        }
    }

    pub(crate) fn charge(&self, bytes: u64, entries: u64) -> Result<(), Exceeded> {
        let b = self
            .bytes
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        let e = self
            .entries
            .fetch_add(entries, Ordering::Relaxed)
            .saturating_add(entries);
        if b > self.max_bytes {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Bytes(self.max_bytes));
        }
        if e > self.max_entries {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Entries(self.max_entries));
        }
        Ok(())
    }

    /// Fails if `bytes` more would not fit.
    pub(super) fn check_fits(&self, bytes: u64) -> Result<(), Exceeded> {
        if self.bytes.load(Ordering::Relaxed).saturating_add(bytes) > self.max_bytes {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(Exceeded::Bytes(self.max_bytes));
        }
        Ok(())
    }

    pub(super) fn exceeded(&self) -> Option<Exceeded> {
        if !self.exceeded.load(Ordering::Relaxed) {
            return None;
        }
        if self.entries.load(Ordering::Relaxed) > self.max_entries {
            Some(Exceeded::Entries(self.max_entries))
        } else {
            Some(Exceeded::Bytes(self.max_bytes))
        }
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A layer blob read as its uncompressed tar stream (see [`open`]).
pub(super) type TarStream<'b> = BudgetReader<'b, Decoder<BufReader<HashingReader<File>>>>;

/// What a whole layer stream hashed to.
pub(super) struct Digests {
    /// Bytes of the uncompressed tar stream.
    pub(super) tar_bytes: u64,
    /// The digest of the uncompressed stream.
    pub(super) diff_id: Digest,
    /// The digest of the blob as stored.
    pub(super) blob: Digest,
}

/// The layer blob `file` as its uncompressed tar stream, charged to `budget`.
pub(super) fn open(file: File, budget: &Budget) -> Result<TarStream<'_>, CorruptLayer> {
    let mut buffered = BufReader::with_capacity(256 << 10, HashingReader::new(file));
    let magic = buffered.fill_buf().map_err(CorruptLayer::Blob)?;
    let decoder = if magic.starts_with(&[0x1f, 0x8b]) {
        Decoder::Gzip(Box::new(flate2::bufread::MultiGzDecoder::new(buffered)))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        // Concatenated frames are read like one stream; libzstd refuses frames whose
        // window exceeds 2^27 bytes (128 MiB), which bounds the decoder's memory.
        let mut d =
            zstd::stream::read::Decoder::with_buffer(buffered).map_err(CorruptLayer::Zstd)?;
        d.window_log_max(27).map_err(CorruptLayer::Zstd)?;
        Decoder::Zstd(d)
    } else {
        Decoder::Plain(buffered)
    };
    Ok(BudgetReader {
        inner: decoder,
        hasher: Hasher::default(),
        budget,
    })
}

impl TarStream<'_> {
    /// The digests of the stream read to its end (the caller reads what follows the
    /// end-of-archive marker first: the digests cover whole streams).
    pub(super) fn finish(self) -> Result<Digests, CorruptLayer> {
        let tar_bytes = self.hasher.len();
        let diff_id = self.hasher.finish();
        let (blob, _) = self
            .inner
            .into_inner()
            .into_inner()
            .finish()
            .map_err(CorruptLayer::Blob)?;
        Ok(Digests {
            tar_bytes,
            diff_id,
            blob,
        })
    }
}

pub(super) enum Decoder<R: BufRead> {
    Plain(R),
    // Boxed: the decoder is much larger than the others (one per layer).
    Gzip(Box<flate2::bufread::MultiGzDecoder<R>>),
    Zstd(zstd::stream::read::Decoder<'static, R>),
}

impl<R: BufRead> Decoder<R> {
    fn into_inner(self) -> R {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => (*d).into_inner(),
            Decoder::Zstd(d) => d.finish(),
        }
    }
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
        }
    }
}

/// Hashes the uncompressed tar stream and charges it to the budget as it is read.
pub(super) struct BudgetReader<'b, R> {
    inner: R,
    hasher: Hasher,
    budget: &'b Budget,
}

impl<R: Read> Read for BudgetReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.budget
            .charge(n as u64, 0)
            .map_err(|_| io::Error::other("unpacked size limit exceeded"))?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, Read as _};

    use crate::config::LayerOwner;
    use crate::unpack::testutil::{Member, TarBuilder, area, big_budget, gzip};
    use crate::unpack::{Budget, UnpackError, unpack_layer};
    use fnrun_registry::digest::Digest;

    #[test]
    fn decompression_bomb_stops_at_the_limit() {
        let a = area();
        // 64 MiB of zeros compresses to ~64 KiB; the budget is 1 MiB.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, "bomb", io::repeat(0).take(64 << 20))
            .unwrap();
        let tar = tar.into_inner().unwrap();
        let gz = gzip(&tar);
        assert!(gz.len() < 1 << 20);
        let err = a
            .unpack(&gz, &tar, LayerOwner::Identity, &Budget::new(1 << 20, 100))
            .unwrap_err();
        assert!(
            matches!(err, UnpackError::TooLarge { limit, .. } if limit == 1 << 20),
            "{err}"
        );
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt);
        assert!(!a.layer.exists());

        // Many small files: the stream is charged as it is read, so this fails too.
        let mut b = TarBuilder::new();
        let names: Vec<String> = (0..3000).map(|i| format!("f{i}")).collect();
        for n in &names {
            b.add(Member::File(n.as_bytes(), b"", 0o644));
        }
        let tar = b.tar();
        let err = a
            .unpack(
                &gzip(&tar),
                &tar,
                LayerOwner::Identity,
                &Budget::new(1 << 30, 1000),
            )
            .unwrap_err();
        assert!(
            matches!(err, UnpackError::TooManyEntries { limit: 1000, .. }),
            "{err}"
        );
    }

    #[test]
    fn digest_mismatch_is_refused() {
        let a = area();
        let tar = TarBuilder::new().add(Member::File(b"f", b"x", 0o644)).tar();
        let gz = gzip(&tar);
        std::fs::write(&a.blob, &gz).unwrap();
        let wrong = Digest::of(b"something else");
        let err = unpack_layer(
            &a.blob,
            &wrong,
            &Digest::of(&tar),
            &a.layer,
            LayerOwner::Identity,
            &big_budget(),
        )
        .unwrap_err();
        assert!(
            matches!(err, UnpackError::DigestMismatch { what: "blob", .. }),
            "{err}"
        );
        assert!(!a.layer.exists());
        let err = unpack_layer(
            &a.blob,
            &Digest::of(&gz),
            &wrong,
            &a.layer,
            LayerOwner::Identity,
            &big_budget(),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                UnpackError::DigestMismatch {
                    what: "diff_id",
                    ..
                }
            ),
            "{err}"
        );
        assert!(!a.layer.exists());
        // Trailing data after the end of the archive is covered by the diff_id.
        let mut padded = tar.clone();
        padded.extend_from_slice(b"trailing");
        let err = a
            .unpack(&gzip(&padded), &tar, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert!(
            matches!(
                err,
                UnpackError::DigestMismatch {
                    what: "diff_id",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn zstd_layers_in_one_or_several_frames() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, "etc/hello", &b"world"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let one = zstd::encode_all(&tar[..], 3).unwrap();
        let (head, tail) = tar.split_at(700);
        let mut two = zstd::encode_all(head, 1).unwrap();
        two.extend(zstd::encode_all(tail, 19).unwrap());
        for blob in [one, two] {
            let a = area();
            let stats = a
                .unpack(&blob, &tar, LayerOwner::Identity, &big_budget())
                .unwrap();
            assert_eq!(stats.bytes, tar.len() as u64);
            assert_eq!(std::fs::read(a.layer.join("etc/hello")).unwrap(), b"world");
            a.assert_contained();
        }
        // A truncated zstd stream is refused and leaves nothing behind.
        let a = area();
        let blob = zstd::encode_all(&tar[..], 3).unwrap();
        let cut = &blob[..blob.len() - 4];
        let err = a
            .unpack(cut, &tar, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt, "{err}");
        assert!(!a.layer.exists());
    }

    #[test]
    fn zstd_bomb_stops_at_the_limit() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        let big = vec![0u8; 8 << 20];
        h.set_size(big.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", &big[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let blob = zstd::encode_all(&tar[..], 19).unwrap();
        assert!(blob.len() < 4096, "{}", blob.len());
        let a = area();
        let err = a
            .unpack(
                &blob,
                &tar,
                LayerOwner::Identity,
                &Budget::new(1 << 20, 100),
            )
            .unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge { .. }), "{err}");
        assert!(!a.layer.exists());
    }

    #[test]
    fn garbage_is_corrupt() {
        let a = area();
        let junk = vec![0x42u8; 2048];
        let err = a
            .unpack(&junk, &junk, LayerOwner::Identity, &big_budget())
            .unwrap_err();
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt, "{err}");
        let err = a
            .unpack(
                &[0x1f, 0x8b, 1, 2, 3],
                &junk,
                LayerOwner::Identity,
                &big_budget(),
            )
            .unwrap_err();
        assert_eq!(err.kind(), fnrun_registry::ErrorKind::Corrupt, "{err}");
        a.assert_contained();
    }
}
