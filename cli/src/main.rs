//! `fnrun`: a rootless container function runner for Crossplane composition
//! functions. `main` parses the command line, sets up logging and calls the
//! command's module in [`commands`].

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

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command, LogFormat, LogLevel};
use fnrun_runner::error::LINE_MAX;

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
    let code = match cli.command {
        Command::Serve(args) => commands::serve::main(args),
        Command::Run(args) => commands::run::main(args),
        Command::Pull(args) => commands::pull::main(args),
        Command::Cache(args) => commands::cache::main(args),
        Command::Function(args) => commands::function::main(args),
        Command::Version(args) => commands::meta::version(args),
        Command::Completion(args) => commands::meta::completion(args, Cli::command()),
        Command::Man(args) => commands::meta::man(args, Cli::command()),
    };
    // A run being killed on another thread as the process ends is left
    // frozen by no one (cgroup v1).
    let thawed = fnrun_sandbox::thaw_frozen_runs();
    if thawed > 0 {
        tracing::warn!(thawed, "thawed run cgroups being killed as fnrun exits");
    }
    code
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
}
