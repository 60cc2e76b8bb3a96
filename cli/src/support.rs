//! What every command shares: build facts, exit codes, error lines, and the
//! runtime of a one-shot command.

use std::process::ExitCode;

use fnrun_runner::error::LINE_MAX;
pub(crate) use fnrun_runner::error::{EXIT_FAILED, EXIT_USAGE};

/// Version with build facts, for `--version` and the start-up log line.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("FNRUN_GIT_COMMIT"),
    ", ",
    env!("FNRUN_TARGET"),
    ", rustc ",
    env!("FNRUN_RUSTC_VERSION"),
    ")"
);

/// A runtime on this thread, for a command that runs one call.
pub(crate) fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Whether logs are JSON (`--log-format json`), set once at start.
pub(crate) static JSON_LOGS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A daemon (`serve`, `function serve`) that could not start or serve: its
/// error once, as one `fnrun:` line as every command says its error; with
/// `--log-format json`, as a JSON log line instead (when logging is on), so
/// that a log collector reading JSON gets it.
pub(crate) fn daemon_failed(e: &anyhow::Error, code: u8) -> ExitCode {
    let message = error_line(&format!("{e:#}"));
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed)
        && tracing::enabled!(tracing::Level::ERROR)
    {
        tracing::error!("{message}");
    } else {
        eprintln!("fnrun: {message}");
    }
    ExitCode::from(code)
}

/// Error output of at most [`LINE_MAX`] bytes (what it quotes may be
/// megabytes long): one line for a script or a log (the stderr tail of a
/// function may have many: `\n` stands for them), and its line breaks kept
/// on a terminal, where a person reads it.
pub(crate) fn error_line(e: &dyn std::fmt::Display) -> String {
    static TERMINAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let terminal = *TERMINAL.get_or_init(|| std::io::IsTerminal::is_terminal(&std::io::stderr()));
    error_text(e, terminal)
}

/// [`error_line`], for a terminal or not.
pub(crate) fn error_text(e: &dyn std::fmt::Display, terminal: bool) -> String {
    let text = e.to_string();
    let text = text.trim_end();
    if terminal {
        fnrun_runner::error::bounded(&text, LINE_MAX)
    } else {
        fnrun_runner::error::bounded(&text.replace('\n', "\\n"), LINE_MAX)
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit, as
/// the Go runtime does for every program. A daemon holds descriptors for each
/// call in flight and for each cgroup v1 slot it keeps (up to 19), and the
/// usual soft default of 1024 would cap it far below what the host allows.
/// Functions are not affected: the sandbox sets their limit from the hard
/// limit.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open files limit"),
        Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise the open files limit"),
    }
}

/// A signal that stopped a one-shot command (`run`, `function call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stopped {
    pub name: &'static str,
    pub number: i32,
}

impl Stopped {
    /// 128 + the signal's number, as a shell reports a process killed by it
    /// (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as podman exits.
    pub fn exit_code(self) -> u8 {
        u8::try_from(128 + self.number).unwrap_or(EXIT_FAILED)
    }

    /// Says on stderr what was done, and gives the exit code.
    pub fn report(self) -> ExitCode {
        eprintln!(
            "fnrun: {}: stopped the function and removed its sandbox",
            self.name
        );
        ExitCode::from(self.exit_code())
    }
}

/// The signals that stop a one-shot command as they stop podman's `run`:
/// SIGINT (Ctrl-C), SIGTERM (`timeout`, `kill`) and SIGHUP (the terminal
/// closed). Caught, instead of killing fnrun at once, so that the function
/// is stopped and its sandbox removed first (a root run's init does not
/// die with fnrun). SIGINT and SIGHUP that fnrun was started ignoring
/// (`nohup`, a background job of a shell script) stay ignored.
pub(crate) struct StopSignals {
    int: Option<tokio::signal::unix::Signal>,
    term: tokio::signal::unix::Signal,
    hup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Installs the handlers; call it in the runtime, before the function
    /// starts.
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let unless_ignored = |number, kind| match ignored(&status, number) {
            true => Ok(None),
            false => signal(kind).map(Some),
        };
        Ok(StopSignals {
            int: unless_ignored(libc::SIGINT, SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: unless_ignored(libc::SIGHUP, SignalKind::hangup())?,
        })
    }

    /// The next of them that arrives (or arrived since `install`).
    pub async fn next(&mut self) -> Stopped {
        async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let (name, number) = tokio::select! {
            () = recv(&mut self.int) => ("SIGINT", libc::SIGINT),
            _ = self.term.recv() => ("SIGTERM", libc::SIGTERM),
            () = recv(&mut self.hup) => ("SIGHUP", libc::SIGHUP),
        };
        Stopped { name, number }
    }

    /// Runs `work` until it ends or one of the signals arrives; then `work`
    /// is dropped, which kills its run and removes its sandbox, before this
    /// returns.
    pub async fn until<F: std::future::Future>(&mut self, work: F) -> Result<F::Output, Stopped> {
        tokio::pin!(work);
        tokio::select! {
            biased;
            stopped = self.next() => Err(stopped),
            out = &mut work => Ok(out),
        }
    }
}

/// Whether `signal` is ignored by the `SigIgn:` mask of a
/// `/proc/PID/status` text.
fn ignored(status: &str, signal: libc::c_int) -> bool {
    let Some(bit) = signal.checked_sub(1).and_then(|b| u32::try_from(b).ok()) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask.checked_shr(bit).is_some_and(|m| m & 1 == 1))
}

/// Runs `work` (a run of `fnrun run`) on a runtime on this thread until it
/// ends, or until SIGINT, SIGTERM or SIGHUP stops it ([`StopSignals`]):
/// then its function is killed and its sandbox removed, one line says so,
/// and the exit code (128 + the signal's number) is the error.
pub(crate) fn block_on_stoppable<F: std::future::Future>(work: F) -> Result<F::Output, ExitCode> {
    current_thread_runtime().block_on(async {
        let mut signals = StopSignals::install().map_err(|e| {
            eprintln!("fnrun: cannot install the signal handlers: {e}");
            ExitCode::from(EXIT_FAILED)
        })?;
        signals.until(work).await.map_err(Stopped::report)
    })
}

/// The exit code of a daemon's error: a functions file that is not valid,
/// an address that cannot be listened on as given, or flags that do not go
/// together are usage errors (2), as a bad flag is; anything else is 1.
pub(crate) fn exit_code_of(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| {
        c.is::<fnrun_host::catalogue::CatalogueError>()
            || c.is::<fnrun_host::daemon::FlagError>()
            || c.is::<Usage>()
    }) {
        EXIT_USAGE
    } else {
        EXIT_FAILED
    }
}

/// A usage or invalid-input error found after the command line was parsed
/// (a `--listen` address that does not resolve, flags that do not go
/// together): `fnrun` exits 2 with it, as with a bad flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_signals_are_read_from_the_status_mask() {
        // SIGHUP (1) and SIGPIPE (13) ignored, as under nohup.
        let status = "Name:\tfnrun\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000001001\n";
        assert!(ignored(status, libc::SIGHUP));
        assert!(ignored(status, libc::SIGPIPE));
        assert!(!ignored(status, libc::SIGINT));
        assert!(!ignored("", libc::SIGHUP));
        assert!(!ignored(status, 0));
    }
}
