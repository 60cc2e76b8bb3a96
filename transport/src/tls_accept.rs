//! TLS handshakes of the daemon's TCP listeners (`--listen` with
//! `--tls-cert`, and the functions listener): each in a task of its own,
//! bounded by [`HANDSHAKE_TIMEOUT`], so that a slow client holds up no other.
//!
//! A refused handshake is logged with the peer, the reason and the server name
//! the client asked for, if it got that far (quoted; at most
//! [`LOG_BURST`] lines a minute per listener, then one line that says how
//! many were left out), counted in
//! `fnrun_tls_handshakes_refused_total{listener,reason}`, and answered so that
//! the client can tell what happened:
//!
//! - a server name that the listener does not serve: the alert
//!   `unrecognized_name` (RFC 6066). rustls can only refuse a name by its
//!   certificate resolver finding nothing, and then sends `access_denied`,
//!   which makes a client suspect its own certificate; so the client's hello
//!   is read first ([`tokio_rustls::LazyConfigAcceptor`]) and the alert,
//!   which is a plaintext record before any server message, written here;
//! - plaintext HTTP/2 (h2c, what a gRPC client sends without TLS): a SETTINGS
//!   and a GOAWAY frame whose debug data says the listener requires TLS,
//!   which gRPC clients show; plaintext HTTP/1: a `400` that says it;
//! - no client certificate, or one the client CA did not sign: rustls's own
//!   alerts (`certificate_required`, `unknown_ca`, `bad_certificate`).
//!
//! A connection closed before its first byte (a TCP readiness probe) is no
//! handshake and is neither logged nor counted.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

/// How long a TLS client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Refused handshakes logged per listener and `LOG_WINDOW`.
pub const LOG_BURST: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// The client's preface of plaintext HTTP/2 (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Why a handshake was refused: the `reason` label of
/// `fnrun_tls_handshakes_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The listener cannot serve yet (Kubernetes mode before it has read
    /// the API: see [`crate::readiness`]).
    NotReady,
    UnknownServerName,
    NoServerName,
    NotTls,
    NoClientCertificate,
    BadClientCertificate,
    ServerCertificateRefused,
    Timeout,
    Other,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::NotReady,
        Reason::UnknownServerName,
        Reason::NoServerName,
        Reason::NotTls,
        Reason::NoClientCertificate,
        Reason::BadClientCertificate,
        Reason::ServerCertificateRefused,
        Reason::Timeout,
        Reason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::NotReady => "not_ready",
            Reason::UnknownServerName => "unknown_server_name",
            Reason::NoServerName => "no_server_name",
            Reason::NotTls => "not_tls",
            Reason::NoClientCertificate => "no_client_certificate",
            Reason::BadClientCertificate => "bad_client_certificate",
            Reason::ServerCertificateRefused => "server_certificate_refused",
            Reason::Timeout => "timeout",
            Reason::Other => "other",
        }
    }
}

/// A refused handshake: its reason and what the log says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

impl Refusal {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail: detail.into(),
        }
    }
}

/// The listeners whose handshakes are counted: the `listener` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// `--listen` with `--tls-cert`.
    Runner,
    /// `--functions-listen`.
    Functions,
}

impl ListenerKind {
    const ALL: [ListenerKind; 2] = [ListenerKind::Runner, ListenerKind::Functions];

    fn label(self) -> &'static str {
        match self {
            ListenerKind::Runner => "runner",
            ListenerKind::Functions => "functions",
        }
    }
}

/// `fnrun_tls_handshakes_refused_total`, by listener and reason.
#[derive(Debug, Default)]
pub struct HandshakeMetrics {
    refused: [[AtomicU64; Reason::ALL.len()]; ListenerKind::ALL.len()],
}

