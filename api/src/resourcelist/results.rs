//! A ResourceList's `results`: what a KRM function reports, in the shape of
//! kpt's `fnresult/v1` ResultItem (kyaml's `framework.Result` with field
//! values as strings).
//!
//! Read as kpt reads them: `results` is a list of items, or (older Go SDKs) a
//! mapping whose `items` is that list; a `resourceRef` may carry its name and
//! namespace under `metadata`, and a `field` its proposed value as
//! `suggestedValue`. An item without severity is `info`.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_norway::{Mapping, Value};

use super::fields::{ShapeError, optional_str, shape};
use crate::yaml::{Quoted, kind_name, truncate};

/// One result reported by a function.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultItem {
    /// What happened, for people.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// How serious it is.
    pub severity: Severity,
    /// The resource it is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_ref: Option<ResourceRef>,
    /// The field of that resource it is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<Field>,
    /// The file holding that resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<File>,
    /// Free-form labels set by tools.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Severity of a [`ResultItem`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The function failed.
    Error,
    /// Something to look at.
    Warning,
    /// For information; the default.
    #[default]
    Info,
}

impl Severity {
    /// The name used in YAML: `error`, `warning` or `info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
            Self::Info => "info",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resource a result is about. Empty fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    /// Its `apiVersion`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Its `kind`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Its `metadata.name`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its `metadata.namespace`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The field a result is about. Values are strings as kpt keeps them: a
/// scalar's text, or the YAML of anything else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Field {
    /// The field's path, such as `spec.replicas`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Its current value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_value: Option<String>,
    /// The value the function proposes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposed_value: Option<String>,
}

/// The file holding the resource a result is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct File {
    /// The file's path, relative to the package.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The resource's index in that file.
    #[serde(skip_serializing_if = "is_zero")]
    pub index: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// kpt's one-line form: `[severity] apiVersion/kind/namespace/name path: message`,
/// each part only when present.
impl fmt::Display for ResultItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.severity)?;
        if let Some(r) = &self.resource_ref {
            let parts: Vec<&str> = [&r.api_version, &r.kind, &r.namespace, &r.name]
                .into_iter()
                .map(String::as_str)
                .filter(|s| !s.is_empty())
                .collect();
            if !parts.is_empty() {
                write!(f, " {}", parts.join("/"))?;
            }
        }
        if let Some(field) = &self.field {
            write!(f, " {}", field.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The results one per line in kpt's form, cut to at most `max` bytes: for a
/// gRPC status or a log line, which must stay small.
pub fn summary(results: &[ResultItem], max: usize) -> String {
    let mut out = String::new();
    for (i, result) in results.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&result.to_string());
        if out.len() > max {
            break;
        }
    }
    truncate(&out, max).into_owned()
}

/// Why a result cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    /// The result is not a mapping.
    #[error("result is not a mapping but a {0}")]
    NotAMapping(&'static str),
    /// A field has the wrong shape.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The severity is not `error`, `warning` or `info`.
    #[error("severity is {0}, expected \"error\", \"warning\" or \"info\"")]
    Severity(Quoted),
}

/// Why a ResourceList's `results` cannot be read (the ResourceList's
/// [`super::Error`] says it as its `Shape` and `Result` variants).
#[derive(Debug)]
pub(super) enum ResultsError {
    /// `results` is not a sequence.
    Shape(ShapeError),
    /// A result has the wrong shape.
    Result { index: usize, reason: ResultError },
}

/// Reads a ResourceList's `results`.
pub(super) fn parse(results: &Value) -> Result<Vec<ResultItem>, ResultsError> {
    let items = match results {
        Value::Null => return Ok(Vec::new()),
        Value::Sequence(items) => items,
        // Older Go SDKs wrap the list: `results: {items: [...]}`.
        Value::Mapping(wrapper) => match wrapper.get("items") {
            Some(Value::Sequence(items)) => items,
            Some(Value::Null) => return Ok(Vec::new()),
            _ => return Err(ResultsError::Shape(shape("results", results, "a sequence"))),
        },
        other => return Err(ResultsError::Shape(shape("results", other, "a sequence"))),
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse_item(item).map_err(|reason| ResultsError::Result { index, reason })
        })
        .collect()
}

