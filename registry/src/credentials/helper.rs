//! Docker credential helpers: `docker-credential-<name> get`, the protocol of
//! docker/docker-credential-helpers, as docker runs it, within bounds.
//!
//! The helper is found on `PATH` (absolute directories only: never the working directory),
//! gets the server URL on stdin (no newline) and prints
//! `{"ServerURL": ..., "Username": ..., "Secret": ...}`. A `Username` of `<token>` makes
//! the secret an identity token. A non-zero exit with `credentials not found in native
//! keychain` on stdout means "no credentials": the pull is anonymous.
//!
//! Bounds: the helper runs in its own process group, which is killed if it has not
//! answered within the timeout (30 s); stdout and stderr are captured and capped; stdin is
//! a pipe closed after the URL, never the terminal. The answer is parsed as a JSON
//! `Value` and its fields picked by hand, so no error quotes it; a failed helper's message
//! is shown (helpers print their errors, never credentials, when they fail), shortened.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Credentials;
use serde_json::Value;

/// How long a helper may take to answer (a keychain may ask the user to unlock it).
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read; credentials are a few KiB at most.
const MAX_STDOUT: u64 = 1 << 20;
/// Largest error output kept.
const MAX_STDERR: u64 = 64 << 10;
/// Longest helper message shown in an error.
const MAX_MESSAGE: usize = 200;
/// What a helper prints when it has no credentials for the server.
const NOT_FOUND: &str = "credentials not found in native keychain";
/// The user name that marks the secret as an identity token.
const TOKEN_USERNAME: &str = "<token>";

/// A credential helper that could not give an answer. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("credential helper name {0:?} is invalid (letters, digits, '-', '_' and '.' only)")]
    InvalidName(String),
    #[error("credential helper {program} is not installed (not found on PATH)")]
    NotFound { program: String },
    #[error("cannot run credential helper {program}: {err}")]
    Spawn {
        program: String,
        err: std::io::Error,
    },
    #[error("credential helper {program} did not answer within {}s and was killed", .timeout.as_secs_f32())]
    Timeout { program: String, timeout: Duration },
    #[error("credential helper {program} printed more than {limit} bytes")]
    TooMuchOutput { program: String, limit: u64 },
    #[error("credential helper {program} failed ({status}){}", message_suffix(.message))]
    Failed {
        program: String,
        status: ExitStatus,
        message: String,
    },
    #[error("credential helper {program} printed an invalid answer: {err}")]
    Invalid { program: String, err: AnswerError },
}

/// Why a helper's answer is not credentials. Names fields, never their values.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// serde_json's syntax errors name a line and column, never the text.
    #[error("not JSON ({0})")]
    Json(serde_json::Error),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("{0:?} is not a string")]
    FieldType(&'static str),
}

fn message_suffix(message: &str) -> String {
    match message.is_empty() {
        true => String::new(),
        false => format!(": {message}"),
    }
}

/// The program of helper `name`: `docker-credential-<name>`.
fn program(name: &str) -> Result<String, HelperError> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match valid {
        true => Ok(format!("docker-credential-{name}")),
        false => Err(HelperError::InvalidName(name.to_owned())),
    }
}

/// `program` in the absolute directories of `path` (a `PATH` value), if executable there.
fn find_on_path(program: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The first line of a helper's message, printable and shortened; empty if it looks like
/// JSON (an answer, which may hold a secret).
fn short_message(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.starts_with('{') {
        return String::new();
    }
    let mut out: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE)
        .collect();
    if line.chars().count() > MAX_MESSAGE {
        out.push('…');
    }
    out
}

/// Reads at most `limit + 1` bytes of `pipe` on a thread; the pipe is closed after, so
/// a helper that writes on gets SIGPIPE instead of blocking.
fn read_capped(mut pipe: impl Read + Send + 'static, limit: u64) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut pipe).take(limit + 1).read_to_end(&mut buf);
        drop(pipe);
        let _ = tx.send(buf);
    });
    rx
}

