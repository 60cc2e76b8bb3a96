//! Derived connection details: a FunctionIO desired resource may say how
//! composite connection details derive from it (`FromValue`,
//! `FromConnectionSecretKey`, `FromFieldPath`). Crossplane v1.13 evaluated
//! them after the pipeline; v1 has no such field, so they are evaluated here,
//! with Crossplane v1.13's rules (`ExtractConnectionDetails` in
//! `internal/controller/apiextensions/composite/connection.go`):
//!
//! - the name defaults to `fromConnectionSecretKey` for that type, and a
//!   detail without a name is an error, as is a type without its source;
//! - `FromConnectionSecretKey` reads the observed resource's connection
//!   details and `FromFieldPath` the observed resource; a key or field that
//!   does not exist (yet) gives no detail, which is not an error;
//! - a field that is a string gives its bytes, anything else its JSON as Go's
//!   `encoding/json` writes it (`5432`, `{"a":1}`);
//! - any other type gives no detail.
//!
//! One difference: v1.13 read the resource as it was just applied, in the
//! same reconcile; here it is the state Crossplane observed before the
//! pipeline, so a newly set field shows one reconcile later.

use std::collections::BTreeMap;
use std::fmt::Write;

use prost_types::Struct;
use prost_types::value::Kind;
use serde::Deserialize;
use serde_norway::Value;

use crate::v1;
use crate::yaml::YamlError;

/// Why a derived connection detail cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DerivedError {
    /// The detail does not have the shape of a DerivedConnectionDetail.
    #[error(transparent)]
    Shape(#[from] YamlError),
    /// No name, and none to default to.
    #[error("connection detail has no name")]
    NoName,
    /// The type's source field is missing.
    #[error("connection detail of type {kind} has no {field}")]
    NoSource {
        /// The detail's type.
        kind: &'static str,
        /// The field that type needs.
        field: &'static str,
    },
}

/// Crossplane v1.13's `DerivedConnectionDetail`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Derived {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    from_connection_secret_key: Option<String>,
    #[serde(default)]
    from_field_path: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

/// Evaluates one derived connection detail of a desired resource against
/// that resource's observed state (`None` if it does not exist yet). Gives
/// the detail's name and value, or nothing.
pub(super) fn derive(
    detail: &BTreeMap<String, Value>,
    observed: Option<&v1::Resource>,
) -> Result<Option<(String, Vec<u8>)>, DerivedError> {
    let d: Derived = serde_norway::from_value(Value::Mapping(
        detail
            .iter()
            .map(|(k, v)| (Value::String(k.clone()), v.clone()))
            .collect(),
    ))
    .map_err(YamlError::from)?;
    let kind = d.kind.as_deref().unwrap_or_default();
    let name = match (&d.name, kind, &d.from_connection_secret_key) {
        (Some(name), _, _) => name.clone(),
        (None, "FromConnectionSecretKey", Some(key)) => key.clone(),
        _ => String::new(),
    };
    if name.is_empty() {
        return Err(DerivedError::NoName);
    }
    let value = match kind {
        "FromValue" => {
            let value = d.value.ok_or(DerivedError::NoSource {
                kind: "FromValue",
                field: "value",
            })?;
            Some(value.into_bytes())
        }
        "FromConnectionSecretKey" => {
            let key = d.from_connection_secret_key.ok_or(DerivedError::NoSource {
                kind: "FromConnectionSecretKey",
                field: "fromConnectionSecretKey",
            })?;
            observed.and_then(|o| o.connection_details.get(&key).cloned())
        }
        "FromFieldPath" => {
            let path = d.from_field_path.ok_or(DerivedError::NoSource {
                kind: "FromFieldPath",
                field: "fromFieldPath",
            })?;
            observed
                .and_then(|o| o.resource.as_ref())
                .and_then(|r| field_value(r, &path))
        }
        _ => None,
    };
    Ok(value.map(|v| (name, v)))
}

