//! The function host: Crossplane v1 functions (Function packages), each in a
//! sandbox, started on demand, as Crossplane's External function runtime.
//!
//! - [`catalogue`]: which functions exist (`--functions FILE`, `--function`);
//! - [`function`]: one function's admission and the life of its one warm
//!   instance ([`instance`]), or its per-call runs in FunctionIO mode
//!   ([`functionio`]);
//! - [`upstream`], [`codec`]: forwarding calls to a function's own server
//!   over HTTP/2 as the bytes they came as;
//! - [`routing`]: which function a call is for (TLS SNI, else `:authority`);
//! - [`api`], [`listener`], [`tls`], [`certs`]: the gRPC services, the
//!   listener, TLS with a certificate per function, and mTLS;
//! - [`daemon`]: `fnrun serve --functions ...`, with SIGHUP reloads;
//! - [`metrics`], [`error`]: what is counted, and every way a call fails.
//!
//! [`Host`] holds the functions of the current catalogue. Applying a new
//! catalogue keeps a function whose definition did not change (and its warm
//! instance), starts nothing, and retires a function that was removed or
//! changed: calls already routed to it finish on its instance, which then
//! stops.

pub mod api;
pub mod catalogue;
pub mod certs;
pub mod codec;
mod context;
pub mod daemon;
pub mod error;
pub mod function;
pub mod functionio;
pub mod instance;
pub mod listener;
pub mod metrics;
pub mod routing;
pub mod tls;
pub mod upstream;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fnrun_api::Quoted;
use tonic::Response;
use tonic::metadata::MetadataMap;

pub use self::catalogue::Catalogue;
pub use self::error::CallError;
pub use self::error::HostError;
use self::error::{KnownNames, RouteKind};
pub use self::function::Function;
use self::instance::Api;
pub use self::metrics::FunctionMetrics;
use self::routing::{Route, function_name};
use fnrun_runner::runner::Runner;
use fnrun_transport::deadline::CallDeadline;

use self::context::Context;

/// How calls find their function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routing {
    /// By name (SNI, else `:authority`) in this namespace.
    ByName { namespace: String },
    /// Every call goes to the one function (`fnrun function serve`).
    Single,
}

/// The functions of the current catalogue.
pub struct Host {
    ctx: Arc<Context>,
    routing: Routing,
    functions: RwLock<Arc<BTreeMap<String, Arc<Function>>>>,
    stopping: AtomicBool,
}

/// What applying a catalogue changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub replaced: Vec<String>,
    pub removed: Vec<String>,
    pub kept: Vec<String>,
}

impl Host {
    /// A host of no function yet, counting in `metrics`.
    pub fn new(runner: Arc<Runner>, routing: Routing, metrics: Arc<FunctionMetrics>) -> Host {
        Host {
            ctx: Arc::new(Context {
                runner,
                metrics,
                next_id: AtomicU64::new(0),
                trim_pending: AtomicBool::new(false),
            }),
            routing,
            functions: RwLock::new(Arc::new(BTreeMap::new())),
            stopping: AtomicBool::new(false),
        }
    }

    /// What the host counts (`fnrun_function_*`).
    pub fn metrics(&self) -> &Arc<FunctionMetrics> {
        &self.ctx.metrics
    }

