//! Composition functions on grpc-go (`tests/go/crossplanefn`): one static
//! binary whose `--variant` picks how it behaves, run on the host or packaged
//! as a Function image.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::go::Toolchain;
use crate::image::TestImage;
use crate::process::{die_with_parent, terminate, wait_timeout};

/// Where the binary is in a function image, as in function-sdk-go's template.
pub const FUNCTION_PATH: &str = "/function";

/// The user function images run as: distroless's `nonroot`.
pub const FUNCTION_USER: &str = "65532:65532";

/// `/etc/passwd` of function images: busybox's users and `nonroot`.
pub(crate) const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n\
                      nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/false\n";
pub(crate) const GROUP: &str = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n";

/// How long a function on the host may take to listen.
const STARTUP: Duration = Duration::from_secs(20);

/// How a function behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `function-label`: serves v1 and v1beta1 RunFunction; labels every
    /// desired composed resource (`fnrun.dev/touched=true` unless
    /// [`GoFunction::label`] says otherwise), adds one Normal result naming
    /// itself, the API version called and the count, echoes `meta.tag` (with
    /// a ttl of 60s) and passes `context` through. Health and reflection too.
    /// An input `failWith: {code: N, message: TEXT}` makes it answer with that
    /// gRPC status instead.
    Label,
    /// As [`Variant::Label`], but serving only v1beta1: v1 is UNIMPLEMENTED.
    V1beta1Only,
    /// Writes `never-listen` to stderr and sleeps forever without listening.
    NeverListen,
    /// Answers the first call as [`Variant::Label`]; on the second writes
    /// `exiting with status 3 on call 2` to stderr and exits 3.
    ExitOnSecondCall,
    /// On a call, allocates and touches memory 16 MiB at a time until it is
    /// killed; gives up after [`GoFunction::hog_max_mib`] (4 GiB by default)
    /// with RESOURCE_EXHAUSTED. Run it only under a memory limit.
    MemoryHog,
    /// On a call, dials TCP `203.0.113.1:443` and `1.1.1.1:53`, sends a DNS
    /// query over UDP to port 53 of each, and pings `127.0.0.1:PORT` (a
    /// [`PongServer`](crate::fixtures::PongServer)) if
    /// [`GoFunction::probe_loopback`] names one; answers with one Normal
    /// result listing each as `TARGET ok|failed (DETAIL)` and the same in the
    /// response context under `fnrun.dev/network-probe`
    /// (`{TARGET: {ok, detail}}`, targets such as `tcp 1.1.1.1:53`,
    /// `udp 1.1.1.1:53`). Never fails the call.
    NetworkProbe,
}

impl Variant {
    /// Every variant.
    pub const ALL: [Variant; 6] = [
        Variant::Label,
        Variant::V1beta1Only,
        Variant::NeverListen,
        Variant::ExitOnSecondCall,
        Variant::MemoryHog,
        Variant::NetworkProbe,
    ];

    /// The program's `--variant` and `--serve` flags for this variant.
    fn flags(self) -> [&'static str; 2] {
        let variant = match self {
            Variant::Label | Variant::V1beta1Only => "--variant=label",
            Variant::NeverListen => "--variant=never-listen",
            Variant::ExitOnSecondCall => "--variant=exit-on-second-call",
            Variant::MemoryHog => "--variant=memory-hog",
            Variant::NetworkProbe => "--variant=network-probe",
        };
        let serve = match self {
            Variant::V1beta1Only => "--serve=v1beta1",
            _ => "--serve=v1,v1beta1",
        };
        [variant, serve]
    }
}

/// The `crossplanefn` binary (static, `CGO_ENABLED=0`), built once.
pub fn function_binary() -> Result<PathBuf> {
    Toolchain::find()?.build("crossplanefn", &[])
}

/// The image of `variant` with its defaults: see [`GoFunction::image`].
pub fn go_function_image(variant: Variant) -> Result<TestImage> {
    GoFunction::new(variant).image()
}

/// Transport security of a function server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTls {
    /// `--insecure`: plain h2c.
    Insecure,
    /// `--tls-certs-dir DIR`: mTLS with `DIR/tls.crt`, `DIR/tls.key`, and
    /// `DIR/ca.crt` to verify clients (see
    /// [`Certs::server`](crate::certs::Certs::server)).
    Mtls(PathBuf),
}

/// A Go function: a variant and its settings.
#[derive(Debug, Clone)]
#[must_use]
pub struct GoFunction {
    variant: Variant,
    name: Option<String>,
    label: Option<(String, String)>,
    delay: Option<Duration>,
    hog_max_mib: Option<u32>,
    probe_loopback: Option<u16>,
    probe_external: Option<Vec<String>>,
    probe_timeout: Option<Duration>,
}

