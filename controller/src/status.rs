//! What the leader writes, as server-side apply objects: a Service per
//! Function, and the runtime's part of each FunctionRevision's status. Pure:
//! built here, sent by the reconciler.

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::resources::{Condition, FunctionRevision};
use crate::{Config, SERVICE_PORT};

/// Labels of the Services fnrun owns: found again by them after a restart.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fnrun");
/// The label naming a Service's Function.
pub const FUNCTION_LABEL: &str = "pkg.crossplane.io/function";

/// Condition types and reasons, as Crossplane's Deployment runtime writes
/// them (`pkg.crossplane.io/v1`).
pub const RUNTIME_HEALTHY: &str = "RuntimeHealthy";
pub const RUNTIME_ACTIVE: &str = "RuntimeActive";
const REASON_HEALTHY: &str = "HealthyPackageRevision";
const REASON_UNHEALTHY: &str = "UnhealthyPackageRevision";
/// `RuntimeHealthy` False: the Function's runtime config asks for a limit
/// this fnrun cannot enforce (see [`crate::LimitPolicy`]).
pub const REASON_UNENFORCEABLE: &str = "UnenforceableLimits";
const REASON_UNKNOWN: &str = "UnknownPackageRevisionHealth";
const REASON_ACTIVE: &str = "ActivePackageRevision";
const REASON_INACTIVE: &str = "InactivePackageRevision";

/// Most bytes of a condition's message (a start failure's output tail).
pub const MESSAGE_MAX: usize = 2048;

/// The endpoint Crossplane dials for Function `name`: the same for every
/// revision.
pub fn endpoint(name: &str, namespace: &str) -> String {
    format!("dns:///{name}.{namespace}:{SERVICE_PORT}")
}

/// The Service of Function `name` (uid `uid`), owned by it.
pub fn service(name: &str, uid: &str, config: &Config) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": config.namespace,
            "labels": {
                MANAGED_BY.0: MANAGED_BY.1,
                FUNCTION_LABEL: name,
            },
            "ownerReferences": [{
                "apiVersion": "pkg.crossplane.io/v1",
                "kind": "Function",
                "name": name,
                "uid": uid,
            }],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": config.service_selector,
            "ports": [{
                "name": "grpc",
                "port": SERVICE_PORT,
                "targetPort": SERVICE_PORT,
                "protocol": "TCP",
            }],
        },
    })
}

/// Whether fnrun made `svc`, the Service of Function `name`: it has fnrun's
/// `app.kubernetes.io/managed-by` label, an owner reference to a Function of
/// that name (of any uid: a Function deleted and made again under the same
/// name while fnrun was down gets its Service back), and fnrun among its
/// field managers. A Service that lacks any of them is someone else's, and
/// fnrun neither writes nor deletes it.
pub fn made_by_fnrun(svc: &Service, name: &str) -> bool {
    let meta = &svc.metadata;
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1);
    let owned = meta.owner_references.iter().flatten().any(|o| {
        o.kind == "Function"
            && o.name == name
            && o.api_version.split('/').next() == Some("pkg.crossplane.io")
    });
    let managed = meta
        .managed_fields
        .iter()
        .flatten()
        .any(|f| f.manager.as_deref() == Some(crate::FIELD_MANAGER));
    labelled && owned && managed
}

/// Why fnrun leaves the Service `namespace/name` alone: it exists and fnrun
/// did not make it (see [`made_by_fnrun`]).
pub fn service_conflict(namespace: &str, name: &str) -> String {
    format!(
        "the Service {namespace}/{name} exists and fnrun did not create it (it lacks the label \
         {}={}, an owner reference to this Function or fnrun's field manager): fnrun leaves it \
         alone and gives this Function no endpoint; delete that Service or install the Function \
         under another name",
        MANAGED_BY.0, MANAGED_BY.1
    )
}

