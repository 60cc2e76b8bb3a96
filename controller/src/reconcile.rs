//! The reconciler of Kubernetes mode (see the crate doc): a kube-rs
//! `Controller` of Functions, each reconciled on its own events and those of
//! the objects that concern it, and the host's catalogue kept from what the
//! reconciles found. The Lease is in [`crate::lease`], the CA in
//! [`crate::ca`], trial starts in [`crate::trial`], the leader's writes in
//! [`crate::writes`], the watches in [`crate::watch`].
//!
//! A deleted Function leaves the catalogue when its watch says it is gone
//! (a delete event, or a new list without it), or when its reconcile finds
//! it being deleted; its Service is owned by it, and Kubernetes' garbage
//! collector deletes it. No finalizer: one on Crossplane's Functions would
//! need a write fnrun is not granted on them, would hold every Function's
//! deletion while fnrun is down or uninstalled, and is removed once, where
//! every replica has to drop the Function from its own catalogue.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use fnrun_host::catalogue::{Catalogue, FunctionDef, PullSecretData};
use fnrun_host::daemon::Serving;

use crate::Config;
use crate::ca::Ca;
use crate::desired::{self, RuntimeSettings};
use crate::resources::{
    DeploymentRuntimeConfig, Function, FunctionRevision, ImageConfig, PACKAGE_LABEL,
};
use crate::status::{CannotServe, Health, MANAGED_BY, REASON_UNENFORCEABLE};
use crate::trial::{Trials, backoff};
use crate::watch::{NOT_READY_MAX, applied, touched, wait_until_read, watch};
use crate::writes::Writer;

/// Reconcile errors (the API) are retried after this, doubling up to the most.
const ERROR_RETRY_FIRST: Duration = Duration::from_secs(1);
const ERROR_RETRY_MOST: Duration = Duration::from_secs(300);
/// A Function that cannot be served yet is looked at again after this (a
/// pull secret it needs is read when needed, not watched).
const CANNOT_SERVE_RETRY: Duration = Duration::from_secs(10);
/// The Secret key of a pull secret's docker config.
const DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
/// The reason Crossplane gives an ImageConfig it applied for its pull secret.
const SET_PULL_SECRET: &str = "SetImagePullSecret";

/// Why a reconcile did not finish: retried by [`error_policy`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API failed: retried with backoff.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The Function cannot be served yet: its revision says why, and it is
    /// looked at again.
    #[error(transparent)]
    CannotServe(#[from] CannotServe),
}

/// The definitions the host serves, with certificates of the CA of this
/// Secret version.
type Applied = (BTreeMap<String, Arc<FunctionDef>>, Option<String>);

/// The catalogue: what should be served, and what the host serves. The
/// host applies it whole, hence one lock.
struct Served {
    /// What should be served, by Function name.
    defs: BTreeMap<String, Arc<FunctionDef>>,
    /// What the host serves.
    applied: Option<Applied>,
    ca: Ca,
}

/// What happened to the Functions or the CA besides what a reconcile of
/// one Function handles.
enum Change {
    /// The Function was deleted.
    Gone(String),
    /// The Functions were listed again: those not listed are gone.
    Relisted,
    /// The CA Secret changed.
    Ca,
}

