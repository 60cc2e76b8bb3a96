//! The reconciler of Kubernetes mode (see the crate doc): reflectors of
//! every object it reads, a `Controller` of Functions, the trial starts, the
//! Lease, and a sweep of what deleted Functions left.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Mutex, Notify, mpsc, watch};

use fnrun_host::catalogue::{Catalogue, FunctionDef, PullSecretData};
use fnrun_host::certs::Minter;
use fnrun_host::daemon::Serving;

use crate::desired::{self, RuntimeSettings};
use crate::resources::{
    DeploymentRuntimeConfig, Function, FunctionRevision, ImageConfig, PACKAGE_LABEL,
};
use crate::status::{self, FUNCTION_LABEL, Health, MANAGED_BY};
use crate::{Config, FIELD_MANAGER};

/// How long a Lease is held without renewal, and how long before its end
/// the holder renews it.
const LEASE_SECONDS: u64 = 15;
const LEASE_GRACE_SECONDS: u64 = 5;
/// How often deleted Functions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(3);
/// A failed trial start is tried again after this, doubling up to the most.
const TRIAL_RETRY_FIRST: Duration = Duration::from_secs(10);
const TRIAL_RETRY_MOST: Duration = Duration::from_secs(300);
/// Reconcile errors (the API) are retried after this, doubling up to the most.
const ERROR_RETRY_FIRST: Duration = Duration::from_secs(1);
const ERROR_RETRY_MOST: Duration = Duration::from_secs(300);
/// The Secret key of a pull secret's docker config.
const DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
/// The reason Crossplane gives an ImageConfig it applied for its pull secret.
const SET_PULL_SECRET: &str = "SetImagePullSecret";
/// What a 404 on Crossplane's kinds means.
pub(crate) const NO_CROSSPLANE_CRDS: &str =
    "Crossplane's CRDs are not installed (is Crossplane v1.14+ running?)";
/// Why nothing is served before every watched object has been read.
const WAITING_FOR_API: &str = "waiting for the API server";
/// Most bytes of a reason for not being ready.
const NOT_READY_MAX: usize = 400;

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// The CA of the listener, from its Secret.
enum Ca {
    /// The listener serves h2c.
    NotUsed,
    /// Not read yet, or the Secret cannot be used: why.
    Unusable {
        version: Option<String>,
        why: String,
    },
    Ready {
        version: String,
        minter: Arc<Minter>,
    },
}

/// A function's runtime health, for the definition it was found with.
struct Trial {
    def: Arc<FunctionDef>,
    health: Health,
    failures: u32,
    retry_at: Option<Instant>,
}

/// The definitions the host serves, with certificates of the CA of this
/// Secret version.
type Applied = (BTreeMap<String, Arc<FunctionDef>>, Option<String>);

struct State {
    /// What should be served, by Function name.
    defs: BTreeMap<String, Arc<FunctionDef>>,
    /// What the host serves.
    applied: Option<Applied>,
    trials: HashMap<String, Trial>,
    /// Why a Function cannot be served as its objects say, as last logged.
    problems: HashMap<String, String>,
    ca: Ca,
}

struct Ctx {
    client: Client,
    config: Config,
    serving: Arc<Serving>,
    /// Every Function, listed before the controller starts.
    functions: Store<Function>,
    revisions: Store<FunctionRevision>,
    runtime_configs: Store<DeploymentRuntimeConfig>,
    image_configs: Store<ImageConfig>,
    ca: Option<Store<Secret>>,
    services: Store<Service>,
    leader: watch::Receiver<bool>,
    recorder: Recorder,
    poke: mpsc::UnboundedSender<()>,
    state: Mutex<State>,
    errors: std::sync::Mutex<HashMap<String, u32>>,
    /// Why a Function's Service is not written, as last reported.
    service_problems: std::sync::Mutex<HashMap<String, String>>,
    /// The Functions reconciled at least once (or failed to be): readiness
    /// waits for every one with an active revision.
    reconciled: std::sync::Mutex<HashSet<String>>,
}

