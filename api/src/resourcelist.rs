//! ResourceList: the YAML document a KRM function (kpt, kustomize, Porch)
//! reads on stdin and writes on stdout.
//!
//! ```yaml
//! apiVersion: config.kubernetes.io/v1   # v1beta1 is accepted too
//! kind: ResourceList
//! items: [...]          # required: KRM objects (apiVersion, kind, metadata.name)
//! functionConfig: {...} # input: the function's configuration, optional
//! results: [...]        # output: what the function reports
//! ```
//!
//! [`validate_input`] checks what is given to a function before any work
//! starts; [`validate_output`] checks what a function returned and parses its
//! results, so the caller can print them ([`ResultItem`]'s `Display` is kpt's
//! format) and decide the exit code ([`ResourceList::failed`]). Items are
//! checked as kpt checks them: every item needs `apiVersion`, `kind` and
//! `metadata.name`, except Kustomization files. Unknown fields are kept.
//!
//! [`with_function_config`] replaces a ResourceList's `functionConfig`, and
//! [`function_config`] reads one given on its own (kpt's `--fn-config`);
//! [`kpt`] builds the ConfigMap `kpt fn eval -- key=value` passes and kpt's
//! `results.yaml`. [`is_resource_list`] tells a ResourceList from another
//! document by its `kind`.

mod fields;
pub mod kpt;
mod results;

use serde_norway::{Mapping, Value};

pub use self::fields::ShapeError;
use self::fields::{optional_str, shape};
use self::results::ResultsError;
pub use self::results::{Field, File, ResourceRef, ResultError, ResultItem, Severity, summary};
use crate::yaml::{
    DocumentError, NotJson, Quoted, TaggedValues, YamlError, find_not_json, kind_name,
    parse_mapping, parse_mappings,
};

/// The `apiVersion` fnrun writes.
pub const API_VERSION: &str = "config.kubernetes.io/v1";
/// Every `apiVersion` accepted.
pub const API_VERSIONS: [&str; 2] = [API_VERSION, "config.kubernetes.io/v1beta1"];
/// The `kind` of a ResourceList.
pub const KIND: &str = "ResourceList";

/// A checked ResourceList.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceList {
    /// One of [`API_VERSIONS`].
    pub api_version: String,
    /// The resources, each a KRM object (or a Kustomization).
    pub items: Vec<Mapping>,
    /// The function's configuration, if any.
    pub function_config: Option<Mapping>,
    /// The function's results, if any.
    pub results: Vec<ResultItem>,
}

impl ResourceList {
    /// A ResourceList of `items` with the current `apiVersion`.
    pub fn new(items: Vec<Mapping>) -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            items,
            function_config: None,
            results: Vec::new(),
        }
    }

    /// Whether a result has severity `error`: the function failed.
    pub fn failed(&self) -> bool {
        self.results.iter().any(|r| r.severity == Severity::Error)
    }

    /// The document as YAML: `apiVersion`, `kind`, `items`, then
    /// `functionConfig` and `results` when present.
    pub fn to_yaml(&self) -> Result<String, YamlError> {
        let mut doc = Mapping::new();
        doc.insert("apiVersion".into(), self.api_version.clone().into());
        doc.insert("kind".into(), KIND.into());
        doc.insert(
            "items".into(),
            Value::Sequence(self.items.iter().cloned().map(Value::Mapping).collect()),
        );
        if let Some(config) = &self.function_config {
            doc.insert("functionConfig".into(), Value::Mapping(config.clone()));
        }
        if !self.results.is_empty() {
            doc.insert("results".into(), serde_norway::to_value(&self.results)?);
        }
        Ok(serde_norway::to_string(&doc)?)
    }
}

