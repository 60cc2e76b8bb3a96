//! `fnrun run --krm`: one KRM function (kpt, kustomize) on a ResourceList,
//! from a terminal or as the executable of kpt's and kustomize's exec
//! runtimes.
//!
//! The flags follow `kpt fn eval`: `--fn-config FILE` or `-- key=value...`
//! for the function's configuration, `--network`, `--as-current-user`,
//! `--env KEY[=VALUE]`, `--mount type=bind,src=PATH,dst=PATH[,rw=true]` and
//! `--results-dir DIR`. Everything is checked before the function starts;
//! its output, a ResourceList, is checked before it is printed on stdout
//! (also when the function fails: kpt and kustomize read its results), and
//! the exit code is 0, or 1 when the function exited non-zero or reported
//! an `error` result.
//!
//! stderr gets a summary in kpt's form (`[PASS]`/`[FAIL]`, the results, the
//! function's stderr) and, on failure, one `fnrun:` line. With `--quiet` it
//! gets the function's own stderr instead of the summary, as kpt's exec
//! runtime expects of a function (kpt prints the results itself).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use fnrun_api::resourcelist::{self, ResultItem, kpt};
use fnrun_api::{Quoted, text};
use fnrun_sandbox::{BindMount, HostUser, MountError};

use crate::package::{self, Output, Source};
use fnrun_api::duration::format as humantime;
use fnrun_runner::error::{LINE_MAX, RunError};
use fnrun_runner::runner::{RunAs, RunRequest, Runner};

/// The KRM flags of `fnrun run`.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "KRM flags")]
pub struct KrmArgs {
    /// Run a KRM function (kpt, kustomize): a ResourceList in and out.
    /// Chosen automatically when the input's kind is ResourceList.
    #[arg(long)]
    pub krm: bool,
    /// The function's configuration: a file holding one KRM object (kpt's
    /// --fn-config). Replaces the input's functionConfig.
    #[arg(long, value_name = "FILE", conflicts_with = "fn_args", value_parser = crate::config::parse_path)]
    pub fn_config: Option<PathBuf>,
    /// Give the function the runner's network (--network-policy Runner).
    #[arg(long, conflicts_with = "network_policy")]
    pub network: bool,
    /// Run the function as the invoking user's uid and gid instead of nobody.
    #[arg(long)]
    pub as_current_user: bool,
    /// Set KEY to VALUE in the function's environment; KEY alone passes
    /// fnrun's own value of KEY, if it has one. Repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VALUE]")]
    pub env: Vec<String>,
    /// Mount a host file or directory, read-only unless rw=true (or
    /// readonly=false). docker's spellings work too:
    /// type=bind,source=PATH,target=PATH[,readonly]. Repeatable.
    #[arg(long = "mount", value_name = "type=bind,src=PATH,dst=PATH[,rw=true]")]
    pub mounts: Vec<String>,
    /// Write the function's results to DIR/results.yaml (kpt's
    /// FunctionResultList); DIR is created if missing.
    #[arg(long, value_name = "DIR", value_parser = crate::config::parse_path)]
    pub results_dir: Option<PathBuf>,
    /// Print the function's own stderr instead of a summary (for kpt's
    /// `--exec` and Kptfile `exec:`, where kpt prints the results itself).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Where the function's resources go, as kpt's --output: `stdout` (a
    /// ResourceList), `unwrap` (the resources as YAML documents) or a new
    /// directory. Default: a package directory given as the input is
    /// written back in place; otherwise a ResourceList is printed.
    #[arg(long, value_name = "stdout|unwrap|DIR", value_parser = Output::parse, conflicts_with_all = ["output_dir", "format"])]
    pub output: Option<Output>,
    /// Write the function's resources to DIR, a new directory (as kpt's
    /// --output DIR).
    #[arg(long, value_name = "DIR", conflicts_with = "format")]
    pub output_dir: Option<PathBuf>,
    /// Print the function's resources as a ResourceList in this format:
    /// json or yaml (kpt's stdout and unwrap too). A directory is
    /// --output DIR.
    #[arg(short = 'o', value_name = "json|yaml", value_parser = Output::parse_format)]
    pub format: Option<Output>,
    /// The function's configuration as key=value pairs, after `--`: a
    /// ConfigMap named function-input, as kpt builds it.
    #[arg(last = true, value_name = "KEY=VALUE")]
    pub fn_args: Vec<String>,
}

