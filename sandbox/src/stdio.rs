//! The run's stdio. A per-call run's input is written while stdout and
//! stderr are read ([`Stdio::pump`]), so neither a large input nor a large
//! output can deadlock the run. A service run's output is kept as a bounded
//! rolling [`Tail`].

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;

/// The parent's ends of the three pipes.
pub(crate) struct Stdio {
    /// Closed once the whole input is written.
    stdin: Option<pipe::Sender>,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

/// What was read, even if the run was cut short.
#[derive(Debug, Default)]
pub(crate) struct Pumped {
    pub stdout: Vec<u8>,
    pub stderr_tail: Vec<u8>,
    pub output_too_large: bool,
}

impl Stdio {
    /// The parent's ends, with as much of `input` written to stdin as its
    /// pipe takes without waiting (and stdin closed if that was all of it);
    /// returns how many bytes that was. Done before the function starts, its
    /// input is there at its first read, and the parent need not be
    /// scheduled again in between.
    pub fn prefilled(
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
        input: &[u8],
    ) -> std::io::Result<(Self, usize)> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        fcntl(&stdin, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        // Would block (the pipe is full) or failed: the pump writes the rest,
        // and a broken pipe is the function's choice (see `pump`).
        let written = nix::unistd::write(&stdin, input).unwrap_or(0);
        let stdin = match written == input.len() {
            true => None,
            false => Some(pipe::Sender::from_owned_fd(stdin)?),
        };
        let stdio = Stdio {
            stdin,
            stdout: pipe::Receiver::from_owned_fd(stdout)?,
            stderr: pipe::Receiver::from_owned_fd(stderr)?,
        };
        Ok((stdio, written))
    }

    /// Writes `input`, then closes stdin; reads stdout (at most `max_output`
    /// bytes) and keeps the last `tail` bytes of stderr, until both reach EOF or
    /// stdout passes its limit.
    pub async fn pump(self, input: &[u8], max_output: usize, tail: usize, out: &mut Pumped) {
        let Stdio {
            stdin,
            mut stdout,
            mut stderr,
        } = self;
        let write = async move {
            // A function may exit, or close stdin, without reading it all: the
            // broken pipe is its choice, not an error of the run.
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(input).await;
            }
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

/// The last bytes written to a pipe, kept by a task that reads it to EOF.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    inner: Arc<Mutex<VecDeque<u8>>>,
    max: usize,
}

impl Tail {
    /// Reads `pipe` until EOF in a task of the current runtime, keeping its
    /// last `max` bytes. The returned handle ends with the pipe.
    pub fn follow(pipe: OwnedFd, max: usize) -> std::io::Result<(Tail, JoinHandle<()>)> {
        let mut pipe = pipe::Receiver::from_owned_fd(pipe)?;
        let tail = Tail {
            inner: Arc::new(Mutex::new(VecDeque::with_capacity(max.min(64 << 10)))),
            max,
        };
        let writer = tail.clone();
        let task = tokio::spawn(async move {
            let mut chunk = vec![0u8; 16 * 1024];
            loop {
                match pipe.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => writer.push(&chunk[..n]),
                }
            }
        });
        Ok((tail, task))
    }

    fn push(&self, data: &[u8]) {
        let mut buf = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let data = &data[data.len().saturating_sub(self.max)..];
        let over = (buf.len() + data.len()).saturating_sub(self.max);
        buf.drain(..over);
        buf.extend(data);
    }

    /// What it holds now.
    pub fn bytes(&self) -> Vec<u8> {
        let buf = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        buf.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
    }

    #[tokio::test]
    async fn the_input_is_in_the_pipe_before_the_function_starts() {
        use std::io::Read;
        // All of a small input, with stdin closed: the reader finds the input
        // and EOF without the parent running again.
        let ((stdin_r, stdin_w), (out_r, _out_w), (err_r, _err_w)) = (pipe(), pipe(), pipe());
        let (stdio, written) = Stdio::prefilled(stdin_w, out_r, err_r, b"observed: {}").unwrap();
        assert_eq!(written, 12);
        assert!(stdio.stdin.is_none());
        let mut got = Vec::new();
        std::fs::File::from(stdin_r).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"observed: {}");

        // A large one: what the pipe takes, and the pump writes the rest.
        let ((stdin_r, stdin_w), (out_r, out_w), (err_r, err_w)) = (pipe(), pipe(), pipe());
        let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (stdio, written) = Stdio::prefilled(stdin_w, out_r, err_r, &input).unwrap();
        assert!(written > 0 && written < input.len(), "{written}");
        assert!(stdio.stdin.is_some());
        drop((out_w, err_w));
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::fs::File::from(stdin_r).read_to_end(&mut got).unwrap();
            got
        });
        let mut out = Pumped::default();
        stdio.pump(&input[written..], 1 << 20, 1024, &mut out).await;
        assert_eq!(reader.join().unwrap(), input);
    }

    #[tokio::test]
    async fn a_tail_keeps_the_last_bytes_of_its_pipe() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (tail, task) = Tail::follow(read, 10).unwrap();
        let mut w = std::fs::File::from(write);
        use std::io::Write;
        w.write_all(b"0123456789abc").unwrap();
        w.write_all(b"de").unwrap();
        drop(w);
        task.await.unwrap();
        assert_eq!(tail.bytes(), b"56789abcde");
        tail.push(&[b'x'; 25]);
        assert_eq!(tail.bytes(), [b'x'; 10]);
    }
}