struct Ctx {
    client: Client,
    config: Config,
    serving: Arc<Serving>,
    /// The controller's store of Functions.
    functions: Store<Function>,
    revisions: Store<FunctionRevision>,
    runtime_configs: Store<DeploymentRuntimeConfig>,
    image_configs: Store<ImageConfig>,
    ca_secret: Option<Store<Secret>>,
    writer: Writer,
    trials: Trials,
    served: tokio::sync::Mutex<Served>,
    /// True once the API has been read and the Lease joined: reconciles
    /// wait for it.
    started: watch::Receiver<bool>,
    /// Reconciles one Function again (its trial ended).
    requeue: mpsc::UnboundedSender<ObjectRef<Function>>,
    /// Why a Function cannot be served as its objects say, as last logged.
    problems: Mutex<HashMap<String, String>>,
    /// The API failures of each Function's reconciles in a row.
    errors: Mutex<HashMap<String, u32>>,
    /// The Functions reconciled at least once (or failed to be): readiness
    /// waits for every one with an active revision.
    reconciled: Mutex<HashSet<String>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
    let mut watched = Vec::new();
    let (functions, function_events) = watch(
        Api::<Function>::all(client.clone()),
        watcher::Config::default(),
        "Functions".into(),
        &mut watched,
    );
    let (revisions, revision_events) = watch(
        Api::<FunctionRevision>::all(client.clone()),
        watcher::Config::default(),
        "FunctionRevisions".into(),
        &mut watched,
    );
    let (runtime_configs, runtime_config_events) = watch(
        Api::<DeploymentRuntimeConfig>::all(client.clone()),
        watcher::Config::default(),
        "DeploymentRuntimeConfigs".into(),
        &mut watched,
    );
    let (image_configs, image_config_events) = watch(
        Api::<ImageConfig>::all(client.clone()),
        watcher::Config::default(),
        "ImageConfigs".into(),
        &mut watched,
    );
    let ca = config.ca_secret.as_ref().map(|name| {
        watch(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
            format!("the CA Secret {ns}/{name} (--functions-ca-secret)"),
            &mut watched,
        )
    });
    let (services, service_events) = watch(
        Api::<Service>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
        format!("Services in {ns}"),
        &mut watched,
    );
    let (ca_secret, ca_events) = match ca {
        Some((store, events)) => (Some(store), Some(events)),
        None => (None, None),
    };

    let (leading, leader) = watch::channel(false);
    let (start, started) = watch::channel(false);
    let (requeue, requeued) = mpsc::unbounded_channel();
    let (leader_changed, leader_changes) = mpsc::unbounded_channel();
    let (changed, mut changes) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        writer: Writer::new(
            client.clone(),
            config.clone(),
            services,
            revisions.clone(),
            leader,
        ),
        client: client.clone(),
        trials: Trials::default(),
        served: tokio::sync::Mutex::new(Served {
            defs: BTreeMap::new(),
            applied: None,
            ca: Ca::new(&config),
        }),
        config: config.clone(),
        serving,
        functions: functions.clone(),
        revisions: revisions.clone(),
        runtime_configs,
        image_configs,
        ca_secret,
        started,
        requeue,
        problems: Mutex::new(HashMap::new()),
        errors: Mutex::new(HashMap::new()),
        reconciled: Mutex::new(HashSet::new()),
    });

    // A Function's own events reconcile it; its deletion (or its absence
    // from a new list) takes it out of the catalogue.
    let gone = changed.clone();
    let function_events = function_events.inspect(move |event| match event {
        watcher::Event::Delete(f) => {
            let _ = gone.send(Change::Gone(f.name_any()));
        }
        watcher::Event::InitDone => {
            let _ = gone.send(Change::Relisted);
        }
        _ => {}
    });
    let mut controller = Controller::for_stream(applied(function_events), functions.clone())
        // Its Service (owned by it).
        .owns_stream(touched(service_events))
        // Its revisions (labelled with its name).
        .watches_stream(touched(revision_events), |rev: FunctionRevision| {
            rev.labels()
                .get(PACKAGE_LABEL)
                .map(|name| ObjectRef::new(name))
        })
        // The runtime configs and image configs it uses.
        .watches_stream(touched(runtime_config_events), {
            let functions = functions.clone();
            move |config: DeploymentRuntimeConfig| {
                using_runtime_config(&functions, &config.name_any())
            }
        })
        .watches_stream(touched(image_config_events), {
            let revisions = revisions.clone();
            move |config: ImageConfig| using_image_config(&revisions, &config.name_any())
        })
        // Its trial start ended.
        .reconcile_on(UnboundedReceiverStream::new(requeued))
        // The lead changed hands: what the leader writes is every Function's.
        .reconcile_all_on(UnboundedReceiverStream::new(leader_changes));
    if let Some(ca_events) = ca_events {
        // The CA concerns every Function (its certificate, its health).
        let changed = changed.clone();
        let ca_events = ca_events.inspect(move |_| {
            let _ = changed.send(Change::Ca);
        });
        let functions = functions.clone();
        controller = controller.watches_stream(touched(ca_events), move |_: Secret| {
            functions
                .state()
                .iter()
                .map(|f| ObjectRef::from_obj(&**f))
                .collect::<Vec<_>>()
        });
    }
    let controller = tokio::spawn(
        controller
            .graceful_shutdown_on(shutdown)
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile");
                }
            }),
    );
    let housekeeping = tokio::spawn({
        let ctx = ctx.clone();
        async move {
            while let Some(change) = changes.recv().await {
                ctx.wait_started().await;
                match change {
                    Change::Gone(name) => ctx.forget(&name).await,
                    Change::Relisted => ctx.forget_unlisted().await,
                    Change::Ca => ctx.sync().await,
                }
            }
        }
    });

    tracing::info!(
        namespace = ns,
        "Kubernetes mode: reading Functions and their revisions"
    );
    let readiness = ctx.serving.readiness().cloned();
    let elected = match wait_until_read(&watched, config.start_timeout, readiness.as_deref()).await
    {
        Ok(()) => {
            if let Some(readiness) = &readiness {
                readiness.not_ready("reading the Lease and serving the Functions read");
            }
            crate::lease::elect(&client, &config, leading, &leader_changed).await
        }
        Err(e) => Err(e),
    };
    let (stop_lease, lease_task) = match elected {
        Ok(elected) => elected,
        Err(e) => {
            controller.abort();
            housekeeping.abort();
            return Err(e);
        }
    };
    let _ = start.send(true);
    // The CA, and the catalogue (empty until the Functions are reconciled):
    // what no reconcile applies when there is no Function.
    ctx.sync().await;
    let _ = controller.await;
    housekeeping.abort();
    stop_lease.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}

