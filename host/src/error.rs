//! Every way the function host can fail a call, and its [`Class`] (mapped
//! once to a gRPC code by the core's table, [`Class::code`]). A function's
//! own gRPC status is not one of these: it passes through unchanged.

use std::sync::Arc;
use std::time::Duration;

use fnrun_api::{Quoted, text};
use fnrun_sandbox::{ServiceExit, Status};

use fnrun_runner::error::{Class, RunError, STDERR_QUOTE_MAX};

/// The most function names listed in a NOT_FOUND message.
const NAMES_LISTED: usize = 20;

/// How a call ended when the function did not answer it.
#[derive(Debug)]
pub enum CallError {
    /// The host failed the call (SPEC.md's status table).
    Failed(HostError),
    /// The function's server answered with this status: passed through.
    Function(tonic::Status),
}

impl From<HostError> for CallError {
    fn from(e: HostError) -> Self {
        CallError::Failed(e)
    }
}

/// Why the host could not get a call answered by the function.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No function of the catalogue answers to the name the call asked for.
    #[error("no function {asked} here ({how}); functions: {known}")]
    UnknownFunction {
        asked: Quoted,
        how: RouteKind,
        known: KnownNames,
    },
    /// The call carried no name at all.
    #[error("the call names no function: no TLS server name and no :authority; functions: {known}")]
    NoName { known: KnownNames },
    /// A FunctionIO-mode call whose request is not a `RunFunctionRequest`.
    #[error("the request is not a RunFunctionRequest: {0}")]
    BadRequest(#[source] prost::DecodeError),
    /// A FunctionIO-mode function's output cannot become a response.
    #[error("function {function}: {error}")]
    BadOutput {
        function: String,
        #[source]
        error: fnrun_api::functionio_v1::Error,
    },
    /// The request cannot be written as FunctionIO.
    #[error("function {function}: the request cannot be written as FunctionIO: {error}")]
    BadFunctionIo {
        function: String,
        #[source]
        error: fnrun_api::functionio_v1::Error,
    },
    /// The function is at `maxConcurrency` and as many calls wait.
    #[error(
        "function {function} is at capacity: {max_concurrency} calls in flight and {max_queue} waiting"
    )]
    Busy {
        function: String,
        max_concurrency: usize,
        max_queue: usize,
    },
    /// The function's server failed repeatedly; it is not started again yet.
    #[error("function {function} is restarting after {failures} failed starts or crashes: next start in {}; last: {last}", fnrun_api::duration::format(*.retry_in))]
    BackingOff {
        function: String,
        failures: u32,
        retry_in: Duration,
        last: Arc<HostError>,
    },
    /// The function's server ended (crashed, exited, could not start).
    #[error("function {function}'s server {exit}")]
    Exited { function: String, exit: ExitReport },
    /// The function's server was killed for exceeding its memory limit.
    #[error("function {function}'s server exceeded its memory limit of {} and was killed{}", fnrun_api::quantity::format_memory(*.limit), output_suffix(.output))]
    OutOfMemory {
        function: String,
        limit: u64,
        output: String,
    },
    /// The function's server did not answer gRPC on its port in time.
    #[error("function {function}'s server did not answer gRPC on 127.0.0.1:{port} within {} ({last_error}){}", fnrun_api::duration::format(*.waited), output_suffix(.output))]
    NeverListened {
        function: String,
        port: u16,
        waited: Duration,
        last_error: String,
        output: String,
    },
    /// The function's instance could not be started (image, sandbox).
    #[error("function {function} could not start: {error}")]
    StartFailed {
        function: String,
        error: Arc<RunError>,
    },
    /// The function's registry credentials cannot be read.
    #[error("function {function}: {error}")]
    Credentials {
        function: String,
        error: Arc<fnrun_registry::credentials::docker_config::DockerConfigError>,
    },
    /// The connection to the function's server broke during the call.
    #[error("function {function}: the call to its server failed: {error}{}", output_suffix(.output))]
    Forward {
        function: String,
        error: String,
        output: String,
    },
    /// The call's deadline passed before the function answered.
    #[error("function {function}: the call's deadline of {} passed {during}", fnrun_api::duration::format(*.deadline))]
    Deadline {
        function: String,
        deadline: Duration,
        during: Phase,
    },
    /// A start that failed, shared by every call that waited for it.
    #[error(transparent)]
    Start(Arc<HostError>),
    /// A per-call run (FunctionIO mode) failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The host is stopping.
    #[error("the function host is shutting down")]
    ShuttingDown,
}

