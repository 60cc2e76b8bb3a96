//! Every way a run can fail, the one table that maps each to a gRPC code and
//! a CLI exit code, and how long a message about it may be.

use std::time::Duration;

use fnrun_api::quantity::format_memory;
use fnrun_api::resourcelist::{self, ResourceList};
use fnrun_api::text;
use fnrun_registry::ErrorKind as CacheKind;
use fnrun_sandbox::Error as SandboxError;
use tonic::{Code, Status};

/// The most bytes of a gRPC status message. The message travels
/// percent-encoded in a trailer, where a byte outside printable ASCII takes
/// three, and grpc-core clients (Python, C++, Ruby) refuse a call whose
/// metadata passes 8 KiB: 2 KiB of text is at most 6 KiB there.
pub const STATUS_MESSAGE_MAX: usize = 2 << 10;

/// The most bytes of an error on the CLI's stderr or in a log line.
pub const LINE_MAX: usize = 4 << 10;

/// The most bytes of a function's stderr tail quoted in a message: it fits in
/// a status message with the rest of the message.
pub const STDERR_QUOTE_MAX: usize = 1536;

/// The most bytes of the caller's image reference in a log line: a valid one
/// is shorter (a name of 255 bytes, a tag of 128 and a digest).
pub const IMAGE_REF_MAX: usize = 512;

/// The most bytes of a KRM function's results quoted in a message, in kpt's
/// one-line form: with a stderr tail, it fits in a status message.
pub const RESULTS_QUOTE_MAX: usize = 384;

/// `message` bounded to `max` bytes (see [`text::bounded`]).
pub fn bounded(message: &dyn std::fmt::Display, max: usize) -> String {
    let message = message.to_string();
    match text::bounded(&message, max) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(cut) => cut,
    }
}

/// The class of a failure: what the caller should do about it.
///
/// The gRPC status code ([`Class::code`]) and the CLI exit code
/// ([`Class::exit_code`]) are both derived from it, here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The request is malformed.
    InvalidArgument,
    /// The image or tag does not exist.
    NotFound,
    /// The registry refused the credentials.
    Unauthenticated,
    /// The runner refuses the request (e.g. a registry not allowed).
    PermissionDenied,
    /// The request cannot run on this host or with this cache state.
    FailedPrecondition,
    /// The function ran past its timeout.
    DeadlineExceeded,
    /// The function hit its memory limit, or the runner is at capacity.
    ResourceExhausted,
    /// The function failed: non-zero exit, bad output, output too large.
    Aborted,
    /// A dependency is unreachable (registry).
    Unavailable,
    /// Something broke that is not the caller's fault.
    Internal,
}

/// Exit codes of the CLI (SPEC.md): a failure, a usage error, a timeout
/// (as `timeout(1)` exits).
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_TIMEOUT: u8 = 124;

impl Class {
    /// The gRPC code (SPEC.md's status table).
    pub fn code(self) -> Code {
        match self {
            Class::InvalidArgument => Code::InvalidArgument,
            Class::NotFound => Code::NotFound,
            Class::Unauthenticated => Code::Unauthenticated,
            Class::PermissionDenied => Code::PermissionDenied,
            Class::FailedPrecondition => Code::FailedPrecondition,
            Class::DeadlineExceeded => Code::DeadlineExceeded,
            Class::ResourceExhausted => Code::ResourceExhausted,
            Class::Aborted => Code::Aborted,
            Class::Unavailable => Code::Unavailable,
            Class::Internal => Code::Internal,
        }
    }

    /// The CLI's exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Class::InvalidArgument => EXIT_USAGE,
            Class::DeadlineExceeded => EXIT_TIMEOUT,
            Class::NotFound
            | Class::Unauthenticated
            | Class::PermissionDenied
            | Class::FailedPrecondition
            | Class::ResourceExhausted
            | Class::Aborted
            | Class::Unavailable
            | Class::Internal => EXIT_FAILED,
        }
    }

    /// A status of this class's code with `message`, bounded to
    /// [`STATUS_MESSAGE_MAX`]: what a message quotes (the input, stderr,
    /// output, a registry's answer) can be megabytes long.
    pub fn status(self, message: &dyn std::fmt::Display) -> Status {
        Status::new(self.code(), bounded(message, STATUS_MESSAGE_MAX))
    }
}