/// The Functions that use the DeploymentRuntimeConfig `config` (`default`:
/// those that name none too).
fn using_runtime_config(functions: &Store<Function>, config: &str) -> Vec<ObjectRef<Function>> {
    functions
        .state()
        .iter()
        .filter(|f| {
            let reference = f.spec.runtime_config_ref.clone().unwrap_or_default();
            let kind = reference
                .kind
                .as_deref()
                .unwrap_or("DeploymentRuntimeConfig");
            let name = if reference.name.is_empty() {
                "default"
            } else {
                reference.name.as_str()
            };
            kind == "DeploymentRuntimeConfig" && name == config
        })
        .map(|f| ObjectRef::from_obj(&**f))
        .collect()
}

/// The Functions whose revisions Crossplane applied the ImageConfig
/// `config` to.
fn using_image_config(
    revisions: &Store<FunctionRevision>,
    config: &str,
) -> Vec<ObjectRef<Function>> {
    let mut names: Vec<String> = revisions
        .state()
        .iter()
        .filter(|r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.applied_image_config_refs.iter().any(|c| c.name == config))
        })
        .filter_map(|r| r.labels().get(PACKAGE_LABEL).cloned())
        .collect();
    names.sort();
    names.dedup();
    names.iter().map(|n| ObjectRef::new(n)).collect()
}

