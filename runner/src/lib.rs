//! fnrun's core, below every front end: a [`Runner`] turns a request into a
//! cached image and a run in a fresh sandbox, within its admission limits.
//!
//! - [`runner`]: the [`Runner`], its requests and its admission;
//! - [`image_spec`]: an image and a request as a sandbox's run spec, and
//!   whom the function runs as ([`user`] reads the image's passwd files);
//! - [`error`]: every way a run fails, its [`Class`], and the one table from
//!   a class to a gRPC code and a CLI exit code;
//! - [`metrics`]: the runner's counters and histograms;
//! - [`pool`]: sandboxes made ahead of their calls, per kind of run;
//! - [`service`]: a function's server, started through
//!   [`Runner::start_service`], and the spare sandbox made ahead for it.
//!
//! Nothing here knows about the command line or any gRPC service; the front
//! ends (the v1alpha1 runner, Porch's evaluator, the function host) call in.

pub mod error;
pub mod image_spec;
pub mod metrics;
pub mod pool;
pub mod runner;
pub mod service;
pub mod user;

pub use crate::error::{Class, RunError};
pub use crate::runner::{RunRequest, Runner};
pub use crate::service::{Service, ServiceKind, ServiceRequest, Spare};
