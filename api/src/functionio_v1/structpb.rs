//! `google.protobuf.Struct` (JSON as protobuf) to YAML values and back.
//!
//! Numbers are doubles in a Struct, as in JSON: a whole number of at most
//! 2^53 becomes a YAML integer (`replicas: 3`, not `3.0`), anything else a
//! YAML float. Back from YAML, mapping keys that are numbers, booleans or
//! null become their text, as `sigs.k8s.io/yaml` (which read FunctionIO in
//! Crossplane v1.13) makes them; what JSON cannot hold is refused: infinite
//! or NaN numbers, tagged values, mappings or sequences as keys.

use std::collections::BTreeMap;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct};
use serde_norway::{Mapping, Number, Value};

use crate::yaml::{Path, Segment};

/// The largest integer a double holds exactly.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// A Struct as a YAML mapping.
pub(super) fn to_yaml(s: &Struct) -> BTreeMap<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_to_yaml(v)))
        .collect()
}

fn value_to_yaml(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => number_to_yaml(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Sequence(l.values.iter().map(value_to_yaml).collect()),
        Some(Kind::StructValue(s)) => Value::Mapping(
            s.fields
                .iter()
                .map(|(k, v)| (Value::String(k.clone()), value_to_yaml(v)))
                .collect(),
        ),
    }
}

fn number_to_yaml(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() <= MAX_EXACT {
        // Exact: |n| <= 2^53 fits an i64 and has no fraction.
        #[allow(clippy::cast_possible_truncation)]
        Value::Number(Number::from(n as i64))
    } else {
        Value::Number(Number::from(n))
    }
}

/// Checks that `s` holds only what JSON can: no NaN or infinite number
/// (a binary Struct can carry one; JSON, and so Crossplane, cannot).
/// Recursion is bounded by prost's decoding limit (100 levels).
pub(super) fn check_json(s: &Struct) -> Result<(), ValueError> {
    for (k, v) in &s.fields {
        check_value(v).map_err(|e| e.within(Segment::Key(k.clone())))?;
    }
    Ok(())
}

fn check_value(v: &prost_types::Value) -> Result<(), ValueError> {
    match &v.kind {
        Some(Kind::NumberValue(n)) if !n.is_finite() => Err(ValueError::new(Reason::NotFinite)),
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_value(v).map_err(|e| e.within(Segment::Index(i)))),
        Some(Kind::StructValue(s)) => check_json(s),
        _ => Ok(()),
    }
}

/// A YAML mapping as a Struct.
pub(super) fn from_yaml(m: &BTreeMap<String, Value>) -> Result<Struct, ValueError> {
    let fields = m
        .iter()
        .map(|(k, v)| {
            value_from_yaml(v)
                .map(|v| (k.clone(), v))
                .map_err(|e| e.within(Segment::Key(k.clone())))
        })
        .collect::<Result<_, _>>()?;
    Ok(Struct { fields })
}

fn value_from_yaml(v: &Value) -> Result<prost_types::Value, ValueError> {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.is_finite() => Kind::NumberValue(f),
            _ => return Err(ValueError::new(Reason::NotFinite)),
        },
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Sequence(items) => Kind::ListValue(ListValue {
            values: items
                .iter()
                .enumerate()
                .map(|(i, v)| value_from_yaml(v).map_err(|e| e.within(Segment::Index(i))))
                .collect::<Result<_, _>>()?,
        }),
        Value::Mapping(m) => Kind::StructValue(mapping_from_yaml(m)?),
        Value::Tagged(_) => return Err(ValueError::new(Reason::Tagged)),
    };
    Ok(prost_types::Value { kind: Some(kind) })
}

fn mapping_from_yaml(m: &Mapping) -> Result<Struct, ValueError> {
    let mut fields = BTreeMap::new();
    for (k, v) in m {
        let key = match k {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".to_owned(),
            _ => return Err(ValueError::new(Reason::ComplexKey)),
        };
        let value = value_from_yaml(v).map_err(|e| e.within(Segment::Key(key.clone())))?;
        fields.insert(key, value);
    }
    Ok(Struct { fields })
}

/// A value of a FunctionIO that a protobuf Struct cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", Path(.path))]
pub struct ValueError {
    /// Where, outermost segment first.
    path: Vec<Segment>,
    reason: Reason,
}

impl ValueError {
    fn new(reason: Reason) -> Self {
        Self {
            path: Vec::new(),
            reason,
        }
    }