/// Why a document is not a ResourceList.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The document is empty.
    #[error("document is empty")]
    Empty,
    /// The document is not YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// The document is not a YAML mapping at the top level.
    #[error("document is not a YAML mapping but a {0}")]
    NotAMapping(&'static str),
    /// A required top-level field is missing.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// A top-level field has the wrong shape.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// `apiVersion` or `kind` has a wrong value.
    #[error("{field} is {found}, expected {expected}")]
    WrongType {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// The value found, quoted and cut short.
        found: Quoted,
        /// What is allowed.
        expected: &'static str,
    },
    /// A mapping key, anywhere in the document, is a mapping or a sequence,
    /// or carries a local YAML tag.
    #[error(
        "{0}, which a ResourceList cannot carry (its resources are JSON to Kubernetes: keys are untagged scalars)"
    )]
    NotJson(NotJson),
    /// An item is not a KRM object.
    #[error("items[{index}]: {reason}")]
    Item {
        /// Its index in `items`.
        index: usize,
        /// What is wrong with it.
        reason: ItemError,
    },
    /// A result has the wrong shape.
    #[error("results[{index}]: {reason}")]
    Result {
        /// Its index in `results`.
        index: usize,
        /// What is wrong with it.
        reason: ResultError,
    },
    /// A function configuration given on its own is not a KRM object.
    #[error("functionConfig: {0}")]
    FunctionConfig(ItemError),
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

impl From<ResultsError> for Error {
    fn from(err: ResultsError) -> Self {
        match err {
            ResultsError::Shape(err) => Self::Shape(err),
            ResultsError::Result { index, reason } => Self::Result { index, reason },
        }
    }
}

/// Why an item is not a KRM object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// The item is not a mapping.
    #[error("item is not a mapping but a {0}")]
    NotAMapping(&'static str),
    /// `apiVersion`, `kind` or `metadata.name` is missing or empty.
    #[error("resource must have `{0}`")]
    Missing(&'static str),
    /// A field has the wrong shape.
    #[error(transparent)]
    Shape(#[from] ShapeError),
}

/// Which side of a function a document is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Input,
    Output,
}

/// Parses and checks a ResourceList given to a function.
///
/// Refused: anything that is not a YAML mapping; a `kind` other than
/// `ResourceList`; an `apiVersion` other than [`API_VERSIONS`]; `items`
/// missing or not a sequence; an item that is not a mapping with `apiVersion`,
/// `kind` and `metadata.name` (Kustomizations excepted, as kpt does); a
/// `functionConfig` that is not a mapping; malformed `results`.
pub fn validate_input(doc: &[u8]) -> Result<ResourceList, Error> {
    parse(parse_mapping(doc)?, Side::Input)
}

/// Parses and checks a ResourceList a function returned, with its results.
///
/// As [`validate_input`], except that `items: null` is read as no items (a
/// function that removed every resource may write it so).
pub fn validate_output(doc: &[u8]) -> Result<ResourceList, Error> {
    parse(parse_mapping(doc)?, Side::Output)
}

/// Whether `doc` says it is a ResourceList: a YAML mapping whose `kind` is
/// `ResourceList`, whatever else it holds (it may still be refused by
/// [`validate_input`]). A document without the word is not parsed at all (so
/// a FunctionIO is not parsed twice); one that spells it with escapes in a
/// quoted scalar is not recognised.
pub fn is_resource_list(doc: &[u8]) -> bool {
    doc.windows(KIND.len()).any(|w| w == KIND.as_bytes())
        && parse_mapping(doc).is_ok_and(|m| m.get("kind").and_then(Value::as_str) == Some(KIND))
}

/// Why a stream of YAML documents is not a list of KRM resources.
///
/// Every variant names the document by its index in the stream, counted
/// from 0 among all documents, empty ones included.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A document is not YAML, or not a mapping.
    #[error("document {index}: {reason}")]
    Document {
        /// The document's index in the stream.
        index: usize,
        /// What is wrong with it.
        reason: Error,
    },
    /// A document is not a KRM object.
    #[error("document {index}{what}: {reason}")]
    Resource {
        /// The document's index in the stream.
        index: usize,
        /// Its kind and name where it has them.
        what: Described,
        /// What is wrong with it.
        reason: ItemError,
    },
}