impl KrmArgs {
    /// Where the resources go, from whichever of `--output`, `--output-dir`
    /// and `-o` was given.
    pub fn output(&self) -> Option<Output> {
        self.output
            .clone()
            .or_else(|| self.output_dir.clone().map(Output::Dir))
            .or_else(|| self.format.clone())
    }

    /// The first flag given that only a KRM function takes, for the error
    /// when the input is a FunctionIO.
    pub fn krm_only_flag(&self) -> Option<&'static str> {
        [
            (self.fn_config.is_some(), "--fn-config"),
            (self.as_current_user, "--as-current-user"),
            (!self.env.is_empty(), "--env"),
            (!self.mounts.is_empty(), "--mount"),
            (self.results_dir.is_some(), "--results-dir"),
            (self.quiet, "--quiet"),
            (self.output.is_some(), "--output"),
            (self.output_dir.is_some(), "--output-dir"),
            (self.format.is_some(), "-o"),
            (!self.fn_args.is_empty(), "-- KEY=VALUE"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// A KRM flag that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    #[error("--env {0}: the name is empty")]
    EnvEmptyName(Quoted),
    #[error("--env {0}: the name holds a NUL byte")]
    EnvNul(Quoted),
    #[error("--env {0}: fnrun's own value of it is not UTF-8")]
    EnvNotUtf8(Quoted),
    #[error("--mount {spec}: {problem}")]
    Mount { spec: Quoted, problem: MountProblem },
    #[error("--mount {spec}: {err}")]
    MountPath {
        spec: Quoted,
        #[source]
        err: MountError,
    },
    #[error("--fn-config {path}: {err}")]
    ReadConfig {
        path: Quoted,
        #[source]
        err: std::io::Error,
    },
    #[error("--fn-config {path}: {err}")]
    Config {
        path: Quoted,
        #[source]
        err: resourcelist::Error,
    },
    #[error(transparent)]
    Args(#[from] kpt::ArgError),
    #[error("--output {0}: the directory already exists; give a new one, as kpt asks")]
    OutputExists(Quoted),
}

/// What is wrong with a `--mount` spec itself.
#[derive(Debug, thiserror::Error)]
pub enum MountProblem {
    #[error("{0} is not of the form key=value")]
    NotKeyValue(Quoted),
    #[error(
        "unknown option {0} (the options are type, src or source, dst, target or destination, rw, and readonly or ro)"
    )]
    Unknown(Quoted),
    #[error("{0} is given twice")]
    Twice(&'static str),
    #[error("type is {0}; only bind mounts are supported")]
    Type(Quoted),
    #[error("type=bind is missing")]
    NoType,
    #[error("src is missing")]
    NoSource,
    #[error("dst is missing")]
    NoTarget,
    #[error("rw is {0}, expected true or false")]
    Rw(Quoted),
    #[error("readonly is {0}, expected true or false (or readonly alone)")]
    ReadOnly(Quoted),
    #[error("rw and readonly are both given")]
    RwAndReadOnly,
}

/// Parses `type=bind,src=PATH,dst=PATH[,rw=true]` (kpt's and kustomize's
/// syntax) and docker's spellings of it (`source`, `target` or
/// `destination`, and `readonly` or `ro`, alone or `=true|false`), and
/// resolves it.
pub fn parse_mount(spec: &str) -> Result<BindMount, FlagError> {
    let bad = |problem| FlagError::Mount {
        spec: Quoted::new(spec),
        problem,
    };
    let (mut kind, mut src, mut dst, mut rw, mut readonly) = (None, None, None, None, None);
    for option in spec.split(',') {
        // docker's `readonly` and `ro` stand alone.
        let (key, value) = match option.split_once('=') {
            Some(pair) => pair,
            None if matches!(option, "readonly" | "ro") => (option, "true"),
            None => return Err(bad(MountProblem::NotKeyValue(Quoted::new(option)))),
        };
        let (slot, name) = match key {
            "type" => (&mut kind, "type"),
            "src" | "source" => (&mut src, "src"),
            "dst" | "target" | "destination" => (&mut dst, "dst"),
            "rw" => (&mut rw, "rw"),
            "readonly" => (&mut readonly, "readonly"),
            "ro" => (&mut readonly, "ro"),
            _ => return Err(bad(MountProblem::Unknown(Quoted::new(key)))),
        };
        if slot.replace(value).is_some() {
            return Err(bad(MountProblem::Twice(name)));
        }
    }
    match kind {
        Some("bind") => {}
        Some(other) => return Err(bad(MountProblem::Type(Quoted::new(other)))),
        None => return Err(bad(MountProblem::NoType)),
    }
    let src = src.ok_or_else(|| bad(MountProblem::NoSource))?;
    let dst = dst.ok_or_else(|| bad(MountProblem::NoTarget))?;
    let writable = match (rw, readonly) {
        (Some(_), Some(_)) => return Err(bad(MountProblem::RwAndReadOnly)),
        (None | Some("false"), None) => false,
        (Some("true"), None) => true,
        (Some(other), None) => return Err(bad(MountProblem::Rw(Quoted::new(other)))),
        (None, Some("true" | "1")) => false,
        (None, Some("false" | "0")) => true,
        (None, Some(other)) => {
            return Err(bad(MountProblem::ReadOnly(Quoted::new(other))));
        }
    };
    BindMount::new(Path::new(src), dst, writable).map_err(|err| FlagError::MountPath {
        spec: Quoted::new(spec),
        err,
    })
}

/// `KEY=VALUE` as given, or `KEY=` fnrun's own value of KEY; `None` when
/// KEY alone is not set here (as docker and kpt leave it out).
pub fn parse_env(pair: &str) -> Result<Option<String>, FlagError> {
    let key = pair.split_once('=').map_or(pair, |(k, _)| k);
    if key.is_empty() {
        return Err(FlagError::EnvEmptyName(Quoted::new(pair)));
    }
    if pair.contains('\0') {
        return Err(FlagError::EnvNul(Quoted::new(pair)));
    }
    if pair.contains('=') {
        return Ok(Some(pair.to_owned()));
    }
    match std::env::var_os(key) {
        None => Ok(None),
        Some(value) => value
            .into_string()
            .map(|v| Some(format!("{key}={v}")))
            .map_err(|_| FlagError::EnvNotUtf8(Quoted::new(key))),
    }
}

/// Why the KRM flags cannot be applied to a request (a usage error).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error("input is not a ResourceList: {0}")]
    Input(#[source] resourcelist::Error),
}

/// Applies the KRM flags to `req`: its function configuration, environment,
/// mounts and user.
pub fn prepare(req: &mut RunRequest, args: &KrmArgs) -> Result<(), PrepareError> {
    if let Some(Output::Dir(dir)) = &args.output()
        && std::fs::symlink_metadata(dir).is_ok()
    {
        return Err(FlagError::OutputExists(Quoted::new(&dir.to_string_lossy())).into());
    }
    let config = match &args.fn_config {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|err| FlagError::ReadConfig {
                path: Quoted::new(&path.to_string_lossy()),
                err,
            })?;
            Some(
                resourcelist::function_config(&bytes).map_err(|err| FlagError::Config {
                    path: Quoted::new(&path.to_string_lossy()),
                    err,
                })?,
            )
        }
        None if !args.fn_args.is_empty() => {
            Some(kpt::config_map(&args.fn_args).map_err(FlagError::from)?)
        }
        None => None,
    };
    if let Some(config) = config {
        req.input =
            resourcelist::with_function_config(&req.input, config).map_err(PrepareError::Input)?;
    }
    for pair in &args.env {
        if let Some(pair) = parse_env(pair)? {
            req.env.push(pair);
        }
    }
    for spec in &args.mounts {
        req.mounts.push(parse_mount(spec)?);
    }
    if args.as_current_user {
        req.run_as = RunAs::Host(HostUser {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        });
    }
    Ok(())
}