/// Runs Kubernetes mode until `shutdown`: the host of `serving` serves every
/// installed Function, and the leader writes their Services and status.
pub async fn run(
    client: Client,
    serving: Arc<Serving>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ns = config.namespace.clone();
    let (poke, poked) = mpsc::unbounded_channel();
    // The Controller keeps a store of Functions of its own; this one is for
    // the sweep, which must know that the list is complete before it takes a
    // Function's absence for its deletion.
    let mut watched = Vec::new();
    let functions = reflect(
        Api::<Function>::all(client.clone()),
        watcher::Config::default(),
        "Functions".into(),
        &poke,
        &mut watched,
    );
    let revisions = reflect(
        Api::<FunctionRevision>::all(client.clone()),
        watcher::Config::default(),
        "FunctionRevisions".into(),
        &poke,
        &mut watched,
    );
    let runtime_configs = reflect(
        Api::<DeploymentRuntimeConfig>::all(client.clone()),
        watcher::Config::default(),
        "DeploymentRuntimeConfigs".into(),
        &poke,
        &mut watched,
    );
    let image_configs = reflect(
        Api::<ImageConfig>::all(client.clone()),
        watcher::Config::default(),
        "ImageConfigs".into(),
        &poke,
        &mut watched,
    );
    let ca = config.ca_secret.as_ref().map(|name| {
        reflect(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            format!("the CA Secret {ns}/{name} (--functions-ca-secret)"),
            &poke,
            &mut watched,
        )
    });
    let services = reflect(
        Api::<Service>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
        format!("Services in {ns}"),
        &poke,
        &mut watched,
    );
    tracing::info!(
        namespace = ns,
        "Kubernetes mode: reading Functions and their revisions"
    );
    let readiness = serving.readiness().cloned();
    wait_until_read(&watched, config.start_timeout, readiness.as_deref()).await?;
    if let Some(readiness) = &readiness {
        readiness.not_ready("reading the Lease and serving the Functions read");
    }

    let (leader, stop_lease, lease_task) = elect(&client, &config, &poke).await?;
    let controller = Controller::new(
        Api::<Function>::all(client.clone()),
        watcher::Config::default(),
    );
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "fnrun".into(),
                instance: Some(config.identity.clone()),
            },
        ),
        client,
        state: Mutex::new(State {
            defs: BTreeMap::new(),
            applied: None,
            trials: HashMap::new(),
            problems: HashMap::new(),
            ca: match config.ca_secret {
                Some(_) => Ca::Unusable {
                    version: None,
                    why: "not read yet".into(),
                },
                None => Ca::NotUsed,
            },
        }),
        config,
        serving,
        functions,
        revisions,
        runtime_configs,
        image_configs,
        ca,
        services,
        leader,
        poke,
        errors: std::sync::Mutex::new(HashMap::new()),
        service_problems: std::sync::Mutex::new(HashMap::new()),
        reconciled: std::sync::Mutex::new(HashSet::new()),
    });
    let sweeper = tokio::spawn(sweep_loop(ctx.clone()));
    controller
        .reconcile_all_on(tokio_stream::wrappers::UnboundedReceiverStream::new(poked))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile");
            }
        })
        .await;
    sweeper.abort();
    stop_lease.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}

/// What a reflector watches, for the start: whether its first list is in,
/// and the last error its watch met.
struct Watched {
    what: String,
    ready: Arc<std::sync::atomic::AtomicBool>,
    error: Arc<std::sync::Mutex<Option<String>>>,
}

/// A store of `api`'s objects (`what`, for the log), kept by a task that
/// pokes the controller at every change and logs what it cannot watch (and
/// retries, with backoff); what [`wait_until_read`] needs is pushed to
/// `watched`.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    what: String,
    poke: &mpsc::UnboundedSender<()>,
    watched: &mut Vec<Watched>,
) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let poke = poke.clone();
    let error = Arc::new(std::sync::Mutex::new(None));
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let last_error = error.clone();
    let crossplane = K::group(&K::DynamicType::default()) == "pkg.crossplane.io";
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    let watching = what.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    *last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    let _ = poke.send(());
                }
                Err(e) => {
                    let error = watch_error(&e, crossplane);
                    tracing::warn!(watching, error, "cannot watch; retrying");
                    *last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                }
            }
        }
    });
    let (store, is_ready) = (reader.clone(), ready.clone());
    tokio::spawn(async move {
        if store.wait_until_ready().await.is_ok() {
            is_ready.store(true, std::sync::atomic::Ordering::Release);
        }
    });
    watched.push(Watched { what, ready, error });
    reader
}

