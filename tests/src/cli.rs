//! The `fnrun` CLI as a user runs it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::fnrun_bin;
use crate::process::{Finished, run_capture};
use crate::user::TestUser;

/// The longest the harness lets one CLI invocation run before killing it.
pub const CLI_GUARD: Duration = Duration::from_secs(180);

/// Runs `fnrun ARGS...` with `stdin` (or an empty stdin) and returns its exit
/// code, stdout and stderr. Uses whatever cache the arguments or environment
/// select; prefer [`Cli`], which gives every test its own cache.
pub fn run_cli(args: &[&str], stdin: Option<&[u8]>) -> Finished {
    run_capture(Command::new(fnrun_bin()).args(args), stdin, CLI_GUARD)
}

/// Subcommands that take `--cache-dir`.
const CACHE_COMMANDS: &[&str] = &["run", "pull", "cache"];

/// The CLI with its own cache dir (and scratch dir for input files), run as
/// the current user or as an unprivileged one.
pub struct Cli {
    dir: TempDir,
    user: Option<TestUser>,
    env: Vec<(String, String)>,
}

impl Cli {
    /// A CLI with a fresh, empty cache.
    pub fn new() -> Result<Cli> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-cli-")
            .tempdir()
            .context("cannot create the CLI's temp dir")?;
        std::fs::create_dir(dir.path().join("cache"))?;
        Ok(Cli {
            dir,
            user: None,
            env: Vec::new(),
        })
    }

    /// A CLI that runs as `user` (rootless), with a cache it owns.
    pub fn as_user(user: TestUser) -> Result<Cli> {
        let mut cli = Cli::new()?;
        user.chown(cli.dir.path())?;
        user.chown(&cli.cache_dir())?;
        cli.user = Some(user);
        Ok(cli)
    }

    /// Adds an environment variable for every invocation.
    pub fn env(&mut self, name: &str, value: &str) -> &mut Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The `--cache-dir` this CLI passes.
    pub fn cache_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("cache")
    }

    /// A scratch directory for the test's files (owned by the CLI's user).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `contents` to a file in the scratch dir and returns its path.
    pub fn write_file(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<String> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if let Some(user) = &self.user {
            user.chown(&path)?;
        }
        Ok(path.display().to_string())
    }

    /// `fnrun SUBCOMMAND [--cache-dir DIR] ARGS...` with this CLI's cache.
    fn with_cache(&self, args: &[&str]) -> Command {
        let mut cmd = self.command();
        if let Some((subcommand, rest)) = args.split_first() {
            cmd.arg(subcommand);
            if CACHE_COMMANDS.contains(subcommand) {
                cmd.arg("--cache-dir").arg(self.cache_dir());
            }
            cmd.args(rest);
        }
        cmd.env("FNRUN_CACHE_DIR", self.cache_dir());
        cmd
    }

    /// Runs `fnrun SUBCOMMAND [--cache-dir DIR] ARGS...` with `stdin`.
    pub fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Finished {
        run_capture(&mut self.with_cache(args), stdin, CLI_GUARD)
    }

    /// Starts `fnrun SUBCOMMAND [--cache-dir DIR] ARGS...` in the
    /// background, as [`Cli::run`] would run it, with stdin and stdout on
    /// `/dev/null` and stderr piped; killed if the test's thread ends.
    pub fn spawn(&self, args: &[&str]) -> Result<std::process::Child> {
        let mut cmd = self.with_cache(args);
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        crate::process::die_with_parent(&mut cmd)
            .spawn()
            .with_context(|| format!("cannot start fnrun {args:?}"))
    }

    /// Runs `fnrun ARGS...` as given, without this CLI's cache: neither
    /// `--cache-dir` nor `$FNRUN_CACHE_DIR` is set, and `env` is applied last
    /// (a `None` value unsets the variable). It runs in the scratch dir, so a
    /// relative path in `args` is one in it.
    pub fn run_as_given(
        &self,
        args: &[&str],
        env: &[(&str, Option<&str>)],
        stdin: Option<&[u8]>,
    ) -> Finished {
        let mut cmd = self.command();
        cmd.args(args).env_remove("FNRUN_CACHE_DIR");
        for (name, value) in env {
            match value {
                Some(value) => cmd.env(name, value),
                None => cmd.env_remove(name),
            };
        }
        run_capture(&mut cmd, stdin, CLI_GUARD)
    }

    /// Runs `fnrun SUBCOMMAND [--cache-dir DIR] ARGS...` on a terminal (a
    /// pseudo-terminal of util-linux's `script`) as stdin, stdout and stderr,
    /// on which `typed` is typed (`\x04` is Ctrl-D). Stdout holds everything
    /// the terminal showed.
    pub fn run_on_terminal(&self, args: &[&str], typed: &[u8]) -> Finished {
        let quote = |a: &str| format!("'{}'", a.replace('\'', r"'\''"));
        let mut line = vec![quote(&fnrun_bin().display().to_string())];
        if let Some((subcommand, rest)) = args.split_first() {
            line.push(quote(subcommand));
            if CACHE_COMMANDS.contains(subcommand) {
                line.push("--cache-dir".into());
                line.push(quote(&self.cache_dir().display().to_string()));
            }
            line.extend(rest.iter().map(|a| quote(a)));
        }
        let mut cmd = match &self.user {
            Some(user) => user.command("script"),
            None => Command::new("script"),
        };
        cmd.args(["--quiet", "--return", "--command"])
            .arg(line.join(" "))
            .arg("/dev/null")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path());
        run_capture(&mut cmd, Some(typed), CLI_GUARD)
    }

    /// `fnrun` as this CLI's user, with its environment, in the scratch dir.
    fn command(&self) -> Command {
        let bin = fnrun_bin();
        let mut cmd = match &self.user {
            Some(user) => user.command(&bin),
            None => Command::new(&bin),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path());
        cmd
    }
}

