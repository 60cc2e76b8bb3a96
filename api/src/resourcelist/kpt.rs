//! What kpt adds around a ResourceList: the ConfigMap `kpt fn eval IMAGE --
//! key=value...` passes as `functionConfig`, and the `results.yaml` it writes
//! to `--results-dir` (a `kpt.dev/v1` `FunctionResultList`).

use serde::Serialize;
use serde_norway::{Mapping, Value};

use super::ResultItem;
use crate::yaml::{Quoted, YamlError};

/// The `metadata.name` of the ConfigMap built from `key=value` arguments.
pub const FUNCTION_INPUT_NAME: &str = "function-input";

/// A `key=value` argument that kpt would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// An argument after the first has no `=`.
    #[error("function argument {0} is not of the form key=value")]
    NotKeyValue(Quoted),
    /// The key before `=` is empty.
    #[error("function argument {0} has an empty key")]
    EmptyKey(Quoted),
}

/// The `functionConfig` kpt builds from the arguments after `--`:
///
/// ```yaml
/// apiVersion: v1
/// kind: ConfigMap
/// metadata: {name: function-input}
/// data: {key: value, ...}   # values are always strings
/// ```
///
/// As in kpt, a first argument without `=` is the kind instead of
/// `ConfigMap`, and a repeated key keeps its last value. Unlike kpt, an empty
/// key is refused: it cannot be a ConfigMap key. No arguments give `data: {}`,
/// which is what kpt passes when it is given none.
pub fn config_map<S: AsRef<str>>(args: &[S]) -> Result<Mapping, ArgError> {
    let mut kind = "ConfigMap";
    let mut data = Mapping::new();
    for (i, arg) in args.iter().enumerate() {
        let arg = arg.as_ref();
        match arg.split_once('=') {
            None if i == 0 => kind = arg,
            None => return Err(ArgError::NotKeyValue(Quoted::new(arg))),
            Some(("", _)) => return Err(ArgError::EmptyKey(Quoted::new(arg))),
            Some((key, value)) => {
                data.insert(key.into(), value.into());
            }
        }
    }
    let mut metadata = Mapping::new();
    metadata.insert("name".into(), FUNCTION_INPUT_NAME.into());
    let mut config = Mapping::new();
    config.insert("apiVersion".into(), "v1".into());
    config.insert("kind".into(), kind.into());
    config.insert("metadata".into(), Value::Mapping(metadata));
    config.insert("data".into(), Value::Mapping(data));
    Ok(config)
}

/// kpt's `results.yaml`: what every function of a run reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionResultList {
    /// 1 when a function failed, else 0.
    pub exit_code: i32,
    /// One entry per function, in the order they ran.
    pub items: Vec<FunctionResult>,
}

/// What one function reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionResult {
    /// The function's image reference.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// The tail of the function's stderr, when it failed.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stderr: String,
    /// The function's exit code.
    pub exit_code: i32,
    /// The results of its output ResourceList.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ResultItem>,
}

impl FunctionResult {
    /// Whether the function failed: it exited non-zero or reported an error.
    pub fn failed(&self) -> bool {
        self.exit_code != 0
            || self
                .results
                .iter()
                .any(|r| r.severity == super::Severity::Error)
    }
}

/// The serialised form, with kpt's field order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    exit_code: i32,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    items: &'a [FunctionResult],
}

#[derive(Serialize)]
struct Metadata {
    name: &'static str,
}

impl FunctionResultList {
    /// The `apiVersion` of `results.yaml`.
    pub const API_VERSION: &str = "kpt.dev/v1";
    /// The `kind` of `results.yaml`.
    pub const KIND: &str = "FunctionResultList";
    /// The `metadata.name` of `results.yaml`.
    pub const NAME: &str = "fnresults";

    /// The list of `items`, with exit code 1 if any of them failed.
    pub fn new(items: Vec<FunctionResult>) -> Self {
        Self {
            exit_code: i32::from(items.iter().any(FunctionResult::failed)),
            items,
        }
    }

    /// Adds a function's result; the exit code becomes 1 if it failed.
    pub fn push(&mut self, item: FunctionResult) {
        if item.failed() {
            self.exit_code = 1;
        }
        self.items.push(item);
    }

