//! What fnrun's gRPC front ends share on the wire, below them and beside the
//! core: nothing here runs a function or knows a service.
//!
//! - [`listen`]: listen addresses (`HOST:PORT`, `unix:PATH`,
//!   `unix-abstract:NAME`), binding them, and `TCP_NODELAY` on every socket;
//! - [`authority`]: the unix-socket `:authority` rewriter, between the
//!   socket and the HTTP/2 server;
//! - [`deadline`]: a call's `grpc-timeout` as a deadline every layer sees;
//! - [`reflection`]: server reflection (v1 and v1alpha) with health;
//! - [`tls_accept`]: TLS handshakes on a listener, and what is refused;
//! - [`metrics_http`]: `GET /metrics`, `/readyz` and `/livez`;
//! - [`readiness`]: whether the daemon can serve yet, which `/readyz` says.

pub mod authority;
pub mod deadline;
pub mod listen;
pub mod metrics_http;
pub mod readiness;
pub mod reflection;
pub mod tls_accept;
