//! Reading a field of a mapping whose value may have the wrong kind: what the
//! ResourceList, its items and its results share. A leaf of the module.

use serde_norway::{Mapping, Value};

use crate::yaml::kind_name;

/// A field whose value has the wrong kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is a {found}, expected {expected}")]
pub struct ShapeError {
    /// The field's path within its object.
    pub field: &'static str,
    /// The kind of value found.
    pub found: &'static str,
    /// The kind of value allowed.
    pub expected: &'static str,
}

pub(super) fn shape(field: &'static str, found: &Value, expected: &'static str) -> ShapeError {
    ShapeError {
        field,
        found: kind_name(found),
        expected,
    }
}

/// A string field that may be absent or null.
pub(super) fn optional_str<'a>(
    mapping: &'a Mapping,
    key: &str,
    field: &'static str,
) -> Result<Option<&'a str>, ShapeError> {
    match mapping.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(shape(field, other, "a string")),
    }
}
