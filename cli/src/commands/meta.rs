//! `fnrun version`, `fnrun completion SHELL` and `fnrun man`: what a user
//! expects of any command-line tool. Completions and man pages are generated
//! from the clap definition of the command line (`fnrun`'s [`clap::Command`], given by `main`) by
//! `clap_complete` and `clap_mangen`, so they never go stale.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use crate::config::{OutputArgs, OutputFormat};

#[derive(Debug, Args)]
pub struct VersionArgs {
    #[command(flatten)]
    pub output: OutputArgs,
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
    let text = match args.output.format {
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
            .and_then(|()| generate_to(man_command(command), dir))
            .map_err(|e| format!("cannot write the man pages into {}: {e}", dir.display())),
        None => {
            let mut out = Vec::new();
            let mut command = man_command(command);
            command.build();
            match render(&command, &mut out) {
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

/// One page per command, as `clap_mangen::generate_to` writes them, each
/// rendered by [`render`].
fn generate_to(command: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    fn generate(command: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            generate(sub.clone(), dir)?;
        }
        let filename = clap_mangen::Man::new(command.clone()).get_filename();
        let mut file = std::fs::File::create(dir.join(filename))?;
        render(&command, &mut file)?;
        std::io::Write::flush(&mut file)
    }
    let mut command = command.disable_help_subcommand(true);
    command.build();
    generate(command, dir)
}

/// `command`'s page (built) as clap_mangen renders it, with EXIT STATUS,
/// ENVIRONMENT and EXAMPLES sections before its version and authors.
fn render(command: &clap::Command, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if command.has_subcommands() {
        man.render_subcommands_section(w)?;
    }
    if command.get_after_long_help().is_some() || command.get_after_help().is_some() {
        man.render_extra_section(w)?;
    }
    w.write_all(EXIT_STATUS.as_bytes())?;
    w.write_all(ENVIRONMENT.as_bytes())?;
    if let Some(examples) = examples(command.get_name()) {
        w.write_all(b".SH EXAMPLES\n")?;
        for (what, line) in examples {
            writeln!(w, ".PP\n{what}\n.PP\n.RS 4\n.nf\n{line}\n.fi\n.RE")?;
        }
    }
    if command.get_version().is_some() || command.get_long_version().is_some() {
        man.render_version_section(w)?;
    }
    if command.get_author().is_some() {
        man.render_authors_section(w)?;
    }
    Ok(())
}

/// The exit codes of every command (roff).
const EXIT_STATUS: &str = "\
.SH \"EXIT STATUS\"
.TP
.B 0
Success.
.TP
.B 1
The function failed (a non-zero exit, a Fatal result, a KRM error result),
or the work could not be done (an image not found or refused, a cache that
cannot be used, an internal error).
.TP
.B 2
A usage error or invalid input: a flag, a quantity, an image reference, a
listen address, an input document.
.TP
.B 124
The function ran past its \\-\\-timeout.
.TP
.B 128+N
Stopped by signal N (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP): the
function was stopped and its sandbox removed first.
";

/// The environment every command reads (roff).
const ENVIRONMENT: &str = "\
.SH ENVIRONMENT
.TP
.B FNRUN_CACHE_DIR
The image cache directory (\\-\\-cache\\-dir).
.TP
.B XDG_CACHE_HOME, HOME
Where the default cache of a user other than root is: $XDG_CACHE_HOME/fnrun,
else $HOME/.cache/fnrun.
.TP
.B REGISTRY_AUTH_FILE
Registry credentials (\\-\\-authfile), as podman and skopeo read it.
.TP
.B RUST_LOG
A log filter, when neither \\-\\-log\\-level nor \\-v is given.
.TP
.B NO_COLOR
When set and not empty, no colours, even on a terminal.
";

/// Examples of a command's page, as (what, command line).
fn examples(name: &str) -> Option<&'static [(&'static str, &'static str)]> {
    Some(match name {
        "fnrun" => &[
            (
                "Run an xfn-era function on a FunctionIO file:",
                "fnrun run xpkg.upbound.io/crossplane-contrib/function-example:v0.1.0 io.yaml",
            ),
            (
                "Call a Crossplane v1.14+ Function package once:",
                "fnrun function call xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.8.2 request.yaml",
            ),
            (
                "Serve functions for Crossplane and Porch:",
                "fnrun serve --functions functions.yaml --functions-insecure",
            ),
        ],
        "run" => &[
            (
                "Run a function on a FunctionIO from stdin, with limits:",
                "fnrun run --memory 128Mi --cpu 500m --timeout 30s IMAGE - < io.yaml",
            ),
            (
                "Run a KRM function on a package directory, as kpt fn eval:",
                "fnrun run gcr.io/kpt-fn/set-labels:v0.2.0 ./pkg -- app=web",
            ),
            (
                "Print a KRM function's ResourceList as JSON:",
                "fnrun run IMAGE resources.yaml -o json",
            ),
        ],
        "pull" => &[
            (
                "Prefetch two images, printing only their digests:",
                "fnrun pull -q IMAGE1 IMAGE2",
            ),
            ("Pull from an OCI archive:", "fnrun pull oci-archive:fn.tar"),
        ],
        "serve" => &[
            (
                "Serve Crossplane's v1alpha1 runner on its default socket:",
                "fnrun serve",
            ),
            (
                "Serve Porch's evaluator and the runner on TCP, every address:",
                "fnrun serve --listen :9445 --tls-cert tls.crt --tls-key tls.key",
            ),
        ],
        "call" => &[(
            "Call a Function package with a RunFunctionRequest, print JSON:",
            "fnrun function call -o json IMAGE request.yaml",
        )],
        "cache" => &[
            ("List what is cached:", "fnrun cache list"),
            (
                "Keep the cache under 10 GiB:",
                "fnrun cache prune --max-size 10Gi",
            ),
        ],
        _ => return None,
    })
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
        let dir = tempfile::tempdir().unwrap();
        generate_to(man_command(Cli::command()), dir.path()).unwrap();
        for (page, example) in [
            ("fnrun-run.1", "fnrun run --memory 128Mi"),
            ("fnrun-function-call.1", "fnrun function call -o json"),
            ("fnrun-cache-rm.1", ""),
        ] {
            let roff = std::fs::read_to_string(dir.path().join(page)).unwrap();
            for section in [".SH \"EXIT STATUS\"", ".SH ENVIRONMENT"] {
                assert!(roff.contains(section), "{page}: {section}");
            }
            assert!(
                roff.contains(".B 130") || roff.contains("130 for SIGINT"),
                "{page}"
            );
            assert!(roff.contains(example), "{page}");
        }
        let mut out = Vec::new();
        let mut command = man_command(Cli::command());
        command.build();
        render(&command, &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains(".SH EXAMPLES"));
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