    /// The document kpt writes as `results.yaml`.
    pub fn to_yaml(&self) -> Result<String, YamlError> {
        Ok(serde_norway::to_string(&Document {
            api_version: Self::API_VERSION,
            kind: Self::KIND,
            metadata: Metadata { name: Self::NAME },
            exit_code: self.exit_code,
            items: &self.items,
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resourcelist::{ResourceRef, Severity};

    #[test]
    fn builds_kpts_function_input() {
        let config =
            config_map(&["namespace=prod", "label=a=b", "namespace=staging", "empty="]).unwrap();
        assert_eq!(
            serde_norway::to_string(&config).unwrap(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: function-input\ndata:\n  namespace: staging\n  label: a=b\n  empty: ''\n"
        );
        // Values stay strings, whatever they look like.
        let config = config_map(&["replicas=3", "enabled=true", "nothing=~"]).unwrap();
        let text = serde_norway::to_string(&config).unwrap();
        let back: Mapping = serde_norway::from_str(&text).unwrap();
        assert_eq!(back["data"]["replicas"], Value::from("3"));
        assert_eq!(back["data"]["enabled"], Value::from("true"));
        assert_eq!(back["data"]["nothing"], Value::from("~"));
    }

    #[test]
    fn first_argument_may_be_the_kind() {
        let config = config_map(&["SetLabels", "app=web"]).unwrap();
        assert_eq!(config["kind"], Value::from("SetLabels"));
        assert_eq!(config["apiVersion"], Value::from("v1"));
        assert_eq!(config["data"]["app"], Value::from("web"));
        let empty = config_map::<&str>(&[]).unwrap();
        assert_eq!(empty["data"], Value::Mapping(Mapping::new()));
    }

    #[test]
    fn refuses_what_kpt_refuses() {
        assert_eq!(
            config_map(&["a=b", "c"]).unwrap_err().to_string(),
            "function argument \"c\" is not of the form key=value"
        );
        assert!(matches!(config_map(&["=b"]), Err(ArgError::EmptyKey(_))));
        let long = "x".repeat(1 << 20);
        assert!(config_map(&["a=b", &long]).unwrap_err().to_string().len() < 512);
    }

    #[test]
    fn writes_kpts_results_yaml() {
        let mut list = FunctionResultList::new(vec![FunctionResult {
            image: "ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.4".into(),
            exit_code: 0,
            results: vec![ResultItem {
                message: "namespace set".into(),
                severity: Severity::Info,
                resource_ref: Some(ResourceRef {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: "web".into(),
                    namespace: "prod".into(),
                }),
                ..ResultItem::default()
            }],
            ..FunctionResult::default()
        }]);
        assert_eq!(list.exit_code, 0);
        list.push(FunctionResult {
            image: "example.org/validate:v1".into(),
            stderr: "panic: boom\n".into(),
            exit_code: 2,
            results: Vec::new(),
        });
        assert_eq!(list.exit_code, 1);
        let yaml = list.to_yaml().unwrap();
        assert_eq!(
            yaml,
            "\
apiVersion: kpt.dev/v1
kind: FunctionResultList
metadata:
  name: fnresults
exitCode: 1
items:
- image: ghcr.io/kptdev/krm-functions-catalog/set-namespace:v0.4
  exitCode: 0
  results:
  - message: namespace set
    severity: info
    resourceRef:
      apiVersion: apps/v1
      kind: Deployment
      name: web
      namespace: prod
- image: example.org/validate:v1
  stderr: |
    panic: boom
  exitCode: 2
"
        );
    }

    #[test]
    fn an_error_result_fails_the_list() {
        let failing = FunctionResult {
            image: "i".into(),
            results: vec![ResultItem {
                severity: Severity::Error,
                ..ResultItem::default()
            }],
            ..FunctionResult::default()
        };
        assert!(failing.failed());
        assert_eq!(FunctionResultList::new(vec![failing]).exit_code, 1);
        let empty = FunctionResultList::new(Vec::new());
        assert_eq!(
            empty.to_yaml().unwrap(),
            "apiVersion: kpt.dev/v1\nkind: FunctionResultList\nmetadata:\n  name: fnresults\nexitCode: 0\n"
        );
    }
}
