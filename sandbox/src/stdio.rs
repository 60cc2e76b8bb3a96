//! The run's stdio: the input is written while stdout and stderr are read, so
//! neither a large input nor a large output can deadlock the run.

use std::os::fd::OwnedFd;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

/// The parent's ends of the three pipes.
pub struct Stdio {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

/// What was read, even if the run was cut short.
#[derive(Debug, Default)]
pub struct Pumped {
    pub stdout: Vec<u8>,
    pub stderr_tail: Vec<u8>,
    pub output_too_large: bool,
}

impl Stdio {
    pub fn new(stdin: OwnedFd, stdout: OwnedFd, stderr: OwnedFd) -> std::io::Result<Self> {
        Ok(Stdio {
            stdin: pipe::Sender::from_owned_fd(stdin)?,
            stdout: pipe::Receiver::from_owned_fd(stdout)?,
            stderr: pipe::Receiver::from_owned_fd(stderr)?,
        })
    }

    /// Writes `input`, then closes stdin; reads stdout (at most `max_output`
    /// bytes) and keeps the last `tail` bytes of stderr, until both reach EOF or
    /// stdout passes its limit.
    pub async fn pump(self, input: &[u8], max_output: usize, tail: usize, out: &mut Pumped) {
        let Stdio {
            mut stdin,
            mut stdout,
            mut stderr,
        } = self;
        let write = async move {
            // A function may exit, or close stdin, without reading it all: the
            // broken pipe is its choice, not an error of the run.
            let _ = stdin.write_all(input).await;
            drop(stdin);
        };
        let Pumped {
            stdout: out_buf,
            stderr_tail,
            output_too_large,
        } = out;
        let read_out = async move {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match stdout.read(&mut chunk).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => {
                        if out_buf.len() + n > max_output {
                            return true;
                        }
                        out_buf.extend_from_slice(&chunk[..n]);
                    }
                }
            }
        };
        let read_err = async move {
            let mut chunk = vec![0u8; 16 * 1024];
            loop {
                match stderr.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        stderr_tail.extend_from_slice(&chunk[..n]);
                        if stderr_tail.len() > tail {
                            let cut = stderr_tail.len() - tail;
                            stderr_tail.drain(..cut);
                        }
                    }
                }
            }
        };
        // Output past the limit ends the pump at once; otherwise wait for all.
        tokio::pin!(read_out);
        let both = async { tokio::join!(write, read_err) };
        tokio::pin!(both);
        tokio::select! {
            too_large = &mut read_out => {
                if too_large {
                    *output_too_large = true;
                    return;
                }
                both.await;
            }
            _ = &mut both => {
                *output_too_large = read_out.await;
            }
        }
    }
}