/// A resource's kind and name, as far as it has them, for a message:
/// ` (kind "ConfigMap", name "web")`, ` (kind "ConfigMap")`, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Described(Option<Box<str>>);

impl Described {
    /// What `item` says of its kind and name (strings only, not empty).
    pub fn of(item: &Mapping) -> Self {
        let string = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(Quoted::new)
        };
        let kind = string(item.get("kind"));
        let name = string(item.get("metadata").and_then(|m| m.get("name")));
        Self(match (kind, name) {
            (Some(kind), Some(name)) => Some(format!(" (kind {kind}, name {name})").into()),
            (Some(kind), None) => Some(format!(" (kind {kind})").into()),
            (None, Some(name)) => Some(format!(" (name {name})").into()),
            (None, None) => None,
        })
    }
}

impl std::fmt::Display for Described {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or(""))
    }
}

/// Reads the KRM resources of a stream of YAML documents separated by `---`
/// (a file of a package, or `kpt fn eval -`'s multi-document input): empty
/// documents are skipped, every other one must be a KRM object, checked as
/// [`validate_input`] checks an item.
pub fn resources(stream: &[u8]) -> Result<Vec<Mapping>, StreamError> {
    let docs = parse_mappings(stream).map_err(|(index, reason)| StreamError::Document {
        index,
        reason: reason.into(),
    })?;
    docs.into_iter()
        .map(|(index, doc)| {
            if let Some(found) = find_not_json(&doc, TaggedValues::Allowed) {
                return Err(StreamError::Document {
                    index,
                    reason: Error::NotJson(found),
                });
            }
            let what = Described::of(&doc);
            check_item(Value::Mapping(doc)).map_err(|reason| StreamError::Resource {
                index,
                what,
                reason,
            })
        })
        .collect()
}

/// Whether a stream of YAML documents that is neither a ResourceList nor a
/// FunctionIO is meant as KRM resources: one of its documents (up to the
/// first that is not YAML) is a mapping with a top-level `apiVersion` or
/// `kind` and no `items` (a document with `items` is a list: a ResourceList
/// of the wrong kind or apiVersion, to be refused as one). Such a stream is
/// to be read with [`resources`], whose error names the document and what it
/// lacks, and not taken for another format because one document is not a
/// KRM object. A stream too deep or too large for [`resources`] is not.
pub fn looks_like_resources(stream: &[u8]) -> bool {
    use serde::Deserialize;
    if crate::yaml::bounds::check_stream(stream).is_err() {
        return false;
    }
    serde_norway::Deserializer::from_slice(stream)
        .map_while(|document| Value::deserialize(document).ok())
        .any(|doc| {
            doc.as_mapping().is_some_and(|m| {
                (m.contains_key("apiVersion") || m.contains_key("kind")) && !m.contains_key("items")
            })
        })
}

/// Reads a function configuration given on its own, as kpt's `--fn-config`
/// file: one KRM object (`apiVersion`, `kind` and `metadata.name`), such as
/// a ConfigMap or the function's own kind.
pub fn function_config(doc: &[u8]) -> Result<Mapping, Error> {
    let config = parse_mapping(doc)?;
    if let Some(found) = find_not_json(&config, TaggedValues::Allowed) {
        return Err(Error::NotJson(found));
    }
    check_item(Value::Mapping(config)).map_err(Error::FunctionConfig)
}

/// Replaces (or sets) the `functionConfig` of the ResourceList `doc`, which is
/// checked as [`validate_input`] checks it, and returns the new document.
///
/// Other fields keep their values and order; comments and formatting are
/// not kept (the document is written again).
pub fn with_function_config(doc: &[u8], config: Mapping) -> Result<Vec<u8>, Error> {
    let mut mapping = parse_mapping(doc)?;
    parse(mapping.clone(), Side::Input)?;
    mapping.insert("functionConfig".into(), Value::Mapping(config));
    Ok(serde_norway::to_string(&mapping)
        .map_err(YamlError::from)?
        .into_bytes())
}

