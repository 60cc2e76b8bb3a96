//! `fnrun pull IMAGE...`: prefetches images into the cache.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use fnrun_cache::{GetOptions, PullPolicy};

use crate::config::{AuthArgs, CacheArgs, IdMapArgs, OutputArgs, OutputFormat};
use crate::support::{EXIT_FAILED, EXIT_USAGE, current_thread_runtime, error_line};
use crate::{config, output, progress};

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Images to pull: [docker://][REGISTRY/]REPO[:TAG][@DIGEST],
    /// oci:PATH[:TAG] or oci-archive:PATH[:TAG].
    #[arg(required = true)]
    pub images: Vec<String>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Print only each image's digest, and no progress bars (podman pull
    /// -q).
    #[arg(short = 'q', long)]
    pub quiet: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub ids: IdMapArgs,
}

pub fn main(args: PullArgs) -> ExitCode {
    let runner = match config::build_runner(
        &args.cache,
        &args.ids.sandbox(),
        fnrun_runner::runner::Admission::ONE,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fnrun: {}", error_line(&format!("{e:#}")));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    // Every reference is checked before anything is pulled: one that is
    // not a reference is a usage error.
    let mut references = Vec::new();
    for image in &args.images {
        match runner.cache().parse_reference(image) {
            Ok(reference) => references.push(reference),
            Err(e) => {
                eprintln!(
                    "fnrun: {}",
                    error_line(&pull_failure(image, &PullError::Cache(e)))
                );
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    let rt = current_thread_runtime();
    // Bars on a terminal only: piped or logged output stays one line per image.
    let terminal = std::io::stderr().is_terminal() && !args.quiet;
    let mut code = ExitCode::SUCCESS;
    let mut pulled = Vec::new();
    for (image, reference) in args.images.iter().zip(&references) {
        let bars = terminal.then(|| Arc::new(progress::LayerBars::stderr()));
        let result = rt.block_on(async {
            let found = fnrun_registry::credentials::find_credentials(
                runner.cache().default_registry(),
                image,
                args.auth.authfile.as_deref(),
            )?;
            let mut options = GetOptions::new(PullPolicy::Always).credentials(found.credentials);
            if let Some(bars) = &bars {
                options = options.progress(bars.clone());
            }
            let got = runner.cache().get(reference, options).await;
            Ok::<_, PullError>(got.map_err(|e| e.noted(found.note.as_deref()))?.image)
        });
        // Every bar is finished or stopped before anything else is printed.
        if let Some(bars) = &bars {
            bars.close();
        }
        match result {
            Ok(img) if args.output.format == OutputFormat::Text && args.quiet => {
                println!("{}", img.digest)
            }
            Ok(img) if args.output.format == OutputFormat::Text => {
                println!("{} {}", img.reference, img.digest)
            }
            Ok(img) => pulled.push(Pulled {
                image: image.clone(),
                reference: img.reference,
                digest: img.digest,
            }),
            Err(e) => {
                eprintln!("fnrun: {}", error_line(&pull_failure(image, &e)));
                code = ExitCode::from(EXIT_FAILED);
            }
        }
    }
    if args.output.format != OutputFormat::Text
        && output::print(output::render(&pulled, args.output.format)) != ExitCode::SUCCESS
    {
        return ExitCode::from(EXIT_FAILED);
    }
    code
}

/// `IMAGE: why`, naming the image once: most errors name it already.
fn pull_failure(image: &str, e: &PullError) -> String {
    let message = e.to_string();
    if message.contains(image) {
        message
    } else {
        format!("{image}: {message}")
    }
}

/// One image of `fnrun pull -o json|yaml`.
#[derive(Debug, serde::Serialize)]
struct Pulled {
    /// As given.
    image: String,
    /// Normalized.
    reference: String,
    digest: String,
}

/// Why `fnrun pull` failed for one image.
#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error(transparent)]
    Config(#[from] fnrun_registry::credentials::DockerConfigError),
    #[error(transparent)]
    Cache(#[from] fnrun_cache::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_failure_names_the_image_once() {
        let e = PullError::Cache(fnrun_cache::Error::from(
            fnrun_registry::ImageRef::parse("r.io/A:1", fnrun_registry::DOCKER_HUB).unwrap_err(),
        ));
        let line = pull_failure("r.io/A:1", &e);
        assert!(line.contains("r.io/A:1"), "{line}");
        assert_eq!(line.matches("r.io/A:1").count(), 1, "{line}");
    }
}
