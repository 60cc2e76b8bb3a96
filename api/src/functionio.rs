//! FunctionIO: the YAML document a composition function reads on stdin and
//! writes on stdout (Crossplane `apiextensions.crossplane.io/v1alpha1`).
//!
//! The types follow Crossplane's Go types field for field. Unknown fields are
//! ignored, as the composition controller ignores them; embedded resources stay
//! free-form YAML. [`validate`] is used on the caller's input before any work
//! starts and on the function's output before it is returned.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_norway::Value;

use crate::yaml::{
    DocumentError, NotJson, Quoted, TaggedValues, YamlError, find_not_json, parse_mapping,
};

/// The `apiVersion` a FunctionIO may carry.
pub const API_VERSION: &str = "apiextensions.crossplane.io/v1alpha1";
/// The `kind` a FunctionIO may carry.
pub const KIND: &str = "FunctionIO";

/// A FunctionIO document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionIo {
    /// Optional; the composition controller omits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Optional; the composition controller omits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function's configuration: any object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<BTreeMap<String, Value>>,
    /// The observed state of the composite resource and its composed resources.
    #[serde(default)]
    pub observed: Observed,
    /// The desired state, which functions in the pipeline amend.
    #[serde(default)]
    pub desired: Desired,
    /// Results reported by functions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<FnResult>,
}

/// Observed state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// The observed composite resource.
    #[serde(default)]
    pub composite: Composite,
    /// The observed composed resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ObservedResource>,
}

/// Desired state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Desired {
    /// The desired composite resource.
    #[serde(default)]
    pub composite: Composite,
    /// The desired composed resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<DesiredResource>,
}

/// A composite resource and its connection details.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Composite {
    /// The resource: any object.
    #[serde(default)]
    pub resource: BTreeMap<String, Value>,
    /// Connection details.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connection_details: Vec<ConnectionDetail>,
}

/// An observed composed resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedResource {
    /// The name of the resource within the composition.
    pub name: String,
    /// The resource: any object.
    #[serde(default)]
    pub resource: BTreeMap<String, Value>,
    /// Connection details.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connection_details: Vec<ConnectionDetail>,
}

/// A desired composed resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DesiredResource {
    /// The name of the resource within the composition.
    pub name: String,
    /// The resource: any object.
    #[serde(default)]
    pub resource: BTreeMap<String, Value>,
    /// Connection details: free-form objects (Crossplane's derived details).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connection_details: Vec<BTreeMap<String, Value>>,
    /// Readiness checks: free-form objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_checks: Vec<BTreeMap<String, Value>>,
}

/// An explicit connection detail.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionDetail {
    /// The key.
    pub name: String,
    /// The value.
    #[serde(default)]
    pub value: String,
}

/// A result reported by a function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FnResult {
    /// How serious the result is.
    pub severity: Severity,
    /// What happened.
    #[serde(default)]
    pub message: String,
}

/// Severity of a [`FnResult`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Severity {
    /// The composition fails.
    Fatal,
    /// A warning event is emitted.
    Warning,
    /// A normal event is emitted.
    Normal,
}

/// Why a document is not a FunctionIO.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The document is empty.
    #[error("document is empty")]
    Empty,
    /// The document is not a YAML mapping at the top level.
    #[error("document is not a YAML mapping but a {0}")]
    NotAMapping(&'static str),
    /// The document is not valid YAML, or a field has the wrong shape.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// `apiVersion` or `kind` is present with a wrong value.
    #[error("{field} is {found}, expected {expected:?}")]
    WrongType {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// The value found, quoted and cut short.
        found: Quoted,
        /// The only value allowed.
        expected: &'static str,
    },
    /// A key or value carries a YAML tag that is not a core one, or a key
    /// is a collection.
    #[error(
        "{0}, which FunctionIO cannot carry (it is JSON to Crossplane: keys are scalars, and only core tags such as !!str are allowed)"
    )]
    NotJson(NotJson),
}

impl From<DocumentError> for Error {
    fn from(err: DocumentError) -> Self {
        match err {
            DocumentError::Empty => Self::Empty,
            DocumentError::Yaml(err) => Self::Yaml(err),
            DocumentError::NotAMapping(kind) => Self::NotAMapping(kind),
        }
    }
}

/// Parses and checks a FunctionIO document.
///
/// The document must be a YAML mapping whose known fields have the shapes of
/// Crossplane's FunctionIO; unknown fields are ignored. `apiVersion` and `kind`
/// are optional but must be right when present. No key or value, anywhere
/// in the document, may carry a YAML tag other than a core one (`!!str`,
/// `!!int`, ...), and no key may be a mapping or a sequence: see below.
pub fn validate(doc: &[u8]) -> Result<FunctionIo, Error> {
    let mapping = parse_mapping(doc)?;
    // Local tags (`!vault x`, `!team: v`) are refused anywhere, keys and
    // values alike. A FunctionIO is JSON to Crossplane: the composition
    // controller reads it with sigs.k8s.io/yaml, which converts YAML to JSON
    // and drops an unknown tag (a tagged scalar becomes a string: `!n 3` is
    // "3"), and Kubernetes objects have no tags anyway. So a tag can never
    // mean to Crossplane what it says, and fnrun would pass it on only to
    // see it read differently, or, as a tagged key, fail to write it at all
    // (serde_norway cannot emit one). kpt is alike: kyaml keeps tags in its
    // node tree, but the objects it applies are JSON. The v1 mapping refuses
    // tagged values for the same reason (`functionio_v1`); core tags are
    // resolved by the parser and are fine. A key that is a mapping or a
    // sequence (`? [a]: b`) is alike: JSON has none, and serde_norway reads
    // it but cannot write it back (the second fuzz finding).
    if let Some(found) = find_not_json(&mapping, TaggedValues::Refused) {
        return Err(Error::NotJson(found));
    }
    let io: FunctionIo =
        serde_norway::from_value(Value::Mapping(mapping)).map_err(YamlError::from)?;
    check_type_meta("apiVersion", io.api_version.as_deref(), API_VERSION)?;
    check_type_meta("kind", io.kind.as_deref(), KIND)?;
    Ok(io)
}

