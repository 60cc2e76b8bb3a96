//! Kubernetes mode: fnrun as Crossplane's function runtime, with no manual
//! step. Crossplane started with `--package-runtime=Function=External`
//! installs Function packages and activates their revisions; this controller
//! does the rest of what its Deployment runtime would:
//!
//! - every Function whose active FunctionRevision exists is served: its image
//!   (`status.resolvedImage`, else `spec.image`), pull secrets
//!   (`spec.packagePullSecrets` and the ImageConfig pull secrets Crossplane
//!   applied) and runtime config ([`desired`]) become a function of the
//!   host's catalogue, as a functions file would;
//! - server certificates are minted from the `crossplane-root-ca` Secret,
//!   read through the API and followed when it changes, and client
//!   certificates are verified against it;
//! - a trial start when a revision becomes Active: the image is pulled and
//!   its server answers once before `RuntimeHealthy` turns True;
//! - the leader (a `coordination.k8s.io` Lease) writes a Service per
//!   Function (owned by it), the revisions' `status.endpoint`,
//!   `tlsServerSecretName`, `RuntimeHealthy` and `RuntimeActive` (server-side
//!   apply on the status subresource), and Events. Every replica serves
//!   every function. A Service of a Function's name that fnrun did not make
//!   ([`status::made_by_fnrun`]) is never written nor deleted: the revision
//!   says why instead, and has no endpoint;
//! - the host's readiness (`/readyz`, and every TLS handshake refused as
//!   not ready until then) turns ready once the API is read, every Function
//!   with an active revision tried once and the certificates minted.
//!
//! [`run`] drives a kube-rs `Controller` of Functions: one reconcile per
//! Function, triggered by that Function's events and those of the objects
//! that concern it (its revisions, its Service, the runtime and image
//! configs it uses, the CA Secret); a deleted Function's Service goes by its
//! owner reference (Kubernetes' garbage collector), its catalogue entry when
//! the Function's watch says it is gone. Everything it reads or writes is
//! in [`resources`] and [`status`].

mod ca;
mod config;
pub mod desired;
mod lease;
mod reconcile;
pub mod resources;
pub mod status;
mod trial;
mod watch;
mod writes;

pub use config::{
    Config, DEFAULT_CA_SECRET, DEFAULT_LEASE, FIELD_MANAGER, LimitPolicy, SERVICE_PORT,
};
pub use reconcile::run;
