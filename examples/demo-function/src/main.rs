//! A tiny, real composition function.
//!
//! It reads a FunctionIO YAML document on stdin, adds the labels from
//! `config.labels` (if any) and `fnrun.dev/demo: "true"` to `metadata.labels` of
//! every `desired.resources[*].resource`, appends a `Normal` result saying how many
//! resources it labelled, and writes the document to stdout. On bad input it writes
//! one clear line to stderr and exits 1.
//!
//! `cargo xtask demo-image` builds it as a static binary and packages it as an OCI
//! image whose entrypoint is `/function`.

use std::fmt;
use std::io::{self, Read, Write};
use std::process::ExitCode;

use serde_norway::{Mapping, Value};

/// The label every desired resource gets.
const DEMO_LABEL: (&str, &str) = ("fnrun.dev/demo", "true");

/// Why the input could not be processed.
#[derive(Debug)]
enum Error {
    /// Reading stdin failed.
    Read(io::Error),
    /// Stdin is not YAML.
    Parse(serde_norway::Error),
    /// A field has the wrong shape; the string is the path of the field.
    Shape {
        path: String,
        expected: &'static str,
    },
    /// Serializing the result failed.
    Serialize(serde_norway::Error),
    /// Writing stdout failed.
    Write(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read(e) => write!(f, "cannot read stdin: {e}"),
            Error::Parse(e) => write!(f, "input is not YAML: {e}"),
            Error::Shape { path, expected } => {
                write!(f, "input is not a FunctionIO: {path} must be {expected}")
            }
            Error::Serialize(e) => write!(f, "cannot serialize output: {e}"),
            Error::Write(e) => write!(f, "cannot write stdout: {e}"),
        }
    }
}

fn shape(path: impl Into<String>, expected: &'static str) -> Error {
    Error::Shape {
        path: path.into(),
        expected,
    }
}

/// Returns the mapping stored under `key` in `map`, creating an empty one if the
/// key is missing or null.
fn child_mapping<'a>(
    map: &'a mut Mapping,
    key: &str,
    path: &str,
) -> Result<&'a mut Mapping, Error> {
    let slot = map
        .entry(Value::from(key))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if slot.is_null() {
        *slot = Value::Mapping(Mapping::new());
    }
    slot.as_mapping_mut()
        .ok_or_else(|| shape(path, "a mapping"))
}

/// Reads `config.labels` as ordered (key, value) pairs. Scalar values are turned
/// into strings, as Kubernetes labels are strings.
fn config_labels(io: &Mapping) -> Result<Vec<(String, String)>, Error> {
    let Some(config) = io.get("config").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let config = config
        .as_mapping()
        .ok_or_else(|| shape("config", "a mapping"))?;
    let Some(labels) = config.get("labels").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let labels = labels
        .as_mapping()
        .ok_or_else(|| shape("config.labels", "a mapping of strings"))?;
    labels
        .iter()
        .map(|(k, v)| {
            let key =
                scalar_string(k).ok_or_else(|| shape("config.labels", "a mapping of strings"))?;
            let value = scalar_string(v)
                .ok_or_else(|| shape(format!("config.labels.{key}"), "a string"))?;
            Ok((key, value))
        })
        .collect()
}

fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Labels every desired resource of `io` and appends a result. Returns how many
/// resources were labelled.
fn label(io: &mut Value) -> Result<usize, Error> {
    let io = io
        .as_mapping_mut()
        .ok_or_else(|| shape("the document", "a mapping"))?;
    let mut labels = config_labels(io)?;
    labels.push((DEMO_LABEL.0.to_owned(), DEMO_LABEL.1.to_owned()));

    let desired = child_mapping(io, "desired", "desired")?;
    let mut count = 0;
    match desired.get_mut("resources") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(resources)) => {
            for (i, entry) in resources.iter_mut().enumerate() {
                let path = format!("desired.resources[{i}]");
                let entry = entry
                    .as_mapping_mut()
                    .ok_or_else(|| shape(path.clone(), "a mapping"))?;
                let resource = child_mapping(entry, "resource", &format!("{path}.resource"))?;
                let metadata =
                    child_mapping(resource, "metadata", &format!("{path}.resource.metadata"))?;
                let target = child_mapping(
                    metadata,
                    "labels",
                    &format!("{path}.resource.metadata.labels"),
                )?;
                for (k, v) in &labels {
                    target.insert(Value::from(k.as_str()), Value::from(v.as_str()));
                }
                count += 1;
            }
        }
        Some(_) => return Err(shape("desired.resources", "a list")),
    }

    let mut result = Mapping::new();
    result.insert("severity".into(), "Normal".into());
    result.insert(
        "message".into(),
        format!("demo-function labelled {count} resources").into(),
    );
    let results = io
        .entry(Value::from("results"))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if results.is_null() {
        *results = Value::Sequence(Vec::new());
    }
    results
        .as_sequence_mut()
        .ok_or_else(|| shape("results", "a list"))?
        .push(Value::Mapping(result));
    Ok(count)
}

