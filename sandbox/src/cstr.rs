//! The strings the planner hands to the kernel, checked before the clone: C
//! strings without NUL bytes, paths that are UTF-8. A leaf: the planner and
//! its steps (the overlay's among them) all make them.

use std::ffi::CString;
use std::path::Path;

use crate::error::{Error, SpecError};

/// `bytes` as a C string; `what` names it in the error if it has a NUL byte.
pub(crate) fn cstring(what: &'static str, bytes: &[u8]) -> Result<CString, Error> {
    CString::new(bytes).map_err(|_| {
        // The message quotes the start only: an environment variable may
        // be 128 KiB.
        let text = String::from_utf8_lossy(bytes);
        let start: String = text.chars().take(64).collect();
        SpecError::NulByte { what, start }.into()
    })
}

/// A path that must be UTF-8 (it goes into mount options).
pub(crate) fn path_str(path: &Path) -> Result<String, Error> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| SpecError::NotUtf8(path.to_owned()).into())
}
