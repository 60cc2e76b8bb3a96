//! The oracle: h2's own server, the one tonic runs on, reads what the rewriter
//! wrote and says which requests it took.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request as h2's server handed it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub authority: Option<String>,
    pub path: String,
    /// Regular fields, sorted.
    pub fields: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Trailer fields, sorted.
    pub trailers: Option<Vec<(String, String)>>,
}

/// What the server made of a connection.
#[derive(Debug)]
pub struct Outcome {
    pub requests: Vec<Seen>,
    /// The connection error the server ended with, if any.
    pub error: Option<h2::Error>,
}

impl Outcome {
    /// Whether the server ended the connection with a GOAWAY of
    /// PROTOCOL_ERROR (what it does with a header block it cannot decode).
    pub fn went_away(&self) -> bool {
        self.error
            .as_ref()
            .is_some_and(|e| e.is_go_away() && e.reason() == Some(h2::Reason::PROTOCOL_ERROR))
    }
}

pub fn sorted(fields: &http::HeaderMap) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = fields
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    fields.sort();
    fields
}

/// A request's head, body and trailers, read to the end of its stream.
pub async fn read_request(request: http::Request<h2::RecvStream>) -> Seen {
    let (parts, mut body) = request.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk: Bytes = chunk.expect("request body");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("trailers").map(|t| sorted(&t));
    Seen {
        method: parts.method.to_string(),
        authority: parts.uri.authority().map(|a| a.as_str().to_owned()),
        path: parts.uri.path().to_owned(),
        fields: sorted(&parts.headers),
        body: data,
        trailers,
    }
}

/// The PING the oracle sends after the bytes of phase `i`: when h2 answers
/// it, it has read every frame before it.
fn ping(i: usize) -> [u8; 8] {
    let mut payload = *b"oracle00";
    payload[6..].copy_from_slice(&u16::try_from(i).expect("few phases").to_be_bytes());
    payload
}

/// Writes `phases` (a connection from its preface on) to an h2 server, one
/// after another, and collects the requests it accepts. A phase ends when h2
/// has handed over every request in it (h2 drops those it has not handed over
/// when the connection ends); the last ends the connection, unless h2 ended
/// it before.
pub fn serve(phases: Vec<Vec<u8>>) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (mut rx, mut tx) = tokio::io::split(client);
        let count = phases.len();
        let (next_tx, mut next) = tokio::sync::mpsc::unbounded_channel::<()>();
        let writer = tokio::spawn(async move {
            for (i, bytes) in phases.into_iter().enumerate() {
                let mut ping_frame = Vec::new();
                super::client::frame(&mut ping_frame, 0x6, 0, 0, &ping(i));
                // The server may end the connection before it reads it all.
                let _ = tx.write_all(&bytes).await;
                let _ = tx.write_all(&ping_frame).await;
                if next.recv().await.is_none() {
                    break;
                }
            }
            tx
        });
        let (ack_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut frames = Vec::new();
            let mut buf = [0; 4096];
            while let Ok(n @ 1..) = rx.read(&mut buf).await {
                frames.extend_from_slice(&buf[..n]);
                for payload in pings_back(&mut frames) {
                    let _ = ack_tx.send(payload);
                }
            }
        });
        let mut requests = Vec::new();
        let mut error = None;
        match h2::server::Builder::new()
            // Large blocks are the rewriter's to refuse, not the oracle's.
            .max_header_list_size(1 << 20)
            .handshake::<_, Bytes>(server)
            .await
        {
            Ok(mut connection) => {
                let mut readers = Vec::new();
                'phases: for i in 0..count {
                    loop {
                        tokio::select! {
                            biased;
                            accepted = connection.accept() => match accepted {
                                Some(Ok((request, respond))) => readers.push(tokio::spawn(async move {
                                    let seen = read_request(request).await;
                                    drop(respond);
                                    seen
                                })),
                                Some(Err(e)) => {
                                    error = Some(e);
                                    break 'phases;
                                }
                                None => break 'phases,
                            },
                            ack = acks.recv() => if ack == Some(ping(i)) {
                                break;
                            },
                        }
                    }
                    let _ = next_tx.send(());
                }
                for reader in readers {
                    let seen = tokio::time::timeout(Duration::from_secs(10), reader)
                        .await
                        .expect("the request is read")
                        .expect("the reader does not panic");
                    requests.push(seen);
                }
            }
            Err(e) => error = Some(e),
        }
        writer.abort();
        reader.abort();
        Outcome { requests, error }
    })
}

/// The payloads of the PING ACK frames among the complete frames at the
/// start of `frames`, which are taken out.
fn pings_back(frames: &mut Vec<u8>) -> Vec<[u8; 8]> {
    let mut acks = Vec::new();
    let mut used = 0;
    // The server's connection preface is its SETTINGS frame: frames only.
    while let Some(head) = frames.get(used..used + 9) {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let Some(payload) = frames.get(used + 9..used + 9 + len) else {
            break;
        };
        if head[3] == 0x6
            && head[4] & 0x1 != 0
            && let Ok(payload) = payload.try_into()
        {
            acks.push(payload);
        }
        used += 9 + len;
    }
    frames.drain(..used);
    acks
}