/// The value at `path` in `object`: a string's bytes, or the JSON of anything
/// else. `None` if the path is malformed or leads nowhere, or the value has
/// no JSON form.
fn field_value(object: &Struct, path: &str) -> Option<Vec<u8>> {
    let segments = parse_path(path)?;
    let (first, rest) = segments.split_first()?;
    let PathSegment::Field(first) = first else {
        return None;
    };
    let mut value = object.fields.get(first)?;
    for segment in rest {
        value = match (segment, value.kind.as_ref()?) {
            (PathSegment::Field(f), Kind::StructValue(s)) => s.fields.get(f)?,
            (PathSegment::Index(i), Kind::ListValue(l)) => l.values.get(*i)?,
            _ => return None,
        };
    }
    match value.kind.as_ref() {
        Some(Kind::StringValue(s)) => Some(s.clone().into_bytes()),
        _ => {
            let mut out = String::new();
            write_json(&mut out, value)?;
            Some(out.into_bytes())
        }
    }
}

/// A step of a Crossplane field path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathSegment {
    Field(String),
    Index(usize),
}

/// Parses a field path as crossplane-runtime's `fieldpath.Parse` does:
/// `metadata.name`, `spec.containers[0].name`, `data[.config.yml]`,
/// `metadata.annotations['crossplane.io/external-name']`. A bracketed
/// segment that is an unsigned 32-bit integer is an index; any other segment
/// is a field name, with surrounding quotes removed. `None` when malformed:
/// a leading, trailing or doubled period, a period before a bracket, empty,
/// nested or unterminated brackets, a stray `]`.
fn parse_path(path: &str) -> Option<Vec<PathSegment>> {
    let field = |s: &str| PathSegment::Field(s.trim_matches(['\'', '"']).to_owned());
    let mut segments = Vec::new();
    let mut rest = path;
    loop {
        // A field name runs to the next period or bracket.
        let end = rest.find(['.', '[', ']']).unwrap_or(rest.len());
        if end > 0 {
            segments.push(field(&rest[..end]));
        }
        rest = &rest[end..];
        match rest.as_bytes().first() {
            None => return Some(segments),
            Some(b']') => return None,
            Some(b'.') => {
                // Not first, not last, not before another period or a bracket.
                if rest.len() == path.len() || rest.len() == 1 {
                    return None;
                }
                rest = &rest[1..];
                if rest.starts_with(['.', '[']) {
                    return None;
                }
            }
            _ => {
                // A bracket: everything up to the next `]` is one segment.
                let close = rest.find(']')?;
                let inner = &rest[1..close];
                if inner.is_empty() || inner.contains('[') {
                    return None;
                }
                // Go's ParseUint: digits only, no sign.
                let index = inner
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| inner.parse::<u32>().ok())
                    .flatten();
                segments.push(match index {
                    Some(i) => PathSegment::Index(usize::try_from(i).ok()?),
                    None => field(inner),
                });
                rest = &rest[close + 1..];
            }
        }
    }
}

/// Writes `value` as Go's `encoding/json` marshals the same value: object
/// keys sorted, `<`, `>`, `&`, U+2028 and U+2029 escaped, numbers in Go's
/// float format. `None` for NaN or infinity, which Go refuses.
fn write_json(out: &mut String, value: &prost_types::Value) -> Option<()> {
    match value.kind.as_ref() {
        None | Some(Kind::NullValue(_)) => out.push_str("null"),
        Some(Kind::BoolValue(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::NumberValue(n)) => write_number(out, *n)?,
        Some(Kind::StringValue(s)) => write_string(out, s),
        Some(Kind::ListValue(l)) => {
            out.push('[');
            for (i, v) in l.values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, v)?;
            }
            out.push(']');
        }
        Some(Kind::StructValue(s)) => {
            out.push('{');
            // BTreeMap: keys in byte order, as Go sorts map keys.
            for (i, (k, v)) in s.fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_json(out, v)?;
            }
            out.push('}');
        }
    }
    Some(())
}

