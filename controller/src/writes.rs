//! What the leader writes through the API: each Function's Service, its
//! revisions' status, and Events. Built by [`crate::status`]; the reconcile
//! decides when.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;

use crate::resources::{Function, FunctionRevision, PACKAGE_LABEL};
use crate::status::{self, Health};
use crate::{Config, FIELD_MANAGER};

/// The leader's writes.
pub(crate) struct Writer {
    client: Client,
    config: Config,
    services: Store<Service>,
    revisions: Store<FunctionRevision>,
    /// Whether this replica leads: only then is anything written.
    leader: watch::Receiver<bool>,
    recorder: Recorder,
    /// Why a Function's Service is not written, as last reported.
    service_problems: Mutex<HashMap<String, String>>,
}

impl Writer {
    pub(crate) fn new(
        client: Client,
        config: Config,
        services: Store<Service>,
        revisions: Store<FunctionRevision>,
        leader: watch::Receiver<bool>,
    ) -> Writer {
        Writer {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "fnrun".into(),
                    instance: Some(config.identity.clone()),
                },
            ),
            client,
            config,
            services,
            revisions,
            leader,
            service_problems: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this replica leads (and writes).
    pub(crate) fn leads(&self) -> bool {
        *self.leader.borrow()
    }

    /// Forgets what was reported of the deleted Function `name`.
    pub(crate) fn forget(&self, name: &str) {
        self.service_problems
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
    }
}

impl Writer {
    /// The leader's write of `function`'s Service ([`status::service`]):
    /// created if there is none, made as it should be if fnrun made it
    /// ([`status::made_by_fnrun`]). A Service of that name that fnrun did not
    /// make is never written (nor deleted: fnrun deletes no Service): the answer
    /// is why, for the revision's `RuntimeHealthy` (and an Event and a log
    /// line when it is first seen).
    pub(crate) async fn write_service(
        &self,
        function: &Function,
    ) -> Result<Option<String>, kube::Error> {
        let name = function.name_any();
        let ns = &self.config.namespace;
        let uid = function.uid().unwrap_or_default();
        let mut service = status::service(&name, &uid, &self.config);
        let why = match status::check_service(&service) {
            Err(why) => Some(why),
            Ok(()) => {
                let api = Api::<Service>::namespaced(self.client.clone(), ns);
                // The store holds the Services with fnrun's label; one
                // without it is asked for.
                let existing = match self.services.get(&ObjectRef::new(&name).within(ns)) {
                    Some(svc) => Some(svc),
                    None => api.get_opt(&name).await?.map(Arc::new),
                };
                match existing {
                    // Created, never applied over: a Service of that name
                    // made meanwhile by someone else makes it fail
                    // (AlreadyExists) and is looked at on the retry.
                    None => {
                        let svc: Service =
                            serde_json::from_value(service).expect("status::service is a Service");
                        let params = PostParams {
                            field_manager: Some(FIELD_MANAGER.into()),
                            ..PostParams::default()
                        };
                        api.create(&params, &svc).await?;
                        tracing::info!(
                            function = name,
                            service = format!("{ns}/{name}"),
                            "Service created"
                        );
                        None
                    }
                    Some(svc) if !status::made_by_fnrun(&svc, &name) => {
                        Some(status::service_conflict(ns, &name))
                    }
                    Some(svc) => {
                        let current = svc.owner_references().iter().any(|o| o.uid == uid)
                            && serde_json::to_value(&svc.spec).is_ok_and(|spec| {
                                spec["selector"] == service["spec"]["selector"]
                                    && spec["ports"][0]["port"]
                                        == service["spec"]["ports"][0]["port"]
                            });
                        if !current {
                            // The uid is a precondition: a Service deleted
                            // and made again by someone else since it was
                            // read is not applied over.
                            service["metadata"]["uid"] = svc.uid().unwrap_or_default().into();
                            let params = PatchParams::apply(FIELD_MANAGER).force();
                            api.patch(&name, &params, &Patch::Apply(&service)).await?;
                            tracing::info!(
                                function = name,
                                service = format!("{ns}/{name}"),
                                "Service applied"
                            );
                        }
                        None
                    }
                }
            }
        };
        let first = {
            let mut reported = self
                .service_problems
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &why {
                Some(why) => reported.insert(name.clone(), why.clone()).as_ref() != Some(why),
                None => {
                    reported.remove(&name);
                    false
                }
            }
        };
        if let (true, Some(why)) = (first, &why) {
            tracing::warn!(
                function = name,
                service = format!("{ns}/{name}"),
                error = why,
                "the Function's Service is not written"
            );
            self.publish_on_active(
                &name,
                Event {
                    type_: EventType::Warning,
                    reason: "ServiceConflict".into(),
                    note: Some(fnrun_api::text::bounded(why, 1000).into_owned()),
                    action: "WriteService".into(),
                    secondary: None,
                },
            )
            .await;
        }
        Ok(why)
    }

    /// The leader's write of the runtime's status of each of `function`'s
    /// revisions (the active one with `health`).
    pub(crate) async fn write_status(
        &self,
        function: &Function,
        revisions: &[Arc<FunctionRevision>],
        health: Option<&Health>,
    ) -> Result<(), kube::Error> {
        let name = function.name_any();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let now = now();
        let api = Api::<FunctionRevision>::all(self.client.clone());
        for rev in revisions {
            let applied = status::revision_status(rev, &name, health, &self.config, &now);
            if status::already_applied(rev, &applied) {
                continue;
            }
            api.patch_status(&rev.name_any(), &params, &Patch::Apply(&applied))
                .await?;
            tracing::info!(
                function = name,
                revision = rev.name_any(),
                active = rev.is_active(),
                health = ?health,
                "FunctionRevision status applied"
            );
        }
        Ok(())
    }

    /// An Event on `name`'s active revision about a trial start (the leader's
    /// only: every replica starts its own).
    pub(crate) async fn event_on_active(
        &self,
        name: &str,
        result: &Result<(), String>,
        image: &str,
    ) {
        let event = match result {
            Ok(()) => Event {
                type_: EventType::Normal,
                reason: "Started".into(),
                note: Some(format!("fnrun pulled {image} and its server answered")),
                action: "TrialStart".into(),
                secondary: None,
            },
            Err(why) => Event {
                type_: EventType::Warning,
                reason: "StartFailed".into(),
                note: Some(fnrun_api::text::bounded(why, 1000).into_owned()),
                action: "TrialStart".into(),
                secondary: None,
            },
        };
        self.publish_on_active(name, event).await;
    }

    /// `event` on `name`'s active revision, if this replica leads.
    pub(crate) async fn publish_on_active(&self, name: &str, event: Event) {
        if !*self.leader.borrow() {
            return;
        }
        let Some(rev) = self.revisions.state().into_iter().find(|r| {
            r.labels().get(PACKAGE_LABEL).map(String::as_str) == Some(name) && r.is_active()
        }) else {
            return;
        };
        if let Err(e) = self.recorder.publish(&event, &rev.object_ref(&())).await {
            tracing::debug!(error = %e, "cannot publish an Event");
        }
    }
}

/// Now, as a condition's `lastTransitionTime` (RFC 3339, seconds).
fn now() -> String {
    let time = Time(k8s_openapi::jiff::Timestamp::now());
    serde_json::to_value(time)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_rfc3339() {
        let now = now();
        assert_eq!(now.len(), "2026-11-26T05:00:00Z".len(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
    }
}