/// Where a call was when its deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Queued,
    Starting,
    Calling,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Queued => "while it waited for a call slot",
            Phase::Starting => "while the function's server was starting",
            Phase::Calling => "before the function's server answered",
        })
    }
}

/// How a call named its function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// The TLS server name (SNI) of its connection.
    Sni,
    /// Its `:authority`.
    Authority,
}

impl std::fmt::Display for RouteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouteKind::Sni => "TLS server name",
            RouteKind::Authority => ":authority",
        })
    }
}

/// The names of the catalogue, listed bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownNames(pub Vec<String>);

impl std::fmt::Display for KnownNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let shown = self.0.iter().take(NAMES_LISTED);
        f.write_str(&shown.cloned().collect::<Vec<_>>().join(", "))?;
        if self.0.len() > NAMES_LISTED {
            write!(f, " and {} more", self.0.len() - NAMES_LISTED)?;
        }
        Ok(())
    }
}

/// How a function's server ended, for messages.
#[derive(Debug, Clone)]
pub struct ExitReport {
    pub status: Result<Status, Arc<fnrun_sandbox::Error>>,
    pub output: String,
    pub elapsed: Duration,
}

impl From<&ServiceExit> for ExitReport {
    fn from(exit: &ServiceExit) -> Self {
        ExitReport {
            status: exit.status.clone(),
            output: String::from_utf8_lossy(&exit.output_tail).into_owned(),
            elapsed: exit.elapsed,
        }
    }
}

impl std::fmt::Display for ExitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let after = fnrun_api::duration::format(Duration::from_millis(
            self.elapsed.as_millis().try_into().unwrap_or(u64::MAX),
        ));
        match &self.status {
            Ok(Status::Exited(code)) => {
                write!(f, "exited with code {code} after {after}")?;
                // A server ends only when stopped: one that ends at once is
                // often an xfn-era FunctionIO image, which reads stdin and exits.
                if self.elapsed < AT_ONCE {
                    f.write_str(FUNCTIONIO_HINT)?;
                }
            }
            Ok(Status::Signaled(signal)) => {
                write!(f, "was killed by signal {signal} after {after}")?
            }
            Ok(Status::OutOfMemory) => {
                write!(f, "exceeded its memory limit and was killed after {after}")?
            }
            // A service run has no timeout and no output limit.
            Ok(status @ (Status::TimedOut | Status::OutputTooLarge)) => {
                write!(f, "ended ({status:?}) after {after}")?
            }
            Err(e) => write!(f, "could not start: {e}")?,
        }
        f.write_str(&output_suffix(&self.output))
    }
}

/// A server that exits sooner than this "exited at once".
const AT_ONCE: Duration = Duration::from_secs(1);

/// What a server that exited at once may be, and what to do then.
const FUNCTIONIO_HINT: &str = " (if it is a FunctionIO image, which reads stdin and exits, run it \
     with --mode functionio, or mode: functionio in the functions file)";

/// `; output: TAIL`, bounded; nothing if the server wrote nothing.
fn output_suffix(output: &str) -> String {
    let s = output.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("; output: {}", text::bounded(s, STDERR_QUOTE_MAX))
    }
}