/// Go's float64 format: shortest decimal, with an exponent (`1e+21`,
/// `1e-7`) below 1e-6 and from 1e21.
fn write_number(out: &mut String, n: f64) -> Option<()> {
    if !n.is_finite() {
        return None;
    }
    let abs = n.abs();
    if abs == 0.0 || (1e-6..1e21).contains(&abs) {
        // Rust's Display is the shortest decimal that reads back the same,
        // without an exponent: Go's 'f' format with precision -1.
        let _ = write!(out, "{n}");
    } else {
        let s = format!("{n:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => {
                let _ = write!(out, "{mantissa}e+{exp}");
            }
            _ => out.push_str(&s),
        }
    }
    Some(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functionio_v1::structpb;

    fn observed() -> v1::Resource {
        let resource: BTreeMap<String, Value> = serde_norway::from_str(
            r#"
apiVersion: rds.aws.upbound.io/v1beta1
kind: Instance
metadata:
  name: db-x7k2p
  annotations: {crossplane.io/external-name: db-x7k2p, a.b: dots}
spec:
  forProvider: {engine: postgres, port: 5432}
status:
  atProvider:
    address: db.example.internal
    ratio: 0.5
    tags: {team: "<payments & co>", env: prod}
    endpoints: [{host: a, port: 1}, {host: b, port: 2}]
"#,
        )
        .unwrap();
        v1::Resource {
            resource: Some(structpb::from_yaml(&resource).unwrap()),
            connection_details: [
                ("username".to_owned(), b"admin".to_vec()),
                ("password".to_owned(), b"s3cr3t".to_vec()),
            ]
            .into(),
            ready: 0,
        }
    }

    fn detail(doc: &str) -> BTreeMap<String, Value> {
        serde_norway::from_str(doc).unwrap()
    }

    fn eval(doc: &str) -> Result<Option<(String, String)>, DerivedError> {
        derive(&detail(doc), Some(&observed()))
            .map(|o| o.map(|(k, v)| (k, String::from_utf8(v).unwrap())))
    }

    fn some(k: &str, v: &str) -> Result<Option<(String, String)>, DerivedError> {
        Ok(Some((k.to_owned(), v.to_owned())))
    }

    #[test]
    fn evaluates_each_type_as_crossplane_did() {
        assert_eq!(
            eval("{type: FromValue, name: port, value: '5432'}"),
            some("port", "5432")
        );
        assert_eq!(
            eval("{type: FromConnectionSecretKey, fromConnectionSecretKey: password}"),
            some("password", "s3cr3t")
        );
        assert_eq!(
            eval("{type: FromConnectionSecretKey, name: user, fromConnectionSecretKey: username}"),
            some("user", "admin")
        );
        assert_eq!(
            eval("{type: FromFieldPath, name: host, fromFieldPath: status.atProvider.address}"),
            some("host", "db.example.internal")
        );
        assert_eq!(
            eval("{type: FromFieldPath, name: port, fromFieldPath: spec.forProvider.port}"),
            some("port", "5432")
        );
        assert_eq!(
            eval("{type: FromFieldPath, name: r, fromFieldPath: status.atProvider.ratio}"),
            some("r", "0.5")
        );
        assert_eq!(
            eval("{type: FromFieldPath, name: tags, fromFieldPath: status.atProvider.tags}"),
            some(
                "tags",
                r#"{"env":"prod","team":"\u003cpayments \u0026 co\u003e"}"#
            )
        );
        assert_eq!(
            eval(
                "{type: FromFieldPath, name: h, fromFieldPath: 'status.atProvider.endpoints[1].host'}"
            ),
            some("h", "b")
        );
        assert_eq!(
            eval(
                "{type: FromFieldPath, name: x, fromFieldPath: \"metadata.annotations['crossplane.io/external-name']\"}"
            ),
            some("x", "db-x7k2p")
        );
        assert_eq!(
            eval("{type: FromFieldPath, name: x, fromFieldPath: 'metadata.annotations[a.b]'}"),
            some("x", "dots")
        );
    }

    #[test]
    fn missing_sources_give_nothing() {
        for doc in [
            "{type: FromConnectionSecretKey, fromConnectionSecretKey: nope}",
            "{type: FromFieldPath, name: x, fromFieldPath: status.atProvider.nope}",
            "{type: FromFieldPath, name: x, fromFieldPath: 'status.atProvider.endpoints[7]'}",
            "{type: FromFieldPath, name: x, fromFieldPath: 'spec[0]'}",
            "{type: FromFieldPath, name: x, fromFieldPath: 'spec..forProvider'}",
            "{type: Unknown, name: x}",
            "{name: x, value: v}",
        ] {
            assert_eq!(eval(doc), Ok(None), "{doc}");
        }
        // A resource that does not exist yet only has FromValue details.
        let none = derive(
            &detail("{type: FromConnectionSecretKey, fromConnectionSecretKey: password}"),
            None,
        );
        assert_eq!(none, Ok(None));
        let value = derive(&detail("{type: FromValue, name: a, value: b}"), None);
        assert_eq!(value, Ok(Some(("a".to_owned(), b"b".to_vec()))));
    }

    #[test]
    fn refuses_what_crossplane_refused() {
        assert_eq!(
            eval("{type: FromValue, value: x}"),
            Err(DerivedError::NoName)
        );
        assert_eq!(
            eval("{type: FromFieldPath, fromFieldPath: a}"),
            Err(DerivedError::NoName)
        );
        assert_eq!(
            eval("{type: FromValue, name: a}"),
            Err(DerivedError::NoSource {
                kind: "FromValue",
                field: "value"
            })
        );
        assert!(matches!(
            eval("{type: FromFieldPath, name: a}"),
            Err(DerivedError::NoSource {
                field: "fromFieldPath",
                ..
            })
        ));
        assert!(matches!(
            eval("{type: FromConnectionSecretKey, name: a}"),
            Err(DerivedError::NoSource {
                field: "fromConnectionSecretKey",
                ..
            })
        ));
        assert!(matches!(
            eval("{type: FromValue, name: [a]}"),
            Err(DerivedError::Shape(_))
        ));
    }

    #[test]
    fn parses_paths_as_crossplane_runtime_does() {
        use PathSegment::{Field as F, Index as I};
        let cases: &[(&str, Option<Vec<PathSegment>>)] = &[
            (
                "metadata.name",
                Some(vec![F("metadata".into()), F("name".into())]),
            ),
            (
                "spec.containers[0].name",
                Some(vec![
                    F("spec".into()),
                    F("containers".into()),
                    I(0),
                    F("name".into()),
                ]),
            ),
            (
                "data[.config.yml]",
                Some(vec![F("data".into()), F(".config.yml".into())]),
            ),
            ("a['b/c']", Some(vec![F("a".into()), F("b/c".into())])),
            (
                "spec.items[0][8]",
                Some(vec![F("spec".into()), F("items".into()), I(0), I(8)]),
            ),
            ("[42]", Some(vec![I(42)])),
            ("a[+1]", Some(vec![F("a".into()), F("+1".into())])),
            ("a[0]b", Some(vec![F("a".into()), I(0), F("b".into())])),
            (
                "a[4294967296]",
                Some(vec![F("a".into()), F("4294967296".into())]),
            ),
            ("apiVersion", Some(vec![F("apiVersion".into())])),
            (".metadata.name", None),
            ("metadata..name", None),
            ("metadata.name.", None),
            ("spec.containers[]", None),
            ("spec.containers.[0].name", None),
            ("a[b", None),
            ("a]b", None),
            ("a[[0]]", None),
        ];
        for (path, want) in cases {
            assert_eq!(&parse_path(path), want, "{path}");
        }
    }

    #[test]
    fn writes_numbers_as_go_does() {
        let cases = [
            (5432.0, "5432"),
            (-1.5, "-1.5"),
            (0.0, "0"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e300, "1.5e+300"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
        ];
        for (n, want) in cases {
            let mut out = String::new();
            write_number(&mut out, n).unwrap();
            assert_eq!(out, want, "{n}");
        }
        assert!(write_number(&mut String::new(), f64::NAN).is_none());
        let mut out = String::new();
        write_string(&mut out, "a\"\\\n\u{1}\u{2028}");
        assert_eq!(out, r#""a\"\\\n\u0001\u2028""#);
    }
}
