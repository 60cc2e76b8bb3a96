//! What fnrun serves for a Function: its active revision's image, its pull
//! secrets and the settings of its runtime config, as a [`FunctionDef`] of
//! the host's catalogue. Pure: the API reads are the caller's.
//!
//! From a DeploymentRuntimeConfig (`spec.deploymentTemplate`), the container
//! named `package-runtime` gives, as Crossplane's Deployment runtime would:
//! - `resources.limits.memory` and `resources.limits.cpu`: the function's
//!   cgroup limits, at least 4Mi and more than 0 (requests are not limits,
//!   and are ignored);
//! - `env` entries with a `value` (`valueFrom` needs the kubelet: ignored);
//! - `args`: appended to the function's arguments (after `--insecure`).
//!
//! Everything else (the image, command, probes, volumes, security context,
//! the pod's and the Deployment's settings, the Service and ServiceAccount
//! templates) is about a Deployment fnrun does not create, and is ignored;
//! [`RuntimeSettings::ignored`] names what was set, for the log.

use fnrun_api::quantity;
use fnrun_host::catalogue::{self, CredentialSource, FieldError, FunctionDef, PullSecretData};
use fnrun_sandbox::Limits;
use serde_json::Value;

/// The container of a DeploymentRuntimeConfig that is the function.
pub const RUNTIME_CONTAINER: &str = "package-runtime";

/// Most `env` entries and `args` taken from a runtime config.
const MAX_LIST: usize = 256;

/// What a runtime config sets for the function's runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeSettings {
    pub limits: Limits,
    /// `(NAME, VALUE)`, sorted by name; a name set twice keeps the last.
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The fields set that fnrun does not honour, as JSON paths.
    pub ignored: Vec<String>,
}

/// Why a Function cannot be served as its objects say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefError {
    #[error("the active FunctionRevision {revision} names no image (spec.image)")]
    NoImage { revision: String },
    #[error("the Function's name {0}")]
    Name(FieldError),
    #[error("the image {0}")]
    Image(FieldError),
    #[error("the DeploymentRuntimeConfig {config}: {field}: {why}")]
    RuntimeConfig {
        config: String,
        field: String,
        why: String,
    },
}