fn parse_item(item: &Value) -> Result<ResultItem, ResultError> {
    let Value::Mapping(item) = item else {
        return Err(ResultError::NotAMapping(kind_name(item)));
    };
    let severity = match optional_str(item, "severity", "severity")? {
        None | Some("") | Some("info") => Severity::Info,
        Some("warning") => Severity::Warning,
        Some("error") => Severity::Error,
        Some(other) => return Err(ResultError::Severity(Quoted::new(other))),
    };
    Ok(ResultItem {
        message: optional_str(item, "message", "message")?
            .unwrap_or_default()
            .to_owned(),
        severity,
        resource_ref: mapping(item, "resourceRef")?
            .map(parse_resource_ref)
            .transpose()?,
        field: mapping(item, "field")?.map(parse_field).transpose()?,
        file: mapping(item, "file")?.map(parse_file).transpose()?,
        tags: mapping(item, "tags")?
            .map(parse_tags)
            .transpose()?
            .unwrap_or_default(),
    })
}

/// A mapping field that may be absent or null.
fn mapping<'a>(item: &'a Mapping, key: &'static str) -> Result<Option<&'a Mapping>, ShapeError> {
    match item.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Mapping(m)) => Ok(Some(m)),
        Some(other) => Err(shape(key, other, "a mapping")),
    }
}

fn string(m: &Mapping, key: &str, field: &'static str) -> Result<String, ShapeError> {
    Ok(optional_str(m, key, field)?.unwrap_or_default().to_owned())
}

fn parse_resource_ref(r: &Mapping) -> Result<ResourceRef, ShapeError> {
    let mut out = ResourceRef {
        api_version: string(r, "apiVersion", "resourceRef.apiVersion")?,
        kind: string(r, "kind", "resourceRef.kind")?,
        name: string(r, "name", "resourceRef.name")?,
        namespace: string(r, "namespace", "resourceRef.namespace")?,
    };
    // Older Go SDKs put name and namespace under metadata; kpt lifts them.
    if let Some(metadata) = mapping(r, "metadata")? {
        if let Some(name) = optional_str(metadata, "name", "resourceRef.metadata.name")? {
            out.name = name.trim().to_owned();
        }
        match optional_str(metadata, "namespace", "resourceRef.metadata.namespace")? {
            Some(ns) if !ns.trim().is_empty() && ns.trim() != "''" => {
                out.namespace = ns.trim().to_owned();
            }
            _ => {}
        }
    }
    Ok(out)
}

fn parse_field(f: &Mapping) -> Result<Field, ShapeError> {
    Ok(Field {
        path: string(f, "path", "field.path")?.trim().to_owned(),
        current_value: f.get("currentValue").map(value_text),
        // Older SDKs call the proposed value `suggestedValue`; kpt lifts it.
        proposed_value: f
            .get("suggestedValue")
            .or_else(|| f.get("proposedValue"))
            .map(value_text),
    })
}

/// A field value as kpt keeps it: a scalar's text, or the YAML of a
/// collection, trimmed.
fn value_text(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_owned(),
        other => serde_norway::to_string(other)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
    }
}

fn parse_file(f: &Mapping) -> Result<File, ShapeError> {
    let index = match f.get("index") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64().unwrap_or_default(),
        Some(other) => return Err(shape("file.index", other, "an integer")),
    };
    Ok(File {
        path: string(f, "path", "file.path")?,
        index,
    })
}

