//! `fnrun run IMAGE [INPUT]`: runs one function, once, and prints its
//! output: a FunctionIO's, or (`run --krm`, [`crate::krm`]) a KRM
//! function's ResourceList or package.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use fnrun_runner::runner::{PullDisplay, RunRequest};
use fnrun_sandbox::Network;

use crate::config::{
    AuthArgs, CacheArgs, NetworkPolicyArg, RunPolicyArgs, SandboxArgs, TimeoutArgs,
};
use crate::support::{EXIT_FAILED, EXIT_USAGE, error_line};
use crate::{config, krm, package, progress, support};

#[derive(Debug, Args)]
pub struct RunArgs {
    // Shared with `function serve` and `function call`.
    #[command(flatten)]
    pub timeout: TimeoutArgs,
    #[command(flatten)]
    pub policy: RunPolicyArgs,
    /// The function image: [docker://][REGISTRY/]REPO[:TAG][@DIGEST],
    /// oci:PATH[:TAG] or oci-archive:PATH[:TAG].
    pub image: String,
    /// The input FunctionIO (or, for a KRM function, ResourceList) file, or -
    /// for stdin.
    #[arg(default_value = "-")]
    pub input: String,
    // Flag groups, each under its heading in `run --help`.
    #[command(flatten)]
    pub krm: crate::krm::KrmArgs,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

pub fn main(args: RunArgs) -> ExitCode {
    // Not a silent wait: a user who typed `fnrun run IMAGE` learns where the
    // input is read from and how to end it.
    if args.input == "-" && std::io::stdin().is_terminal() {
        eprintln!(
            "fnrun: reading the input (a FunctionIO or a ResourceList) from stdin; \
             end it with Ctrl-D, or give a file: fnrun run IMAGE FILE"
        );
    }
    let (input, source) = match read_run_input(&args) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("fnrun: {}", error_line(&e));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let krm = source.is_some();
    if !krm && let Some(field) = run_function_request_field(&input) {
        eprintln!(
            "fnrun: the input is a RunFunctionRequest (it has `{field}`), not a FunctionIO: \
             call a Crossplane v1.14+ Function package with `fnrun function call IMAGE FILE`"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    if !krm && let Some(flag) = args.krm.krm_only_flag() {
        eprintln!(
            "fnrun: {flag} is for KRM functions, and the input is not a ResourceList \
             (add --krm to run the function as one)"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let runner = match config::build_runner(
        &args.cache,
        &args.sandbox,
        fnrun_runner::runner::Admission::ONE,
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fnrun: {}", error_line(&format!("{e:#}")));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let mut req = match krm {
        true => RunRequest::krm(args.image, input),
        false => RunRequest::new(args.image, input),
    };
    req.timeout = args.timeout.timeout;
    req.refuse_function_package = true;
    req.memory_bytes = args.policy.memory;
    req.cpu_millis = args.policy.cpu;
    (req.credentials, req.auth_note) = match fnrun_registry::credentials::find_credentials(
        runner.cache().default_registry(),
        &req.image,
        args.auth.authfile.as_deref(),
    ) {
        Ok(found) => (found.credentials, found.note),
        Err(e) => {
            eprintln!("fnrun: {}", error_line(&e));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    req.pull_policy = args.policy.image_pull_policy.into();
    req.network = match (args.policy.network_policy, args.krm.network) {
        (NetworkPolicyArg::Runner, _) | (_, true) => Network::Runner,
        (NetworkPolicyArg::Isolated, false) => Network::Isolated,
    };
    // A pull shows its layers on a terminal, as `docker run` does; the bars
    // are closed when the pull is over, before the run prints anything.
    if std::io::stderr().is_terminal() {
        req.progress = Some(PullDisplay(Arc::new(progress::LayerBars::stderr())));
    }
    if let Some(source) = &source {
        return krm::run(&runner, req, &args.krm, source);
    }
    let result = match support::block_on_stoppable(runner.run(req)) {
        Ok(result) => result,
        Err(code) => return code,
    };
    match result {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(&out.output)
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::from(EXIT_FAILED);
            }
            // A Fatal result fails the composition: exit 1 and name it, as
            // `function call` and a KRM function's error result do.
            match fatal_result(&out.output) {
                Some(message) => {
                    eprintln!(
                        "fnrun: {}",
                        error_line(&format!("the function returned a fatal result: {message}"))
                    );
                    ExitCode::from(EXIT_FAILED)
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("fnrun: {}", error_line(&e));
            ExitCode::from(e.class().exit_code())
        }
    }
}

/// The first field of a v1 RunFunctionRequest that no FunctionIO has, if
/// `input` is a YAML or JSON mapping with one and no `kind`: such input is
/// for `fnrun function call`.
fn run_function_request_field(input: &[u8]) -> Option<&'static str> {
    const FIELDS: [&str; 8] = [
        "meta",
        "input",
        "context",
        "extraResources",
        "extra_resources",
        "requiredResources",
        "required_resources",
        "credentials",
    ];
    fnrun_api::yaml_bounds::check(input).ok()?;
    let value: serde_norway::Value = serde_norway::from_slice(input).ok()?;
    let mapping = value.as_mapping()?;
    if mapping.contains_key("kind") {
        return None;
    }
    FIELDS.into_iter().find(|f| mapping.contains_key(*f))
}

/// The first Fatal result's message of an output FunctionIO, if it has one.
fn fatal_result(output: &[u8]) -> Option<String> {
    use fnrun_api::functionio::{Severity, validate};
    validate(output)
        .ok()?
        .results
        .into_iter()
        .find(|r| r.severity == Severity::Fatal)
        .map(|r| r.message)
}

/// `fnrun run`'s input, and where a KRM function's came from: a KRM
/// function when the input is a package directory, a ResourceList, or YAML
/// documents that are KRM objects and no FunctionIO, or when asked
/// (`--krm`). Resources not in a ResourceList are wrapped into one, as kpt
/// does; with `--krm`, anything else is read as a ResourceList, and
/// refused as one.
fn read_run_input(args: &RunArgs) -> Result<(Vec<u8>, Option<package::Source>), RunInputError> {
    use fnrun_api::resourcelist::is_resource_list;
    if args.input != "-" && std::path::Path::new(&args.input).is_dir() {
        let (list, package) = package::read_package(std::path::Path::new(&args.input))?;
        return Ok((list, Some(package::Source::Package(package))));
    }
    let input = read_input(&args.input)?;
    if is_resource_list(&input) {
        return Ok((input, Some(package::Source::ResourceList)));
    }
    let functionio = input
        .windows(fnrun_api::functionio::KIND.len())
        .any(|w| w == fnrun_api::functionio::KIND.as_bytes());
    // Meant as resources when a document has an apiVersion or a kind: read
    // as such, and refused naming the document that is no KRM object.
    if !functionio && fnrun_api::resourcelist::looks_like_resources(&input) {
        let (list, inputs) = package::wrap_stream(&input)?;
        return Ok((list, Some(package::Source::Stream(inputs))));
    }
    // Neither: with --krm, checked (and refused) as a ResourceList.
    Ok((input, args.krm.krm.then_some(package::Source::ResourceList)))
}

/// Why `fnrun run`'s input cannot be read.
#[derive(Debug, thiserror::Error)]
enum RunInputError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error(transparent)]
    Resources(#[from] package::InputError),
}

fn read_input(path: &str) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if path == "-" {
        std::io::stdin().lock().read_to_end(&mut buf)?;
    } else {
        buf = std::fs::read(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read {path}: {e}")))?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn a_run_function_request_is_told_from_a_functionio() {
        assert_eq!(
            run_function_request_field(b"meta: {tag: t}\nobserved: {}\n"),
            Some("meta")
        );
        assert_eq!(
            run_function_request_field(br#"{"observed": {}, "input": {}}"#),
            Some("input")
        );
        assert_eq!(
            run_function_request_field(b"observed: {}\ndesired: {}\n"),
            None
        );
        assert_eq!(
            run_function_request_field(b"kind: FunctionIO\nmeta: {}\n"),
            None
        );
        assert_eq!(run_function_request_field(b"a: [\n"), None);
    }

    #[test]
    fn a_fatal_result_is_found() {
        let io = |results: &str| {
            format!(
                "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {{composite: {{resource: {{}}}}}}\nresults: {results}\n"
            )
        };
        assert_eq!(
            fatal_result(
                io("[{severity: Normal, message: ok}, {severity: Fatal, message: no}]").as_bytes()
            ),
            Some("no".to_owned())
        );
        assert_eq!(
            fatal_result(io("[{severity: Warning, message: hm}]").as_bytes()),
            None
        );
    }

    #[test]
    fn tells_krm_input_by_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let source = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["fnrun", "run"][..], args].concat()).unwrap();
            let Command::Run(run) = cli.command else {
                unreachable!("parsed as run")
            };
            read_run_input(&run).map(|(_, source)| source)
        };
        let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";
        let stream = file("stream.yaml", &format!("{cm}---\n{cm}"));
        assert!(matches!(
            source(&["img", &stream]),
            Ok(Some(package::Source::Stream(_)))
        ));
        let rl = file(
            "rl.yaml",
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n",
        );
        assert!(matches!(
            source(&["img", &rl]),
            Ok(Some(package::Source::ResourceList))
        ));
        let pkg = dir.path().join("pkg");
        std::fs::create_dir(&pkg).unwrap();
        std::fs::write(pkg.join("a.yaml"), cm).unwrap();
        assert!(matches!(
            source(&["img", pkg.to_str().unwrap()]),
            Ok(Some(package::Source::Package(_)))
        ));
        // A FunctionIO, or YAML that is no KRM object: not KRM unless asked.
        let fio = file(
            "fio.yaml",
            "apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nmetadata: {name: x}\n",
        );
        assert!(matches!(source(&["img", &fio]), Ok(None)));
        // One document that is no KRM object, or lacks metadata.name: the
        // document named, not taken for a FunctionIO (#37).
        let bad = file("bad.yaml", &format!("{cm}---\nreplicas: 3\n"));
        assert_eq!(
            source(&["img", &bad]).unwrap_err().to_string(),
            "input is neither a ResourceList nor KRM resources: document 1: resource must have `apiVersion`"
        );
        let unnamed = file(
            "unnamed.yaml",
            "apiVersion: v1\nkind: ConfigMap\ndata: {}\n",
        );
        assert_eq!(
            source(&["--krm", "img", &unnamed]).unwrap_err().to_string(),
            "input is neither a ResourceList nor KRM resources: document 0 (kind \"ConfigMap\"): resource must have `metadata.name`"
        );
        let plain = file("plain.yaml", "replicas: 3\n");
        assert!(matches!(source(&["img", &plain]), Ok(None)));
        assert!(matches!(
            source(&["--krm", "img", &plain]),
            Ok(Some(package::Source::ResourceList))
        ));
        std::fs::write(pkg.join("b.yaml"), "replicas: 3\n").unwrap();
        let err = source(&["img", pkg.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "\"b.yaml\": document 0: resource must have `apiVersion`"
        );
    }
}