/// How one KRM run ended, as kpt records it.
struct Report<'a> {
    image: &'a str,
    elapsed: Duration,
    /// The function's exit code, or fnrun's when the function did not end
    /// by itself (for results.yaml).
    exit_code: i32,
    /// The function's own non-zero exit code, when it exited so.
    function_exit: Option<i32>,
    results: &'a [ResultItem],
    stderr: &'a [u8],
    /// fnrun's one line, on failure.
    error: Option<String>,
}

/// Runs the KRM function of `req` (already a KRM request, its input read
/// from `source`) with `args`, prints what it returned and writes its
/// resources where `--output` says; returns the exit code.
///
/// A ResourceList given as it is, without `--output`, gets the function's
/// own output on stdout, also when the function fails (kpt's and
/// kustomize's exec runtimes read its results). Otherwise the resources are
/// written as `kpt fn eval` writes them, and only when the function
/// succeeded: a failed function changes no file.
pub fn run(runner: &Runner, mut req: RunRequest, args: &KrmArgs, source: &Source) -> ExitCode {
    let image = text::bounded(&req.image, fnrun_runner::error::IMAGE_REF_MAX).into_owned();
    if let Err(e) = prepare(&mut req, args) {
        eprintln!("fnrun: {}", crate::support::error_line(&e));
        return ExitCode::from(crate::support::EXIT_USAGE);
    }
    let start = Instant::now();
    let result = match crate::support::block_on_stoppable(runner.run(req)) {
        Ok(result) => result,
        Err(code) => return code,
    };
    let elapsed = start.elapsed();
    let (output, report, code) = match &result {
        Ok(out) => {
            let results = out
                .resource_list
                .as_ref()
                .map_or(&[][..], |l| l.results.as_slice());
            let errors = results
                .iter()
                .filter(|r| r.severity == resourcelist::Severity::Error)
                .count();
            let error = (errors > 0).then(|| {
                format!(
                    "the function reported {errors} error result{}",
                    if errors == 1 { "" } else { "s" }
                )
            });
            let code = if error.is_some() {
                crate::support::EXIT_FAILED
            } else {
                0
            };
            let report = Report {
                image: &image,
                elapsed,
                exit_code: i32::from(code),
                function_exit: None,
                results,
                stderr: &out.stderr,
                error,
            };
            (Some(&out.output[..]), report, code)
        }
        Err(e) => {
            let code = e.class().exit_code();
            let (output, results) = match e {
                RunError::KrmFunctionFailed { returned, .. } => (
                    returned.as_ref().map(|r| &r.output[..]),
                    returned.as_ref().map_or(&[][..], |r| &r.list.results[..]),
                ),
                _ => (None, &[][..]),
            };
            // The function's own stderr (a timed-out or killed function's
            // too), for the summary and results.yaml.
            let stderr = e.function_stderr().unwrap_or_default().as_bytes();
            let function_exit = match e {
                RunError::KrmFunctionFailed { code, .. } => Some(*code),
                _ => None,
            };
            let error = match function_exit {
                // The summary shows the function's results and stderr: not twice.
                Some(code) => format!("function exited with code {code}"),
                None if !args.quiet => crate::support::error_line(&e.without_stderr()),
                None => crate::support::error_line(e),
            };
            let report = Report {
                image: &image,
                elapsed,
                exit_code: function_exit.unwrap_or(i32::from(code)),
                function_exit,
                results,
                stderr,
                error: Some(error),
            };
            (output, report, code)
        }
    };
    let mut code = ExitCode::from(code);
    let output_to = args.output();
    let verbatim = matches!(source, Source::ResourceList) && output_to.is_none();
    let mut write_error = None;
    let written;
    let output = match (&result, verbatim) {
        (_, true) => output,
        (Ok(out), false) if report.error.is_none() => {
            let list = out
                .resource_list
                .as_ref()
                .expect("a KRM run's output is read");
            match package::write(list, source, output_to.as_ref()) {
                Ok(bytes) => {
                    written = bytes;
                    Some(&written[..])
                }
                Err(e) => {
                    write_error = Some(crate::support::error_line(&e));
                    code = ExitCode::from(crate::support::EXIT_FAILED);
                    None
                }
            }
        }
        (_, false) => None,
    };
    if let Some(output) = output.filter(|o| !o.is_empty()) {
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(output)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            code = ExitCode::from(crate::support::EXIT_FAILED);
        }
    }
    let started = result.as_ref().err().is_none_or(function_ran);
    let mut stderr = std::io::stderr().lock();
    let _ = if args.quiet {
        write_quiet(&mut stderr, &report)
    } else {
        write_summary(&mut stderr, &report, started)
    };
    if let Some(dir) = &args.results_dir {
        match write_results(dir, &report, started) {
            Ok(path) if !args.quiet => {
                let _ = writeln!(stderr, "For complete results, see {}", path.display());
            }
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(
                    stderr,
                    "fnrun: {}",
                    crate::support::error_line(&format!(
                        "cannot write {}/results.yaml: {e}",
                        dir.display()
                    ))
                );
                code = ExitCode::from(crate::support::EXIT_FAILED);
            }
        }
    }
    if let Some(error) = report.error.as_ref().or(write_error.as_ref()) {
        let _ = writeln!(stderr, "fnrun: {error}");
    }
    code
}

