//! What every document parser of this crate shares: parsing one YAML document
//! into a value, naming a value's kind, and quoting input in error messages
//! without ever quoting more than a few hundred bytes of it (through
//! [`text::bounded`]).

use std::fmt;

use serde_norway::Value;

use crate::text;

pub mod bounds;

/// The most bytes of a value that an error message quotes.
pub const MAX_QUOTED: usize = 200;
/// The most bytes of a YAML parser's message that an error keeps.
pub const MAX_MESSAGE: usize = 1024;

/// A YAML parse or shape error, its message cut to [`MAX_MESSAGE`] bytes.
///
/// The parser's own messages quote the offending value (`invalid type: string
/// "…"`), which may be megabytes long; this keeps the start of the message,
/// which says what, and its end, which says what was expected and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

impl From<serde_norway::Error> for YamlError {
    fn from(err: serde_norway::Error) -> Self {
        Self(truncate(&err.to_string(), MAX_MESSAGE).into_owned())
    }
}

impl From<bounds::BoundsError> for YamlError {
    fn from(err: bounds::BoundsError) -> Self {
        YamlError(err.to_string())
    }
}

/// A value quoted in an error message: `"text"`, cut to [`MAX_QUOTED`] bytes
/// (head and tail) with the bytes left out said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted(String);

impl Quoted {
    /// Quotes `s`.
    pub fn new(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", text::bounded(&self.0, MAX_QUOTED))
    }
}

/// `s` cut to at most `max` bytes (see [`text::bounded`]).
pub(crate) fn truncate(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    text::bounded(s, max)
}

/// The name of a value's kind, for messages such as "is a sequence".
pub(crate) fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "sequence",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// A path such as `desired.resources["my bucket"].resource.spec[0]`: plain
/// keys after a dot, others quoted in brackets, at most a few hundred bytes.
pub(crate) struct Path<'a>(pub(crate) &'a [Segment]);

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        for segment in self.0 {
            match segment {
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
                Segment::Key(k)
                    if !k.is_empty()
                        && k.len() <= 64
                        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Key(k) => out.push_str(&format!("[{}]", Quoted::new(&truncate(k, 64)))),
            }
            if out.len() > 4 * MAX_QUOTED {
                break;
            }
        }
        f.write_str(&truncate(&out, 2 * MAX_QUOTED))
    }
}

/// Something of a document that JSON cannot carry, found by `find_not_json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJson {
    /// Where: the path of the value, or of the mapping whose key it is (see
    /// `on_key`), shown as `a.b["c d"][0]`, bounded.
    pub path: String,
    /// Whether it is a mapping key rather than a value.
    pub on_key: bool,
    pub what: NotJsonKind,
}

/// What [`NotJson`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotJsonKind {
    /// A YAML tag serde_norway keeps (a local one), quoted and cut short.
    Tag(Quoted),
    /// A mapping key that is a collection (`? {a: b}: c`): `"mapping"` or
    /// `"sequence"`.
    CollectionKey(&'static str),
}

impl fmt::Display for NotJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.path.is_empty() {
            "the document"
        } else {
            &self.path
        };
        let what = if self.on_key {
            "a mapping key"
        } else {
            "the value"
        };
        match &self.what {
            NotJsonKind::Tag(tag) => write!(f, "at {at}: {what} has the YAML tag {tag}"),
            NotJsonKind::CollectionKey(kind) => write!(f, "at {at}: {what} is a {kind}"),
        }
    }
}

/// The first value or key of `mapping` (depth first) that JSON cannot
/// carry: one with a YAML tag serde_norway keeps (a local tag such as
/// `!vault` or `!<!x>`; core tags, `!!str`, `!!int`, `!!map`, ... ,
/// `tag:yaml.org,2002:*`, are resolved by the parser and never reach a
/// [`Value`] as tags), or a key that is a mapping or a sequence. serde_norway
/// reads both and can write neither back.
///
/// With [`TaggedValues::Allowed`], tagged values are passed over: only
/// keys are checked (serde_norway writes a tagged value back as it read it).
///
/// Recursion is bounded: a parsed document is at most
/// [`bounds::MAX_DEPTH`] collections deep.
pub(crate) fn find_not_json(
    mapping: &serde_norway::Mapping,
    tagged_values: TaggedValues,
) -> Option<NotJson> {
    let mut path = Vec::new();
    find_in_mapping(mapping, &mut path, tagged_values)
}

/// Whether [`find_not_json`] reports a value with a local YAML tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaggedValues {
    Refused,
    Allowed,
}

fn find_in_mapping(
    mapping: &serde_norway::Mapping,
    path: &mut Vec<Segment>,
    tagged_values: TaggedValues,
) -> Option<NotJson> {
    for (key, value) in mapping {
        let on_key = |what| {
            Some(NotJson {
                path: Path(path).to_string(),
                on_key: true,
                what,
            })
        };
        let segment = match key {
            Value::Tagged(tagged) => {
                return on_key(NotJsonKind::Tag(Quoted::new(&tagged.tag.to_string())));
            }
            Value::Mapping(_) => return on_key(NotJsonKind::CollectionKey("mapping")),
            Value::Sequence(_) => return on_key(NotJsonKind::CollectionKey("sequence")),
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".to_owned(),
        };
        path.push(Segment::Key(segment));
        let found = find_in_value(value, path, tagged_values);
        path.pop();
        if found.is_some() {
            return found;
        }
    }
    None
}

