//! Content digests (`sha256:<hex>`) and hashing readers.
//!
//! Every digest that comes from outside (a reference, a manifest, a config, an
//! index.json) is parsed into [`Digest`] before it is used, so a hostile value such
//! as `sha256:../../x` can never become part of a store path.

use std::fmt;
use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

/// A validated sha256 digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

/// Why a digest string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("invalid digest \"{0}\": expected sha256:<64 lower-case hex digits>")]
    Invalid(String),
    #[error("unsupported digest algorithm \"{0}\": only sha256 is supported")]
    Unsupported(String),
}

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Digest, DigestError> {
        let Some((algorithm, hex)) = s.split_once(':') else {
            return Err(DigestError::Invalid(truncate(s)));
        };
        if algorithm != "sha256" {
            let known = matches!(algorithm, "sha384" | "sha512");
            let plausible = !algorithm.is_empty()
                && algorithm
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
            if known || plausible {
                return Err(DigestError::Unsupported(truncate(algorithm)));
            }
            return Err(DigestError::Invalid(truncate(s)));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Invalid(truncate(s)));
        }
        Ok(Digest {
            hex: hex.to_owned(),
        })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    /// The 64 hex digits, safe to use as a file name.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// Keeps error messages short when they echo untrusted input.
pub fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// An incremental sha256.
#[derive(Default, Clone)]
pub struct Hasher {
    inner: Sha256,
    len: u64,
}

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was hashed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn finish(self) -> Digest {
        Digest {
            hex: hex::encode(self.inner.finalize()),
        }
    }
}

/// A reader that hashes everything read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::default(),
        }
    }

    /// Reads the rest of the stream, then returns the digest of everything read and its length.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        let len = self.hasher.len();
        Ok((self.hasher.finish(), len))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_valid_sha256() {
        let d = Digest::parse(&format!("sha256:{EMPTY}")).unwrap();
        assert_eq!(d.hex(), EMPTY);
        assert_eq!(d.to_string(), format!("sha256:{EMPTY}"));
        assert_eq!(Digest::of(b""), d);
    }

    #[test]
    fn refuses_bad_digests() {
        for bad in [
            "",
            "sha256",
            "sha256:",
            "sha256:../../etc/passwd",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
            "../x:abc",
        ] {
            assert!(
                matches!(Digest::parse(bad), Err(DigestError::Invalid(_))),
                "{bad:?} must be invalid"
            );
        }
        assert!(matches!(
            Digest::parse(&format!("sha512:{EMPTY}{EMPTY}")),
            Err(DigestError::Unsupported(_))
        ));
    }

    #[test]
    fn hashing_reader_hashes_everything() {
        let r = HashingReader::new(&b"hello"[..]);
        let (d, len) = r.finish().unwrap();
        assert_eq!(d, Digest::of(b"hello"));
        assert_eq!(len, 5);
    }
}