/// Kills the helper's process group (the helper and anything it started), then reaps it.
fn kill_group(child: &mut Child) {
    match i32::try_from(child.id()) {
        Ok(pid) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        Err(_) => {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

/// Credentials for `server` from helper `name` found on `path` (a `PATH` value), which
/// must answer within `timeout`. `server` is `https://index.docker.io/v1/` for Docker
/// Hub and `host[:port]` otherwise, as docker passes it.
pub fn get(
    name: &str,
    server: &str,
    path: Option<&OsStr>,
    timeout: Duration,
) -> Result<Credentials, HelperError> {
    let program = program(name)?;
    let exe = find_on_path(&program, path).ok_or_else(|| HelperError::NotFound {
        program: program.clone(),
    })?;
    let deadline = Instant::now() + timeout;
    let mut child = Command::new(&exe)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a timeout kills whatever it started too.
        .process_group(0)
        .spawn()
        .map_err(|err| HelperError::Spawn {
            program: program.clone(),
            err,
        })?;
    tracing::debug!(helper = %program, server, "running credential helper");
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(&mut child);
        return Err(HelperError::Spawn {
            program,
            err: std::io::Error::other("no pipes"),
        });
    };
    // The URL is far below a pipe's buffer: this cannot block on a helper that does not
    // read; one that exits first makes it fail, which changes nothing.
    let _ = stdin.write_all(server.as_bytes());
    drop(stdin);
    let stdout = read_capped(stdout, MAX_STDOUT);
    let stderr = read_capped(stderr, MAX_STDERR);

    let timed_out = |child: &mut Child| {
        kill_group(child);
        HelperError::Timeout {
            program: program.clone(),
            timeout,
        }
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => return Err(timed_out(&mut child)),
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(err) => {
                kill_group(&mut child);
                return Err(HelperError::Spawn { program, err });
            }
        }
    };
    // Something it left behind may hold the pipes open: wait no longer than the deadline.
    let collect = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()
    };
    let (Some(out), Some(err)) = (collect(stdout), collect(stderr)) else {
        return Err(timed_out(&mut child));
    };
    if out.len() as u64 > MAX_STDOUT {
        return Err(HelperError::TooMuchOutput {
            program,
            limit: MAX_STDOUT,
        });
    }
    if !status.success() {
        if String::from_utf8_lossy(&out).trim() == NOT_FOUND {
            return Ok(Credentials::Anonymous);
        }
        // docker-credential-helpers print their errors on stdout; others on stderr.
        let mut message = short_message(&out);
        if message.is_empty() {
            message = short_message(&err);
        }
        return Err(HelperError::Failed {
            program,
            status,
            message,
        });
    }
    parse_answer(&out).map_err(|err| HelperError::Invalid { program, err })
}