fn parse(mut doc: Mapping, side: Side) -> Result<ResourceList, Error> {
    // A key that is a collection (`? {a: b}: c`) or tagged (`!t k: v`):
    // serde_norway reads both and cannot write either back, so fnrun would
    // accept a ResourceList it then fails to pass on (the ResourceList half
    // of #18's second fuzz finding; `? [a]: b` it writes, but JSON, and so
    // Kubernetes, has no such key either). Tagged values are written back as
    // read, and kpt keeps them: they pass.
    if let Some(found) = find_not_json(&doc, TaggedValues::Allowed) {
        return Err(Error::NotJson(found));
    }
    let kind = required_str(&doc, "kind")?;
    if kind != KIND {
        return Err(Error::WrongType {
            field: "kind",
            found: Quoted::new(kind),
            expected: "\"ResourceList\"",
        });
    }
    let api_version = required_str(&doc, "apiVersion")?;
    if !API_VERSIONS.contains(&api_version) {
        return Err(Error::WrongType {
            field: "apiVersion",
            found: Quoted::new(api_version),
            expected: "\"config.kubernetes.io/v1\" or \"config.kubernetes.io/v1beta1\"",
        });
    }
    let api_version = api_version.to_owned();

    let items = match doc.remove("items") {
        None => return Err(Error::Missing("items")),
        Some(Value::Null) if side == Side::Output => Vec::new(),
        Some(Value::Sequence(items)) => items,
        Some(other) => return Err(shape("items", &other, "a sequence").into()),
    };
    let items = items
        .into_iter()
        .enumerate()
        .map(|(index, item)| check_item(item).map_err(|reason| Error::Item { index, reason }))
        .collect::<Result<Vec<_>, _>>()?;

    let function_config = match doc.remove("functionConfig") {
        None | Some(Value::Null) => None,
        Some(Value::Mapping(config)) => Some(config),
        Some(other) => return Err(shape("functionConfig", &other, "a mapping").into()),
    };
    let results = match doc.get("results") {
        None => Vec::new(),
        Some(results) => results::parse(results)?,
    };
    Ok(ResourceList {
        api_version,
        items,
        function_config,
        results,
    })
}

