//! Functions, listeners and checks shared by the e2e tests.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::functionio::report_script;
use crate::image::TestImage;

/// A function that writes `boom` to stderr and exits 3, without reading stdin.
pub const FAIL_SCRIPT: &str = "#!/bin/sh\necho boom >&2\nexit 3\n";

/// A function whose output is not FunctionIO.
pub const HELLO_SCRIPT: &str = "#!/bin/sh\necho hello\n";

/// Input that is YAML but not a FunctionIO mapping, and plain garbage.
pub const NOT_FUNCTIONIO: &[&str] = &["- a\n- b\n", "hello\n", "a: [\n"];

/// A function that sleeps `seconds` (pick a number unique to the test, so
/// [`leftover_processes`] can look for it).
pub fn sleeper(seconds: u32) -> TestImage {
    TestImage::busybox().entrypoint(["/bin/sleep".to_owned(), seconds.to_string()])
}

/// A function that reports the interfaces it sees (from `/proc/net/dev`) and
/// what `127.0.0.1:port` answered to `ping`, as
/// `ifs=<sorted names, space separated> reply=<answer>`.
pub fn network_probe(port: u16) -> TestImage {
    TestImage::script(&report_script(
        &format!(
            "ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | xargs)\n\
             reply=$(echo ping | nc -w 3 127.0.0.1 {port} 2>/dev/null | head -n 1)"
        ),
        "ifs=$ifs reply=$reply",
    ))
}

/// A TCP listener on the runner's 127.0.0.1 that answers one `ping` line with
/// `pong`, for network policy tests.
pub struct PongServer {
    port: u16,
    answered: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PongServer {
    pub fn start() -> PongServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let answered = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (answered, stop) = (answered.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut reader = BufReader::new(&stream);
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_ok() && line.trim() == "ping" {
                        // Record first: the client may look as soon as it reads.
                        answered.store(true, Ordering::SeqCst);
                        let _ = (&stream).write_all(b"pong\n");
                    }
                }
            })
        };
        PongServer {
            port,
            answered,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether anybody sent `ping` and got `pong`.
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::SeqCst)
    }
}

impl Drop for PongServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Pids of host processes whose command line is exactly `argv` (`argv[0]` may
/// be given without its directory). Functions run in a PID namespace but stay
/// visible in the host's /proc.
pub fn processes_with_argv(argv: &[&str]) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.len() == argv.len()
                && args.iter().zip(argv).enumerate().all(|(i, (a, want))| {
                    a == want || (i == 0 && a.rsplit('/').next() == Some(*want))
                })
        })
        .collect()
}

/// Waits up to `timeout` until no host process has command line `argv`;
/// returns the ones still there.
pub fn leftover_processes(argv: &[&str], timeout: Duration) -> Vec<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let pids = processes_with_argv(argv);
        if pids.is_empty() || Instant::now() >= deadline {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills processes a failed test left behind (only the given pids).
pub fn kill_pids(pids: &[i32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// `len` bytes that do not compress (xorshift64 from `seed`), so that a layer
/// keeps its size on the wire.
pub fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}