/// What the log and the start's failure say of a watch's error: a 404 on
/// Crossplane's kinds is their CRDs missing.
fn watch_error(e: &watcher::Error, crossplane: bool) -> String {
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
async fn wait_until_read(
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

/// Joins the election of the Lease; the receiver says whether this replica
/// leads. Notifying the `Notify` releases the Lease and ends the task.
async fn elect(
    client: &Client,
    config: &Config,
    poke: &mpsc::UnboundedSender<()>,
) -> anyhow::Result<(
    watch::Receiver<bool>,
    Arc<Notify>,
    tokio::task::JoinHandle<()>,
)> {
    use anyhow::Context as _;
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .with_field_manager(FIELD_MANAGER)
        .build()
        .await
        .with_context(|| format!("the Lease {}/{}", config.namespace, config.lease))?;
    tracing::info!(
        identity = config.identity,
        lease = format!("{}/{}", config.namespace, config.lease),
        "leader election: serving every function; the Lease's holder writes"
    );
    let (tx, rx) = watch::channel(false);
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let poke = poke.clone();
    let identity = config.identity.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = manager.changed() => match changed {
                    Ok(leading) => {
                        tracing::info!(identity, leading, "leader election: {}", if leading {
                            "this replica leads: it writes Services and status"
                        } else {
                            "another replica leads"
                        });
                        let _ = tx.send(leading);
                        let _ = poke.send(());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "leader election: cannot reach the Lease; retrying");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                },
                () = stopped.notified() => {
                    if *tx.borrow() && let Err(e) = manager.release().await {
                        tracing::warn!(error = %e, "cannot release the Lease");
                    }
                    return;
                }
            }
        }
    });
    Ok((rx, stop, task))
}

async fn reconcile(function: Arc<Function>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = function.name_any();
    if function.meta().deletion_timestamp.is_some() {
        // Being deleted: Crossplane composes with it no more, and its
        // revisions go with it.
        ctx.sweep().await;
        return Ok(Action::await_change());
    }
    let revisions: Vec<Arc<FunctionRevision>> = ctx
        .revisions
        .state()
        .into_iter()
        .filter(|r| r.labels().get(PACKAGE_LABEL) == Some(&name))
        .collect();
    let active = revisions.iter().find(|r| r.is_active()).cloned();
    let built = match &active {
        Some(rev) => Some(ctx.build(&function, rev).await?),
        None => None,
    };
    let health = {
        let mut state = ctx.state.lock().await;
        let problem = match built {
            // No active revision: Crossplane is between two (an upgrade
            // deactivates the old one first) or waits for a manual
            // activation, and calls nothing meanwhile. What is served stays
            // until another revision is active or the Function goes.
            None => None,
            Some(Ok(def)) => {
                if state.defs.get(&name).is_none_or(|d| **d != def) {
                    state.defs.insert(name.clone(), Arc::new(def));
                }
                None
            }
            // What is served stays; the revision says why it cannot change.
            Some(Err(why)) => {
                if state.problems.get(&name) != Some(&why) {
                    tracing::warn!(
                        function = name,
                        error = why,
                        "cannot serve the Function as its objects say"
                    );
                    state.problems.insert(name.clone(), why.clone());
                }
                Some(why)
            }
        };
        if problem.is_none() {
            state.problems.remove(&name);
        }
        ctx.sync_host(&mut state).await;
        ctx.reconciled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.clone());
        ctx.update_readiness(&state);
        ctx.retry_trial(&mut state, &name);
        let ca_problem = match &state.ca {
            Ca::Unusable { why, .. } => Some(format!(
                "fnrun cannot serve TLS: the CA Secret {}/{}: {why}",
                ctx.config.namespace,
                ctx.config.ca_secret.as_deref().unwrap_or_default()
            )),
            _ => None,
        };
        problem
            .or(ca_problem)
            .map(Health::Unhealthy)
            .or_else(|| state.trials.get(&name).map(|t| t.health.clone()))
    };
    let health = if *ctx.leader.borrow() {
        let blocked = ctx.write_service(&function).await?;
        let health = match blocked {
            // Without a Service of fnrun's the active revision has no
            // endpoint; with no active revision there is nothing to say.
            Some(why) => health.map(|_| Health::NoService(why)),
            None => health,
        };
        ctx.write_status(&function, &revisions, health.as_ref())
            .await?;
        health
    } else {
        health
    };
    ctx.errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&name);
    Ok(match health {
        Some(Health::Starting) => Action::requeue(Duration::from_secs(15)),
        Some(Health::Unhealthy(_)) => Action::requeue(Duration::from_secs(10)),
        Some(Health::NoService(_)) => Action::requeue(Duration::from_secs(30)),
        _ => Action::requeue(Duration::from_secs(600)),
    })
}