/// Whether the function started before the run failed with `e` (so that a
/// summary has something to say).
fn function_ran(e: &RunError) -> bool {
    matches!(
        e,
        RunError::KrmFunctionFailed { .. }
            | RunError::FunctionFailed { .. }
            | RunError::FunctionKilled { .. }
            | RunError::TimedOut { .. }
            | RunError::OutOfMemory { .. }
            | RunError::OutputTooLarge { .. }
            | RunError::InvalidOutput { .. }
    )
}

/// kpt's summary: `[PASS]` or `[FAIL]` with the time taken, the results one
/// per line, the function's stderr and, on failure, its exit code. A run
/// that never started (bad input, no image) has only the `fnrun:` line.
fn write_summary(out: &mut impl Write, report: &Report<'_>, started: bool) -> std::io::Result<()> {
    if !started {
        return Ok(());
    }
    let verdict = if report.error.is_none() {
        "PASS"
    } else {
        "FAIL"
    };
    writeln!(
        out,
        "[{verdict}] {:?} in {}",
        report.image,
        humantime(truncate_to_millis(report.elapsed))
    )?;
    if !report.results.is_empty() {
        writeln!(out, "  Results:")?;
        for line in resourcelist::summary(report.results, LINE_MAX).lines() {
            writeln!(out, "    {line}")?;
        }
    }
    let stderr = String::from_utf8_lossy(report.stderr);
    if !stderr.trim().is_empty() {
        writeln!(out, "  Stderr:")?;
        for line in stderr.trim_end().lines() {
            writeln!(out, "    {line}")?;
        }
    }
    if let Some(code) = report.function_exit {
        writeln!(out, "  Exit code: {code}")?;
    }
    Ok(())
}