impl GoFunction {
    pub fn new(variant: Variant) -> GoFunction {
        GoFunction {
            variant,
            name: None,
            label: None,
            delay: None,
            hog_max_mib: None,
            probe_loopback: None,
            probe_external: None,
            probe_timeout: None,
        }
    }

    /// The variant.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The name in result messages (default `function-label`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// The label set on desired composed resources (default
    /// `fnrun.dev/touched=true`).
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.label = Some((key.to_owned(), value.to_owned()));
        self
    }

    /// Makes every call wait this long before it answers.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// [`Variant::MemoryHog`]: how many MiB it takes before it gives up.
    pub fn hog_max_mib(mut self, mib: u32) -> Self {
        self.hog_max_mib = Some(mib);
        self
    }

    /// [`Variant::NetworkProbe`]: also ping `127.0.0.1:port`.
    pub fn probe_loopback(mut self, port: u16) -> Self {
        self.probe_loopback = Some(port);
        self
    }

    /// [`Variant::NetworkProbe`]: the TCP addresses to dial instead of
    /// `203.0.113.1:443` and `1.1.1.1:53` (a DNS query also goes to port 53
    /// of each host); none to probe only the loopback.
    pub fn probe_external(mut self, addrs: &[&str]) -> Self {
        self.probe_external = Some(addrs.iter().map(|a| (*a).to_owned()).collect());
        self
    }

    /// [`Variant::NetworkProbe`]: how long each probe may take (default 2s).
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = Some(timeout);
        self
    }

    /// The program's arguments for this function, without `--insecure`,
    /// `--tls-certs-dir` or `--address`: what an image's entrypoint carries
    /// after [`FUNCTION_PATH`].
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = self.variant.flags().map(str::to_owned).into();
        if let Some(name) = &self.name {
            args.push(format!("--name={name}"));
        }
        if let Some((key, value)) = &self.label {
            args.push(format!("--label={key}={value}"));
        }
        if let Some(delay) = self.delay {
            args.push(format!("--delay={}ms", delay.as_millis()));
        }
        if let Some(mib) = self.hog_max_mib {
            args.push(format!("--hog-max-mib={mib}"));
        }
        if let Some(port) = self.probe_loopback {
            args.push(format!("--probe-loopback-port={port}"));
        }
        if let Some(addrs) = &self.probe_external {
            args.push(format!("--probe-external={}", addrs.join(",")));
        }
        if let Some(timeout) = self.probe_timeout {
            args.push(format!("--probe-timeout={}ms", timeout.as_millis()));
        }
        args
    }

    /// A Function image: busybox, the static binary at [`FUNCTION_PATH`],
    /// entrypoint `[/function, ARGS...]` (see [`GoFunction::args`]) and no
    /// cmd, so a runtime appends `--insecure` or its TLS flags as Crossplane's
    /// does; `User: 65532:65532` with a `nonroot` entry in `/etc/passwd`, like
    /// distroless function images. The function listens on `:9443` unless
    /// given `--address`.
    pub fn image(&self) -> Result<TestImage> {
        let mut entrypoint = vec![FUNCTION_PATH.to_owned()];
        entrypoint.extend(self.args());
        Ok(TestImage::busybox()
            .binary(function_binary()?, FUNCTION_PATH)
            .file("/etc/passwd", PASSWD, 0o644)
            .file("/etc/group", GROUP, 0o644)
            .dir("/home/nonroot", 0o755)
            .entrypoint(entrypoint)
            .user(FUNCTION_USER))
    }

    /// Runs the function on the host on `127.0.0.1:0` and waits until it
    /// listens.
    pub fn start(&self, tls: &ServerTls) -> Result<RunningFunction> {
        let mut function = self.spawn(tls, &[])?;
        function.wait_listening(STARTUP)?;
        Ok(function)
    }

    /// Runs the function on the host on `127.0.0.1:0`, under `wrapper` (a
    /// command and its arguments that run the rest, such as `prlimit
    /// --data=SIZE --`, or none), without waiting.
    pub fn spawn(&self, tls: &ServerTls, wrapper: &[&str]) -> Result<RunningFunction> {
        let binary = function_binary()?;
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&binary);
                cmd
            }
            None => Command::new(&binary),
        };
        cmd.args(self.args()).arg("--address=127.0.0.1:0");
        match tls {
            ServerTls::Insecure => cmd.arg("--insecure"),
            ServerTls::Mtls(dir) => cmd.arg(format!("--tls-certs-dir={}", dir.display())),
        };
        RunningFunction::spawn(cmd.env_remove("TLS_SERVER_CERTS_DIR"))
    }
}