/// Checks a Service fnrun is about to write: a ClusterIP Service only, with
/// no `externalIPs`, `externalName` and no `loadBalancer*` field, which would
/// route traffic from outside the cluster (the CVE-2020-8554 class) or ask a
/// cloud for an address. [`service`] writes none of them; this holds
/// whatever a later change of it would write.
pub fn check_service(svc: &Value) -> Result<(), String> {
    let spec = &svc["spec"];
    let name = svc["metadata"]["name"].as_str().unwrap_or_default();
    match spec.get("type").and_then(Value::as_str) {
        Some("ClusterIP") => {}
        other => {
            return Err(format!(
                "fnrun refuses to write the Service {name} of type {}: only ClusterIP",
                other.unwrap_or("(none)")
            ));
        }
    }
    let refused = spec.as_object().into_iter().flatten().find(|(k, v)| {
        !v.is_null()
            && (*k == "externalIPs" || *k == "externalName" || k.starts_with("loadBalancer"))
    });
    if let Some((field, _)) = refused {
        return Err(format!(
            "fnrun refuses to write the Service {name} with spec.{field}"
        ));
    }
    Ok(())
}

/// Why a Function cannot be served yet as its objects say (a pull secret
/// missing, a runtime config fnrun cannot honour, the CA unusable): not a
/// failure of the API, but what its active revision's `RuntimeHealthy` says,
/// with `reason`, until the reconcile tried again finds it solved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CannotServe {
    /// The condition's reason.
    pub reason: &'static str,
    pub message: String,
}

impl CannotServe {
    pub fn new(message: impl Into<String>) -> Self {
        CannotServe {
            reason: REASON_UNHEALTHY,
            message: message.into(),
        }
    }
}

/// How the runtime of an active revision is, as fnrun knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Its image has been pulled and its server answered.
    Healthy,
    /// Being pulled and started.
    Starting,
    /// It cannot be served: why.
    Unhealthy(String),
    /// Its objects ask for what fnrun cannot do (a limit it cannot enforce,
    /// a pull secret it cannot read): why, with the condition's reason.
    Refused(CannotServe),
    /// Served, but without what [`Health::Refused`] would name, as the
    /// operator chose (`--best-effort-limits`): what it runs without.
    HealthyWithout(String),
    /// It has no Service fnrun may write (see [`service_conflict`]), hence no
    /// endpoint: why.
    NoService(String),
}

/// The status fnrun applies to revision `rev` of Function `name`: for the
/// active one the endpoint, the TLS Secret and both conditions; for another
/// `RuntimeActive` False only. A condition whose status does not change
/// keeps its `lastTransitionTime`.
pub fn revision_status(
    rev: &FunctionRevision,
    name: &str,
    health: Option<&Health>,
    config: &Config,
    now: &str,
) -> Value {
    let rev_name = rev.metadata.name.clone().unwrap_or_default();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let since = rev
            .condition(type_)
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.to_owned());
        let mut c = json!({
            "type": type_,
            "status": status,
            "reason": reason,
            "lastTransitionTime": since,
        });
        if !message.is_empty() {
            c["message"] = json!(fnrun_api::text::bounded(message, MESSAGE_MAX));
        }
        c
    };
    let mut status = serde_json::Map::new();
    match health {
        Some(health) if rev.is_active() => {
            // Without a Service of fnrun's the endpoint would name someone
            // else's: none is written (and fnrun's earlier one goes).
            let served = !matches!(health, Health::NoService(_));
            if served {
                status.insert("endpoint".into(), json!(endpoint(name, &config.namespace)));
                if let Some(secret) = &config.ca_secret {
                    status.insert("tlsServerSecretName".into(), json!(secret));
                }
            }
            let healthy = match health {
                Health::Healthy => condition(RUNTIME_HEALTHY, "True", REASON_HEALTHY, ""),
                Health::HealthyWithout(what) => {
                    condition(RUNTIME_HEALTHY, "True", REASON_HEALTHY, what)
                }
                // A revision already healthy stays so while a replica that
                // just started (or took the lead) tries it again: a restart
                // of fnrun does not flap the Function's health.
                Health::Starting
                    if rev
                        .condition(RUNTIME_HEALTHY)
                        .is_some_and(|c| c.status == "True") =>
                {
                    condition(RUNTIME_HEALTHY, "True", REASON_HEALTHY, "")
                }
                Health::Starting => condition(
                    RUNTIME_HEALTHY,
                    "Unknown",
                    REASON_UNKNOWN,
                    "fnrun is pulling the function's image and starting its server",
                ),
                Health::Unhealthy(why) | Health::NoService(why) => {
                    condition(RUNTIME_HEALTHY, "False", REASON_UNHEALTHY, why)
                }
                Health::Refused(why) => {
                    condition(RUNTIME_HEALTHY, "False", why.reason, &why.message)
                }
            };
            let active = if served {
                condition(
                    RUNTIME_ACTIVE,
                    "True",
                    REASON_ACTIVE,
                    &format!("served by fnrun at {}", endpoint(name, &config.namespace)),
                )
            } else {
                condition(
                    RUNTIME_ACTIVE,
                    "True",
                    REASON_ACTIVE,
                    "fnrun runs it but gives it no endpoint: see RuntimeHealthy",
                )
            };
            status.insert("conditions".into(), json!([healthy, active]));
        }
        _ => {
            status.insert(
                "conditions".into(),
                json!([condition(
                    RUNTIME_ACTIVE,
                    "False",
                    REASON_INACTIVE,
                    "not the active revision: fnrun does not serve it",
                )]),
            );
        }
    }
    json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "FunctionRevision",
        "metadata": {"name": rev_name},
        "status": Value::Object(status),
    })
}