/// The settings of the DeploymentRuntimeConfig `config` whose
/// `spec.deploymentTemplate` is `template`.
pub fn runtime_settings(
    config: &str,
    template: Option<&Value>,
) -> Result<RuntimeSettings, DefError> {
    let mut settings = RuntimeSettings::default();
    let Some(template) = template else {
        return Ok(settings);
    };
    let bad = |field: &str, why: String| DefError::RuntimeConfig {
        config: config.to_owned(),
        field: field.to_owned(),
        why,
    };
    let mut ignored = Vec::new();
    if let Some(top) = template.as_object() {
        for key in top.keys().filter(|k| *k != "spec") {
            ignored.push(format!("deploymentTemplate.{key}"));
        }
    }
    let spec = &template["spec"];
    if let Some(spec) = spec.as_object() {
        for key in spec.keys().filter(|k| *k != "template") {
            ignored.push(format!("deploymentTemplate.spec.{key}"));
        }
    }
    let pod = &spec["template"]["spec"];
    if let Some(pod) = pod.as_object() {
        for key in pod.keys().filter(|k| *k != "containers") {
            ignored.push(format!("deploymentTemplate.spec.template.spec.{key}"));
        }
    }
    let containers = pod["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let path = "deploymentTemplate.spec.template.spec.containers";
    for c in containers {
        if c["name"] != RUNTIME_CONTAINER {
            ignored.push(format!("{path}[{}]", c["name"].as_str().unwrap_or("?")));
        }
    }
    let Some(container) = containers.iter().find(|c| c["name"] == RUNTIME_CONTAINER) else {
        settings.ignored = ignored;
        return Ok(settings);
    };
    let at = format!("{path}[{RUNTIME_CONTAINER}]");
    if let Some(fields) = container.as_object() {
        for key in fields
            .keys()
            .filter(|k| !matches!(k.as_str(), "name" | "resources" | "env" | "args"))
        {
            ignored.push(format!("{at}.{key}"));
        }
    }
    let limits = &container["resources"]["limits"];
    if let Some(memory) = limits.get("memory") {
        let field = format!("{at}.resources.limits.memory");
        let text = quantity_text(memory).ok_or_else(|| bad(&field, "not a quantity".into()))?;
        let bytes = quantity::parse_memory_limit(&text).map_err(|e| bad(&field, e.to_string()))?;
        settings.limits.memory_bytes = Some(bytes);
    }
    if let Some(cpu) = limits.get("cpu") {
        let field = format!("{at}.resources.limits.cpu");
        let text = quantity_text(cpu).ok_or_else(|| bad(&field, "not a quantity".into()))?;
        let millis = quantity::parse_cpu_limit(&text).map_err(|e| bad(&field, e.to_string()))?;
        settings.limits.cpu_millis = Some(millis);
    }
    if container["resources"].get("requests").is_some() {
        ignored.push(format!("{at}.resources.requests"));
    }
    let env = container["env"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if env.len() > MAX_LIST {
        return Err(bad(
            &format!("{at}.env"),
            format!("more than {MAX_LIST} entries"),
        ));
    }
    let mut vars = std::collections::BTreeMap::new();
    for (i, var) in env.iter().enumerate() {
        let field = format!("{at}.env[{i}]");
        let name = var["name"]
            .as_str()
            .ok_or_else(|| bad(&field, "no name".into()))?;
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(bad(
                &field,
                format!("{} is not a variable name", fnrun_api::Quoted::new(name)),
            ));
        }
        match (&var["value"], var.get("valueFrom")) {
            (_, Some(_)) => ignored.push(format!("{field}.valueFrom")),
            (Value::String(value), None) => {
                if value.contains('\0') {
                    return Err(bad(&field, "the value holds a NUL byte".into()));
                }
                vars.insert(name.to_owned(), value.clone());
            }
            (Value::Null, None) => {
                vars.insert(name.to_owned(), String::new());
            }
            (_, None) => return Err(bad(&field, "the value is not a string".into())),
        }
    }
    settings.env = vars.into_iter().collect();
    let args = container["args"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if args.len() > MAX_LIST {
        return Err(bad(
            &format!("{at}.args"),
            format!("more than {MAX_LIST} entries"),
        ));
    }
    for (i, arg) in args.iter().enumerate() {
        let field = format!("{at}.args[{i}]");
        let arg = arg
            .as_str()
            .ok_or_else(|| bad(&field, "not a string".into()))?;
        if arg.contains('\0') {
            return Err(bad(&field, "holds a NUL byte".into()));
        }
        settings.args.push(arg.to_owned());
    }
    settings.ignored = ignored;
    Ok(settings)
}

/// A quantity as Kubernetes writes it: a string, or a bare number.
fn quantity_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The function the host serves for Function `name` whose active revision
/// `revision` runs `image`, with these settings and pull secrets.
pub fn function_def(
    name: &str,
    revision: &str,
    image: Option<&str>,
    settings: &RuntimeSettings,
    pull_secrets: Vec<PullSecretData>,
) -> Result<FunctionDef, DefError> {
    let image = image.ok_or_else(|| DefError::NoImage {
        revision: revision.to_owned(),
    })?;
    catalogue::check_dns_label(name).map_err(DefError::Name)?;
    catalogue::check_image(image).map_err(DefError::Image)?;
    let mut def = FunctionDef::new(name, image).map_err(DefError::Name)?;
    def.limits = settings.limits;
    def.env = settings.env.clone();
    def.args = settings.args.clone();
    if !pull_secrets.is_empty() {
        def.credentials = CredentialSource::PullSecrets(pull_secrets);
    }
    Ok(def)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_package_runtime_container_gives_limits_env_and_args() {
        let template = json!({
            "metadata": {"labels": {"a": "b"}},
            "spec": {
                "replicas": 3,
                "template": {"spec": {
                    "serviceAccountName": "x",
                    "containers": [
                        {"name": "sidecar", "image": "busybox"},
                        {
                            "name": "package-runtime",
                            "image": "ignored",
                            "args": ["--debug"],
                            "env": [
                                {"name": "B", "value": "2"},
                                {"name": "A", "value": "1"},
                                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                            ],
                            "resources": {
                                "limits": {"memory": "256Mi", "cpu": "500m"},
                                "requests": {"memory": "64Mi"},
                            },
                        },
                    ],
                }},
            },
        });
        let s = runtime_settings("default", Some(&template)).unwrap();
        assert_eq!(s.limits.memory_bytes, Some(256 << 20));
        assert_eq!(s.limits.cpu_millis, Some(500));
        assert_eq!(s.limits.pids, None);
        assert_eq!(
            s.env,
            vec![("A".into(), "1".into()), ("B".into(), "2".into())]
        );
        assert_eq!(s.args, vec!["--debug".to_owned()]);
        for path in [
            "deploymentTemplate.metadata",
            "deploymentTemplate.spec.replicas",
            "deploymentTemplate.spec.template.spec.serviceAccountName",
            "deploymentTemplate.spec.template.spec.containers[sidecar]",
            "deploymentTemplate.spec.template.spec.containers[package-runtime].image",
            "deploymentTemplate.spec.template.spec.containers[package-runtime].resources.requests",
            "deploymentTemplate.spec.template.spec.containers[package-runtime].env[2].valueFrom",
        ] {
            assert!(
                s.ignored.iter().any(|i| i == path),
                "{path}: {:?}",
                s.ignored
            );
        }
    }

    #[test]
    fn no_template_or_no_runtime_container_gives_the_defaults() {
        assert_eq!(
            runtime_settings("default", None).unwrap(),
            RuntimeSettings::default()
        );
        let s = runtime_settings("c", Some(&json!({"spec": {"template": {"spec": {}}}}))).unwrap();
        assert_eq!(s, RuntimeSettings::default());
    }

    #[test]
    fn bad_runtime_settings_name_the_config_and_the_field() {
        for (container, field) in [
            (
                json!({"resources": {"limits": {"memory": "lots"}}}),
                "resources.limits.memory",
            ),
            (
                json!({"resources": {"limits": {"cpu": "0"}}}),
                "resources.limits.cpu",
            ),
            (
                json!({"resources": {"limits": {"memory": "128m"}}}),
                "resources.limits.memory: \"128m\" is 128 thousandths of a byte",
            ),
            (
                json!({"resources": {"limits": {"memory": "0"}}}),
                "resources.limits.memory",
            ),
            (
                json!({"resources": {"limits": {"cpu": true}}}),
                "resources.limits.cpu",
            ),
            (json!({"env": [{"name": "A=B", "value": "x"}]}), "env[0]"),
            (json!({"env": [{"value": "x"}]}), "env[0]"),
            (json!({"env": [{"name": "A", "value": 3}]}), "env[0]"),
            (json!({"args": [1]}), "args[0]"),
        ] {
            let mut container = container;
            container["name"] = json!("package-runtime");
            let template = json!({"spec": {"template": {"spec": {"containers": [container]}}}});
            let err = runtime_settings("mine", Some(&template))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("the DeploymentRuntimeConfig mine: "),
                "{err}"
            );
            assert!(
                err.contains(&format!("[package-runtime].{field}")),
                "{field}: {err}"
            );
        }
        let many: Vec<Value> = (0..=MAX_LIST).map(|i| json!(format!("--a{i}"))).collect();
        let template = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "package-runtime", "args": many}
        ]}}}});
        assert!(runtime_settings("mine", Some(&template)).is_err());
    }

    #[test]
    fn a_function_def_takes_the_image_settings_and_secrets() {
        let settings = RuntimeSettings {
            limits: Limits {
                memory_bytes: Some(1 << 20),
                ..Limits::default()
            },
            env: vec![("A".into(), "1".into())],
            args: vec!["--debug".into()],
            ignored: vec![],
        };
        let secret = PullSecretData {
            origin: "secret crossplane-system/pull".into(),
            dockerconfigjson: std::sync::Arc::from(&b"{}"[..]),
        };
        let def = function_def(
            "fn-a",
            "fn-a-1",
            Some("r.example/f:v1"),
            &settings,
            vec![secret.clone()],
        )
        .unwrap();
        assert_eq!(def.name, "fn-a");
        assert_eq!(def.image, "r.example/f:v1");
        assert_eq!(def.limits.memory_bytes, Some(1 << 20));
        assert_eq!(def.env, settings.env);
        assert_eq!(def.args, settings.args);
        assert_eq!(def.credentials, CredentialSource::PullSecrets(vec![secret]));
        let def = function_def(
            "fn-a",
            "r",
            Some("r.example/f:v1"),
            &RuntimeSettings::default(),
            vec![],
        )
        .unwrap();
        assert_eq!(def.credentials, CredentialSource::DaemonDockerConfig);

        let err = function_def("fn-a", "fn-a-1", None, &settings, vec![]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the active FunctionRevision fn-a-1 names no image (spec.image)"
        );
        let err = function_def("fn.a", "r", Some("i"), &settings, vec![]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the Function's name \"fn.a\" is not a DNS label"),
            "{err}"
        );
    }
}
