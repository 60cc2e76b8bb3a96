//! A per-call run: input on stdin, output read from stdout (up to a limit),
//! the tail of stderr kept, a timeout, and how it ended.

use std::time::Duration;

use crate::error::Error;
use crate::init::Report;
use crate::process::{self, Kind, Status};
use crate::{RunSpec, Sandbox, stdio};

/// The result of a run that started.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Everything written to stdout (at most `max_output_bytes`).
    pub stdout: Vec<u8>,
    /// The last `stderr_tail_bytes` written to stderr.
    pub stderr_tail: Vec<u8>,
    /// From clone to the end of the run.
    pub elapsed: Duration,
    /// Highest memory use of the run, when its cgroup reports it.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of all the run's processes, when its cgroup reports it.
    pub cpu_time: Option<Duration>,
}

impl Sandbox {
    /// Runs `spec` with `input` on stdin, killing it (every process of it)
    /// after `timeout`.
    ///
    /// Returns the outcome of a run that started, whatever the function did;
    /// an error only when the sandbox could not be built or the function could
    /// not be executed. Dropping the future kills the run.
    pub async fn run(
        &self,
        spec: &RunSpec,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        let process::Started {
            mut guard,
            ends,
            plan,
            at,
        } = self.start(spec, Kind::Call)?;
        let stderr = ends.stderr.expect("a per-call run has its own stderr pipe");
        let stdio = stdio::Stdio::new(ends.stdin, ends.stdout, stderr)
            .map_err(Error::io("set up the run's stdio"))?;
        let mut io = stdio::Pumped::default();
        let exited = guard.exited();
        let cfg = &self.config;
        let finished = tokio::time::timeout(timeout, async {
            stdio
                .pump(input, cfg.max_output_bytes, cfg.stderr_tail_bytes, &mut io)
                .await;
            if !io.output_too_large {
                let _ = exited.await;
            }
        })
        .await;
        let cut = if finished.is_err() {
            Some(Status::TimedOut)
        } else if io.output_too_large {
            Some(Status::OutputTooLarge)
        } else {
            None
        };
        if cut.is_some() {
            guard.kill();
        }
        let init_status = guard.reap().await?;
        let usage = guard.remove_cgroup();
        let reports = Report::read_all(ends.report);
        let status = process::ended(&plan, cut, &reports, init_status, &usage)?;
        Ok(Outcome {
            status,
            stdout: io.stdout,
            stderr_tail: io.stderr_tail,
            elapsed: at.elapsed(),
            peak_memory_bytes: usage.peak_memory_bytes,
            cpu_time: usage.cpu_time,
        })
    }
}