fn check_type_meta(
    field: &'static str,
    found: Option<&str>,
    expected: &'static str,
) -> Result<(), Error> {
    match found {
        Some(found) if found != expected => Err(Error::WrongType {
            field,
            found: Quoted::new(found),
            expected,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../testdata/functionio.yaml");

    #[test]
    fn accepts_what_the_composition_controller_sends() {
        let io = validate(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(io.desired.resources.len(), 1);
        assert_eq!(io.desired.resources[0].name, "bucket");
        assert_eq!(io.results[0].severity, Severity::Normal);
        assert!(io.api_version.is_none());
    }

    #[test]
    fn accepts_type_meta_and_unknown_fields() {
        let doc = "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nextra: 1\nobserved: {composite: {resource: {}, future: true}}\n";
        validate(doc.as_bytes()).unwrap();
        validate(b"{}").unwrap();
    }

    #[test]
    fn refuses_what_is_not_a_functionio() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("  \n", "empty"),
            ("hello", "not a YAML mapping but a string"),
            ("- a\n- b\n", "not a YAML mapping but a sequence"),
            ("42", "not a YAML mapping but a number"),
            ("~", "not a YAML mapping but a null"),
            ("a: [1, 2", "did not find expected"),
            (
                "results: [{severity: Bad, message: x}]",
                "unknown variant `Bad`",
            ),
            ("results: {}", "expected a sequence"),
            (
                "desired: {resources: [{resource: {}}]}",
                "missing field `name`",
            ),
            ("observed: []", "expected struct Observed"),
            ("kind: Pod", "kind is \"Pod\""),
            ("apiVersion: v1", "apiVersion is \"v1\""),
            (
                "config: {labels: {!team x: y}}",
                "at config.labels: a mapping key has the YAML tag \"!team\"",
            ),
            (
                "desired: {composite: {resource: {status: {x: !vault secret/db}}}}",
                "at desired.composite.resource.status.x: the value has the YAML tag \"!vault\"",
            ),
            (
                "observed: {resources: [{name: a, resource: {spec: [1, !<!x> {}]}}]}",
                "at observed.resources[0].resource.spec[1]: the value has the YAML tag \"!x\"",
            ),
            (
                "extra: {\"my key\": !t 1}",
                "at extra[\"my key\"]: the value",
            ),
            (
                "config:\n  labels:\n    ? {a: b}\n    : c\n",
                "at config.labels: a mapping key is a mapping",
            ),
            (
                "config: {? [a, b] : c}",
                "at config: a mapping key is a sequence",
            ),
        ];
        for (doc, want) in cases {
            let err = validate(doc.as_bytes()).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{doc:?}: {err:?} does not contain {want:?}"
            );
        }
    }

    #[test]
    fn refuses_alias_bombs() {
        let mut doc = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..12 {
            let prev = if i == 0 {
                "a".to_owned()
            } else {
                format!("a{}", i - 1)
            };
            doc.push_str(&format!(
                "a{i}: &a{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        doc.push_str("config: {x: *a11}\n");
        assert!(validate(doc.as_bytes()).is_err());
    }

    #[test]
    fn errors_quote_at_most_a_few_hundred_bytes() {
        let huge = "x".repeat(1 << 20);
        for doc in [
            format!("kind: {huge}"),
            format!("results: \"{huge}\""),
            format!("observed: {{composite: \"{huge}\"}}"),
        ] {
            let err = validate(doc.as_bytes()).unwrap_err().to_string();
            assert!(err.len() < 2048, "{} bytes: {}", err.len(), &err[..100]);
        }
    }

    #[test]
    fn refuses_local_tags_but_reads_core_ones() {
        // The first fuzz finding: a tagged key, which serde_norway reads
        // but cannot write back.
        let doc = "config:\n  labels:\n    !team: payments:\n";
        let err = validate(doc.as_bytes()).unwrap_err().to_string();
        assert!(
            err.starts_with("at config.labels: a mapping key has the YAML tag \"!team:\""),
            "{err}"
        );
        let huge = format!("config: {{{}: !t x}}", "k".repeat(1 << 20));
        let err = validate(huge.as_bytes()).unwrap_err().to_string();
        assert!(err.len() < 1024, "{} bytes", err.len());
        let io = validate(b"config: {s: !!str 3, i: !!int '5', m: !!map {a: b}}").unwrap();
        let config = io.config.unwrap();
        assert_eq!(config["s"], Value::from("3"));
        assert_eq!(config["i"], Value::from(5));
    }

    #[test]
    fn round_trips() {
        let io = validate(EXAMPLE.as_bytes()).unwrap();
        let out = serde_norway::to_string(&io).unwrap();
        assert_eq!(validate(out.as_bytes()).unwrap(), io);
    }
}