impl HandshakeMetrics {
    pub fn refused(&self, listener: ListenerKind, reason: Reason) {
        self.refused[listener as usize][reason as usize].fetch_add(1, Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP fnrun_tls_handshakes_refused_total TLS handshakes refused, by listener and reason.\n# TYPE fnrun_tls_handshakes_refused_total counter"
        );
        for listener in ListenerKind::ALL {
            for reason in Reason::ALL {
                let _ = writeln!(
                    out,
                    "fnrun_tls_handshakes_refused_total{{listener=\"{}\",reason=\"{}\"}} {}",
                    listener.label(),
                    reason.label(),
                    self.refused[listener as usize][reason as usize].load(Relaxed)
                );
            }
        }
    }
}

/// Decides, from the client's hello and its address, whether a server name is
/// served, and is told of each handshake that succeeded.
pub trait ServerNames: Send + Sync {
    /// Why the handshake of `peer` for server name `name` (`None`: it sent
    /// none) is refused; `None`: it goes on.
    fn refusal(&self, name: Option<&str>, peer: SocketAddr) -> Option<Refusal>;

    /// `peer`'s handshake succeeded: on a listener that requires client
    /// certificates, it has shown one the client CA signed.
    fn accepted(&self, _peer: SocketAddr) {}
}

/// The [`ServerNames`] of a listener.
pub type NameCheck = Arc<dyn ServerNames>;

/// A TLS listener's handshake settings.
#[derive(Clone)]
pub struct TlsAccept {
    pub kind: ListenerKind,
    pub config: Arc<ServerConfig>,
    /// Refuses server names before the handshake goes on (the function
    /// host's SNI routing); `None`: any name.
    pub names: Option<NameCheck>,
    pub metrics: Arc<HandshakeMetrics>,
    log: Arc<LogLimit>,
}

impl TlsAccept {
    pub fn new(
        kind: ListenerKind,
        config: Arc<ServerConfig>,
        names: Option<NameCheck>,
        metrics: Arc<HandshakeMetrics>,
    ) -> TlsAccept {
        TlsAccept {
            kind,
            config,
            names,
            metrics,
            log: Arc::new(LogLimit::default()),
        }
    }

    /// Accepts TCP connections on `listener` and hands each to the server
    /// (through `tx`, as `wrap` makes it) once its handshake is done, until
    /// the server stops taking them.
    pub async fn run<T: Send + 'static>(
        self,
        listener: TcpListener,
        tx: tokio::sync::mpsc::Sender<io::Result<T>>,
        wrap: impl Fn(TlsStream<TcpStream>) -> T + Send + Sync + 'static,
    ) {
        let wrap = Arc::new(wrap);
        loop {
            let (stream, remote) = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::debug!(error = %e, listener = self.kind.label(), "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            crate::listen::no_delay(&stream);
            let this = self.clone();
            let (tx, wrap) = (tx.clone(), wrap.clone());
            tokio::spawn(async move {
                // The server name the client asked for, once its hello is read.
                let mut name = None;
                let handshake = tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    this.handshake(stream, remote, &mut name),
                );
                match handshake.await {
                    Ok(Ok(Some(tls))) => {
                        if let Some(names) = &this.names {
                            names.accepted(remote);
                        }
                        let _ = tx.send(Ok(wrap(tls))).await;
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(refusal)) => this.refused(remote, &refusal, name.as_deref()),
                    Err(_) => this.refused(
                        remote,
                        &Refusal::new(
                            Reason::Timeout,
                            format!("the handshake did not finish within {HANDSHAKE_TIMEOUT:?}"),
                        ),
                        name.as_deref(),
                    ),
                }
            });
        }
    }

    /// One handshake; `None` for a connection closed before its first byte.
    /// `name` is set to the server name the client asks for, if any, once its
    /// hello is read.
    async fn handshake(
        &self,
        stream: TcpStream,
        remote: SocketAddr,
        name: &mut Option<String>,
    ) -> Result<Option<TlsStream<TcpStream>>, Refusal> {
        let mut first = [0u8; H2_PREFACE.len()];
        let seen = stream
            .peek(&mut first)
            .await
            .map_err(|e| Refusal::new(Reason::Other, format!("cannot read: {e}")))?;
        if seen == 0 {
            return Ok(None);
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            return Err(refuse_plaintext(stream, &first[..seen]).await);
        }
        let mut acceptor = std::pin::pin!(tokio_rustls::LazyConfigAcceptor::new(
            rustls::server::Acceptor::default(),
            stream
        ));
        let mut start = acceptor.as_mut().await.map_err(|e| classify(&e))?;
        *name = start.client_hello().server_name().map(str::to_owned);
        if let Some(refusal) = self
            .names
            .as_ref()
            .and_then(|names| names.refusal(start.client_hello().server_name(), remote))
        {
            let description = match refusal.reason {
                Reason::UnknownServerName => alert::UNRECOGNIZED_NAME,
                _ => alert::HANDSHAKE_FAILURE,
            };
            let _ = start.io.write_all(&alert::fatal(description)).await;
            let _ = start.io.shutdown().await;
            return Err(refusal);
        }
        start
            .into_stream(self.config.clone())
            .await
            .map(Some)
            .map_err(|e| classify(&e))
    }

    fn refused(&self, remote: SocketAddr, refusal: &Refusal, name: Option<&str>) {
        self.metrics.refused(self.kind, refusal.reason);
        match self.log.admit(Instant::now()) {
            Admit::No => {}
            Admit::Yes { left_out } => {
                if left_out > 0 {
                    tracing::warn!(
                        listener = self.kind.label(),
                        left_out,
                        "refused TLS handshakes not logged in the last minute (see fnrun_tls_handshakes_refused_total)"
                    );
                }
                match name {
                    Some(name) => tracing::warn!(
                        listener = self.kind.label(),
                        peer = %remote,
                        reason = refusal.reason.label(),
                        server_name = %fnrun_api::Quoted::new(name),
                        "TLS handshake refused: {}",
                        refusal.detail
                    ),
                    None => tracing::warn!(
                        listener = self.kind.label(),
                        peer = %remote,
                        reason = refusal.reason.label(),
                        "TLS handshake refused: {}",
                        refusal.detail
                    ),
                }
            }
        }
    }
}