impl Finished {
    /// A one-line summary plus the full output, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit code {:?} (signal {:?}) after {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.signal,
            self.elapsed,
            if self.timed_out {
                " (killed by the harness)"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        )
    }
}

/// `fnrun function serve [--listen ADDR] IMAGE`, as `crossplane render`'s
/// Development runtime expects a function: killed on drop.
pub struct FunctionServe {
    child: std::process::Child,
    listen: String,
    log: std::path::PathBuf,
}

impl Cli {
    /// Starts `fnrun function serve` for `image` on a free loopback port,
    /// with this CLI's cache, and waits until it serves (its server started:
    /// the image is checked before the first call).
    pub fn function_serve(&self, image: &str) -> Result<FunctionServe> {
        let listen = format!("127.0.0.1:{}", crate::registry::free_port()?);
        self.function_serve_with(&["--listen", &listen], image)
    }

    /// `fnrun function serve ARGS... IMAGE` as a user types it, as this CLI's
    /// user, with its cache: without `--listen` in `args`, on its default address
    /// (`127.0.0.1:9443`, where `crossplane render`'s Development runtime
    /// looks by default).
    pub fn function_serve_with(&self, args: &[&str], image: &str) -> Result<FunctionServe> {
        let listen = args
            .iter()
            .position(|a| *a == "--listen")
            .and_then(|i| args.get(i + 1))
            .unwrap_or(&"127.0.0.1:9443")
            .to_string();
        let log = self
            .scratch()
            .join(format!("serve-{}.log", listen.replace([':', '/'], "-")));
        let file = std::fs::File::create(&log)?;
        let mut serve = self.command();
        serve
            .args(["function", "serve"])
            .args(args)
            .arg(image)
            .env("FNRUN_CACHE_DIR", self.cache_dir())
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = crate::process::die_with_parent(&mut serve)
            .spawn()
            .context("cannot start fnrun function serve")?;
        let serve = FunctionServe { child, listen, log };
        let ready = crate::wait_for(Duration::from_secs(120), || {
            Some(serve.log()).filter(|l| l.contains("serving the function"))
        });
        if ready.is_none() {
            anyhow::bail!("fnrun function serve did not serve: {}", serve.log());
        }
        Ok(serve)
    }
}

impl FunctionServe {
    /// Its `--listen` address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> &str {
        &self.listen
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it (SIGTERM, then SIGKILL) and returns how it exited.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        crate::process::terminate(&mut self.child, Duration::from_secs(30))
    }
}

impl Drop for FunctionServe {
    fn drop(&mut self) {
        crate::process::terminate(&mut self.child, Duration::from_secs(5));
    }
}
