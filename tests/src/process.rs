//! Running host tools and child processes with bounded waits.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Makes the child get SIGKILL when the thread that spawned it exits, so a
/// test that dies without running its destructors leaves no process behind.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // one async-signal-safe syscall (prctl); it allocates nothing and takes no
    // locks.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        })
    }
}

/// Runs a tool to completion; fails with its stderr if it exits non-zero.
/// Returns its stdout.
pub fn check_output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| {
        format!("cannot run {cmd:?} (is it installed? scripts/test installs it)")
    })?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed non-UTF-8"))
}

/// Sends `signal` to the child, ignoring a child that is already gone.
pub fn signal(child: &Child, signal: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// Waits up to `timeout` for the child to exit.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; reaps the child and returns its status.
pub fn terminate(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    signal(child, Signal::SIGTERM);
    if let Some(status) = wait_timeout(child, grace) {
        return Some(status);
    }
    signal(child, Signal::SIGKILL);
    child.wait().ok()
}

/// How long to wait for output pipes to close after the child exited.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// What a finished command did.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The exit code; `None` if killed by a signal (see `signal`).
    pub code: Option<i32>,
    /// The signal that killed it, if any.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
    /// Whether the harness had to kill it for running past its time limit.
    pub timed_out: bool,
}

/// Runs `cmd` with `stdin` written to it (or an empty stdin), capturing stdout
/// and stderr; kills it after `timeout`.
pub fn run_capture(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Finished {
    let start = Instant::now();
    let mut child = die_with_parent(cmd)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let input = input.to_vec();
        // A child that does not read its stdin must not block the harness: write
        // from a detached thread.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let reader = |mut pipe: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
        });
        rx
    };
    let stdout = reader(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = reader(Box::new(child.stderr.take().expect("stderr is piped")));
    let (status, timed_out) = match wait_timeout(&mut child, timeout) {
        Some(status) => (status, false),
        None => {
            signal(&child, Signal::SIGKILL);
            (child.wait().expect("reap the killed child"), true)
        }
    };
    let elapsed = start.elapsed();
    // A process left behind by the child could keep a pipe open: do not wait
    // for it forever, but say so.
    let collect = |rx: mpsc::Receiver<String>, name: &str| {
        rx.recv_timeout(PIPE_GRACE).unwrap_or_else(|_| {
            format!("<{name} still held open by a leftover process {PIPE_GRACE:?} after exit>")
        })
    };
    let stdout = collect(stdout, "stdout");
    let stderr = collect(stderr, "stderr");
    Finished {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        elapsed,
        timed_out,
    }
}

/// Whether `pid` is a spawner of the daemon `daemon_pid`: its live child named
/// `fnrun-spawner` in the daemon's own PID namespace (the inits a spawner
/// clones have the same name but are in new PID namespaces).
pub fn is_spawner(pid: u32, daemon_pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    field("Name:") == ["fnrun-spawner"]
        && field("PPid:") == [daemon_pid.to_string().as_str()]
        && field("NSpid:").len() == 1
        && field("State:").first().is_none_or(|s| *s != "Z")
}

/// The spawners of the daemon `daemon_pid` (see [`is_spawner`]).
pub fn spawners_of(daemon_pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| is_spawner(pid, daemon_pid))
        .collect()
}

/// `pid` and every process below it, from `/proc/*/stat`.
pub fn tree(pid: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![pid];
    };
    for entry in entries.flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
        else {
            continue;
        };
        children.entry(ppid).or_default().push(p);
    }
    let (mut out, mut todo) = (Vec::new(), vec![pid]);
    while let Some(p) = todo.pop() {
        out.push(p);
        todo.extend(children.get(&p).into_iter().flatten());
    }
    out
}