fn error_policy(function: Arc<Function>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let name = function.name_any();
    let mut errors = ctx
        .errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    ctx.reconciled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(name.clone());
    let failures = errors.entry(name.clone()).or_default();
    *failures = failures.saturating_add(1);
    let wait = backoff(ERROR_RETRY_FIRST, ERROR_RETRY_MOST, *failures);
    tracing::warn!(function = name, error = %error, retry_in_s = wait.as_secs(), "reconcile failed");
    Action::requeue(wait)
}

/// `first`, doubled for each failure after the first, at most `most`.
fn backoff(first: Duration, most: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(most)
}

impl Ctx {
    /// The function to serve for `function`'s active revision `rev`: the
    /// error is why it cannot be served (a condition, not a retry); an API
    /// failure is the reconcile's.
    async fn build(
        &self,
        function: &Function,
        rev: &FunctionRevision,
    ) -> Result<Result<FunctionDef, String>, Error> {
        let name = function.name_any();
        let settings = match self.runtime_settings(function) {
            Ok(s) => s,
            Err(why) => return Ok(Err(why)),
        };
        let mut secret_names: Vec<String> = function
            .spec
            .package_pull_secrets
            .iter()
            .chain(&rev.spec.package_pull_secrets)
            .map(|r| r.name.clone())
            .collect();
        let applied = rev
            .status
            .as_ref()
            .map(|s| s.applied_image_config_refs.as_slice())
            .unwrap_or_default();
        for config in applied.iter().filter(|c| c.reason == SET_PULL_SECRET) {
            let secret = self
                .image_configs
                .get(&ObjectRef::new(&config.name))
                .and_then(|ic| ic.spec.registry.clone()?.authentication?.pull_secret_ref)
                .map(|r| r.name);
            if let Some(secret) = secret {
                secret_names.push(secret);
            }
        }
        let mut seen = HashSet::new();
        secret_names.retain(|n| !n.is_empty() && seen.insert(n.clone()));
        let ns = &self.config.namespace;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let mut pull_secrets = Vec::new();
        for secret_name in secret_names {
            let secret = match secrets.get_opt(&secret_name).await {
                Ok(secret) => secret,
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    return Ok(Err(format!(
                        "fnrun may not read the pull secret {ns}/{secret_name} (grant it in the Role \
                         fnrun-functions-pull-secrets, docs/security.md): {}",
                        e.message
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            let Some(secret) = secret else {
                return Ok(Err(format!(
                    "the pull secret {ns}/{secret_name} does not exist"
                )));
            };
            let Some(json) = secret.data.as_ref().and_then(|d| d.get(DOCKER_CONFIG_JSON)) else {
                return Ok(Err(format!(
                    "the pull secret {ns}/{secret_name} has no {DOCKER_CONFIG_JSON} (a kubernetes.io/dockerconfigjson Secret)"
                )));
            };
            pull_secrets.push(PullSecretData {
                origin: format!("secret {ns}/{secret_name}"),
                dockerconfigjson: Arc::from(json.0.as_slice()),
            });
        }
        Ok(
            desired::function_def(&name, &rev.name_any(), rev.image(), &settings, pull_secrets)
                .map(|mut def| {
                    def.idle_timeout = self.config.idle_timeout;
                    def
                })
                .map_err(|e| e.to_string()),
        )
    }

    /// The settings of `function`'s runtime config (`default` when it names
    /// none, as Crossplane has it); a config that does not exist gives the
    /// defaults.
    fn runtime_settings(&self, function: &Function) -> Result<RuntimeSettings, String> {
        let reference = function.spec.runtime_config_ref.clone().unwrap_or_default();
        if reference
            .kind
            .as_deref()
            .is_some_and(|k| k != "DeploymentRuntimeConfig")
        {
            return Ok(RuntimeSettings::default());
        }
        let config_name = if reference.name.is_empty() {
            "default".to_owned()
        } else {
            reference.name
        };
        let Some(config) = self.runtime_configs.get(&ObjectRef::new(&config_name)) else {
            return Ok(RuntimeSettings::default());
        };
        let settings =
            desired::runtime_settings(&config_name, config.spec.deployment_template.as_ref())
                .map_err(|e| e.to_string())?;
        if !settings.ignored.is_empty() {
            tracing::debug!(
                function = function.name_any(),
                config = config_name,
                ignored = ?settings.ignored,
                "DeploymentRuntimeConfig fields fnrun does not honour"
            );
        }
        Ok(settings)
    }

    /// Makes this replica ready once it can serve what it read: the CA
    /// usable (if TLS), every Function with an active revision reconciled
    /// once (served, or its revision says why not), and the host serving the
    /// catalogue with certificates of the CA. Ready stays ready: what is
    /// served keeps being served when the API or the CA goes (docs/crossplane.md).
    fn update_readiness(&self, state: &State) {
        let Some(readiness) = self.serving.readiness() else {
            return;
        };
        if readiness.is_ready() {
            return;
        }
        if let Ca::Unusable { why, .. } = &state.ca {
            readiness.not_ready(fnrun_api::text::bounded(
                &format!(
                    "the CA Secret {}/{}: {why}",
                    self.config.namespace,
                    self.config.ca_secret.as_deref().unwrap_or_default()
                ),
                NOT_READY_MAX,
            ));
            return;
        }
        let active: HashSet<String> = self
            .revisions
            .state()
            .iter()
            .filter(|r| r.is_active())
            .filter_map(|r| r.labels().get(PACKAGE_LABEL).cloned())
            .collect();
        let pending: Vec<String> = {
            let reconciled = self
                .reconciled
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut pending: Vec<String> = self
                .functions
                .state()
                .iter()
                .filter(|f| f.meta().deletion_timestamp.is_none())
                .map(|f| f.name_any())
                .filter(|n| active.contains(n) && !reconciled.contains(n))
                .collect();
            pending.sort();
            pending
        };
        if !pending.is_empty() {
            readiness.not_ready(fnrun_api::text::bounded(
                &format!(
                    "{} Functions not read yet: {}",
                    pending.len(),
                    pending.join(", ")
                ),
                NOT_READY_MAX,
            ));
            return;
        }
        let applied = state.applied.as_ref().is_some_and(|(defs, ca)| {
            *defs == state.defs && (matches!(state.ca, Ca::NotUsed) || ca.is_some())
        });
        if !applied {
            readiness.not_ready("the catalogue read is not served yet");
            return;
        }
        readiness.ready();
    }

    /// Reads the CA Secret again if it changed.
    fn refresh_ca(&self, state: &mut State) {
        let (Some(store), Some(secret_name)) = (&self.ca, &self.config.ca_secret) else {
            return;
        };
        let ns = &self.config.namespace;
        let secret = store.get(&ObjectRef::new(secret_name).within(ns));
        let version = secret.as_ref().and_then(|s| s.resource_version());
        let current = match &state.ca {
            Ca::Ready { version, .. } => Some(version.clone()),
            Ca::Unusable { version, .. } => version.clone(),
            Ca::NotUsed => return,
        };
        if version.is_some() && version == current {
            return;
        }
        let Some(secret) = secret else {
            if !matches!(&state.ca, Ca::Unusable { version: None, why } if why.starts_with("does not"))
            {
                tracing::error!(
                    secret = format!("{ns}/{secret_name}"),
                    "the CA Secret does not exist: no function can be served over TLS"
                );
            }
            state.ca = Ca::Unusable {
                version: None,
                why: "does not exist".into(),
            };
            return;
        };
        let version = version.unwrap_or_default();
        let key = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|b| b.0.clone())
                .unwrap_or_default()
        };
        let (cert, key_pem) = (key("tls.crt"), key("tls.key"));
        let origin = |k: &str| format!("secret {ns}/{secret_name} {k}");
        let cert_origin = origin("tls.crt");
        let minter = Minter::from_pem(
            Path::new(&cert_origin),
            &cert,
            Path::new(&origin("tls.key")),
            &key_pem,
        )
        .map_err(|e| e.to_string())
        .and_then(|minter| {
            if let Some(client_ca) = self.serving.client_ca() {
                client_ca
                    .replace(Path::new(&cert_origin), &cert)
                    .map_err(|e| e.to_string())?;
            }
            Ok(minter)
        });
        state.ca = match minter {
            Ok(minter) => {
                tracing::info!(
                    secret = format!("{ns}/{secret_name}"),
                    version,
                    "CA read: minting the functions' certificates from it"
                );
                Ca::Ready {
                    version,
                    minter: Arc::new(minter),
                }
            }
            Err(why) => {
                tracing::error!(
                    secret = format!("{ns}/{secret_name}"),
                    error = why,
                    "the CA Secret cannot be used: no function can be served over TLS"
                );
                Ca::Unusable {
                    version: Some(version),
                    why,
                }
            }
        };
    }

    /// Makes the host serve `state.defs` with certificates of the current CA,
    /// and starts a trial of each function added or changed.
    async fn sync_host(self: &Arc<Self>, state: &mut State) {
        self.refresh_ca(state);
        let ca_version = match &state.ca {
            Ca::Ready { version, .. } => Some(version.clone()),
            _ => None,
        };
        if state
            .applied
            .as_ref()
            .is_some_and(|(defs, ca)| *defs == state.defs && *ca == ca_version)
        {
            return;
        }
        let catalogue = match Catalogue::new(state.defs.values().map(|d| (**d).clone())) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "the Functions cannot all be served");
                return;
            }
        };
        let names: Vec<String> = catalogue.names().map(str::to_owned).collect();
        let certs = match &state.ca {
            Ca::Ready { minter, .. } => match minter.cert_set(&names, &self.config.namespace) {
                Ok(certs) => Some(certs),
                Err(e) => {
                    tracing::error!(error = %e, "cannot mint the functions' certificates");
                    None
                }
            },
            _ => None,
        };
        let changes = self.serving.apply(&catalogue, certs).await;
        if !(changes.added.is_empty() && changes.replaced.is_empty() && changes.removed.is_empty())
        {
            tracing::info!(
                added = ?changes.added,
                replaced = ?changes.replaced,
                removed = ?changes.removed,
                kept = changes.kept.len(),
                "functions from the Kubernetes API applied"
            );
        }
        for name in &changes.removed {
            state.trials.remove(name);
        }
        for name in changes.added.iter().chain(&changes.replaced) {
            self.start_trial(state, name, 0);
        }
        state.applied = Some((state.defs.clone(), ca_version));
    }

    /// Starts a trial of the function `name` as the host now serves it.
    fn start_trial(self: &Arc<Self>, state: &mut State, name: &str, failures: u32) {
        let Some(function) = self.serving.host().function(name) else {
            return;
        };
        let def = function.def.clone();
        state.trials.insert(
            name.to_owned(),
            Trial {
                def: def.clone(),
                health: Health::Starting,
                failures,
                retry_at: None,
            },
        );
        let ctx = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = function.prepare().await;
            let health = match &result {
                Ok(()) => Health::Healthy,
                Err(e) => Health::Unhealthy(format!("{e}")),
            };
            {
                let mut state = ctx.state.lock().await;
                let Some(trial) = state
                    .trials
                    .get_mut(&name)
                    .filter(|t| Arc::ptr_eq(&t.def, &def))
                else {
                    return;
                };
                trial.health = health.clone();
                if result.is_err() {
                    trial.failures = trial.failures.saturating_add(1);
                    trial.retry_at = Some(
                        Instant::now()
                            + backoff(TRIAL_RETRY_FIRST, TRIAL_RETRY_MOST, trial.failures),
                    );
                }
            }
            let ms = started.elapsed().as_millis();
            match &result {
                Ok(()) => tracing::info!(
                    function = name,
                    image = def.image,
                    duration_ms = ms,
                    "trial start: the function's server answered"
                ),
                Err(e) => {
                    tracing::warn!(function = name, image = def.image, duration_ms = ms, error = %e, "trial start failed")
                }
            }
            ctx.event_on_active(&name, &result.map_err(|e| e.to_string()), &def.image)
                .await;
            let _ = ctx.poke.send(());
        });
    }

    /// Tries a failed trial of `name` again once its backoff is over.
    fn retry_trial(self: &Arc<Self>, state: &mut State, name: &str) {
        let due = state
            .trials
            .get(name)
            .and_then(|t| match (&t.health, t.retry_at) {
                (Health::Unhealthy(_), Some(at)) if Instant::now() >= at => Some(t.failures),
                _ => None,
            });
        if let Some(failures) = due {
            self.start_trial(state, name, failures);
        }
    }
}