/// Reconciles one Function: serves what its active revision says (or says
/// why not), and the leader writes its Service and its revisions' status.
async fn reconcile(function: Arc<Function>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.wait_started().await;
    let name = function.name_any();
    ctx.serving.host().metrics().reconciled(&name);
    if function.meta().deletion_timestamp.is_some() {
        // Being deleted: Crossplane composes with it no more, and its
        // revisions go with it (its Service too: it owns it).
        ctx.forget(&name).await;
        return Ok(Action::await_change());
    }
    let revisions: Vec<Arc<FunctionRevision>> = ctx
        .revisions
        .state()
        .into_iter()
        .filter(|r| r.labels().get(PACKAGE_LABEL) == Some(&name))
        .collect();
    let active = revisions.iter().find(|r| r.is_active()).cloned();
    // What it is served without, as the operator chose; or why it cannot
    // run at all, which its calls are told too (FAILED_PRECONDITION).
    let mut without = None;
    let mut unenforceable = None;
    let problem = match &active {
        // No active revision: Crossplane is between two (an upgrade
        // deactivates the old one first) or waits for a manual activation,
        // and calls nothing meanwhile. What is served stays until another
        // revision is active or the Function goes.
        None => None,
        Some(rev) => match ctx.build(&function, rev).await {
            Ok(def) => {
                match ctx.config.limits.unenforceable(&def.limits) {
                    Some(why) if ctx.config.limits.best_effort => {
                        without = Some(format!(
                            "served without the limits it asks for (--best-effort-limits): {why}"
                        ));
                    }
                    Some(why) => {
                        unenforceable = Some(CannotServe {
                            reason: REASON_UNENFORCEABLE,
                            message: format!(
                                "{why}: its calls are refused (fnrun's --best-effort-limits \
                                 runs it without them; docs/deployment.md says what gives a pod \
                                 a cgroup it may write)"
                            ),
                        });
                    }
                    None => {}
                }
                ctx.serve(&function, def).await;
                None
            }
            // What is served stays; the revision says why it cannot change.
            Err(Error::CannotServe(why)) => Some(why),
            Err(e) => return Err(e),
        },
    };
    {
        let mut problems = locked(&ctx.problems);
        match problem.as_ref().or(unenforceable.as_ref()) {
            Some(why) if problems.get(&name) != Some(&why.message) => {
                tracing::warn!(
                    function = name,
                    error = why.message,
                    "cannot serve the Function as its objects say"
                );
                problems.insert(name.clone(), why.message.clone());
            }
            Some(_) => {}
            None => {
                problems.remove(&name);
            }
        }
    }
    let ca_problem = {
        let mut served = ctx.served.lock().await;
        ctx.sync_host(&mut served).await;
        locked(&ctx.reconciled).insert(name.clone());
        ctx.update_readiness(&served);
        served
            .ca
            .problem(&ctx.config)
            .map(|why| format!("fnrun cannot serve TLS: {why}"))
    };
    // A trial of a function whose limits cannot be enforced would only fail
    // the same way.
    if unenforceable.is_none()
        && let Some(failures) = ctx.trials.due(&name)
    {
        ctx.start_trial(&name, failures);
    }
    let health = problem
        .clone()
        .or(unenforceable)
        .map(Health::Refused)
        .or(ca_problem.map(Health::Unhealthy))
        .or_else(|| ctx.trials.health(&name))
        .map(|health| match (health, without) {
            (Health::Healthy, Some(what)) => Health::HealthyWithout(what),
            (health, _) => health,
        });
    let health = if ctx.writer.leads() {
        let blocked = ctx.writer.write_service(&function).await?;
        let health = match blocked {
            // Without a Service of fnrun's the active revision has no
            // endpoint; with no active revision there is nothing to say.
            Some(why) => health.map(|_| Health::NoService(why)),
            None => health,
        };
        ctx.writer
            .write_status(&function, &revisions, health.as_ref())
            .await?;
        health
    } else {
        health
    };
    locked(&ctx.errors).remove(&name);
    if let Some(why) = problem {
        return Err(why.into());
    }
    Ok(match health {
        Some(Health::Starting) => Action::requeue(Duration::from_secs(15)),
        Some(Health::Unhealthy(_) | Health::Refused(_)) => Action::requeue(Duration::from_secs(10)),
        Some(Health::NoService(_)) => Action::requeue(Duration::from_secs(30)),
        _ => Action::requeue(Duration::from_secs(600)),
    })
}