/// The function's own stderr, as a function run by kpt's exec runtime
/// would write it.
fn write_quiet(out: &mut impl Write, report: &Report<'_>) -> std::io::Result<()> {
    out.write_all(report.stderr)?;
    if !report.stderr.is_empty() && !report.stderr.ends_with(b"\n") {
        writeln!(out)?;
    }
    Ok(())
}

fn truncate_to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes `DIR/results.yaml`, creating DIR (0755) if needed. Its `stderr`
/// is the function's own, as kpt records it; fnrun's message stands in only
/// when the function never `started` (no image, say), as a container
/// runtime's message would.
fn write_results(dir: &Path, report: &Report<'_>, started: bool) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let stderr = match &report.error {
        Some(error) if !started => error.clone(),
        _ => String::from_utf8_lossy(report.stderr).into_owned(),
    };
    let list = kpt::FunctionResultList::new(vec![kpt::FunctionResult {
        image: report.image.to_owned(),
        stderr: text::bounded(&stderr, LINE_MAX).into_owned(),
        exit_code: report.exit_code,
        results: report.results.to_vec(),
    }]);
    let yaml = list.to_yaml().map_err(std::io::Error::other)?;
    let path = dir.join("results.yaml");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_parse_as_kpt_fn_evals() {
        use clap::Parser;

        use crate::cli::{Cli, Command};
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["fnrun", "run"][..], args].concat()).map(|cli| {
                match cli.command {
                    Command::Run(run) => run,
                    _ => unreachable!("parsed as run"),
                }
            })
        };
        let run = parse(&[
            "--krm",
            "-e",
            "A=b",
            "--env",
            "HOME",
            "--mount",
            "type=bind,src=/tmp,dst=/x",
            "--network",
            "--as-current-user",
            "--results-dir",
            "r",
            "-q",
            "img",
            "in.yaml",
            "--",
            "a=b",
            "c=d",
        ])
        .unwrap();
        assert!(run.krm.krm && run.krm.network && run.krm.as_current_user && run.krm.quiet);
        assert_eq!(run.krm.env, ["A=b", "HOME"]);
        assert_eq!(run.krm.fn_args, ["a=b", "c=d"]);
        assert_eq!((run.image.as_str(), run.input.as_str()), ("img", "in.yaml"));
        assert_eq!(run.krm.krm_only_flag(), Some("--as-current-user"));
        // The input defaults to stdin before the function's arguments.
        let run = parse(&["img", "--", "a=b"]).unwrap();
        assert_eq!((run.input.as_str(), run.krm.fn_args.len()), ("-", 1));
        assert_eq!(run.krm.krm_only_flag(), Some("-- KEY=VALUE"));
        assert_eq!(parse(&["img"]).unwrap().krm.krm_only_flag(), None);
        for conflicting in [
            &["--network", "--network-policy", "Runner", "img"][..],
            &["--fn-config", "f.yaml", "img", "--", "a=b"][..],
        ] {
            let err = parse(conflicting).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{err}"
            );
        }
    }

    #[test]
    fn parses_kpts_mount_syntax_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().display().to_string();
        let m = parse_mount(&format!("type=bind,src={src},dst=/source")).unwrap();
        assert_eq!((m.target(), m.writable()), ("/source", false));
        let m = parse_mount(&format!("type=bind,source={src},target=/out,rw=true")).unwrap();
        assert_eq!((m.target(), m.writable()), ("/out", true));
        // docker's spellings.
        for (options, writable) in [
            ("readonly", false),
            ("ro", false),
            ("readonly=true", false),
            ("ro=1", false),
            ("readonly=false", true),
            ("ro=0", true),
        ] {
            let spec = format!("type=bind,source={src},destination=/d,{options}");
            let m = parse_mount(&spec).unwrap();
            assert_eq!((m.target(), m.writable()), ("/d", writable), "{spec}");
        }
        for (spec, want) in [
            (format!("src={src},dst=/x"), "type=bind is missing"),
            (format!("type=volume,src={src},dst=/x"), "only bind mounts"),
            ("type=bind,dst=/x".to_owned(), "src is missing"),
            (format!("type=bind,src={src}"), "dst is missing"),
            (
                format!("type=bind,src={src},dst=/x,rw=yes"),
                "rw is \"yes\"",
            ),
            (
                format!("type=bind,src={src},dst=/x,rx"),
                "\"rx\" is not of the form",
            ),
            (
                format!("type=bind,src={src},dst=/x,readonly=yes"),
                "readonly is \"yes\"",
            ),
            (
                format!("type=bind,src={src},dst=/x,rw=true,ro"),
                "rw and readonly are both given",
            ),
            (
                format!("type=bind,src={src},dst=/x,bind-propagation=shared"),
                "unknown option \"bind-propagation\"",
            ),
            (
                format!("type=bind,src={src},src=/etc,dst=/x"),
                "src is given twice",
            ),
            (
                format!("type=bind,src={src},dst=x"),
                "is not an absolute path",
            ),
            (format!("type=bind,src={src},dst=/proc/x"), "under /proc"),
            (
                "type=bind,src=/nonexistent/fnrun,dst=/x".to_owned(),
                "No such file",
            ),
        ] {
            let err = parse_mount(&spec).unwrap_err().to_string();
            assert!(err.contains(want), "{spec}: {err}");
            assert!(err.starts_with("--mount \""), "{err}");
        }
        let long = format!("type=bind,src={},dst=/x", "y".repeat(1 << 20));
        assert!(parse_mount(&long).unwrap_err().to_string().len() < 2048);
    }

    #[test]
    fn env_takes_a_value_or_fnruns_own() {
        assert_eq!(parse_env("A=b=c").unwrap().as_deref(), Some("A=b=c"));
        assert_eq!(parse_env("A=").unwrap().as_deref(), Some("A="));
        let path = std::env::var("PATH").unwrap();
        assert_eq!(parse_env("PATH").unwrap(), Some(format!("PATH={path}")));
        assert_eq!(parse_env("FNRUN_SURELY_UNSET_VARIABLE").unwrap(), None);
        assert!(
            parse_env("=x")
                .unwrap_err()
                .to_string()
                .contains("name is empty")
        );
        assert!(parse_env("A\0=x").unwrap_err().to_string().contains("NUL"));
    }

    fn report<'a>(results: &'a [ResultItem], stderr: &'a [u8], error: Option<&str>) -> Report<'a> {
        Report {
            image: "example.org/fn:v1",
            elapsed: Duration::from_micros(1_234_567),
            exit_code: i32::from(error.is_some()),
            function_exit: error.is_some().then_some(1),
            results,
            stderr,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn summaries_read_like_kpts() {
        let results = [ResultItem {
            message: "label set".into(),
            severity: resourcelist::Severity::Info,
            ..ResultItem::default()
        }];
        let mut out = Vec::new();
        write_summary(&mut out, &report(&results, b"one\ntwo\n", None), true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[PASS] \"example.org/fn:v1\" in 1.234s\n  Results:\n    [info]: label set\n  Stderr:\n    one\n    two\n"
        );
        let mut out = Vec::new();
        write_summary(&mut out, &report(&[], b"", Some("boom")), true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[FAIL] \"example.org/fn:v1\" in 1.234s\n  Exit code: 1\n"
        );
        let mut out = Vec::new();
        write_summary(&mut out, &report(&[], b"", Some("no image")), false).unwrap();
        assert!(out.is_empty());
        let mut out = Vec::new();
        write_quiet(&mut out, &report(&results, b"log", None)).unwrap();
        assert_eq!(out, b"log\n");
    }

    #[test]
    fn results_yaml_is_kpts_function_result_list() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let results = [ResultItem {
            message: "bad".into(),
            severity: resourcelist::Severity::Error,
            ..ResultItem::default()
        }];
        let path = write_results(
            &nested,
            &report(
                &results,
                b"checking 1 object\n",
                Some("the function reported 1 error result"),
            ),
            true,
        )
        .unwrap();
        let yaml = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            yaml,
            "apiVersion: kpt.dev/v1\nkind: FunctionResultList\nmetadata:\n  name: fnresults\nexitCode: 1\nitems:\n- image: example.org/fn:v1\n  stderr: |\n    checking 1 object\n  exitCode: 1\n  results:\n  - message: bad\n    severity: error\n"
        );
        // A function that wrote nothing to stderr has an empty stderr, not
        // fnrun's message; one that never started has fnrun's message.
        write_results(&nested, &report(&results, b"", Some("reported")), true).unwrap();
        let yaml = std::fs::read_to_string(nested.join("results.yaml")).unwrap();
        assert!(!yaml.contains("reported"), "{yaml}");
        write_results(&nested, &report(&[], b"", Some("image not found")), false).unwrap();
        let yaml = std::fs::read_to_string(nested.join("results.yaml")).unwrap();
        assert!(yaml.contains("stderr: image not found"), "{yaml}");
    }
}
