//! Porch's function evaluator, `evaluator.FunctionEvaluator`, served on the
//! daemon's `--listen` addresses: a thin shell over the core [`Runner`], as
//! the v1alpha1 service is.
//!
//! `EvaluateFunction` runs `image` as a KRM function on `resource_list` with
//! kpt's defaults (no network, `nobody`) and the daemon's pull policy
//! default, registry settings, allowed registries and limits; it answers
//! with the output ResourceList and the function's stderr tail as `log`, as
//! Porch's own runner does (`func/wrapper-server`). A non-empty `Tag` is a
//! semantic version constraint: the repository's highest `v`-tag that
//! satisfies it is run (Porch's pod evaluator; see [`tag`]).
//!
//! Status codes: the daemon's table, except that a function that fails
//! (exits non-zero, is killed, writes what is not a ResourceList) gives
//! INTERNAL, as in Porch, with its structured results and stderr tail in
//! the message. A function that exits 0 with `error` results succeeds: Porch
//! reads the results itself.
//!
//! Registry credentials come from the daemon's own podman, skopeo and
//! docker logins (`$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$XDG_CONFIG_HOME/containers/auth.json`, then `$DOCKER_CONFIG/config.json`
//! or `~/.docker/config.json`), as for `fnrun run`: Porch's requests carry
//! none.

pub mod semver;
pub mod tag;

use std::sync::Arc;

use fnrun_api::evaluator::function_evaluator_server::{FunctionEvaluator, FunctionEvaluatorServer};
use fnrun_api::evaluator::{EvaluateFunctionRequest, EvaluateFunctionResponse};
use fnrun_api::text;
use fnrun_registry::Credentials;
use tonic::{Code, Request, Response, Status};

use fnrun_registry::credentials as docker_config;
use fnrun_runner::error::{Class, IMAGE_REF_MAX, LINE_MAX, RunError, STATUS_MESSAGE_MAX, bounded};
use fnrun_runner::runner::{RunRequest, Runner};

use crate::tag::TagError;

/// The gRPC code of each failure class for Porch: a failed function is
/// INTERNAL, as Porch's own runner answers; the rest as the daemon's table.
pub fn code(class: Class) -> Code {
    match class {
        Class::Aborted => Code::Internal,
        other => other.code(),
    }
}

/// Why an evaluation failed: its `Tag` chose no image, or the run failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Tag(#[from] TagError),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl EvalError {
    /// The failure class (SPEC.md's table).
    pub fn class(&self) -> Class {
        match self {
            EvalError::Tag(e) => e.class(),
            EvalError::Run(e) => e.class(),
        }
    }
}

/// Serves `EvaluateFunction` from a shared [`Runner`].
#[derive(Clone)]
pub struct EvaluatorService {
    runner: Arc<Runner>,
}

impl EvaluatorService {
    pub fn new(runner: Arc<Runner>) -> Self {
        EvaluatorService { runner }
    }

    /// The tonic server, with the message sizes of the other services.
    pub fn server(runner: Arc<Runner>) -> FunctionEvaluatorServer<EvaluatorService> {
        FunctionEvaluatorServer::new(EvaluatorService::new(runner))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(128 << 20)
    }
}

/// The status of a failed evaluation of `image`.
fn status(image: &str, e: &EvalError) -> Status {
    Status::new(
        code(e.class()),
        bounded(
            &format!("failed to evaluate function {image:?}: {e}"),
            STATUS_MESSAGE_MAX,
        ),
    )
}

/// Registry credentials for `image` from the daemon's docker config file.
pub fn credentials(runner: &Runner, image: &str) -> Result<Credentials, Status> {
    // Reading the file, or a credential helper, blocks.
    tokio::task::block_in_place(|| {
        docker_config::credentials_for_image(runner.cache().default_registry(), image)
    })
    .map_err(|e| {
        Status::failed_precondition(bounded(
            &format!("registry credentials for {image:?}: {e}"),
            STATUS_MESSAGE_MAX,
        ))
    })
}

#[tonic::async_trait]
impl FunctionEvaluator for EvaluatorService {
    async fn evaluate_function(
        &self,
        request: Request<EvaluateFunctionRequest>,
    ) -> Result<Response<EvaluateFunctionResponse>, Status> {
        let req = request.into_inner();
        let shown = text::bounded(&req.image, IMAGE_REF_MAX).into_owned();
        if req.image.trim().is_empty() {
            return Err(Status::invalid_argument("image is required"));
        }
        let credentials = credentials(&self.runner, &req.image)?;
        let image = tag::resolve(&self.runner, &req.image, &req.tag, &credentials)
            .await
            .map_err(|e| status(&shown, &e.into()))?;
        if image != req.image {
            tracing::info!(image = shown, tag = %text::bounded(&req.tag, LINE_MAX), resolved = image, "resolved the image's tag");
        }
        let mut run = RunRequest::krm(image.clone(), req.resource_list);
        run.credentials = credentials;
        match self.runner.run(run).await {
            Ok(out) => Ok(Response::new(EvaluateFunctionResponse {
                resource_list: out.output,
                log: out.stderr,
            })),
            Err(e) => Err(status(&text::bounded(&image, IMAGE_REF_MAX), &e.into())),
        }
    }
}

/// Pulls `images` into the cache, if not there yet, one after the other:
/// `fnrun serve --prefetch`. Each is logged; one that fails is a warning.
pub async fn prefetch(runner: Arc<Runner>, images: Vec<String>) {
    for image in images {
        let shown = text::bounded(&image, IMAGE_REF_MAX).into_owned();
        let credentials = match credentials(&runner, &image) {
            Ok(c) => c,
            Err(status) => {
                tracing::warn!(
                    image = shown,
                    error = status.message(),
                    "cannot prefetch the image"
                );
                continue;
            }
        };
        match runner.prefetch(&image, credentials).await {
            Ok(got) => tracing::info!(
                image = shown,
                digest = got.digest,
                pulled = got.pulled,
                "prefetched the image"
            ),
            Err(e) => tracing::warn!(
                image = shown,
                error = %bounded(&e, LINE_MAX),
                "cannot prefetch the image"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_function_is_internal_as_in_porch() {
        assert_eq!(code(Class::Aborted), Code::Internal);
        assert_eq!(code(Class::InvalidArgument), Code::InvalidArgument);
        assert_eq!(code(Class::NotFound), Code::NotFound);
        assert_eq!(code(Class::DeadlineExceeded), Code::DeadlineExceeded);
        let e = RunError::KrmFunctionFailed {
            code: 1,
            returned: None,
            stderr: format!("{}boom", "x".repeat(1 << 20)),
        };
        let s = status(&"i".repeat(IMAGE_REF_MAX), &e.into());
        assert_eq!(s.code(), Code::Internal);
        assert!(
            s.message().len() <= STATUS_MESSAGE_MAX,
            "{}",
            s.message().len()
        );
        assert!(
            s.message().starts_with("failed to evaluate function \"iii"),
            "{}",
            s.message()
        );
        assert!(s.message().ends_with("boom"), "{}", s.message());
    }
}