impl Ctx {
    /// The leader's write of `function`'s Service ([`status::service`]):
    /// created if there is none, made as it should be if fnrun made it
    /// ([`status::made_by_fnrun`]). A Service of that name that fnrun did not
    /// make is never written (nor deleted, see [`Ctx::sweep`]): the answer
    /// is why, for the revision's `RuntimeHealthy` (and an Event and a log
    /// line when it is first seen).
    async fn write_service(&self, function: &Function) -> Result<Option<String>, Error> {
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
    async fn write_status(
        &self,
        function: &Function,
        revisions: &[Arc<FunctionRevision>],
        health: Option<&Health>,
    ) -> Result<(), Error> {
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
    async fn event_on_active(&self, name: &str, result: &Result<(), String>, image: &str) {
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
    async fn publish_on_active(&self, name: &str, event: Event) {
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

    /// Stops serving Functions that are gone, and (the leader) deletes
    /// Services of Functions that are gone: what a restart, or a Function
    /// deleted while fnrun was down, left.
    async fn sweep(self: &Arc<Self>) {
        // A Function being deleted counts as gone: without a garbage
        // collector (or while its finalizers wait) it may stay for long.
        let existing: HashSet<String> = self
            .functions
            .state()
            .iter()
            .filter(|f| f.meta().deletion_timestamp.is_none())
            .map(|f| f.name_any())
            .collect();
        {
            let mut state = self.state.lock().await;
            let gone: Vec<String> = state
                .defs
                .keys()
                .filter(|n| !existing.contains(*n))
                .cloned()
                .collect();
            for name in &gone {
                tracing::info!(
                    function = name,
                    "the Function was deleted: no longer served"
                );
                state.trials.remove(name);
                state.defs.remove(name);
            }
            // Also what no reconcile applies: the CA read while there is no
            // Function, and the empty catalogue then served.
            self.sync_host(&mut state).await;
            self.update_readiness(&state);
        }
        if !*self.leader.borrow() {
            return;
        }
        let ns = &self.config.namespace;
        let api = Api::<Service>::namespaced(self.client.clone(), ns);
        for svc in self.services.state() {
            let Some(function) = svc.labels().get(FUNCTION_LABEL) else {
                continue;
            };
            // Only a Service fnrun made for that Function: a label alone
            // makes no Service fnrun's.
            if existing.contains(function)
                || svc.name_any() != *function
                || !status::made_by_fnrun(&svc, function)
            {
                continue;
            }
            // The uid is a precondition: a Service of that name made again
            // since by someone else is not deleted.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: svc.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&svc.name_any(), &params).await {
                Ok(_) => tracing::info!(
                    function,
                    service = format!("{ns}/{}", svc.name_any()),
                    "the Function was deleted: its Service too"
                ),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(function, error = %e, "cannot delete the Service of a deleted Function")
                }
            }
        }
    }
}

/// Sweeps every few seconds.
async fn sweep_loop(ctx: Arc<Ctx>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        ctx.sweep().await;
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
    fn backoff_doubles_up_to_the_most() {
        let (first, most) = (Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(backoff(first, most, 0), first);
        assert_eq!(backoff(first, most, 1), first);
        assert_eq!(backoff(first, most, 2), Duration::from_secs(2));
        assert_eq!(backoff(first, most, 5), Duration::from_secs(16));
        assert_eq!(backoff(first, most, 40), most);
        assert_eq!(backoff(first, most, u32::MAX), most);
    }

    #[test]
    fn now_is_rfc3339() {
        let now = now();
        assert_eq!(now.len(), "2026-11-26T05:00:00Z".len(), "{now}");
        assert!(now.ends_with('Z'), "{now}");
    }
}