/// A top-level string field that must be present.
fn required_str<'a>(doc: &'a Mapping, field: &'static str) -> Result<&'a str, Error> {
    match doc.get(field) {
        None | Some(Value::Null) => Err(Error::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(shape(field, other, "a string").into()),
    }
}

/// Checks that an item is a KRM object, as kpt's `IsKRM` does: `apiVersion`,
/// `kind` and `metadata.name` are non-empty strings. Kustomization files
/// (`apiVersion` in `kustomize.config.k8s.io`, or no `apiVersion` and `kind:
/// Kustomization`) are exempt.
fn check_item(item: Value) -> Result<Mapping, ItemError> {
    let Value::Mapping(item) = item else {
        return Err(ItemError::NotAMapping(kind_name(&item)));
    };
    let api_version = optional_str(&item, "apiVersion", "apiVersion")?.unwrap_or("");
    let kind = optional_str(&item, "kind", "kind")?.unwrap_or("");
    if api_version.starts_with("kustomize.config.k8s.io")
        || (api_version.is_empty() && kind == "Kustomization")
    {
        return Ok(item);
    }
    if api_version.is_empty() {
        return Err(ItemError::Missing("apiVersion"));
    }
    if kind.is_empty() {
        return Err(ItemError::Missing("kind"));
    }
    let name = match item.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Mapping(metadata)) => optional_str(metadata, "name", "metadata.name")?,
        Some(other) => return Err(shape("metadata", other, "a mapping").into()),
    };
    if name.is_none_or(str::is_empty) {
        return Err(ItemError::Missing("metadata.name"));
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str = include_str!("../testdata/resourcelist.yaml");

    #[test]
    fn accepts_what_kpt_sends() {
        let rl = validate_input(INPUT.as_bytes()).unwrap();
        assert_eq!(rl.api_version, API_VERSION);
        assert_eq!(rl.items.len(), 3);
        assert_eq!(rl.items[1]["kind"], "Deployment");
        let config = rl.function_config.unwrap();
        assert_eq!(config["data"]["namespace"], "prod");
        assert!(rl.results.is_empty());
    }

    /// Issue 18: a multi-line string is written back as a block scalar, whose
    /// text held 129 `[` that the old pre-check took for nesting.
    #[test]
    fn what_it_accepts_its_own_yaml_passes_too() {
        let doc = format!(
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n\
             - {{apiVersion: v1, kind: ConfigMap, metadata: {{name: a}}, data: {{v: \"x\\n{}\"}}}}\n",
            "[".repeat(129)
        );
        let rl = validate_input(doc.as_bytes()).unwrap();
        let again = rl.to_yaml().unwrap();
        assert!(again.contains("v: |"), "{again}");
        assert_eq!(validate_input(again.as_bytes()).unwrap(), rl);
    }

    /// Keys JSON has not, anywhere: refused with where they are, in input
    /// and output. Before, they were accepted and `to_yaml` then failed
    /// ("expected SCALAR, SEQUENCE-START, ..."). Tagged values pass, and are
    /// written back as read.
    #[test]
    fn keys_are_untagged_scalars() {
        let item = |data: &str| {
            format!(
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n\
                 - apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: a}}\n  data:\n{data}"
            )
        };
        let cases = [
            (
                item("    ? {a: b}\n    : c\n"),
                "at items[0].data: a mapping key is a mapping",
            ),
            (
                item("    ? [a]\n    : c\n"),
                "at items[0].data: a mapping key is a sequence",
            ),
            (
                item("    !t k: c\n"),
                "at items[0].data: a mapping key has the YAML tag \"!t\"",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n\
                 functionConfig:\n  ? {a: b}\n  : c\n"
                    .to_owned(),
                "at functionConfig: a mapping key is a mapping",
            ),
        ];
        for (doc, want) in &cases {
            for result in [
                validate_input(doc.as_bytes()),
                validate_output(doc.as_bytes()),
            ] {
                let err = result.expect_err(doc);
                assert!(matches!(err, Error::NotJson(_)), "{doc}: {err:?}");
                let message = err.to_string();
                assert!(message.starts_with(want), "{doc}: {message}");
                assert!(message.contains("JSON to Kubernetes"), "{message}");
            }
        }
        // A package's files and a function config given on its own, which
        // fnrun writes into the ResourceList it makes.
        let object =
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata:\n  ? [a]\n  : c\n";
        let err = resources(
            format!(
                "{}\n---\n{object}",
                "{apiVersion: v1, kind: ConfigMap, metadata: {name: b}}"
            )
            .as_bytes(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("document 1: at data: a mapping key is a sequence"),
            "{err}"
        );
        let err = function_config(object.as_bytes()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("at data: a mapping key is a sequence"),
            "{err}"
        );

        let tagged = item("    k: !t c\n");
        let rl = validate_input(tagged.as_bytes()).unwrap();
        let again = rl.to_yaml().unwrap();
        assert!(again.contains("k: !t c"), "{again}");
        assert_eq!(validate_input(again.as_bytes()).unwrap(), rl);
    }

    #[test]
    fn accepts_v1beta1_json_and_kustomizations() {
        let doc = r#"{"apiVersion": "config.kubernetes.io/v1beta1", "kind": "ResourceList",
            "items": [{"kind": "Kustomization", "resources": ["a.yaml"]},
                      {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}]}"#;
        let rl = validate_input(doc.as_bytes()).unwrap();
        assert_eq!(rl.items.len(), 2);
        assert!(rl.function_config.is_none());
    }

    #[test]
    fn refuses_what_is_not_a_resourcelist() {
        let ok_item = "{apiVersion: v1, kind: ConfigMap, metadata: {name: a}}";
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "document is empty"),
            ("- a".into(), "not a YAML mapping but a sequence"),
            ("a: [1".into(), "did not find expected"),
            ("apiVersion: config.kubernetes.io/v1\nitems: []".into(), "kind is missing"),
            ("kind: ResourceList\nitems: []".into(), "apiVersion is missing"),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: List\nitems: []".into(),
                "kind is \"List\", expected \"ResourceList\"",
            ),
            (
                "apiVersion: v1\nkind: ResourceList\nitems: []".into(),
                "apiVersion is \"v1\", expected \"config.kubernetes.io/v1\"",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: [ResourceList]\nitems: []".into(),
                "kind is a sequence, expected a string",
            ),
            ("apiVersion: config.kubernetes.io/v1\nkind: ResourceList".into(), "items is missing"),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: ~".into(),
                "items is a null, expected a sequence",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: {a: 1}".into(),
                "items is a mapping, expected a sequence",
            ),
            (
                format!("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{ok_item}, x]"),
                "items[1]: item is not a mapping but a string",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{kind: ConfigMap, metadata: {name: a}}]".into(),
                "items[0]: resource must have `apiVersion`",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{apiVersion: v1, metadata: {name: a}}]".into(),
                "items[0]: resource must have `kind`",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{apiVersion: v1, kind: ConfigMap}]".into(),
                "items[0]: resource must have `metadata.name`",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{apiVersion: v1, kind: ConfigMap, metadata: {name: ''}}]".into(),
                "items[0]: resource must have `metadata.name`",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{apiVersion: v1, kind: ConfigMap, metadata: [a]}]".into(),
                "items[0]: metadata is a sequence, expected a mapping",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: [{apiVersion: 1, kind: ConfigMap}]".into(),
                "items[0]: apiVersion is a number, expected a string",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nfunctionConfig: [a]".into(),
                "functionConfig is a sequence, expected a mapping",
            ),
            (
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nresults: [{severity: fatal}]".into(),
                "results[0]: severity is \"fatal\"",
            ),
        ];
        for (doc, want) in &cases {
            let err = validate_input(doc.as_bytes()).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{doc:?}: {err:?} does not contain {want:?}"
            );
        }
    }

    #[test]
    fn tells_a_resourcelist_by_its_kind() {
        assert!(is_resource_list(INPUT.as_bytes()));
        assert!(is_resource_list(b"{kind: ResourceList, items: 3}"));
        for doc in [
            "kind: List",
            "- kind: ResourceList",
            "",
            "desired: {}",
            "kind: [ResourceList]",
            // Spelt with an escape: not recognised (`--krm` says it).
            "kind: \"Resource\\x4cist\"\nitems: []",
        ] {
            assert!(!is_resource_list(doc.as_bytes()), "{doc:?}");
        }
    }

    #[test]
    fn reads_a_function_config_file() {
        let config = function_config(
            b"apiVersion: fn.example/v1\nkind: SetLabel\nmetadata: {name: x}\nvalue: a",
        )
        .unwrap();
        assert_eq!(config["value"], Value::from("a"));
        for (doc, want) in [
            (
                "kind: SetLabel\nmetadata: {name: x}",
                "functionConfig: resource must have `apiVersion`",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap",
                "functionConfig: resource must have `metadata.name`",
            ),
            ("- a", "not a YAML mapping"),
            ("", "document is empty"),
        ] {
            let err = function_config(doc.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{doc:?}: {err}");
        }
    }

    #[test]
    fn output_may_have_null_items() {
        let doc = b"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: null\n";
        assert!(validate_output(doc).unwrap().items.is_empty());
        assert!(validate_input(doc).is_err());
    }

    #[test]
    fn errors_quote_at_most_a_few_hundred_bytes() {
        let huge = "x".repeat(1 << 20);
        for doc in [
            format!("apiVersion: config.kubernetes.io/v1\nkind: {huge}\nitems: []"),
            format!("apiVersion: {huge}\nkind: ResourceList\nitems: []"),
            format!(
                "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nresults: [{{severity: {huge}}}]"
            ),
            format!("{{\"a\": \"{huge}\""),
        ] {
            let err = validate_input(doc.as_bytes()).unwrap_err().to_string();
            assert!(err.len() < 2048, "{} bytes: {}", err.len(), &err[..100]);
        }
    }

    #[test]
    fn parses_results_and_failure() {
        let doc = "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nresults:\n- {message: fine}\n- {message: bad, severity: error}\n";
        let rl = validate_output(doc.as_bytes()).unwrap();
        assert_eq!(rl.results.len(), 2);
        assert_eq!(rl.results[0].severity, Severity::Info);
        assert!(rl.failed());
        let doc = doc.replace("severity: error", "severity: warning");
        assert!(!validate_output(doc.as_bytes()).unwrap().failed());
    }

    #[test]
    fn replaces_the_function_config() {
        let config: Mapping = serde_norway::from_str(
            "{apiVersion: v1, kind: ConfigMap, metadata: {name: x}, data: {a: b}}",
        )
        .unwrap();
        let out = with_function_config(INPUT.as_bytes(), config.clone()).unwrap();
        let rl = validate_input(&out).unwrap();
        assert_eq!(rl.function_config, Some(config.clone()));
        assert_eq!(rl.items, validate_input(INPUT.as_bytes()).unwrap().items);
        // Sets it when there was none, and refuses what is not a ResourceList.
        let bare = b"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n";
        let out = with_function_config(bare, config.clone()).unwrap();
        assert_eq!(
            validate_input(&out).unwrap().function_config,
            Some(config.clone())
        );
        assert!(matches!(
            with_function_config(b"kind: Pod", config),
            Err(Error::WrongType { field: "kind", .. })
        ));
    }

    #[test]
    fn writes_what_it_reads() {
        let rl = validate_output(INPUT.as_bytes()).unwrap();
        let again = validate_output(rl.to_yaml().unwrap().as_bytes()).unwrap();
        assert_eq!(again, rl);
        let mut with_results = ResourceList::new(rl.items.clone());
        with_results.results = vec![ResultItem {
            message: "m".into(),
            severity: Severity::Warning,
            ..ResultItem::default()
        }];
        let again = validate_output(with_results.to_yaml().unwrap().as_bytes()).unwrap();
        assert_eq!(again, with_results);
    }

    #[test]
    fn reads_a_stream_of_resources() {
        let stream = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\n{apiVersion: v1, kind: Secret, metadata: {name: b}}\n";
        let items = resources(stream).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1]["kind"], "Secret");
        for (doc, want) in [
            ("a: 1\n", "document 0: resource must have `apiVersion`"),
            (
                "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\n- x\n",
                "document 1: document is not a YAML mapping but a sequence",
            ),
            ("a: [\n", "document 0: did not find expected"),
            // The document is named by its place in the stream, empty ones
            // counted, with its kind and name where it has them (#37).
            (
                "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\n# empty\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: x}\n",
                "document 2 (kind \"ConfigMap\"): resource must have `metadata.name`",
            ),
            (
                "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\nmetadata: {name: web}\nkind: Service\n",
                "document 1 (kind \"Service\", name \"web\"): resource must have `apiVersion`",
            ),
            (
                "apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\nreplicas: 3\n",
                "document 1: resource must have `apiVersion`",
            ),
        ] {
            let err = resources(doc.as_bytes()).unwrap_err().to_string();
            assert!(err.starts_with(want), "{doc:?}: {err}");
        }
    }

    #[test]
    fn tells_a_stream_meant_as_resources() {
        for stream in [
            "apiVersion: v1\nkind: ConfigMap\n",
            "replicas: 3\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            "kind: Kustomization\n",
            "apiVersion: v1\nkind: A\n---\nb: [\n",
        ] {
            assert!(looks_like_resources(stream.as_bytes()), "{stream:?}");
        }
        let deep = format!("apiVersion: v1\nkind: A\nx: {}\n", "[".repeat(1 << 20));
        for stream in [
            "",
            "replicas: 3\n",
            "- apiVersion: v1\n",
            "apiVersion: v1\nkind: List\nitems: []\n",
            "b: [\n---\nkind: A\n",
            &deep,
        ] {
            assert!(!looks_like_resources(stream.as_bytes()), "{stream:?}");
        }
    }
}
