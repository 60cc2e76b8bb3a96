//! What every command shares: build facts, exit codes, error lines, and the
//! runtime of a one-shot command.

use std::process::ExitCode;

use fnrun_core::error::LINE_MAX;
pub(crate) use fnrun_core::error::{EXIT_FAILED, EXIT_USAGE};

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

/// A daemon (`serve`, `function serve`) that could not start or serve: its
/// error once, as a log line in the chosen `--log-format` (a `fnrun:` line
/// only when logging is filtered off, so that it is never lost).
pub(crate) fn daemon_failed(e: &anyhow::Error, code: u8) -> ExitCode {
    let message = error_line(&format!("{e:#}"));
    if tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!("{message}");
    } else {
        eprintln!("fnrun: {message}");
    }
    ExitCode::from(code)
}

/// Error output is one line (the stderr tail of a function may have many) of
/// at most [`LINE_MAX`] bytes (what it quotes may be megabytes long).
pub(crate) fn error_line(e: &dyn std::fmt::Display) -> String {
    let line = e.to_string().trim_end().replace('\n', "\\n");
    fnrun_core::error::bounded(&line, LINE_MAX)
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