/// Turns a FunctionIO document into the labelled document.
fn process(input: &str) -> Result<String, Error> {
    let mut io: Value = serde_norway::from_str(input).map_err(Error::Parse)?;
    label(&mut io)?;
    serde_norway::to_string(&io).map_err(Error::Serialize)
}

fn run() -> Result<(), Error> {
    let mut input = String::new();
    io::stdin()
        .read_to_string(&mut input)
        .map_err(Error::Read)?;
    let output = process(&input)?;
    let mut stdout = io::stdout().lock();
    stdout.write_all(output.as_bytes()).map_err(Error::Write)?;
    stdout.flush().map_err(Error::Write)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo-function: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_of(out: &Value, i: usize) -> &Mapping {
        out["desired"]["resources"][i]["resource"]["metadata"]["labels"]
            .as_mapping()
            .expect("labels mapping")
    }

    fn parse(s: &str) -> Value {
        serde_norway::from_str(s).expect("valid yaml")
    }

    #[test]
    fn labels_every_desired_resource_with_config_labels() {
        let out = parse(
            &process(
                r#"
config:
  labels:
    team: payments
    tier: 1
desired:
  resources:
  - name: a
    resource:
      kind: Bucket
      metadata:
        name: a
        labels:
          keep: me
  - name: b
    resource:
      kind: Bucket
"#,
            )
            .expect("processes"),
        );
        let a = labels_of(&out, 0);
        assert_eq!(a.get("keep"), Some(&Value::from("me")));
        assert_eq!(a.get("team"), Some(&Value::from("payments")));
        assert_eq!(a.get("tier"), Some(&Value::from("1")));
        assert_eq!(a.get("fnrun.dev/demo"), Some(&Value::from("true")));
        assert_eq!(
            out["desired"]["resources"][0]["resource"]["metadata"]["name"],
            "a"
        );
        let b = labels_of(&out, 1);
        assert_eq!(b.get("team"), Some(&Value::from("payments")));
        assert_eq!(b.get("fnrun.dev/demo"), Some(&Value::from("true")));
        let results = out["results"].as_sequence().expect("results");
        assert_eq!(results.len(), 1);
        assert_eq!(results[0]["severity"], "Normal");
        assert_eq!(results[0]["message"], "demo-function labelled 2 resources");
    }

    #[test]
    fn keeps_earlier_results_and_other_fields() {
        let out = parse(
            &process(
                r#"
observed:
  composite:
    resource: {kind: XBucket}
desired:
  composite:
    resource: {kind: XBucket}
  resources:
  - name: a
    resource: {kind: Bucket}
results:
- severity: Warning
  message: earlier
"#,
            )
            .expect("processes"),
        );
        assert_eq!(out["observed"]["composite"]["resource"]["kind"], "XBucket");
        assert_eq!(out["desired"]["composite"]["resource"]["kind"], "XBucket");
        let results = out["results"].as_sequence().expect("results");
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["message"], "earlier");
        assert_eq!(results[1]["message"], "demo-function labelled 1 resources");
        let labels = labels_of(&out, 0);
        assert_eq!(labels.len(), 1, "only the demo label without config.labels");
    }

    #[test]
    fn empty_document_gets_a_result() {
        let out = parse(&process("{}").expect("processes"));
        assert_eq!(
            out["results"][0]["message"],
            "demo-function labelled 0 resources"
        );
    }

    #[test]
    fn example_functionio_is_labelled() {
        let input = include_str!("../../functionio.yaml");
        let out = parse(&process(input).expect("processes"));
        let labels = labels_of(&out, 0);
        assert_eq!(labels.get("team"), Some(&Value::from("payments")));
        assert_eq!(labels.get("fnrun.dev/demo"), Some(&Value::from("true")));
        assert_eq!(out["results"].as_sequence().map(Vec::len), Some(2));
    }

    #[test]
    fn rejects_bad_input_with_a_clear_message() {
        for (input, want) in [
            ("- a\n- b\n", "the document must be a mapping"),
            ("hello", "the document must be a mapping"),
            (
                "desired: {resources: 3}",
                "desired.resources must be a list",
            ),
            (
                "desired: {resources: [3]}",
                "desired.resources[0] must be a mapping",
            ),
            (
                "desired: {resources: [{resource: {metadata: []}}]}",
                "desired.resources[0].resource.metadata must be a mapping",
            ),
            (
                "config: {labels: [a]}",
                "config.labels must be a mapping of strings",
            ),
            (
                "config: {labels: {a: [b]}}",
                "config.labels.a must be a string",
            ),
            ("results: {}", "results must be a list"),
        ] {
            let err = process(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input:?}: {err:?} lacks {want:?}");
        }
        let err = process("a: [").expect_err("not yaml").to_string();
        assert!(err.starts_with("input is not YAML"), "{err}");
    }
}