impl From<RunError> for Status {
    fn from(e: RunError) -> Status {
        e.class().status(&e)
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("input is not a FunctionIO: {0}")]
    InvalidInput(#[source] fnrun_api::functionio::Error),
    #[error("input is not a ResourceList: {0}")]
    InvalidResourceList(#[source] resourcelist::Error),
    #[error(transparent)]
    InvalidRequest(#[from] RequestError),
    #[error("runner is at capacity: {max_concurrency} runs in flight and {max_queue} calls queued")]
    Overloaded {
        max_concurrency: usize,
        max_queue: usize,
    },
    #[error("images from registry {registry:?} are not allowed on this runner")]
    RegistryNotAllowed { registry: String },
    #[error("{0}")]
    Image(#[from] fnrun_cache::Error),
    #[error("{0}")]
    User(#[from] crate::user::UserError),
    #[error("{}{}", .0, best_effort_hint(.0))]
    Sandbox(#[from] fnrun_sandbox::Error),
    #[error("function exited with code {code}{}", stderr_suffix(.stderr))]
    FunctionFailed { code: i32, stderr: String },
    #[error("function was killed by signal {signal}{}", stderr_suffix(.stderr))]
    FunctionKilled { signal: i32, stderr: String },
    #[error("function ran past its timeout of {}{}", fnrun_api::duration::format(*.timeout), stderr_suffix(.stderr))]
    TimedOut { timeout: Duration, stderr: String },
    #[error("function exceeded its memory limit of {} and was killed{}", format_memory(*.limit), stderr_suffix(.stderr))]
    OutOfMemory { limit: u64, stderr: String },
    #[error("function output exceeds the limit of {} (the runner's --max-output-bytes)", format_memory(*.limit as u64))]
    OutputTooLarge { limit: usize },
    #[error("function output is {error}{}", stderr_suffix(.stderr))]
    InvalidOutput {
        #[source]
        error: OutputError,
        stderr: String,
    },
    /// A KRM function exited non-zero; what it returned, if it was a
    /// ResourceList, is kept: its results say why (kpt and Porch show them).
    #[error("function exited with code {code}{}{}", results_suffix(.returned), stderr_suffix(.stderr))]
    KrmFunctionFailed {
        code: i32,
        returned: Option<Box<Returned>>,
        stderr: String,
    },
}

/// What a function wrote that is not what it should have.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("not a FunctionIO: {0}")]
    FunctionIo(#[source] fnrun_api::functionio::Error),
    #[error("not a ResourceList: {0}")]
    ResourceList(#[source] resourcelist::Error),
}

/// The ResourceList a failed KRM function returned, as bytes and as read.
#[derive(Debug)]
pub struct Returned {
    pub output: Vec<u8>,
    pub list: ResourceList,
}

/// `; results: [error] ...`, bounded to [`RESULTS_QUOTE_MAX`]; nothing if the
/// function returned none.
fn results_suffix(returned: &Option<Box<Returned>>) -> String {
    match returned {
        Some(r) if !r.list.results.is_empty() => format!(
            "; results: {}",
            resourcelist::summary(&r.list.results, RESULTS_QUOTE_MAX).replace('\n', "; ")
        ),
        _ => String::new(),
    }
}

/// Why a request is refused before any work starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("image is required")]
    NoImage,
    #[error("unknown image pull policy {0}")]
    PullPolicy(i32),
    #[error("unknown network policy {0}")]
    NetworkPolicy(i32),
    #[error("memory limit {0}")]
    Memory(#[source] fnrun_api::quantity::Error),
    #[error("cpu limit {0}")]
    Cpu(#[source] fnrun_api::quantity::Error),
    #[error("timeout {seconds}s{nanos}ns is negative")]
    NegativeTimeout { seconds: i64, nanos: i32 },
    #[error("timeout must be positive")]
    ZeroTimeout,
    #[error("image pull auth is not base64")]
    AuthNotBase64,
    #[error("image pull auth is not UTF-8 once decoded")]
    AuthNotUtf8,
    #[error("image pull auth is not base64 of user:password")]
    AuthNotUserPassword,
    #[error(
        "the image is a Crossplane Function package{}, a gRPC server, not a FunctionIO \
         or KRM function: call it with `fnrun function call IMAGE REQUEST`",
        if name.is_empty() { String::new() } else { format!(" ({name})") }
    )]
    FunctionPackage { name: String },
}

/// For a limit this host cannot enforce: the flag that runs without it.
fn best_effort_hint(e: &SandboxError) -> &'static str {
    match e {
        SandboxError::LimitUnavailable { .. } => {
            " (fnrun's --best-effort-limits runs the function without it, with a warning)"
        }
        _ => "",
    }
}

/// `; stderr: TAIL`, the tail bounded to [`STDERR_QUOTE_MAX`]; nothing if the
/// function wrote nothing.
fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("; stderr: {}", text::bounded(s, STDERR_QUOTE_MAX))
    }
}

impl RunError {
    /// The failure class (see the table in SPEC.md).
    pub fn class(&self) -> Class {
        match self {
            RunError::InvalidInput(_)
            | RunError::InvalidResourceList(_)
            | RunError::InvalidRequest(_) => Class::InvalidArgument,
            RunError::Overloaded { .. } => Class::ResourceExhausted,
            RunError::RegistryNotAllowed { .. } => Class::PermissionDenied,
            RunError::Image(e) => match e.kind() {
                CacheKind::InvalidReference => Class::InvalidArgument,
                CacheKind::NotFound => Class::NotFound,
                CacheKind::Unauthorized => Class::Unauthenticated,
                CacheKind::NotCached => Class::FailedPrecondition,
                CacheKind::Unavailable => Class::Unavailable,
                CacheKind::Corrupt | CacheKind::Internal => Class::Internal,
            },
            RunError::User(e) if e.is_internal() => Class::Internal,
            RunError::User(_) => Class::InvalidArgument,
            RunError::Sandbox(e) => match e {
                SandboxError::InvalidSpec(_)
                | SandboxError::LimitUnavailable { .. }
                | SandboxError::Mount { .. } => Class::FailedPrecondition,
                SandboxError::Exec { .. } => Class::Aborted,
                SandboxError::Io { .. }
                | SandboxError::Setup { .. }
                | SandboxError::InitDied { .. }
                | SandboxError::Cgroup(_) => Class::Internal,
            },
            RunError::FunctionFailed { .. }
            | RunError::KrmFunctionFailed { .. }
            | RunError::FunctionKilled { .. }
            | RunError::OutputTooLarge { .. }
            | RunError::InvalidOutput { .. } => Class::Aborted,
            RunError::TimedOut { .. } => Class::DeadlineExceeded,
            RunError::OutOfMemory { .. } => Class::ResourceExhausted,
        }
    }

    /// The function's own stderr tail, when the function ran and failed.
    pub fn function_stderr(&self) -> Option<&str> {
        match self {
            RunError::FunctionFailed { stderr, .. }
            | RunError::FunctionKilled { stderr, .. }
            | RunError::TimedOut { stderr, .. }
            | RunError::OutOfMemory { stderr, .. }
            | RunError::InvalidOutput { stderr, .. }
            | RunError::KrmFunctionFailed { stderr, .. } => Some(stderr),
            _ => None,
        }
    }

    /// The message without the `; stderr: ...` it ends with, for where the
    /// function's stderr is shown on its own.
    pub fn without_stderr(&self) -> String {
        let message = self.to_string();
        match self.function_stderr() {
            Some(stderr) => message
                .strip_suffix(&stderr_suffix(stderr))
                .map_or(message.clone(), str::to_owned),
            None => message,
        }
    }

    /// A short outcome label for logs and metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            RunError::InvalidInput(_)
            | RunError::InvalidResourceList(_)
            | RunError::InvalidRequest(_)
            | RunError::RegistryNotAllowed { .. } => "invalid_request",
            RunError::Overloaded { .. } => "rejected",
            RunError::Image(_) => "image_error",
            RunError::User(e) if e.is_internal() => "image_error",
            RunError::User(_) => "invalid_request",
            RunError::Sandbox(_) => "sandbox_error",
            RunError::FunctionFailed { .. }
            | RunError::KrmFunctionFailed { .. }
            | RunError::FunctionKilled { .. } => "function_failed",
            RunError::TimedOut { .. } => "timeout",
            RunError::OutOfMemory { .. } => "out_of_memory",
            RunError::OutputTooLarge { .. } => "output_too_large",
            RunError::InvalidOutput { .. } => "invalid_output",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn the_output_limit_names_its_flag() {
        let e = RunError::OutputTooLarge { limit: 100 << 20 };
        assert_eq!(
            e.to_string(),
            "function output exceeds the limit of 100Mi (the runner's --max-output-bytes)"
        );
    }

    #[test]
    fn messages_carry_the_stderr_tail() {
        let e = RunError::FunctionFailed {
            code: 3,
            stderr: "boom\n".into(),
        };
        assert_eq!(e.to_string(), "function exited with code 3; stderr: boom");
        assert_eq!(e.class(), Class::Aborted);
        assert_eq!(e.function_stderr(), Some("boom\n"));
        assert_eq!(e.without_stderr(), "function exited with code 3");
        let e = RunError::TimedOut {
            timeout: Duration::from_secs(25),
            stderr: String::new(),
        };
        assert_eq!(e.to_string(), "function ran past its timeout of 25s");
        assert_eq!(e.class(), Class::DeadlineExceeded);
    }

    #[test]
    fn a_long_stderr_tail_is_bounded_and_keeps_its_end() {
        let stderr = format!("{}the-end\n", "x".repeat(64 << 10));
        let e = RunError::FunctionFailed { code: 1, stderr };
        let message = e.to_string();
        assert!(
            message.len() <= STDERR_QUOTE_MAX + 64,
            "{} bytes",
            message.len()
        );
        assert!(message.starts_with("function exited with code 1; stderr: xxx"));
        assert!(message.ends_with("xxxthe-end"), "{message}");
        assert!(message.len() <= STATUS_MESSAGE_MAX);
    }

    #[test]
    fn a_failed_krm_function_quotes_its_results_and_stderr_bounded() {
        let doc = format!(
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\nresults:\n{}",
            "- {message: not allowed, severity: error, resourceRef: {apiVersion: v1, kind: ConfigMap, name: cm}}\n"
                .repeat(200)
        );
        let list = resourcelist::validate_output(doc.as_bytes()).unwrap();
        let e = RunError::KrmFunctionFailed {
            code: 1,
            returned: Some(Box::new(Returned {
                output: doc.into_bytes(),
                list,
            })),
            stderr: format!("{}validation failed\n", "x".repeat(64 << 10)),
        };
        let message = e.to_string();
        assert!(
            message.starts_with(
                "function exited with code 1; results: [error] v1/ConfigMap/cm: not allowed; [error]"
            ),
            "{message}"
        );
        assert!(message.ends_with("validation failed"), "{message}");
        assert!(
            message.len() <= RESULTS_QUOTE_MAX + STDERR_QUOTE_MAX + 80,
            "{}",
            message.len()
        );
        assert_eq!(e.class(), Class::Aborted);
        let bare = RunError::KrmFunctionFailed {
            code: 2,
            returned: None,
            stderr: String::new(),
        };
        assert_eq!(bare.to_string(), "function exited with code 2");
    }

    #[test]
    fn bounded_keeps_short_messages_and_cuts_long_ones() {
        assert_eq!(bounded(&"short", 10), "short");
        let long = bounded(&"y".repeat(100_000), LINE_MAX);
        assert!(long.len() <= LINE_MAX);
        assert!(long.contains("bytes elided"));
    }

    #[test]
    fn limits_are_named_in_the_users_units_and_flags() {
        let e = RunError::OutOfMemory {
            limit: 32 << 20,
            stderr: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "function exceeded its memory limit of 32Mi and was killed"
        );
        let e = RunError::Sandbox(SandboxError::LimitUnavailable {
            what: "memory",
            why: "no cgroup".into(),
        });
        assert!(
            e.to_string()
                .ends_with("--best-effort-limits runs the function without it, with a warning)"),
            "{e}"
        );
    }

    #[test]
    fn exit_codes_follow_the_spec() {
        assert_eq!(Class::InvalidArgument.exit_code(), 2);
        assert_eq!(Class::DeadlineExceeded.exit_code(), 124);
        assert_eq!(Class::Aborted.exit_code(), 1);
        assert_eq!(Class::NotFound.exit_code(), 1);
    }

    #[test]
    fn every_class_has_its_code() {
        assert_eq!(Class::ResourceExhausted.code(), Code::ResourceExhausted);
        assert_eq!(Class::Aborted.code(), Code::Aborted);
        let s: Status = RunError::InvalidRequest(RequestError::NoImage).into();
        assert_eq!(s.code(), Code::InvalidArgument);
    }

    #[test]
    fn a_status_message_is_bounded() {
        let huge = format!("config: {}\n", "a".repeat(12 << 20));
        let e = fnrun_api::functionio::validate(huge.as_bytes()).unwrap_err();
        let s: Status = RunError::InvalidInput(e).into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().len() <= STATUS_MESSAGE_MAX,
            "{}",
            s.message().len()
        );
        assert!(
            s.message()
                .starts_with("input is not a FunctionIO: invalid type: string \"aaa"),
            "{}",
            s.message()
        );
        let s: Status = RunError::RegistryNotAllowed {
            registry: "b".repeat(1 << 20),
        }
        .into();
        assert!(
            s.message().len() <= STATUS_MESSAGE_MAX,
            "{}",
            s.message().len()
        );
        assert!(s.message().contains("bytes elided"), "{}", s.message());
    }
}
