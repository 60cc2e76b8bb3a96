//! What Kubernetes mode watches: a reflector store per kind, kept by the
//! stream the controller polls, with what the start needs to know of it
//! (whether its first list is in, the last error its watch met), and the
//! metadata a store need not keep stripped from every object.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::FIELD_MANAGER;

/// What a 404 on Crossplane's kinds means.
pub(crate) const NO_CROSSPLANE_CRDS: &str =
    "Crossplane's CRDs are not installed (is Crossplane v1.14+ running?)";
/// Why nothing is served before every watched object has been read.
const WAITING_FOR_API: &str = "waiting for the API server";
/// Most bytes of a reason for not being ready.
pub(crate) const NOT_READY_MAX: usize = 400;
/// The annotation `kubectl apply` (client-side) keeps a copy of the object
/// in: never read, and as large as the object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a reflector watches, for the start: whether its first list is in,
/// and the last error its watch met.
pub(crate) struct Watched {
    pub(crate) what: String,
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) error: Arc<std::sync::Mutex<Option<String>>>,
}

/// A store of `api`'s objects (`what`, for the log), kept by a task of its
/// own, and the stream of its watch events, for the controller's triggers.
/// The task, not the controller, drives the watch: the start waits for
/// every store to be read before any reconcile runs. Errors are logged (and
/// the watch retried, with backoff) and left out of the stream; what
/// [`wait_until_read`] needs is pushed to `watched`. Each object is stored with what fnrun reads of its metadata
/// only ([`trim`]).
pub(crate) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    what: String,
    watched: &mut Vec<Watched>,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Event<K>> + Send + 'static,
)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let error = Arc::new(std::sync::Mutex::new(None));
    let ready = Arc::new(AtomicBool::new(false));
    let last_error = error.clone();
    let crossplane = K::group(&K::DynamicType::default()) == "pkg.crossplane.io";
    let watching = what.clone();
    let (events, received) = tokio::sync::mpsc::unbounded_channel();
    let stream = watcher::watcher(api, config)
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .filter_map(move |event| {
            let event = match event {
                Ok(event) => {
                    *last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    Some(event)
                }
                Err(e) => {
                    let error = watch_error(&e, crossplane);
                    tracing::warn!(watching, error, "cannot watch; retrying");
                    *last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                    None
                }
            };
            std::future::ready(event)
        });
    let is_ready = ready.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            // The first list is in the store. (Not `Store::wait_until_ready`:
            // the controller waits on the Functions' store that way, and
            // that wait wakes one waiter only.)
            if matches!(event, watcher::Event::InitDone) {
                is_ready.store(true, Ordering::Release);
            }
            // The controller gone (shutting down): the store is kept still.
            let _ = events.send(event);
        }
    });
    watched.push(Watched { what, ready, error });
    (
        reader,
        tokio_stream::wrappers::UnboundedReceiverStream::new(received),
    )
}

/// The objects of watch events that are in the store (added, changed, or
/// listed): what the controlled kind gives the controller (as kube's own
/// watch of it does).
pub(crate) fn applied<K>(
    events: impl Stream<Item = watcher::Event<K>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    events.flat_map(|event| {
        futures::stream::iter(match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some(Ok(o)),
            _ => None,
        })
    })
}

/// The objects of watch events, deleted ones too: what an owned or watched
/// kind gives the controller (as kube's `owns` and `watches` take them), so
/// that a deleted Service or revision, or the CA Secret deleted, reconciles
/// the Functions it concerns.
pub(crate) fn touched<K>(
    events: impl Stream<Item = watcher::Event<K>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    events.flat_map(|event| {
        futures::stream::iter(match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o) => {
                Some(Ok(o))
            }
            _ => None,
        })
    })
}

/// An object's metadata as fnrun keeps it: no `managedFields` but fnrun's
/// own entry, without its field set (a Service's is what says fnrun made
/// it, [`crate::status::made_by_fnrun`]), and no copy of the object in the
/// annotation `kubectl apply` keeps. The rest of each object is the little
/// its type deserializes ([`crate::resources`]).
pub(crate) fn trim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    if let Some(fields) = &mut meta.managed_fields {
        fields.retain(|f| f.manager.as_deref() == Some(FIELD_MANAGER));
        for f in fields.iter_mut() {
            f.fields_v1 = None;
        }
        if fields.is_empty() {
            meta.managed_fields = None;
        }
    }
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// What the log and the start's failure say of a watch's error: a 404 on
/// Crossplane's kinds is their CRDs missing.
pub(crate) fn watch_error(e: &watcher::Error, crossplane: bool) -> String {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    };
    if crossplane && code == Some(404) {
        NO_CROSSPLANE_CRDS.to_owned()
    } else {
        e.to_string()
    }
}

