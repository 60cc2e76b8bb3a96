//! FunctionIO mode: an xfn-era image (Crossplane v1.11 to v1.13) behind the
//! v1 API. Each call's `RunFunctionRequest` is written as FunctionIO, the
//! image runs once on it through the core runner (as `fnrun run`, with its
//! admission), and its output FunctionIO becomes the `RunFunctionResponse`
//! (`fnrun_api::functionio_v1`, whose tables docs/crossplane.md repeats).
//! v1beta1 requests are read as v1: one wire format.

use std::time::{Duration, Instant};

use bytes::Bytes;
use fnrun_api::functionio_v1;
use prost::Message;
use tonic::Response;

use super::catalogue::FunctionDef;
use super::error::CallError;
use super::error::{HostError, Phase};
use super::instance;
use crate::context::Context;
use fnrun_runner::runner::RunRequest;

/// Answers one call with one run of the function's image, before `deadline`.
pub async fn call(
    ctx: &Context,
    def: &FunctionDef,
    message: Bytes,
    deadline: Instant,
) -> Result<Response<Bytes>, CallError> {
    let function = || def.name.clone();
    let request =
        fnrun_api::v1::RunFunctionRequest::decode(message).map_err(HostError::BadRequest)?;
    let input = functionio_v1::functionio_yaml_from_request(&request).map_err(|error| {
        HostError::BadFunctionIo {
            function: function(),
            error,
        }
    })?;
    let credentials = instance::credentials(&ctx.runner, def).await?;
    let mut run = RunRequest::new(def.image.clone(), input);
    run.pull_policy = def.pull_policy;
    run.credentials = credentials;
    run.network = def.network;
    run.memory_bytes = def.limits.memory_bytes;
    run.cpu_millis = def.limits.cpu_millis;
    run.pids = def.limits.pids;
    run.timeout = deadline.saturating_duration_since(Instant::now());
    if run.timeout.is_zero() {
        return Err(HostError::Deadline {
            function: function(),
            deadline: Duration::ZERO,
            during: Phase::Queued,
        }
        .into());
    }
    let output = ctx
        .runner
        .run(run)
        .await
        .map_err(|e| CallError::Failed(e.into()))?;
    let response = functionio_v1::response_from_functionio_yaml(&request, &output.output).map_err(
        |error| HostError::BadOutput {
            function: function(),
            error,
        },
    )?;
    Ok(Response::new(Bytes::from(response.encode_to_vec())))
}