/// A function process on the host; killed on drop.
pub struct RunningFunction {
    child: Child,
    dir: TempDir,
    addr: Option<String>,
}

impl RunningFunction {
    /// Starts `cmd` (a function server: this one, the Python SDK's in a
    /// chroot...) with its stdout and stderr kept in temp files; killed on
    /// drop.
    pub fn spawn(cmd: &mut Command) -> Result<RunningFunction> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-function-")
            .tempdir()
            .context("cannot create the function's temp dir")?;
        let stdout = File::create(dir.path().join("stdout"))?;
        let stderr = File::create(dir.path().join("stderr"))?;
        let child = die_with_parent(cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr))
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        Ok(RunningFunction {
            child,
            dir,
            addr: None,
        })
    }

    /// Sets the address of a function that does not say where it listens
    /// (the Python SDK's), after waiting up to `timeout` until it accepts
    /// TCP connections there.
    pub fn wait_accepting(&mut self, addr: &str, timeout: Duration) -> Result<&str> {
        let deadline = std::time::Instant::now() + timeout;
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = self.try_wait() {
                bail!("the function exited ({status}); stderr:\n{}", self.stderr());
            }
            if std::time::Instant::now() >= deadline {
                bail!(
                    "the function did not accept connections on {addr} within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(self.addr.insert(addr.to_owned()))
    }

    /// Waits until the function says it listens (`listening on HOST:PORT` on
    /// stderr); returns the address. Fails if it exits or takes `timeout`.
    pub fn wait_listening(&mut self, timeout: Duration) -> Result<&str> {
        let line = self.wait_for_stderr(" listening on ", timeout);
        let Some(line) = line else {
            let status = self.child.try_wait()?;
            bail!(
                "the function did not listen within {timeout:?} (exit status {status:?}); stderr:\n{}",
                self.stderr()
            );
        };
        let addr = line
            .rsplit(' ')
            .next()
            .context("a listening line ends with the address")?
            .to_owned();
        Ok(self.addr.insert(addr))
    }

    /// The first stderr line containing `needle`, waiting up to `timeout`;
    /// `None` if the function exits first or time runs out.
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let stderr = self.stderr();
            if let Some(line) = stderr.lines().find(|l| l.contains(needle)) {
                return Some(line.to_owned());
            }
            let exited = !matches!(self.child.try_wait(), Ok(None));
            if exited || std::time::Instant::now() >= deadline {
                // What it wrote just before exiting counts too.
                let stderr = self.stderr();
                return stderr
                    .lines()
                    .find(|l| l.contains(needle))
                    .map(str::to_owned);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:PORT`. Panics before [`RunningFunction::wait_listening`]
    /// succeeded.
    pub fn addr(&self) -> &str {
        self.addr
            .as_deref()
            .expect("the function is not listening yet")
    }

    /// Everything the function wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Everything the function wrote to stdout so far (the Python SDK logs
    /// there, as JSON lines).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    /// The process id (of the wrapper, if there is one).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited, and how.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_timeout(&mut self.child, timeout)
    }
}

impl Drop for RunningFunction {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_carry_the_variant_and_every_setting() {
        assert_eq!(
            GoFunction::new(Variant::Label).args(),
            ["--variant=label", "--serve=v1,v1beta1"]
        );
        assert_eq!(
            GoFunction::new(Variant::V1beta1Only).args(),
            ["--variant=label", "--serve=v1beta1"]
        );
        assert_eq!(
            GoFunction::new(Variant::NetworkProbe)
                .name("fn-x")
                .label("a", "b=c")
                .delay(Duration::from_millis(1500))
                .probe_loopback(4321)
                .probe_external(&[])
                .probe_timeout(Duration::from_secs(1))
                .args(),
            [
                "--variant=network-probe",
                "--serve=v1,v1beta1",
                "--name=fn-x",
                "--label=a=b=c",
                "--delay=1500ms",
                "--probe-loopback-port=4321",
                "--probe-external=",
                "--probe-timeout=1000ms",
            ]
        );
        assert_eq!(
            GoFunction::new(Variant::MemoryHog).hog_max_mib(64).args(),
            [
                "--variant=memory-hog",
                "--serve=v1,v1beta1",
                "--hog-max-mib=64"
            ]
        );
        let flags: std::collections::BTreeSet<[&str; 2]> =
            Variant::ALL.iter().map(|v| v.flags()).collect();
        assert_eq!(
            flags.len(),
            Variant::ALL.len(),
            "each variant its own flags"
        );
    }
}