/// Answers a client that spoke plaintext to the TLS listener in its own
/// protocol, so that it can say what went wrong.
async fn refuse_plaintext(mut stream: TcpStream, first: &[u8]) -> Refusal {
    const MESSAGE: &[u8] = b"this listener requires TLS: connect with TLS, not plaintext";
    let (what, answer) = if H2_PREFACE.starts_with(first) {
        ("plaintext HTTP/2 (h2c)", h2_goaway(MESSAGE))
    } else if first.iter().all(|b| b.is_ascii_uppercase() || *b == b' ') {
        let mut answer = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MESSAGE.len() + 1
        )
        .into_bytes();
        answer.extend_from_slice(MESSAGE);
        answer.push(b'\n');
        ("plaintext HTTP/1", answer)
    } else {
        ("bytes that are not TLS", Vec::new())
    };
    if !answer.is_empty() {
        let _ = stream.write_all(&answer).await;
    }
    let _ = stream.shutdown().await;
    Refusal::new(
        Reason::NotTls,
        format!("the client sent {what} to a listener that requires TLS"),
    )
}

/// An empty SETTINGS frame (the server's preface) and a GOAWAY frame
/// (PROTOCOL_ERROR, last stream 0) with `message` as its debug data.
fn h2_goaway(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let len = u32::try_from(8 + message.len()).expect("a short message");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&0x1u32.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// What a failed handshake says of itself.
fn classify(e: &io::Error) -> Refusal {
    let tls = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::NoCertificatesPresented) => Refusal::new(
            Reason::NoClientCertificate,
            "the client sent no certificate, and this listener requires one (mTLS)",
        ),
        Some(err @ rustls::Error::InvalidCertificate(_)) => Refusal::new(
            Reason::BadClientCertificate,
            format!("the client's certificate was refused: {err}"),
        ),
        Some(rustls::Error::AlertReceived(alert)) => Refusal::new(
            Reason::ServerCertificateRefused,
            format!(
                "the client ended the handshake with the alert {alert:?}: it does not accept this listener's certificate, or the TLS settings"
            ),
        ),
        Some(err) => Refusal::new(Reason::Other, err.to_string()),
        None => Refusal::new(Reason::Other, e.to_string()),
    }
}

