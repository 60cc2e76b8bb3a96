//! `fnrun`: a rootless container function runner for Crossplane composition
//! functions. `main` only sets up logging, dispatches and prints the error.

// The doc comments of the clap-derived arguments are the command's help text,
// written in usage syntax (`[REGISTRY/]REPO[:TAG]`, `HOST[:PORT]`), which
// rustdoc would take for links; escaping them would show in `--help`.
#![allow(rustdoc::broken_intra_doc_links)]

mod cli;
mod commands;
mod config;
mod functions_args;
mod krm;
mod output;
mod package;
mod progress;
mod support;
#[cfg(test)]
mod surface;

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, Parser};
use fnrun_cache::{GetOptions, PullPolicy};
use fnrun_sandbox::Network;

use crate::cli::{Cli, Command, LogFormat, LogLevel, PullArgs, RunArgs};
use crate::config::{NetworkPolicyArg, OutputFormat, PullPolicyArg};
use crate::support::{EXIT_FAILED, EXIT_USAGE, current_thread_runtime, daemon_failed, error_line};
use fnrun_runner::error::LINE_MAX;
use fnrun_runner::runner::{PullDisplay, RunRequest};

fn main() -> ExitCode {
    // The daemon execs this binary as its spawner (`fnrun_sandbox`'s process that
    // clones each run's init): then it serves as that and never returns.
    fnrun_sandbox::run_spawner_if_asked();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => usage_error(e),
    };
    // rustls uses ring, the only crypto provider linked; install it before any
    // TLS (registries, TCP listeners) is set up.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let default_level = match &cli.command {
        Command::Serve(_) => LogLevel::Info,
        Command::Function(f) => match f.command {
            commands::function::FunctionCommand::Serve(_) => LogLevel::Info,
            // `call` prints the response and, on failure, one error line.
            commands::function::FunctionCommand::Call(_) => LogLevel::Off,
        },
        // `run` prints the output FunctionIO and, on failure, one error line.
        Command::Run(_)
        | Command::Pull(_)
        | Command::Cache(_)
        | Command::Version(_)
        | Command::Completion(_)
        | Command::Man(_) => LogLevel::Off,
    };
    let level = match (cli.log_level, cli.verbose) {
        (Some(level), _) => Some(level),
        (None, 0) => None,
        (None, v) => Some(LogLevel::raised(default_level, v)),
    };
    init_logging(cli.log_format, level, default_level);
    match cli.command {
        Command::Serve(args) => match commands::serve::serve(args) {
            Ok(None) => ExitCode::SUCCESS,
            Ok(Some(stopped)) => ExitCode::from(stopped.exit_code()),
            Err(e) => daemon_failed(&e, support::exit_code_of(&e)),
        },
        Command::Run(args) => run(args),
        Command::Pull(args) => pull(args),
        Command::Cache(args) => commands::cache::main(args),
        Command::Function(args) => commands::function::main(args),
        Command::Version(args) => commands::meta::version(args),
        Command::Completion(args) => commands::meta::completion(args, Cli::command()),
        Command::Man(args) => commands::meta::man(args, Cli::command()),
    }
}

/// Logs at `level` (`--log-level`, `-v`) when given, else as RUST_LOG says,
/// else at the command's `default_level`.
fn init_logging(format: LogFormat, level: Option<LogLevel>, default_level: LogLevel) {
    let filter = match level {
        Some(level) => tracing_subscriber::EnvFilter::new(level.directive()),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level.directive())),
    };
    // Colours only on a terminal: a DaemonSet's log, a file or a pipe gets
    // plain text (and never with NO_COLOR set).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    support::JSON_LOGS.store(
        matches!(format, LogFormat::Json),
        std::sync::atomic::Ordering::Relaxed,
    );
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(args: RunArgs) -> ExitCode {
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
    req.timeout = args.timeout;
    req.memory_bytes = args.memory;
    req.cpu_millis = args.cpu;
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
    req.pull_policy = match args.image_pull_policy {
        PullPolicyArg::IfNotPresent => PullPolicy::IfNotPresent,
        PullPolicyArg::Always => PullPolicy::Always,
        PullPolicyArg::Never => PullPolicy::Never,
    };
    req.network = match (args.network_policy, args.krm.network) {
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
            // A Function package (a gRPC server) run as a FunctionIO
            // function waits for calls until the timeout.
            let hint = match e {
                fnrun_runner::error::RunError::TimedOut { .. } => {
                    " (if the image is a Crossplane v1.14+ Function package, a gRPC server, \
                     call it with `fnrun function call IMAGE REQUEST`)"
                }
                _ => "",
            };
            eprintln!("fnrun: {}", error_line(&format!("{e}{hint}")));
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

/// Prints a command line error and exits, as clap does, but with the message
/// bounded: it quotes the offending argument, which may be 128 KiB long.
/// `--help` and `--version` are clap's to print.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let message = e.render().to_string();
    eprint!("{}", fnrun_runner::error::bounded(&message, LINE_MAX));
    if !message.ends_with('\n') {
        eprintln!();
    }
    std::process::exit(e.exit_code());
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

fn pull(args: PullArgs) -> ExitCode {
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
            Ok(img) if args.output == OutputFormat::Text && args.quiet => {
                println!("{}", img.digest)
            }
            Ok(img) if args.output == OutputFormat::Text => {
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
    if args.output != OutputFormat::Text
        && output::print(output::render(&pulled, args.output)) != ExitCode::SUCCESS
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
    fn command_line_errors_quote_a_long_argument_bounded() {
        let long = "9".repeat(100_000);
        let e = Cli::try_parse_from(["fnrun", "run", "--memory", &long, "fn:v1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let message = fnrun_runner::error::bounded(&e.render().to_string(), LINE_MAX);
        assert!(message.len() <= LINE_MAX, "{}", message.len());
        assert!(message.contains("bytes elided]"), "{message}");
    }

    #[test]
    fn a_pull_failure_names_the_image_once() {
        let e = PullError::Cache(fnrun_cache::Error::from(
            fnrun_registry::ImageRef::parse("r.io/A:1", fnrun_registry::DOCKER_HUB).unwrap_err(),
        ));
        let line = pull_failure("r.io/A:1", &e);
        assert!(line.contains("r.io/A:1"), "{line}");
        assert_eq!(line.matches("r.io/A:1").count(), 1, "{line}");
    }

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
    fn error_lines_are_one_bounded_line() {
        use crate::support::error_text;
        assert_eq!(error_text(&"a\nb\n", false), "a\\nb");
        let line = error_text(&format!("{}\n", "z\n".repeat(1 << 20)), false);
        assert!(line.len() <= LINE_MAX, "{}", line.len());
        assert!(!line.contains('\n'));
        // On a terminal, a function's stderr tail keeps its line breaks.
        assert_eq!(error_text(&"a\nb\n", true), "a\nb");
        let text = error_text(&format!("{}\n", "z\n".repeat(1 << 20)), true);
        assert!(text.len() <= LINE_MAX, "{}", text.len());
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