    fn current(&self) -> Arc<BTreeMap<String, Arc<Function>>> {
        self.functions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The names of the current catalogue's functions.
    pub fn names(&self) -> Vec<String> {
        self.current().keys().cloned().collect()
    }

    /// The function `name` of the current catalogue.
    pub fn function(&self, name: &str) -> Option<Arc<Function>> {
        self.current().get(name).cloned()
    }

    /// Makes `catalogue` the current one (see the module doc).
    pub fn apply(&self, catalogue: &Catalogue) -> Changes {
        let mut changes = Changes::default();
        let mut retired = Vec::new();
        {
            let mut functions = self
                .functions
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let old = functions.clone();
            let mut new = BTreeMap::new();
            for def in catalogue.iter() {
                let function = match old.get(&def.name) {
                    Some(f) if *f.def == **def => {
                        changes.kept.push(def.name.clone());
                        f.clone()
                    }
                    Some(f) => {
                        changes.replaced.push(def.name.clone());
                        retired.push(f.clone());
                        Function::new(def.clone(), self.ctx.clone())
                    }
                    None => {
                        changes.added.push(def.name.clone());
                        Function::new(def.clone(), self.ctx.clone())
                    }
                };
                new.insert(def.name.clone(), function);
            }
            for (name, f) in old.iter() {
                if !new.contains_key(name) {
                    changes.removed.push(name.clone());
                    retired.push(f.clone());
                }
            }
            *functions = Arc::new(new);
        }
        for f in retired {
            f.retire();
        }
        let names: Vec<&str> = catalogue.names().collect();
        self.ctx.metrics.retain(&names);
        changes
    }

    /// The function a call is for.
    pub fn route(&self, route: &Route) -> Result<Arc<Function>, HostError> {
        let functions = self.current();
        let known = || KnownNames(functions.keys().cloned().collect());
        let namespace = match &self.routing {
            Routing::Single => {
                return functions
                    .values()
                    .next()
                    .cloned()
                    .ok_or_else(|| HostError::NoName { known: known() });
            }
            Routing::ByName { namespace } => namespace,
        };
        let (asked, how) = match (&route.sni, &route.authority) {
            (Some(sni), _) => (sni, RouteKind::Sni),
            (None, Some(authority)) => (authority, RouteKind::Authority),
            (None, None) => return Err(HostError::NoName { known: known() }),
        };
        function_name(asked, namespace)
            .and_then(|name| functions.get(&name).cloned())
            .ok_or_else(|| HostError::UnknownFunction {
                // The name asked for, as a function's is written: without
                // the port of an authority.
                asked: Quoted::new(routing::strip_port(asked.trim()).unwrap_or(asked)),
                how,
                known: known(),
            })
    }

    /// Answers one call of `api` on `route` by the caller's `deadline` (else
    /// the function's own `timeout`), and counts and logs it.
    pub async fn call(
        &self,
        route: &Route,
        api: Api,
        message: Bytes,
        metadata: MetadataMap,
        deadline: Option<CallDeadline>,
    ) -> Result<Response<Bytes>, CallError> {
        let arrived = Instant::now();
        let (name, result) = match self.route(route) {
            Err(e) => (String::new(), Err(e.into())),
            Ok(_) if self.stopping.load(Ordering::Relaxed) => {
                (String::new(), Err(HostError::ShuttingDown.into()))
            }
            Ok(function) => {
                let (deadline, budget) = match deadline {
                    Some(d) => (d.for_handler(), d.budget()),
                    None => (arrived + function.def.timeout, function.def.timeout),
                };
                let result = function
                    .call(api, message, metadata, deadline, budget)
                    .await;
                (function.def.name.clone(), result)
            }
        };
        let elapsed = arrived.elapsed();
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(CallError::Function(status)) => status.code(),
            Err(CallError::Failed(e)) => e.class().code(),
        };
        self.ctx.metrics.call(&name, code, elapsed);
        let code_name = metrics::code_name(code);
        let ms = elapsed.as_secs_f64() * 1e3;
        match &result {
            Ok(_) => tracing::debug!(
                function = name,
                api = api.name(),
                code = code_name,
                duration_ms = ms,
                "function call"
            ),
            Err(CallError::Function(status)) => tracing::info!(
                function = name,
                api = api.name(),
                code = code_name,
                duration_ms = ms,
                message = %fnrun_runner::error::bounded(&status.message(), fnrun_runner::error::LINE_MAX),
                "function call: the function answered with an error"
            ),
            Err(CallError::Failed(e)) => tracing::info!(
                function = name,
                api = api.name(),
                code = code_name,
                outcome = e.outcome(),
                duration_ms = ms,
                error = %fnrun_runner::error::bounded(e, fnrun_runner::error::LINE_MAX),
                "function call failed"
            ),
        }
        result
    }

    /// Stops every instance once its calls have ended, waiting at most
    /// `grace`; refuses new calls meanwhile.
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        let functions = self.current();
        for f in functions.values() {
            f.retire();
        }
        let deadline = Instant::now() + grace;
        let metrics = &self.ctx.metrics;
        while metrics.instances.load(Ordering::Relaxed) > 0 || functions.values().any(|f| f.is_up())
        {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "function servers still running after the grace period; they are killed"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