/// TLS alert records (RFC 8446, 6), written before any server message, so
/// in plaintext.
mod alert {
    pub const HANDSHAKE_FAILURE: u8 = 40;
    pub const UNRECOGNIZED_NAME: u8 = 112;

    /// A fatal alert record: content type 21, version TLS 1.2 (as TLS 1.3's
    /// records say), length 2, level 2 (fatal), the description.
    pub fn fatal(description: u8) -> [u8; 7] {
        [21, 3, 3, 0, 2, 2, description]
    }
}

/// At most [`LOG_BURST`] lines per [`LOG_WINDOW`]; those left out are told
/// with the next one logged.
#[derive(Debug, Default)]
struct LogLimit {
    state: Mutex<Option<LimitState>>,
}

#[derive(Debug)]
struct LimitState {
    window: Instant,
    logged: u32,
    left_out: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Admit {
    No,
    /// Log, and say how many were left out before.
    Yes {
        left_out: u64,
    },
}

impl LogLimit {
    fn admit(&self, now: Instant) -> Admit {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = state.get_or_insert(LimitState {
            window: now,
            logged: 0,
            left_out: 0,
        });
        if now.duration_since(s.window) >= LOG_WINDOW {
            s.window = now;
            s.logged = 0;
        }
        if s.logged < LOG_BURST {
            s.logged += 1;
            Admit::Yes {
                left_out: std::mem::take(&mut s.left_out),
            }
        } else {
            s.left_out += 1;
            Admit::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_to_its_burst_and_says_what_it_left_out() {
        let limit = LogLimit::default();
        let t0 = Instant::now();
        for _ in 0..LOG_BURST {
            assert_eq!(limit.admit(t0), Admit::Yes { left_out: 0 });
        }
        for _ in 0..5 {
            assert_eq!(limit.admit(t0 + Duration::from_secs(30)), Admit::No);
        }
        assert_eq!(
            limit.admit(t0 + LOG_WINDOW),
            Admit::Yes { left_out: 5 },
            "a new window logs again, saying how many were left out"
        );
        assert_eq!(limit.admit(t0 + LOG_WINDOW), Admit::Yes { left_out: 0 });
    }

    #[test]
    fn every_reason_is_rendered_per_listener_and_moves() {
        let m = HandshakeMetrics::default();
        m.refused(ListenerKind::Functions, Reason::UnknownServerName);
        m.refused(ListenerKind::Functions, Reason::UnknownServerName);
        m.refused(ListenerKind::Runner, Reason::NotTls);
        let mut out = String::new();
        m.render(&mut out);
        let series = out.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series, Reason::ALL.len() * ListenerKind::ALL.len(), "{out}");
        for line in [
            "fnrun_tls_handshakes_refused_total{listener=\"functions\",reason=\"unknown_server_name\"} 2",
            "fnrun_tls_handshakes_refused_total{listener=\"runner\",reason=\"not_tls\"} 1",
            "fnrun_tls_handshakes_refused_total{listener=\"runner\",reason=\"timeout\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
        }
    }

    #[test]
    fn the_goaway_is_a_settings_and_a_goaway_frame() {
        let frames = h2_goaway(b"no");
        // SETTINGS: length 0, type 4, flags 0, stream 0.
        assert_eq!(frames[..9], [0, 0, 0, 4, 0, 0, 0, 0, 0]);
        // GOAWAY: length 10, type 7, stream 0, last stream 0, PROTOCOL_ERROR.
        assert_eq!(frames[9..18], [0, 0, 10, 7, 0, 0, 0, 0, 0]);
        assert_eq!(frames[18..26], [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&frames[26..], b"no");
        assert_eq!(
            alert::fatal(alert::UNRECOGNIZED_NAME),
            [21, 3, 3, 0, 2, 2, 112]
        );
    }
}
