//! An entry's failure before it is given the entry's name (the unpacker names it), and
//! the helpers the stages make one with.

use std::io;

use nix::errno::Errno;

use super::reason::{CorruptLayer, HostileEntry};
use super::stream::Exceeded;

/// An entry-level failure before it is given the entry's name.
pub(super) enum Fail {
    Hostile(HostileEntry),
    Corrupt(CorruptLayer),
    Exceeded(Exceeded),
    Stream(io::Error),
    Fs(&'static str, io::Error, bool),
}

impl From<Exceeded> for Fail {
    fn from(e: Exceeded) -> Fail {
        Fail::Exceeded(e)
    }
}

/// `fs(op)` turns an errno into a failure, deciding whether the layer's content caused it.
pub(super) fn fs(op: &'static str) -> impl Fn(Errno) -> Fail {
    move |e| {
        let from_layer = matches!(
            e,
            Errno::ENOTDIR
                | Errno::EEXIST
                | Errno::ELOOP
                | Errno::EXDEV
                | Errno::ENOENT
                | Errno::EISDIR
                | Errno::EMLINK
                | Errno::ENAMETOOLONG
                | Errno::EINVAL
                | Errno::ENOTEMPTY
        );
        Fail::Fs(op, e.into(), from_layer)
    }
}

pub(super) fn lossy(b: &[u8]) -> String {
    fnrun_registry::digest::truncate(&String::from_utf8_lossy(b))
}
