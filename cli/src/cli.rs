//! The command line: `fnrun`'s global flags and its commands (each one's
//! flags are in its module under [`crate::commands`]).

use clap::{Parser, Subcommand, ValueEnum};

use crate::commands::pull::PullArgs;
use crate::commands::run::RunArgs;
use crate::commands::serve::ServeArgs;

/// A rootless container function runner for Crossplane composition functions.
#[derive(Debug, Parser)]
#[command(name = "fnrun", version = crate::support::VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, help_heading = "Global flags")]
    pub log_format: LogFormat,
    /// Log level [default: info for `serve` and `function serve`, else off].
    /// Without it or -v, RUST_LOG (a tracing filter) is used if set.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "LEVEL",
        help_heading = "Global flags"
    )]
    pub log_level: Option<LogLevel>,
    /// More log output, one level per -v above the command's default (off,
    /// info, debug, trace): `run -v` logs at info, `serve -v` at debug.
    #[arg(
        short = 'v',
        long = "verbose",
        global = true,
        action = clap::ArgAction::Count,
        conflicts_with = "log_level",
        help_heading = "Global flags"
    )]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-level`, in increasing verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level `verbose` steps of -v above `default`: the steps are off,
    /// info, debug, trace (errors and warnings of a one-shot command are
    /// its own error line).
    pub fn raised(default: LogLevel, verbose: u8) -> LogLevel {
        const STEPS: [LogLevel; 4] = [
            LogLevel::Off,
            LogLevel::Info,
            LogLevel::Debug,
            LogLevel::Trace,
        ];
        let start = STEPS.iter().rposition(|l| *l <= default).unwrap_or(0);
        STEPS[(start + usize::from(verbose)).min(STEPS.len() - 1)].max(default)
    }

    /// The tracing filter directive.
    pub fn directive(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

// Parsed once at start and matched at once: the size of the largest
// variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve functions sandboxed: Crossplane v1.14+ Function packages
    /// (--functions, Kubernetes mode), Porch's function evaluator and the
    /// v1alpha1 runner of Crossplane before v1.14.
    #[command(visible_alias = "start")]
    Serve(ServeArgs),
    /// Run one function and print its output FunctionIO (or, for a KRM
    /// function, its output ResourceList).
    Run(RunArgs),
    /// Prefetch images into the cache.
    ///
    /// Prints `REFERENCE DIGEST` for each image pulled, and a progress bar per layer on
    /// stderr when stderr is a terminal; with -o json or yaml, a list of {image,
    /// reference, digest}, once every image is pulled.
    Pull(PullArgs),
    /// Manage the image cache: list, inspect, rm, prune, verify.
    Cache(crate::commands::cache::CacheCmdArgs),
    /// Serve or call one Crossplane v1 function (a Function package).
    Function(crate::commands::function::FunctionArgs),
    /// Print fnrun's version, commit, target and compiler.
    Version(crate::commands::meta::VersionArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    ///
    /// bash: `source <(fnrun completion bash)`; zsh: `fnrun completion zsh >
    /// "${fpath[1]}/_fnrun"`; fish: `fnrun completion fish >
    /// ~/.config/fish/completions/fnrun.fish`.
    Completion(crate::commands::meta::CompletionArgs),
    /// Print the man page (roff), or write one per command into a directory.
    Man(crate::commands::meta::ManArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_path;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn paths_are_made_absolute_at_start() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(parse_path("./c").unwrap(), cwd.join("c"));
        assert_eq!(parse_path("c/d").unwrap(), cwd.join("c/d"));
        assert_eq!(parse_path("/abs").unwrap(), PathBuf::from("/abs"));
        assert_eq!(parse_path("").unwrap_err(), "the path is empty");
        let cli = Cli::try_parse_from(["fnrun", "run", "--cache-dir", "./c", "img"]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.cache.dir.cache_dir, Some(cwd.join("c")));
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["fnrun", "start"]).unwrap();
        let Command::Serve(s) = cli.command else {
            panic!()
        };
        assert_eq!(s.listen, vec!["unix-abstract:crossplane/fn/default.sock"]);
        let cli = Cli::try_parse_from([
            "fnrun",
            "run",
            "--timeout",
            "2s",
            "--image-pull-policy",
            "Never",
            "img",
            "in.yaml",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.timeout.timeout, Duration::from_secs(2));
        assert_eq!(r.input, "in.yaml");
    }

    #[test]
    fn pull_policies_in_kubernetes_and_kpt_spellings() {
        for (given, want) in [
            ("IfNotPresent", "IfNotPresent"),
            ("ifNotPresent", "IfNotPresent"),
            ("if-not-present", "IfNotPresent"),
            ("always", "Always"),
            ("Always", "Always"),
            ("never", "Never"),
            ("NEVER", "Never"),
        ] {
            let cli = Cli::try_parse_from(["fnrun", "run", "--image-pull-policy", given, "img"])
                .unwrap_or_else(|e| panic!("{given}: {e}"));
            let Command::Run(r) = cli.command else {
                panic!()
            };
            assert_eq!(format!("{:?}", r.policy.image_pull_policy), want, "{given}");
        }
        assert!(
            Cli::try_parse_from(["fnrun", "run", "--image-pull-policy", "sometimes", "img"])
                .is_err()
        );
    }

    #[test]
    fn network_policies_none_and_isolated_are_isolated() {
        for (given, want) in [
            ("none", "Isolated"),
            ("isolated", "Isolated"),
            ("Isolated", "Isolated"),
            ("NONE", "Isolated"),
            ("runner", "Runner"),
            ("Runner", "Runner"),
        ] {
            let cli = Cli::try_parse_from(["fnrun", "run", "--network-policy", given, "img"])
                .unwrap_or_else(|e| panic!("{given}: {e}"));
            let Command::Run(r) = cli.command else {
                panic!()
            };
            assert_eq!(format!("{:?}", r.policy.network_policy), want, "{given}");
        }
        assert!(Cli::try_parse_from(["fnrun", "run", "--network-policy", "host", "img"]).is_err());
    }

    #[test]
    fn log_levels_from_flags() {
        use LogLevel::*;
        assert_eq!(LogLevel::raised(Off, 1), Info);
        assert_eq!(LogLevel::raised(Off, 2), Debug);
        assert_eq!(LogLevel::raised(Off, 9), Trace);
        assert_eq!(LogLevel::raised(Info, 1), Debug);
        assert_eq!(LogLevel::raised(Info, 2), Trace);
        assert_eq!(LogLevel::raised(Warn, 1), Info);
        let cli = Cli::try_parse_from(["fnrun", "pull", "-vv", "img"]).unwrap();
        assert_eq!((cli.verbose, cli.log_level), (2, None));
        let cli = Cli::try_parse_from(["fnrun", "--log-level", "debug", "cache", "list"]).unwrap();
        assert_eq!(cli.log_level, Some(Debug));
        assert!(Cli::try_parse_from(["fnrun", "-v", "--log-level", "info", "version"]).is_err());
    }
}