/// Whether `rev` already says what `applied` would write (its conditions
/// and fields), so that nothing needs to be sent.
pub fn already_applied(rev: &FunctionRevision, applied: &Value) -> bool {
    let have = serde_json::to_value(&rev.status).unwrap_or_default();
    let want = &applied["status"];
    for key in ["endpoint", "tlsServerSecretName"] {
        if let Some(v) = want.get(key)
            && have.get(key) != Some(v)
        {
            return false;
        }
    }
    let Some(conditions) = want["conditions"].as_array() else {
        return true;
    };
    conditions.iter().all(|want| {
        let Ok(want) = serde_json::from_value::<Condition>(want.clone()) else {
            return false;
        };
        rev.condition(&want.type_).is_some_and(|have| {
            have.status == want.status && have.reason == want.reason && have.message == want.message
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{FunctionRevisionSpec, FunctionRevisionStatus};

    fn config() -> Config {
        Config {
            namespace: "crossplane-system".into(),
            ca_secret: Some("crossplane-root-ca".into()),
            identity: "a".into(),
            lease: "fnrun-functions".into(),
            service_selector: [("app".to_owned(), "fnrun".to_owned())].into(),
            idle_timeout: None,
            start_timeout: std::time::Duration::from_secs(60),
            limits: crate::LimitPolicy {
                support: fnrun_sandbox::LimitSupport {
                    memory: fnrun_sandbox::Enforcement::Unavailable("no cgroup".into()),
                    cpu: fnrun_sandbox::Enforcement::Unavailable("no cgroup".into()),
                    pids: fnrun_sandbox::Enforcement::Rlimit,
                },
                best_effort: false,
            },
        }
    }

    fn revision(state: &str, conditions: Vec<Condition>) -> FunctionRevision {
        let mut rev = FunctionRevision::new(
            "fn-a-1234",
            FunctionRevisionSpec {
                desired_state: state.into(),
                ..Default::default()
            },
        );
        rev.status = Some(FunctionRevisionStatus {
            conditions,
            ..Default::default()
        });
        rev
    }

    #[test]
    fn the_service_selects_fnrun_and_is_owned_by_the_function() {
        let svc = service("fn-a", "uid-1", &config());
        assert_eq!(svc["metadata"]["namespace"], "crossplane-system");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["kind"], "Function");
        assert_eq!(svc["metadata"]["labels"][MANAGED_BY.0], "fnrun");
        assert_eq!(svc["spec"]["selector"]["app"], "fnrun");
        assert_eq!(svc["spec"]["ports"][0]["port"], 9443);
    }

    #[test]
    fn the_active_revision_gets_endpoint_secret_and_both_conditions() {
        let rev = revision("Active", vec![]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Healthy), &config(), "T1");
        let status = &applied["status"];
        assert_eq!(status["endpoint"], "dns:///fn-a.crossplane-system:9443");
        assert_eq!(status["tlsServerSecretName"], "crossplane-root-ca");
        assert_eq!(status["conditions"][0]["type"], "RuntimeHealthy");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["conditions"][0]["reason"], "HealthyPackageRevision");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "T1");
        assert_eq!(status["conditions"][1]["type"], "RuntimeActive");
        assert!(!already_applied(&rev, &applied));

        let failed = Health::Unhealthy(format!("pull failed: {}", "x".repeat(5000)));
        let applied = revision_status(&rev, "fn-a", Some(&failed), &config(), "T1");
        let c = &applied["status"]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert!(
            c["message"].as_str().unwrap().len() <= MESSAGE_MAX + 64,
            "{c}"
        );
    }

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let old = Condition {
            type_: "RuntimeHealthy".into(),
            status: "True".into(),
            reason: "HealthyPackageRevision".into(),
            message: String::new(),
            last_transition_time: Some("T0".into()),
        };
        let rev = revision("Active", vec![old]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Healthy), &config(), "T1");
        assert_eq!(
            applied["status"]["conditions"][0]["lastTransitionTime"],
            "T0"
        );
        let failed = Health::Unhealthy("gone".into());
        let applied = revision_status(&rev, "fn-a", Some(&failed), &config(), "T1");
        assert_eq!(
            applied["status"]["conditions"][0]["lastTransitionTime"],
            "T1"
        );
        assert_eq!(applied["status"]["conditions"][0]["status"], "False");
    }

    #[test]
    fn a_healthy_revision_stays_healthy_while_it_is_tried_again() {
        let rev = revision("Active", vec![]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Starting), &config(), "T1");
        assert_eq!(applied["status"]["conditions"][0]["status"], "Unknown");
        let healthy = Condition {
            type_: "RuntimeHealthy".into(),
            status: "True".into(),
            reason: "HealthyPackageRevision".into(),
            message: String::new(),
            last_transition_time: Some("T0".into()),
        };
        let rev = revision("Active", vec![healthy]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Starting), &config(), "T1");
        assert_eq!(applied["status"]["conditions"][0]["status"], "True");
        assert_eq!(
            applied["status"]["conditions"][0]["lastTransitionTime"],
            "T0"
        );
        assert!(already_applied(&rev, &applied) || rev.condition("RuntimeActive").is_none());
    }

    #[test]
    fn a_limit_fnrun_cannot_enforce_is_said_on_the_revision() {
        let rev = revision("Active", vec![]);
        let limits = fnrun_sandbox::Limits {
            memory_bytes: Some(200 << 20),
            ..Default::default()
        };
        let why = config().limits.unenforceable(&limits).unwrap();
        assert!(why.contains("memory (no cgroup)"), "{why}");
        // Refused: False, with its own reason.
        let refused = Health::Refused(CannotServe {
            reason: REASON_UNENFORCEABLE,
            message: why.clone(),
        });
        let applied = revision_status(&rev, "fn-a", Some(&refused), &config(), "T1");
        let healthy = &applied["status"]["conditions"][0];
        assert_eq!(healthy["type"], "RuntimeHealthy");
        assert_eq!(healthy["status"], "False");
        assert_eq!(healthy["reason"], "UnenforceableLimits");
        assert_eq!(healthy["message"], why.as_str());
        // Served without it (--best-effort-limits): True, and says so.
        let without = Health::HealthyWithout(format!("served without: {why}"));
        let applied = revision_status(&rev, "fn-a", Some(&without), &config(), "T1");
        let healthy = &applied["status"]["conditions"][0];
        assert_eq!(healthy["status"], "True");
        assert!(
            healthy["message"]
                .as_str()
                .unwrap()
                .starts_with("served without"),
            "{healthy}"
        );
        // Nothing asked that cannot be enforced: nothing said.
        let pids_only = fnrun_sandbox::Limits {
            pids: Some(10),
            ..Default::default()
        };
        assert_eq!(config().limits.unenforceable(&pids_only), None);
    }

    #[test]
    fn an_inactive_revision_gets_runtime_active_false_only() {
        let rev = revision("Inactive", vec![]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Healthy), &config(), "T1");
        assert!(applied["status"].get("endpoint").is_none());
        let conditions = applied["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "RuntimeActive");
        assert_eq!(conditions[0]["status"], "False");
    }

    #[test]
    fn what_is_already_there_is_not_written_again() {
        let rev = revision("Active", vec![]);
        let applied = revision_status(&rev, "fn-a", Some(&Health::Healthy), &config(), "T1");
        let mut written = rev.clone();
        let status: FunctionRevisionStatus =
            serde_json::from_value(applied["status"].clone()).unwrap();
        written.status = Some(status);
        assert!(already_applied(&written, &applied));
        let failed = Health::Unhealthy("pull failed".into());
        let changed = revision_status(&written, "fn-a", Some(&failed), &config(), "T2");
        assert!(!already_applied(&written, &changed));
    }

    /// A Service as the API server returns it: `svc` (an applied object)
    /// with the field managers `managers`.
    fn stored(svc: &Value, managers: &[&str]) -> Service {
        let mut svc: Service = serde_json::from_value(svc.clone()).unwrap();
        svc.metadata.managed_fields = Some(
            managers
                .iter()
                .map(
                    |m| k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
                        manager: Some((*m).to_owned()),
                        operation: Some("Apply".into()),
                        ..Default::default()
                    },
                )
                .collect(),
        );
        svc
    }

    #[test]
    fn only_a_service_fnrun_made_for_this_function_is_fnruns() {
        let ours = service("fn-a", "uid-1", &config());
        assert!(made_by_fnrun(&stored(&ours, &["fnrun"]), "fn-a"));
        // Made for a Function of the same name deleted since: still fnrun's.
        assert!(made_by_fnrun(
            &stored(&service("fn-a", "uid-0", &config()), &["fnrun"]),
            "fn-a"
        ));
        // Another Function's, or someone else's apply of the same object.
        assert!(!made_by_fnrun(&stored(&ours, &["fnrun"]), "fn-b"));
        assert!(!made_by_fnrun(&stored(&ours, &["kubectl"]), "fn-a"));
        // Crossplane's webhook Service, as Helm makes it: no label of fnrun's,
        // no owner.
        let webhooks = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "crossplane-webhooks", "namespace": "crossplane-system",
                         "labels": {"app.kubernetes.io/managed-by": "Helm"}},
            "spec": {"selector": {"app": "crossplane"}, "ports": [{"port": 9443}]},
        });
        assert!(!made_by_fnrun(
            &stored(&webhooks, &["helm"]),
            "crossplane-webhooks"
        ));
        // fnrun's label forged on a Service with no owner reference.
        let mut forged = ours.clone();
        forged["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
        assert!(!made_by_fnrun(&stored(&forged, &["fnrun"]), "fn-a"));
        let mut unlabelled = ours.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        assert!(!made_by_fnrun(&stored(&unlabelled, &["fnrun"]), "fn-a"));
        let why = service_conflict("crossplane-system", "crossplane-webhooks");
        assert!(
            why.starts_with("the Service crossplane-system/crossplane-webhooks exists"),
            "{why}"
        );
    }

    #[test]
    fn only_a_plain_cluster_ip_service_is_written() {
        let svc = service("fn-a", "uid-1", &config());
        assert_eq!(check_service(&svc), Ok(()));
        for (field, value) in [
            ("externalIPs", json!(["203.0.113.7"])),
            ("loadBalancerIP", json!("203.0.113.7")),
            ("loadBalancerSourceRanges", json!(["0.0.0.0/0"])),
            ("loadBalancerClass", json!("x")),
            ("externalName", json!("example.org")),
        ] {
            let mut bad = svc.clone();
            bad["spec"][field] = value;
            let error = check_service(&bad).unwrap_err();
            assert_eq!(
                error,
                format!("fnrun refuses to write the Service fn-a with spec.{field}")
            );
        }
        for type_ in ["LoadBalancer", "NodePort", "ExternalName"] {
            let mut bad = svc.clone();
            bad["spec"]["type"] = json!(type_);
            assert_eq!(
                check_service(&bad).unwrap_err(),
                format!("fnrun refuses to write the Service fn-a of type {type_}: only ClusterIP")
            );
        }
        let mut untyped = svc.clone();
        untyped["spec"].as_object_mut().unwrap().remove("type");
        assert!(check_service(&untyped).is_err());
    }

    #[test]
    fn a_revision_without_a_service_gets_no_endpoint() {
        let rev = revision("Active", vec![]);
        let why = service_conflict("crossplane-system", "fn-a");
        let applied = revision_status(
            &rev,
            "fn-a",
            Some(&Health::NoService(why.clone())),
            &config(),
            "T1",
        );
        let status = &applied["status"];
        assert!(status.get("endpoint").is_none(), "{status}");
        assert!(status.get("tlsServerSecretName").is_none(), "{status}");
        assert_eq!(status["conditions"][0]["type"], "RuntimeHealthy");
        assert_eq!(status["conditions"][0]["status"], "False");
        assert_eq!(status["conditions"][0]["message"], why.as_str());
    }
}