fn find_in_value(
    value: &Value,
    path: &mut Vec<Segment>,
    tagged_values: TaggedValues,
) -> Option<NotJson> {
    match value {
        Value::Tagged(tagged) if tagged_values == TaggedValues::Refused => Some(NotJson {
            path: Path(path).to_string(),
            on_key: false,
            what: NotJsonKind::Tag(Quoted::new(&tagged.tag.to_string())),
        }),
        Value::Tagged(tagged) => find_in_value(&tagged.value, path, tagged_values),
        Value::Mapping(mapping) => find_in_mapping(mapping, path, tagged_values),
        Value::Sequence(items) => items.iter().enumerate().find_map(|(i, item)| {
            path.push(Segment::Index(i));
            let found = find_in_value(item, path, tagged_values);
            path.pop();
            found
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

/// Why a document could not be read as one YAML mapping.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DocumentError {
    #[error("document is empty")]
    Empty,
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("document is not a YAML mapping but a {0}")]
    NotAMapping(&'static str),
}

/// Parses one YAML (or JSON) document that must be a mapping.
pub(crate) fn parse_mapping(doc: &[u8]) -> Result<serde_norway::Mapping, DocumentError> {
    if doc.iter().all(u8::is_ascii_whitespace) {
        return Err(DocumentError::Empty);
    }
    bounds::check(doc).map_err(YamlError::from)?;
    let value: Value = serde_norway::from_slice(doc).map_err(YamlError::from)?;
    match value {
        Value::Mapping(mapping) => Ok(mapping),
        other => Err(DocumentError::NotAMapping(kind_name(&other))),
    }
}

/// Parses a stream of YAML (or JSON) documents separated by `---`, as kpt
/// reads a file of a package or `kpt fn eval -`'s stdin: documents that are
/// empty or only comments are skipped, every other one must be a mapping.
/// Each mapping comes with its index in the stream, and the error names the
/// document: both count from 0 among all documents, empty ones included.
pub(crate) fn parse_mappings(
    stream: &[u8],
) -> Result<Vec<(usize, serde_norway::Mapping)>, (usize, DocumentError)> {
    use serde::Deserialize;
    bounds::check_stream(stream).map_err(|e| (0, DocumentError::Yaml(e.into())))?;
    let mut out = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_slice(stream).enumerate() {
        match Value::deserialize(document) {
            Ok(Value::Null) => {}
            Ok(Value::Mapping(mapping)) => out.push((index, mapping)),
            Ok(other) => return Err((index, DocumentError::NotAMapping(kind_name(&other)))),
            Err(e) => return Err((index, DocumentError::Yaml(e.into()))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_short_values_whole() {
        assert_eq!(Quoted::new("Pod").to_string(), "\"Pod\"");
        assert_eq!(Quoted::new("a\"b").to_string(), "\"a\\\"b\"");
    }

    #[test]
    fn quotes_long_values_cut_with_their_length() {
        let long = format!("{}end", "é".repeat(10_000));
        let quoted = Quoted::new(&long).to_string();
        assert!(quoted.len() <= MAX_QUOTED + 2, "{}", quoted.len());
        assert!(quoted.starts_with("\"ééé"), "{quoted}");
        assert!(quoted.ends_with("éend\""), "{quoted}");
        assert!(quoted.contains(" of 20003 bytes elided]"), "{quoted}");
    }

    #[test]
    fn cuts_parser_messages_keeping_what_was_expected() {
        let err: YamlError =
            serde_norway::from_str::<Vec<String>>(&format!("{{key: \"{}\"}}", "y".repeat(1 << 20)))
                .map_err(YamlError::from)
                .unwrap_err();
        assert!(err.to_string().len() <= MAX_MESSAGE);
        assert!(err.to_string().starts_with("invalid type"), "{err}");
        assert!(err.to_string().contains("expected a sequence"), "{err}");
    }

    #[test]
    fn parses_only_mappings() {
        assert!(matches!(parse_mapping(b" \n"), Err(DocumentError::Empty)));
        assert!(matches!(
            parse_mapping(b"- a"),
            Err(DocumentError::NotAMapping("sequence"))
        ));
        assert!(matches!(
            parse_mapping(b"a: [1"),
            Err(DocumentError::Yaml(_))
        ));
        assert_eq!(parse_mapping(b"{\"a\": 1}").unwrap().len(), 1);
    }

    #[test]
    fn parses_streams_of_mappings() {
        let docs = parse_mappings(b"---\n# only a comment\n---\na: 1\n---\n---\n{b: 2}\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].0, 1);
        assert_eq!(docs[1].0, 3);
        assert_eq!(docs[1].1["b"], Value::from(2));
        assert!(parse_mappings(b"").unwrap().is_empty());
        assert!(matches!(
            parse_mappings(b"a: 1\n---\n- x\n"),
            Err((1, DocumentError::NotAMapping("sequence")))
        ));
        assert!(matches!(
            parse_mappings(b"a: 1\n---\nb: [\n"),
            Err((1, DocumentError::Yaml(_)))
        ));
        let deep = format!("a: {}\n", "[".repeat(1 << 20));
        assert!(matches!(
            parse_mappings(deep.as_bytes()),
            Err((0, DocumentError::Yaml(_)))
        ));
    }
}