    /// The same error one level further out, inside `segment`.
    pub(super) fn within(mut self, segment: Segment) -> Self {
        self.path.insert(0, segment);
        self
    }
}

/// What JSON cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Reason {
    #[error("number is not finite (JSON has no NaN or infinity)")]
    NotFinite,
    #[error("tagged YAML values have no JSON form")]
    Tagged,
    #[error("a mapping key is a mapping or a sequence, which JSON keys cannot be")]
    ComplexKey,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> BTreeMap<String, Value> {
        serde_norway::from_str(s).unwrap()
    }

    fn yaml_value(s: &str) -> Value {
        serde_norway::from_str(s).unwrap()
    }

    #[test]
    fn round_trips_json_values() {
        let doc = yaml(
            r#"
apiVersion: example.org/v1
kind: XThing
spec:
  replicas: 3
  ratio: 0.25
  negative: -7
  big: 1.0e300
  enabled: false
  nothing: null
  list: [1, "two", {three: 3}, [4]]
  quoted: "3"
"#,
        );
        let s = from_yaml(&doc).unwrap();
        let spec = match &s.fields["spec"].kind {
            Some(Kind::StructValue(spec)) => spec,
            other => panic!("{other:?}"),
        };
        assert_eq!(spec.fields["replicas"].kind, Some(Kind::NumberValue(3.0)));
        assert_eq!(
            spec.fields["quoted"].kind,
            Some(Kind::StringValue("3".into()))
        );
        assert_eq!(to_yaml(&s), doc);
        // Whole numbers come back as integers, not floats.
        let text = serde_norway::to_string(&to_yaml(&s)).unwrap();
        assert!(text.contains("replicas: 3\n"), "{text}");
        assert!(text.contains("negative: -7\n"), "{text}");
    }

    #[test]
    fn numbers_beyond_doubles_stay_floats() {
        let s = Struct {
            fields: [(
                "n".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::NumberValue(1e17)),
                },
            )]
            .into(),
        };
        assert!(matches!(&to_yaml(&s)["n"], Value::Number(n) if n.is_f64()));
        let s = Struct {
            fields: [("n".to_owned(), prost_types::Value { kind: None })].into(),
        };
        assert_eq!(to_yaml(&s)["n"], Value::Null);
    }

    #[test]
    fn stringifies_scalar_keys() {
        let s = from_yaml(&yaml("m: {1: a, true: b, ~: c}")).unwrap();
        let Some(Kind::StructValue(m)) = &s.fields["m"].kind else {
            panic!()
        };
        let keys: Vec<&str> = m.fields.keys().map(String::as_str).collect();
        assert_eq!(keys, ["1", "null", "true"]);
    }

    #[test]
    fn refuses_what_json_cannot_hold() {
        let cases = [
            ("spec: {ratio: .nan}", "spec.ratio: number is not finite"),
            (
                "spec: {list: [1, .inf]}",
                "spec.list[1]: number is not finite",
            ),
            ("spec: {v: !custom x}", "spec.v: tagged YAML values"),
            (
                "spec: {? [a] : b}",
                "spec: a mapping key is a mapping or a sequence",
            ),
            ("\"my key\": {a: .nan}", "[\"my key\"].a: number"),
        ];
        for (doc, want) in cases {
            let err = from_yaml(&yaml(doc)).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{doc:?}: {err:?} does not contain {want:?}"
            );
        }
        let nan = Struct {
            fields: [(
                "spec".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::ListValue(ListValue {
                        values: vec![
                            prost_types::Value {
                                kind: Some(Kind::NumberValue(1.0)),
                            },
                            prost_types::Value {
                                kind: Some(Kind::NumberValue(f64::NEG_INFINITY)),
                            },
                        ],
                    })),
                },
            )]
            .into(),
        };
        let err = check_json(&nan).unwrap_err().to_string();
        assert_eq!(
            err,
            "spec[1]: number is not finite (JSON has no NaN or infinity)"
        );
        check_json(&from_yaml(&yaml("a: {b: [1, 2.5, x, null, true]}")).unwrap()).unwrap();
        let long_key = BTreeMap::from([("k".repeat(100_000), yaml_value("{a: .nan}"))]);
        let err = from_yaml(&long_key).unwrap_err().to_string();
        assert!(err.len() < 512, "{}", err.len());
    }
}