impl HostError {
    /// The failure class (SPEC.md's status table).
    pub fn class(&self) -> Class {
        match self {
            HostError::UnknownFunction { .. } | HostError::NoName { .. } => Class::NotFound,
            HostError::BadRequest(_) => Class::InvalidArgument,
            HostError::BadOutput { .. } => Class::Aborted,
            // A value of the caller's request that FunctionIO cannot carry
            // (NaN or infinity): the caller's fault, found before any run.
            HostError::BadFunctionIo {
                error: fnrun_api::functionio_v1::Error::Request(_),
                ..
            } => Class::InvalidArgument,
            HostError::BadFunctionIo { .. } => Class::Internal,
            HostError::Busy { .. } | HostError::OutOfMemory { .. } => Class::ResourceExhausted,
            HostError::BackingOff { .. }
            | HostError::Exited { .. }
            | HostError::NeverListened { .. }
            | HostError::Forward { .. }
            | HostError::ShuttingDown => Class::Unavailable,
            HostError::StartFailed { error, .. } => error.class(),
            HostError::Credentials { .. } => Class::FailedPrecondition,
            HostError::Deadline { .. } => Class::DeadlineExceeded,
            HostError::Start(e) => e.class(),
            HostError::Run(e) => e.class(),
        }
    }

    /// A short outcome label for logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            HostError::UnknownFunction { .. } | HostError::NoName { .. } => "unknown_function",
            HostError::BadRequest(_)
            | HostError::BadFunctionIo {
                error: fnrun_api::functionio_v1::Error::Request(_),
                ..
            } => "invalid_request",
            HostError::BadOutput { .. } | HostError::BadFunctionIo { .. } => "invalid_output",
            HostError::Busy { .. } => "rejected",
            HostError::BackingOff { .. } => "backing_off",
            HostError::Exited { .. } | HostError::NeverListened { .. } => "server_failed",
            HostError::OutOfMemory { .. } => "out_of_memory",
            HostError::StartFailed { error, .. } => error.outcome(),
            HostError::Credentials { .. } => "image_error",
            HostError::Forward { .. } => "server_failed",
            HostError::Deadline { .. } => "timeout",
            HostError::ShuttingDown => "rejected",
            HostError::Start(e) => e.outcome(),
            HostError::Run(e) => e.outcome(),
        }
    }
}

