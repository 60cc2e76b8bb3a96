//! `fnrun version`, `fnrun completion SHELL` and `fnrun man`: what a user
//! expects of any command-line tool. Completions and man pages are generated
//! from the clap definition of the command line (`fnrun`'s [`clap::Command`], given by `main`) by
//! `clap_complete` and `clap_mangen`, so they never go stale.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use crate::config::OutputFormat;

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Output format: text, json or yaml.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write fnrun.1 and a page per subcommand (fnrun-run.1, ...) into DIR
    /// instead of printing fnrun.1 on stdout.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

/// What `fnrun version -o json|yaml` prints.
#[derive(Debug, Serialize)]
struct Version {
    version: &'static str,
    commit: &'static str,
    target: &'static str,
    rustc: &'static str,
}

const VERSION: Version = Version {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("FNRUN_GIT_COMMIT"),
    target: env!("FNRUN_TARGET"),
    rustc: env!("FNRUN_RUSTC_VERSION"),
};

pub fn version(args: VersionArgs) -> ExitCode {
    let text = match args.output {
        OutputFormat::Text => format!(
            "fnrun {}\ncommit: {}\ntarget: {}\nrustc: {}\n",
            VERSION.version, VERSION.commit, VERSION.target, VERSION.rustc
        ),
        format => crate::output::render(&VERSION, format),
    };
    crate::output::print(&text)
}

pub fn completion(args: CompletionArgs, mut command: clap::Command) -> ExitCode {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "fnrun", &mut out);
    crate::output::print(&out)
}

pub fn man(args: ManArgs, command: clap::Command) -> ExitCode {
    let result = match &args.output_dir {
        Some(dir) => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(man_command(command), dir))
            .map_err(|e| format!("cannot write the man pages into {}: {e}", dir.display())),
        None => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(man_command(command)).render(&mut out) {
                Ok(()) => return crate::output::print(&out),
                Err(e) => Err(format!("cannot render the man page: {e}")),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fnrun: {}", crate::support::error_line(&e));
            ExitCode::from(crate::support::EXIT_FAILED)
        }
    }
}

/// The command line as the man pages show it: the long version (with the
/// commit) in their footer.
fn man_command(command: clap::Command) -> clap::Command {
    command.version(env!("CARGO_PKG_VERSION"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    #[test]
    fn completions_name_every_command() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fnrun", &mut out);
            let script = String::from_utf8(out).unwrap();
            for word in ["run", "pull", "cache", "completion", "image-pull-policy"] {
                assert!(script.contains(word), "{shell}: {word} missing");
            }
        }
    }

    #[test]
    fn man_pages_cover_every_command() {
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(man_command(Cli::command()), dir.path()).unwrap();
        for page in [
            "fnrun.1",
            "fnrun-run.1",
            "fnrun-cache-rm.1",
            "fnrun-version.1",
        ] {
            let roff = std::fs::read_to_string(dir.path().join(page))
                .unwrap_or_else(|e| panic!("{page}: {e}"));
            assert!(roff.contains(".TH"), "{page}");
        }
        let mut out = Vec::new();
        clap_mangen::Man::new(man_command(Cli::command()))
            .render(&mut out)
            .unwrap();
        let roff = String::from_utf8(out).unwrap();
        assert!(roff.contains(".TH fnrun 1"), "{}", &roff[..200]);
        assert!(roff.contains("completion"), "subcommands are listed");
    }

    #[test]
    fn version_as_json_and_yaml() {
        let json: serde_json::Value =
            serde_json::from_str(&crate::output::render(&VERSION, OutputFormat::Json)).unwrap();
        assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
        assert!(json["commit"].as_str().is_some_and(|c| !c.is_empty()));
        let yaml: serde_json::Value =
            serde_norway::from_str(&crate::output::render(&VERSION, OutputFormat::Yaml)).unwrap();
        assert_eq!(yaml, json);
    }
}
