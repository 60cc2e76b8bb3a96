//! What a request costs the daemon, and raw HTTP/2 to send hostile requests.
//!
//! - [`Usage`]: a process's CPU time (all its threads, `/proc/PID/stat`) and
//!   peak resident memory (`VmHWM` in `/proc/PID/status`), read before and
//!   after a test's requests.
//! - [`h2`]: an HTTP/2 client's side of the wire as bytes (preface, frames,
//!   HPACK literals), and [`h2::exchange`], which sends them and reads what
//!   the server answers until it ends the connection.

use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A process's CPU time and peak memory so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// User and system time of all its threads.
    pub cpu: Duration,
    /// The most memory it has had resident (`VmHWM`), in bytes.
    pub peak_rss: u64,
}

impl Usage {
    /// Reads `/proc/PID/stat` and `/proc/PID/status`.
    pub fn of(pid: u32) -> Result<Usage> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
        // After the command name, in parentheses (which may hold anything):
        // state is field 3, utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("no command name in /proc/PID/stat")?
            .1
            .split_whitespace()
            .collect();
        let ticks = |i: usize| -> Result<u64> {
            fields
                .get(i - 3)
                .context("a short /proc/PID/stat")?
                .parse()
                .context("a tick count")
        };
        let per_second =
            nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no CLK_TCK")?;
        let per_second = u64::try_from(per_second).context("CLK_TCK")?;
        let total = ticks(14)? + ticks(15)?;
        let cpu = Duration::from_nanos(total * 1_000_000_000 / per_second);

        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .context("no VmHWM in /proc/PID/status")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .context("VmHWM")?;
        Ok(Usage {
            cpu,
            peak_rss: kib * 1024,
        })
    }

    /// What was spent since `before`: CPU time, and how much the peak grew.
    pub fn since(&self, before: &Usage) -> Usage {
        Usage {
            cpu: self.cpu.saturating_sub(before.cpu),
            peak_rss: self.peak_rss.saturating_sub(before.peak_rss),
        }
    }
}

pub mod h2 {
    //! A client's side of HTTP/2 as bytes (RFC 9113, RFC 7541).

    use super::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const GOAWAY: u8 = 0x7;
    pub const CONTINUATION: u8 = 0x9;
    const END_STREAM: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;
    /// The largest frame payload every server takes.
    const MAX_FRAME: usize = 16_384;

    /// The connection preface and an empty SETTINGS frame.
    pub fn preface() -> Vec<u8> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        frame(&mut out, 0x4, 0, 0, &[]);
        out
    }

    /// One frame.
    pub fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("a frame under 16 MiB");
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(frame_type);
        out.push(flags);
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.extend_from_slice(payload);
    }

    /// A header block as a HEADERS frame and CONTINUATION frames of at most
    /// 16 KiB, ending the stream.
    pub fn headers(out: &mut Vec<u8>, stream_id: u32, block: &[u8]) {
        let mut pieces = block.chunks(MAX_FRAME).peekable();
        let mut first = true;
        if block.is_empty() {
            frame(out, HEADERS, END_STREAM | END_HEADERS, stream_id, &[]);
        }
        while let Some(piece) = pieces.next() {
            let mut flags = if pieces.peek().is_none() {
                END_HEADERS
            } else {
                0
            };
            let frame_type = if first {
                flags |= END_STREAM;
                HEADERS
            } else {
                CONTINUATION
            };
            frame(out, frame_type, flags, stream_id, piece);
            first = false;
        }
    }

    /// An HPACK integer with an `n`-bit prefix (RFC 7541, 5.1).
    pub fn integer(out: &mut Vec<u8>, n: u8, flags: u8, mut value: usize) {
        let max = (1usize << n) - 1;
        let byte = |v: usize| u8::try_from(v).expect("below 256");
        if value < max {
            out.push(flags | byte(value));
            return;
        }
        out.push(flags | byte(max));
        value -= max;
        while value >= 128 {
            out.push(byte(value % 128) | 0x80);
            value /= 128;
        }
        out.push(byte(value));
    }

    /// A field as a literal without indexing, its name from the static
    /// table and its value a raw string (RFC 7541, 6.2.2).
    pub fn field(out: &mut Vec<u8>, static_name: usize, value: &str) {
        integer(out, 4, 0x00, static_name);
        integer(out, 7, 0x00, value.len());
        out.extend_from_slice(value.as_bytes());
    }

    /// The pseudo-header fields and `content-type` of a gRPC call to
    /// `path`, with `authority`.
    pub fn grpc_request_block(path: &str, authority: &str) -> Vec<u8> {
        // :method POST (3), :scheme http (6), indexed.
        let mut block = vec![0x83, 0x86];
        field(&mut block, 4, path);
        field(&mut block, 1, authority);
        field(&mut block, 31, "application/grpc");
        block
    }

    /// What the server sent on a connection until it ended it.
    #[derive(Debug, Default)]
    pub struct Answer {
        /// The error code of its GOAWAY, if it sent one.
        pub goaway: Option<u32>,
        /// The error codes of its RST_STREAM frames.
        pub resets: Vec<u32>,
        /// How many HEADERS frames (responses or trailers) it sent.
        pub headers: usize,
        /// Whether it ended the connection (rather than the wait ending).
        pub ended: bool,
    }

    /// Writes `bytes` to `io` while reading the server's frames, until the
    /// server ends the connection, `done` says the answer is complete, or
    /// `wait` passes; then the client closes. The server may close before it
    /// has read all of `bytes`.
    pub async fn exchange<IO>(
        io: IO,
        bytes: Vec<u8>,
        done: fn(&Answer) -> bool,
        wait: Duration,
    ) -> Result<Answer>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rx, mut tx) = tokio::io::split(io);
        let writer = tokio::spawn(async move {
            let _ = tx.write_all(&bytes).await;
            tx
        });
        let mut answer = Answer::default();
        let mut buf = Vec::new();
        let read = async {
            let mut chunk = vec![0; 64 << 10];
            loop {
                let n = rx.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    answer.ended = true;
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let mut used = 0;
                while let Some(head) = buf.get(used..used + 9) {
                    let len = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let Some(payload) = buf.get(used + 9..used + 9 + len) else {
                        break;
                    };
                    let code = |at: usize| {
                        payload
                            .get(at..at + 4)
                            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                    };
                    match head[3] {
                        GOAWAY => answer.goaway = code(4),
                        RST_STREAM => answer.resets.extend(code(0)),
                        HEADERS => answer.headers += 1,
                        _ => {}
                    }
                    used += 9 + len;
                }
                buf.drain(..used);
                if done(&answer) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(wait, read).await;
        let tx = writer.await.context("the writer")?;
        drop(tx);
        if buf.len() > 1 << 20 {
            bail!("the server sent {} bytes of no whole frame", buf.len());
        }
        Ok(answer)
    }
}