/// Credentials from a helper's answer. Errors name fields, never their values.
fn parse_answer(out: &[u8]) -> Result<Credentials, AnswerError> {
    let json: Value = serde_json::from_slice(out).map_err(AnswerError::Json)?;
    if !json.is_object() {
        return Err(AnswerError::NotAnObject);
    }
    let field = |name: &'static str| -> Result<&str, AnswerError> {
        match json.get(name) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(AnswerError::FieldType(name)),
        }
    };
    let (username, secret) = (field("Username")?, field("Secret")?);
    Ok(match (username, secret) {
        (_, "") if username.is_empty() || username == TOKEN_USERNAME => Credentials::Anonymous,
        (TOKEN_USERNAME, token) => Credentials::IdentityToken {
            token: token.to_owned(),
        },
        (username, password) => Credentials::Basic {
            username: username.to_owned(),
            password: password.to_owned(),
        },
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;

    /// Writes the helper script `docker-credential-<name>` into `dir`: `body` runs for
    /// `get`; any other action exits 0.
    pub(crate) fn install(dir: &Path, name: &str, body: &str) {
        let path = dir.join(format!("docker-credential-{name}"));
        std::fs::write(
            &path,
            format!("#!/bin/sh\n[ \"$1\" = get ] || exit 0\n{body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A child that another test forked while the file was open for writing keeps it
        // busy until that child execs: wait until it runs.
        for _ in 0..200 {
            match Command::new(&path).arg("probe").status() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => return,
            }
        }
    }

    fn helpers() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        install(
            dir.path(),
            "basic",
            r#"server=$(cat)
[ "$server" = "registry.example:5000" ] || { echo "unexpected server [$server]"; exit 1; }
echo '{"ServerURL":"registry.example:5000","Username":"alice","Secret":"s3cret-pw"}'"#,
        );
        install(
            dir.path(),
            "token",
            r#"server=$(cat)
[ "$server" = "https://index.docker.io/v1/" ] || exit 1
printf '{"ServerURL":"%s","Username":"<token>","Secret":"s3cret-refresh"}' "$server""#,
        );
        install(
            dir.path(),
            "none",
            "cat >/dev/null\necho 'credentials not found in native keychain'\nexit 1",
        );
        install(
            dir.path(),
            "broken",
            "echo 'the keychain is locked' >&2\nexit 3",
        );
        install(
            dir.path(),
            "garbage",
            "echo 'Username=alice Secret=s3cret-pw'",
        );
        install(
            dir.path(),
            "typed",
            r#"echo '{"Username":"alice","Secret":["s3cret-pw"]}'"#,
        );
        install(dir.path(), "hang", "sleep 60");
        install(
            dir.path(),
            "flood",
            "while :; do echo s3cret-s3cret-s3cret-s3cret-s3cret-s3cret; done",
        );
        dir
    }

    fn run(dir: &Path, name: &str, server: &str) -> Result<Credentials, HelperError> {
        get(name, server, Some(dir.as_os_str()), Duration::from_secs(10))
    }

    #[test]
    fn helpers_answer_credentials_tokens_or_nothing() {
        let dir = helpers();
        let d = dir.path();
        assert_eq!(
            run(d, "basic", "registry.example:5000").unwrap(),
            Credentials::Basic {
                username: "alice".into(),
                password: "s3cret-pw".into()
            }
        );
        assert_eq!(
            run(d, "token", "https://index.docker.io/v1/").unwrap(),
            Credentials::IdentityToken {
                token: "s3cret-refresh".into()
            }
        );
        assert_eq!(
            run(d, "none", "registry.example:5000").unwrap(),
            Credentials::Anonymous
        );
        // The basic helper refuses another server, and says which it got.
        let err = run(d, "basic", "other.example").unwrap_err();
        assert!(
            matches!(err, HelperError::Failed { .. }) && err.to_string().contains("other.example"),
            "{err}"
        );
    }

    #[test]
    fn helper_failures_are_clear_and_never_show_secrets() {
        let dir = helpers();
        let d = dir.path();
        let err = run(d, "broken", "r.example").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("docker-credential-broken")
                && msg.contains("exit status: 3")
                && msg.contains("is locked"),
            "{msg}"
        );
        for name in ["garbage", "typed"] {
            let err = run(d, name, "r.example").unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, HelperError::Invalid { .. }), "{msg}");
            assert!(
                msg.contains(&format!("docker-credential-{name}")) && !msg.contains("s3cret"),
                "{msg}"
            );
        }
        let err = run(d, "flood", "r.example").unwrap_err();
        assert!(
            matches!(err, HelperError::TooMuchOutput { .. }) && !err.to_string().contains("s3cret"),
            "{err}"
        );
        let err = run(d, "missing", "r.example").unwrap_err();
        assert!(
            matches!(err, HelperError::NotFound { .. })
                && err.to_string().contains("docker-credential-missing"),
            "{err}"
        );
        // Not on this PATH; nor in a relative PATH entry.
        let err = get(
            "basic",
            "r.example",
            Some(OsStr::new("relative:")),
            HELPER_TIMEOUT,
        )
        .unwrap_err();
        assert!(matches!(err, HelperError::NotFound { .. }), "{err}");
        for name in ["", "../basic", "a/b", ".hidden", "x y"] {
            let err = run(d, name, "r.example").unwrap_err();
            assert!(matches!(err, HelperError::InvalidName(_)), "{name}: {err}");
        }
    }

    #[test]
    fn a_helper_that_hangs_is_killed_at_the_timeout() {
        let dir = helpers();
        let start = Instant::now();
        let err = get(
            "hang",
            "r.example",
            Some(dir.path().as_os_str()),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(err, HelperError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("docker-credential-hang"), "{err}");
        // Killed with its group: the pipes closed, nothing waited for `sleep 60`.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn answers_map_to_credentials() {
        let anon = [
            r#"{"ServerURL":"x","Username":"","Secret":""}"#,
            r#"{"Username":"<token>","Secret":""}"#,
            r#"{}"#,
        ];
        for a in anon {
            assert_eq!(
                parse_answer(a.as_bytes()).unwrap(),
                Credentials::Anonymous,
                "{a}"
            );
        }
        assert_eq!(
            parse_answer(br#"{"Username":"u","Secret":""}"#).unwrap(),
            Credentials::Basic {
                username: "u".into(),
                password: "".into()
            }
        );
        for bad in [&b"[]"[..], b"", b"{\"Secret\": 1}"] {
            assert!(parse_answer(bad).is_err());
        }
        assert_eq!(short_message(b"  first line\nsecond"), "first line");
        assert_eq!(short_message(br#"{"Secret":"s3cret"}"#), "");
        assert_eq!(
            short_message("x".repeat(500).as_bytes()).chars().count(),
            201
        );
    }
}