/// What follows a reconcile that did not finish: a Function that cannot be
/// served yet is looked at again shortly (its revision says why, and the
/// log said it once); an API failure is retried with backoff.
fn error_policy(function: Arc<Function>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let name = function.name_any();
    locked(&ctx.reconciled).insert(name.clone());
    match error {
        Error::CannotServe(_) => Action::requeue(CANNOT_SERVE_RETRY),
        Error::Kube(e) => {
            let mut errors = locked(&ctx.errors);
            let failures = errors.entry(name.clone()).or_default();
            *failures = failures.saturating_add(1);
            let wait = backoff(ERROR_RETRY_FIRST, ERROR_RETRY_MOST, *failures);
            tracing::warn!(function = name, error = %e, retry_in_s = wait.as_secs(), "reconcile failed");
            Action::requeue(wait)
        }
    }
}

impl Ctx {
    /// Returns once the API has been read and the Lease joined.
    async fn wait_started(&self) {
        let mut started = self.started.clone();
        if started.wait_for(|s| *s).await.is_err() {
            // The start failed: [`run`] returns, and nothing is reconciled.
            std::future::pending::<()>().await;
        }
    }

    /// Serves `def` for `function`, unless the Function went meanwhile.
    async fn serve(self: &Arc<Self>, function: &Function, def: FunctionDef) {
        let name = function.name_any();
        let mut served = self.served.lock().await;
        // Its deletion is handled under this lock: a reconcile that ends
        // after it does not serve it again.
        let current = self
            .functions
            .get(&ObjectRef::from_obj(function))
            .is_some_and(|f| f.uid() == function.uid() && f.meta().deletion_timestamp.is_none());
        if current && served.defs.get(&name).is_none_or(|d| **d != def) {
            served.defs.insert(name, Arc::new(def));
        }
    }

    /// Applies the catalogue and the CA, and updates readiness.
    async fn sync(self: &Arc<Self>) {
        let mut served = self.served.lock().await;
        self.sync_host(&mut served).await;
        self.update_readiness(&served);
    }

    /// The Function `name` was deleted: no longer served, nor remembered.
    async fn forget(self: &Arc<Self>, name: &str) {
        let mut served = self.served.lock().await;
        if served.defs.remove(name).is_some() {
            tracing::info!(
                function = name,
                "the Function was deleted: no longer served"
            );
        }
        self.trials.remove(name);
        self.writer.forget(name);
        locked(&self.problems).remove(name);
        locked(&self.errors).remove(name);
        locked(&self.reconciled).remove(name);
        self.serving.host().metrics().forget_reconciles(name);
        self.sync_host(&mut served).await;
        self.update_readiness(&served);
    }

    /// Forgets every Function served that the store no longer has (a
    /// deletion while the watch was down is no delete event).
    async fn forget_unlisted(self: &Arc<Self>) {
        let listed: HashSet<String> = self
            .functions
            .state()
            .iter()
            .map(|f| f.name_any())
            .collect();
        let gone: Vec<String> = {
            let served = self.served.lock().await;
            served
                .defs
                .keys()
                .filter(|n| !listed.contains(*n))
                .cloned()
                .collect()
        };
        for name in gone {
            self.forget(&name).await;
        }
    }