impl From<HostError> for tonic::Status {
    /// The class's code and the message, bounded.
    fn from(e: HostError) -> tonic::Status {
        e.class().status(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fnrun_runner::error::STATUS_MESSAGE_MAX;

    #[test]
    fn unknown_names_list_what_exists_bounded() {
        let known = KnownNames((0..100).map(|i| format!("fn-{i}")).collect());
        let e = HostError::UnknownFunction {
            asked: Quoted::new("nope"),
            how: RouteKind::Authority,
            known,
        };
        let message = e.to_string();
        assert!(
            message.starts_with("no function \"nope\" here (:authority); functions: fn-0, fn-1,"),
            "{message}"
        );
        assert!(message.ends_with("fn-19 and 80 more"), "{message}");
        assert_eq!(e.class(), Class::NotFound);
        let e = HostError::NoName {
            known: KnownNames(Vec::new()),
        };
        assert!(e.to_string().ends_with("functions: none"));
        let e = HostError::UnknownFunction {
            asked: Quoted::new(&"x".repeat(1 << 20)),
            how: RouteKind::Sni,
            known: KnownNames(vec!["a".into()]),
        };
        assert!(e.to_string().len() < 400);
    }

    #[test]
    fn exits_say_how_with_the_output_tail_bounded() {
        let exit = ExitReport {
            status: Ok(Status::Exited(2)),
            output: format!("{}panic: boom\n", "x".repeat(1 << 20)),
            elapsed: Duration::from_millis(1500),
        };
        let e = HostError::Exited {
            function: "fn-a".into(),
            exit,
        };
        let message = e.to_string();
        assert!(
            message
                .starts_with("function fn-a's server exited with code 2 after 1.500s; output: xxx"),
            "{message}"
        );
        assert!(message.ends_with("panic: boom"), "{message}");
        assert!(message.len() <= STATUS_MESSAGE_MAX, "{}", message.len());
        assert!(!message.contains("--mode functionio"), "{message}");
        // At once: perhaps a FunctionIO image.
        let e = HostError::Exited {
            function: "fn-a".into(),
            exit: ExitReport {
                status: Ok(Status::Exited(0)),
                output: format!("{}\n", "y".repeat(1 << 20)),
                elapsed: Duration::from_millis(20),
            },
        };
        let message = e.to_string();
        assert!(
            message.starts_with(&format!(
                "function fn-a's server exited with code 0 after 20ms{FUNCTIONIO_HINT}; output: yyy"
            )),
            "{message}"
        );
        assert!(message.len() <= STATUS_MESSAGE_MAX, "{}", message.len());
        assert_eq!(e.class(), Class::Unavailable);
        let e = HostError::OutOfMemory {
            function: "fn-a".into(),
            limit: 1 << 20,
            output: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "function fn-a's server exceeded its memory limit of 1Mi and was killed"
        );
        assert_eq!(e.class(), Class::ResourceExhausted);
    }

    #[test]
    fn start_failures_keep_the_class_of_their_cause() {
        let e = HostError::StartFailed {
            function: "fn-a".into(),
            error: Arc::new(RunError::RegistryNotAllowed {
                registry: "evil.example".into(),
            }),
        };
        assert_eq!(e.class(), Class::PermissionDenied);
        let e = HostError::Deadline {
            function: "fn-a".into(),
            deadline: Duration::from_secs(1),
            during: Phase::Starting,
        };
        assert_eq!(
            e.to_string(),
            "function fn-a: the call's deadline of 1s passed while the function's server was starting"
        );
        assert_eq!(e.class(), Class::DeadlineExceeded);
    }

    /// What Kubernetes mode writes in a revision's `RuntimeHealthy` when its
    /// trial start fails (the start failure's message, bounded there): an
    /// image refused for its size or its pull's deadline says so.
    #[test]
    fn a_refused_image_says_why_it_could_not_start() {
        let reference = "registry.test/fns/a:v1";
        for (error, class, says) in [
            (
                fnrun_cache::Error::PullTimeout {
                    reference: reference.into(),
                    timeout: Duration::from_secs(300),
                },
                Class::Unavailable,
                "the pull did not finish within the pull timeout of 300s (--pull-timeout)",
            ),
            (
                fnrun_cache::Error::TooLarge {
                    reference: reference.into(),
                    limit: 1 << 30,
                },
                Class::Internal,
                "exceeds the unpacked size limit of 1073741824 bytes",
            ),
        ] {
            let e = HostError::StartFailed {
                function: "fn-a".into(),
                error: Arc::new(RunError::Image(error)),
            };
            let message = e.to_string();
            assert!(
                message.starts_with("function fn-a could not start: image registry.test/fns/a:v1"),
                "{message}"
            );
            assert!(message.contains(says), "{message}");
            assert_eq!(e.class(), class, "{message}");
        }
    }

    #[test]
    fn a_request_functionio_cannot_carry_is_invalid_argument() {
        use fnrun_api::v1;
        use prost::Message;
        // A v1 request whose desired resource holds a NaN, which a binary
        // Struct carries and JSON cannot (`n: NaN`). The Value is decoded
        // from its bytes (number_value, field 2, a double): the host does
        // not depend on prost-types to name it.
        let nan = Message::decode(&[0x11, 0, 0, 0, 0, 0, 0, 0xf8, 0x7f][..]).unwrap();
        let mut body = fnrun_api::v1::Resource::default();
        body.resource
            .get_or_insert_with(Default::default)
            .fields
            .insert("n".to_owned(), nan);
        let request = v1::RunFunctionRequest {
            desired: Some(v1::State {
                resources: [("cm".to_owned(), body)].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let request = v1::RunFunctionRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        let error = fnrun_api::functionio_v1::functionio_yaml_from_request(&request).unwrap_err();
        let e = HostError::BadFunctionIo {
            function: "fn-a".into(),
            error,
        };
        assert_eq!(e.class(), Class::InvalidArgument);
        assert_eq!(e.outcome(), "invalid_request");
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .ends_with("at desired.resources.cm.resource.n: number is not finite (JSON has no NaN or infinity)"),
            "{}",
            status.message()
        );
    }
}