/// Waits until every store of `watched` has its first list, for at most
/// `timeout`; then fails, naming each one that has none and the last error
/// its watch met (a Forbidden names the permission `rbac.yaml` lacks). A
/// missing grant is often a moment's race with the RoleBinding being applied,
/// hence the wait; a grant that never comes fails the start, so that the pod
/// restarts and says why, rather than waiting forever with nothing served.
/// Meanwhile `readiness` says it waits for the API server, and the first
/// error met.
pub(crate) async fn wait_until_read(
    watched: &[Watched],
    timeout: Duration,
    readiness: Option<&fnrun_transport::readiness::Readiness>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let pending = || {
        watched
            .iter()
            .filter(|w| !w.ready.load(std::sync::atomic::Ordering::Acquire))
    };
    while pending().next().is_some() {
        if let Some(readiness) = readiness {
            let error = pending().find_map(|w| {
                let error = w.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
                error.map(|e| format!("{}: {e}", w.what))
            });
            readiness.not_ready(match error {
                Some(error) => {
                    fnrun_api::text::bounded(&format!("{WAITING_FOR_API} ({error})"), NOT_READY_MAX)
                        .into_owned()
                }
                None => WAITING_FOR_API.to_owned(),
            });
        }
        if Instant::now() >= deadline {
            let unread: Vec<String> = pending()
                .map(|w| {
                    let error = w.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    match error {
                        Some(error) => format!("{}: {error}", w.what),
                        None => format!("{}: no answer", w.what),
                    }
                })
                .collect();
            anyhow::bail!(
                "Kubernetes mode cannot read what it serves from (--functions-start-timeout {}): {}",
                fnrun_api::duration::format(timeout),
                unread.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(what: &str, ready: bool, error: Option<&str>) -> Watched {
        Watched {
            what: what.into(),
            ready: Arc::new(std::sync::atomic::AtomicBool::new(ready)),
            error: Arc::new(std::sync::Mutex::new(error.map(str::to_owned))),
        }
    }

    #[tokio::test]
    async fn the_start_fails_naming_what_it_could_not_read_and_why() {
        let all = [
            watched("Functions", true, None),
            watched(
                "the CA Secret ns/ca (--functions-ca-secret)",
                false,
                Some("secrets \"ca\" is forbidden"),
            ),
            watched("Services in ns", false, None),
        ];
        let error = wait_until_read(&all, Duration::from_millis(100), None)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "Kubernetes mode cannot read what it serves from (--functions-start-timeout 100ms): \
             the CA Secret ns/ca (--functions-ca-secret): secrets \"ca\" is forbidden; \
             Services in ns: no answer"
        );
    }

    #[tokio::test]
    async fn the_start_waits_for_every_store() {
        let all = [
            watched("Functions", true, None),
            watched("Services", false, None),
        ];
        let late = all[1].ready.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            late.store(true, std::sync::atomic::Ordering::Release);
        });
        wait_until_read(&all, Duration::from_secs(30), None)
            .await
            .unwrap();
        assert!(all[1].ready.load(std::sync::atomic::Ordering::Acquire));
    }

    #[tokio::test]
    async fn while_the_api_is_not_read_readiness_says_it_waits_for_it() {
        let readiness = fnrun_transport::readiness::Readiness::new("starting");
        let all = [
            watched("Functions", false, Some(NO_CROSSPLANE_CRDS)),
            watched("Services in ns", true, None),
        ];
        let error = wait_until_read(&all, Duration::from_millis(100), Some(&readiness))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            readiness.get(),
            Err(format!(
                "waiting for the API server (Functions: {NO_CROSSPLANE_CRDS})"
            ))
        );
        assert!(
            error.ends_with(&format!("Functions: {NO_CROSSPLANE_CRDS}")),
            "{error}"
        );
        let quiet = [watched("Functions", false, None)];
        let _ = wait_until_read(&quiet, Duration::from_millis(100), Some(&readiness)).await;
        assert_eq!(
            readiness.get(),
            Err("waiting for the API server".to_owned())
        );
    }

    #[test]
    fn a_404_on_crossplanes_kinds_is_their_crds_missing() {
        let not_found = || {
            kube::Error::Api(Box::new(kube::core::Status {
                code: 404,
                message: "the server could not find the requested resource".into(),
                ..Default::default()
            }))
        };
        let e = watcher::Error::InitialListFailed(not_found());
        assert_eq!(watch_error(&e, true), NO_CROSSPLANE_CRDS);
        // Another kind's 404 (the Secret's watch) is not Crossplane's.
        assert_ne!(watch_error(&e, false), NO_CROSSPLANE_CRDS);
        let forbidden =
            watcher::Error::InitialListFailed(kube::Error::Api(Box::new(kube::core::Status {
                code: 403,
                message: "forbidden".into(),
                ..Default::default()
            })));
        assert!(watch_error(&forbidden, true).contains("forbidden"));
    }

    #[test]
    fn objects_are_kept_without_what_fnrun_never_reads() {
        use k8s_openapi::api::core::v1::Service;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let entry = |manager: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {}}))),
            ..Default::default()
        };
        let mut svc = Service::default();
        svc.metadata.managed_fields = Some(vec![entry("kubectl"), entry(FIELD_MANAGER)]);
        svc.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_owned(), "{}".to_owned()),
                ("a".to_owned(), "b".to_owned()),
            ]
            .into(),
        );
        trim(&mut svc);
        let fields = svc.metadata.managed_fields.as_ref().unwrap();
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].manager.as_deref(), Some(FIELD_MANAGER));
        assert!(fields[0].fields_v1.is_none());
        assert_eq!(
            svc.metadata.annotations,
            Some([("a".to_owned(), "b".to_owned())].into())
        );
        // Someone else's object: no managedFields left at all.
        let mut other = Service::default();
        other.metadata.managed_fields = Some(vec![entry("kubectl")]);
        trim(&mut other);
        assert!(other.metadata.managed_fields.is_none());
    }
}