fn parse_tags(tags: &Mapping) -> Result<BTreeMap<String, String>, ShapeError> {
    tags.iter()
        .map(|(k, v)| {
            let Value::String(k) = k else {
                return Err(shape("tags key", k, "a string"));
            };
            match v {
                Value::String(_) | Value::Bool(_) | Value::Number(_) => {
                    Ok((k.clone(), value_text(v)))
                }
                other => Err(shape("tags value", other, "a string")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resourcelist::Error;

    fn parse_str(results: &str) -> Result<Vec<ResultItem>, Error> {
        Ok(parse(&serde_norway::from_str(results).unwrap())?)
    }

    #[test]
    fn reads_every_field() {
        let results = parse_str(
            r#"
- message: replicas must be at least 2
  severity: error
  resourceRef: {apiVersion: apps/v1, kind: Deployment, name: web, namespace: example}
  field: {path: spec.replicas, currentValue: 1, proposedValue: {min: 2}}
  file: {path: deployment.yaml, index: 1}
  tags: {rule: min-replicas, level: 3}
"#,
        )
        .unwrap();
        assert_eq!(
            results,
            [ResultItem {
                message: "replicas must be at least 2".into(),
                severity: Severity::Error,
                resource_ref: Some(ResourceRef {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: "web".into(),
                    namespace: "example".into(),
                }),
                field: Some(Field {
                    path: "spec.replicas".into(),
                    current_value: Some("1".into()),
                    proposed_value: Some("min: 2".into()),
                }),
                file: Some(File {
                    path: "deployment.yaml".into(),
                    index: 1,
                }),
                tags: [
                    ("level".into(), "3".into()),
                    ("rule".into(), "min-replicas".into())
                ]
                .into(),
            }]
        );
        assert_eq!(
            results[0].to_string(),
            "[error] apps/v1/Deployment/example/web spec.replicas: replicas must be at least 2"
        );
    }

    #[test]
    fn reads_legacy_shapes_as_kpt_does() {
        let results = parse_str(
            r#"
items:
- message: m
  resourceRef: {apiVersion: v1, kind: ConfigMap, metadata: {name: cm, namespace: "''"}}
  field: {path: data.a, suggestedValue: b}
"#,
        )
        .unwrap();
        let r = &results[0];
        assert_eq!(r.severity, Severity::Info);
        let rr = r.resource_ref.as_ref().unwrap();
        assert_eq!((rr.name.as_str(), rr.namespace.as_str()), ("cm", ""));
        assert_eq!(
            r.field.as_ref().unwrap().proposed_value.as_deref(),
            Some("b")
        );
        assert_eq!(r.to_string(), "[info] v1/ConfigMap/cm data.a: m");
        assert!(parse_str("~").unwrap().is_empty());
        assert!(parse_str("{items: ~}").unwrap().is_empty());
    }

    #[test]
    fn refuses_malformed_results() {
        let cases = [
            ("results", "results is a string, expected a sequence"),
            ("{a: 1}", "results is a mapping, expected a sequence"),
            ("[x]", "results[0]: result is not a mapping but a string"),
            ("[{message: [a]}]", "results[0]: message is a sequence"),
            ("[{severity: Error}]", "results[0]: severity is \"Error\""),
            (
                "[{resourceRef: a}]",
                "resourceRef is a string, expected a mapping",
            ),
            (
                "[{resourceRef: {name: [a]}}]",
                "resourceRef.name is a sequence",
            ),
            (
                "[{file: {index: a}}]",
                "file.index is a string, expected an integer",
            ),
            ("[{tags: {a: [b]}}]", "tags value is a sequence"),
        ];
        for (doc, want) in cases {
            let err = parse_str(doc).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{doc:?}: {err:?} does not contain {want:?}"
            );
        }
    }

    #[test]
    fn summary_is_bounded() {
        let many = vec![
            ResultItem {
                message: "x".repeat(1000),
                severity: Severity::Error,
                ..ResultItem::default()
            };
            1000
        ];
        let s = summary(&many, 4096);
        assert!(s.len() <= 4096 + '…'.len_utf8(), "{}", s.len());
        assert!(s.starts_with("[error]: xxx"));
        let two = &many[..2];
        assert_eq!(summary(two, usize::MAX).lines().count(), 2);
    }

    #[test]
    fn serialises_as_kpt_does() {
        let item = ResultItem {
            message: "m".into(),
            severity: Severity::Warning,
            resource_ref: Some(ResourceRef {
                kind: "Pod".into(),
                name: "p".into(),
                ..ResourceRef::default()
            }),
            file: Some(File {
                path: "p.yaml".into(),
                index: 0,
            }),
            ..ResultItem::default()
        };
        assert_eq!(
            serde_norway::to_string(&item).unwrap(),
            "message: m\nseverity: warning\nresourceRef:\n  kind: Pod\n  name: p\nfile:\n  path: p.yaml\n"
        );
    }
}