    /// The function to serve for `function`'s active revision `rev`: the
    /// error is why it cannot be served ([`CannotServe`], said on the revision)
    /// or an API failure.
    async fn build(
        &self,
        function: &Function,
        rev: &FunctionRevision,
    ) -> Result<FunctionDef, Error> {
        let name = function.name_any();
        let settings = match self.runtime_settings(function) {
            Ok(s) => s,
            Err(why) => return Err(CannotServe::new(why).into()),
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
                    return Err(CannotServe::new(format!(
                        "fnrun may not read the pull secret {ns}/{secret_name} (grant it in the Role \
                         fnrun-functions-pull-secrets, docs/security.md): {}",
                        e.message
                    ))
                    .into());
                }
                Err(e) => return Err(e.into()),
            };
            let Some(secret) = secret else {
                return Err(CannotServe::new(format!(
                    "the pull secret {ns}/{secret_name} does not exist"
                ))
                .into());
            };
            let Some(json) = secret.data.as_ref().and_then(|d| d.get(DOCKER_CONFIG_JSON)) else {
                return Err(CannotServe::new(format!(
                    "the pull secret {ns}/{secret_name} has no {DOCKER_CONFIG_JSON} (a kubernetes.io/dockerconfigjson Secret)"
                ))
                .into());
            };
            pull_secrets.push(PullSecretData {
                origin: format!("secret {ns}/{secret_name}"),
                dockerconfigjson: Arc::from(json.0.as_slice()),
            });
        }
        let mut def =
            desired::function_def(&name, &rev.name_any(), rev.image(), &settings, pull_secrets)
                .map_err(|e| CannotServe::new(e.to_string()))?;
        def.idle_timeout = self.config.idle_timeout;
        Ok(def)
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
    fn update_readiness(&self, served: &Served) {
        let Some(readiness) = self.serving.readiness() else {
            return;
        };
        if readiness.is_ready() {
            return;
        }
        if let Some(why) = served.ca.problem(&self.config) {
            readiness.not_ready(fnrun_api::text::bounded(&why, NOT_READY_MAX));
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
        let applied = served.applied.as_ref().is_some_and(|(defs, ca)| {
            *defs == served.defs && (matches!(served.ca, Ca::NotUsed) || ca.is_some())
        });
        if !applied {
            readiness.not_ready("the catalogue read is not served yet");
            return;
        }
        readiness.ready();
    }

    /// Makes the host serve `served.defs` with certificates of the current
    /// CA (the CA Secret read again if it changed), and starts a trial of
    /// each function added or changed.
    async fn sync_host(self: &Arc<Self>, served: &mut Served) {
        if let (Some(store), Some(secret)) = (&self.ca_secret, &self.config.ca_secret) {
            let secret = store.get(&ObjectRef::new(secret).within(&self.config.namespace));
            served
                .ca
                .refresh(secret, &self.config, self.serving.client_ca());
        }
        let ca_version = served.ca.version();
        if served
            .applied
            .as_ref()
            .is_some_and(|(defs, ca)| *defs == served.defs && *ca == ca_version)
        {
            return;
        }
        let catalogue = match Catalogue::new(served.defs.values().map(|d| (**d).clone())) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "the Functions cannot all be served");
                return;
            }
        };
        let names: Vec<String> = catalogue.names().map(str::to_owned).collect();
        let certs = match &served.ca {
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
            self.trials.remove(name);
        }
        for name in changes.added.iter().chain(&changes.replaced) {
            self.start_trial(name, 0);
        }
        served.applied = Some((served.defs.clone(), ca_version));
    }

    /// Starts a trial of the function `name` as the host now serves it;
    /// when it ends, an Event says how (the leader's) and `name` is
    /// reconciled again.
    fn start_trial(self: &Arc<Self>, name: &str, failures: u32) {
        let Some(function) = self.serving.host().function(name) else {
            return;
        };
        let def = function.def.clone();
        self.trials.begin(name, def.clone(), failures);
        let ctx = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let permit = ctx.trials.permit().await;
            let started = Instant::now();
            let result = function.prepare().await.map_err(|e| e.to_string());
            drop(permit);
            if !ctx.trials.end(&name, &def, &result) {
                return;
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
            ctx.writer.event_on_active(&name, &result, &def.image).await;
            let _ = ctx.requeue.send(ObjectRef::new(&name));
        });
    }
}
