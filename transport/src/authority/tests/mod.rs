//! Tests of the `:authority` rewriter. h2's own server is the oracle: what the
//! rewriter writes must be what h2 takes, field for field, but for an
//! `:authority` made valid.
//!
//! - fixed cases: RFC 7541's examples (Huffman strings, dynamic table), a unix
//!   path that the client's dynamic table carries into later requests, every
//!   framing case, every refusal;
//! - properties: any sequence of requests a client may encode (every HPACK
//!   representation, table size updates, padding, priority, CONTINUATION,
//!   trailers, DATA and PING between), cut into any chunks, reaches h2 as sent;
//!   requests of h2's own client (Huffman, its dynamic table, its framing) go
//!   through [`NormalizeAuthority`] and back unchanged; arbitrary bytes never
//!   make it panic or hold more than a block.

mod client;
mod oracle;
mod properties;

use bytes::BytesMut;
use client::{Encoder, Framing, REPRS, Repr, frame, headers, preface};
use oracle::{Seen, serve};

use super::rewrite::{
    LOCALHOST, MAX_BLOCK, MAX_HEADER_LIST, Refusal, Rewriter, SERVER_HEADER_TABLE_SIZE,
    rewrite_chunked,
};
use super::*;

/// Runs consecutive pieces of one connection through one rewriter, each fed
/// in chunks of the first size in `chunks` (whole if none); returns what it
/// wrote for each.
fn rewrite_phases(phases: &[&[u8]], chunks: &[usize]) -> (Vec<Vec<u8>>, Rewriter) {
    let mut rewriter = Rewriter::new();
    let mut pending = BytesMut::new();
    let mut outs = Vec::new();
    for phase in phases {
        let mut out = BytesMut::new();
        let size = chunks.first().copied().unwrap_or(phase.len()).max(1);
        for piece in phase.chunks(size) {
            pending.extend_from_slice(piece);
            rewriter.feed(&mut pending, &mut out);
        }
        outs.push(out.to_vec());
    }
    (outs, rewriter)
}

fn rewrite(input: &[u8]) -> Vec<u8> {
    rewrite_chunked(input, &[]).0
}

fn owned(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = fields
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

/// A POST to `path` at `authority`, with `fields`, as a client encodes it.
fn request_fields(
    authority: Option<&str>,
    path: &str,
    fields: &[(&str, &str)],
    repr: Repr,
) -> Vec<(String, String, Repr)> {
    let mut all = vec![
        (":method".to_owned(), "POST".to_owned(), repr),
        (":scheme".to_owned(), "http".to_owned(), repr),
        (":path".to_owned(), path.to_owned(), repr),
    ];
    if let Some(authority) = authority {
        all.push((":authority".to_owned(), authority.to_owned(), repr));
    }
    all.extend(
        fields
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned(), repr)),
    );
    all
}

fn seen(authority: Option<&str>, path: &str, fields: &[(&str, &str)]) -> Seen {
    Seen {
        method: "POST".to_owned(),
        authority: authority.map(str::to_owned),
        path: path.to_owned(),
        fields: owned(fields),
        body: Vec::new(),
        trailers: None,
    }
}

const UNIX_AUTHORITIES: &[&str] = &[
    "/tmp/fn.sock",
    "%2Ftmp%2Ffn.sock",
    "crossplane/fn/default.sock",
    "unix-abstract:crossplane/fn/default.sock",
    "unix:/var/run/fnrun/fn.sock",
    "",
];

#[test]
fn the_rfc_7541_requests_go_through_with_huffman_and_the_dynamic_table() {
    // RFC 7541, C.4.1 to C.4.3: three requests, Huffman-coded, the later
    // ones referring to entries the earlier ones added.
    let blocks: [&[u8]; 3] = [
        &[
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
        ],
        &[
            0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
        ],
        &[
            0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
            0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
        ],
    ];
    let mut input = preface();
    for (i, block) in blocks.iter().enumerate() {
        let framing = Framing {
            end_stream: true,
            ..Framing::default()
        };
        let stream = 1 + 2 * u32::try_from(i).expect("a few streams");
        headers(&mut input, stream, block, &framing);
    }
    let outcome = serve(vec![rewrite(&input)]);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let get = |path: &str, fields: &[(&str, &str)]| Seen {
        method: "GET".to_owned(),
        ..seen(Some("www.example.com"), path, fields)
    };
    assert_eq!(
        outcome.requests,
        [
            get("/", &[]),
            get("/", &[("cache-control", "no-cache")]),
            get("/index.html", &[("custom-key", "custom-value")]),
        ]
    );
}

#[test]
fn a_unix_path_or_name_becomes_localhost_also_from_the_dynamic_table() {
    for authority in UNIX_AUTHORITIES {
        for repr in REPRS {
            let mut encoder = Encoder::new();
            let mut input = preface();
            let framing = Framing {
                end_stream: true,
                ..Framing::default()
            };
            // The second and third requests find the authority in the
            // client's dynamic table, when the first one added it.
            for (i, path) in ["/a.S/M", "/a.S/M", "/b.S/N"].iter().enumerate() {
                let fields = request_fields(Some(authority), path, &[("te", "trailers")], repr);
                let block = encoder.block(None, &fields, false);
                let stream = 1 + 2 * u32::try_from(i).expect("a few streams");
                headers(&mut input, stream, &block, &framing);
            }
            let out = rewrite(&input);
            let outcome = serve(vec![out]);
            assert!(
                outcome.error.is_none(),
                "{authority:?} {repr:?}: {:?}",
                outcome.error
            );
            let want = seen(Some("localhost"), "/a.S/M", &[("te", "trailers")]);
            assert_eq!(outcome.requests.len(), 3, "{authority:?} {repr:?}");
            assert_eq!(outcome.requests[0], want, "{authority:?} {repr:?}");
            assert_eq!(outcome.requests[1], want, "{authority:?} {repr:?}");
            assert_eq!(outcome.requests[2].path, "/b.S/N");
            assert_eq!(outcome.requests[2].authority.as_deref(), Some("localhost"));
        }
    }
}

#[test]
fn the_rewriter_reports_what_it_replaced() {
    let mut input = preface();
    let fields = request_fields(Some("/tmp/fn.sock"), "/", &[], Repr::Incremental);
    let block = Encoder::new().block(None, &fields, false);
    headers(&mut input, 1, &block, &Framing::default());
    let (_, mut rewriter) = rewrite_chunked(&input, &[]);
    assert_eq!(rewriter.take_replaced(), [b"/tmp/fn.sock".to_vec()]);
    assert!(rewriter.take_replaced().is_empty());
    assert_eq!(LOCALHOST, b"localhost");
}

#[test]
fn a_valid_authority_and_a_missing_one_are_kept() {
    for authority in [
        Some("localhost"),
        Some("[::]:50051"),
        Some("fn.example.org:9443"),
        None,
    ] {
        let mut input = preface();
        let fields = request_fields(authority, "/p.S/M", &[("x-a", "1")], Repr::Incremental);
        let block = Encoder::new().block(None, &fields, false);
        let framing = Framing {
            end_stream: true,
            ..Framing::default()
        };
        headers(&mut input, 1, &block, &framing);
        let outcome = serve(vec![rewrite(&input)]);
        assert_eq!(
            outcome.requests,
            [seen(authority, "/p.S/M", &[("x-a", "1")])],
            "{authority:?}: {:?}",
            outcome.error
        );
    }
}

#[test]
fn other_frames_and_other_protocols_go_through_byte_for_byte() {
    let mut input = preface();
    frame(&mut input, 0x6, 0, 0, b"pingping"); // PING
    frame(&mut input, 0x8, 0, 0, &[0, 0, 0x10, 0]); // WINDOW_UPDATE
    frame(&mut input, 0x0, 0x1, 1, &vec![7; 40_000]); // DATA, any length
    frame(&mut input, 0xfa, 0xff, 3, b"an extension frame");
    frame(&mut input, 0x3, 0, 5, &[0, 0, 0, 8]); // RST_STREAM
    frame(&mut input, 0x2, 0, 7, &[0, 0, 0, 1, 16]); // PRIORITY
    frame(&mut input, 0x7, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]); // GOAWAY
    for chunks in [&[][..], &[1], &[5, 3, 17]] {
        assert_eq!(rewrite_chunked(&input, chunks).0, input, "{chunks:?}");
    }
    let http1 = b"POST /a.S/M HTTP/1.1\r\nHost: /tmp/fn.sock\r\n\r\n".to_vec();
    assert_eq!(rewrite(&http1), http1);
    // A preface that goes wrong late goes through too.
    let almost = b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\nmore".to_vec();
    assert_eq!(rewrite_chunked(&almost, &[3]).0, almost);
}

#[test]
fn padding_is_dropped_priority_is_kept_and_large_blocks_are_cut_in_frames() {
    let big = "v".repeat(40_000);
    let mut encoder = Encoder::new();
    let fields = request_fields(
        Some("/tmp/fn.sock"),
        "/p.S/M",
        &[("x-big", &big)],
        Repr::Incremental,
    );
    let block = encoder.block(None, &fields, false);
    let framing = Framing {
        end_stream: true,
        padding: Some(200),
        priority: Some((0, 42)),
        cuts: vec![3, 700, 20_000],
    };
    let mut input = preface();
    headers(&mut input, 1, &block, &framing);
    let out = rewrite(&input);

    // Frames as written: HEADERS with the priority and no padding, then
    // CONTINUATION frames, none over 16 KiB.
    let mut frames = Vec::new();
    let mut rest = &out[24 + 9..];
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        frames.push((rest[3], rest[4], len, rest[9..9 + len.min(5)].to_vec()));
        rest = &rest[9 + len..];
    }
    assert!(frames.len() >= 3, "{frames:?}");
    assert_eq!(frames[0].0, 0x1);
    assert_eq!(
        frames[0].1,
        0x1 | 0x20,
        "END_STREAM and PRIORITY, not PADDED"
    );
    assert_eq!(frames[0].3, [0, 0, 0, 0, 42]);
    for (i, (frame_type, flags, _, _)) in frames.iter().enumerate().skip(1) {
        assert_eq!(*frame_type, 0x9);
        assert_eq!(flags & 0x4 != 0, i + 1 == frames.len());
    }
    assert!(frames.iter().all(|f| f.2 <= 16_384));

    let outcome = serve(vec![out]);
    assert_eq!(
        outcome.requests,
        [seen(Some("localhost"), "/p.S/M", &[("x-big", &big)])],
        "{:?}",
        outcome.error
    );
}

#[test]
fn a_table_size_update_is_followed() {
    let mut encoder = Encoder::new();
    let mut input = preface();
    let framing = Framing {
        end_stream: true,
        ..Framing::default()
    };
    let first = request_fields(
        Some("/tmp/a.sock"),
        "/a",
        &[("x-k", "v1")],
        Repr::Incremental,
    );
    headers(&mut input, 1, &encoder.block(None, &first, false), &framing);
    // Emptied and shrunk, then grown again: the old entries are gone.
    let second = request_fields(Some("/tmp/a.sock"), "/b", &[("x-k", "v2")], Repr::Indexed);
    let block = [
        encoder.block(Some(0), &[], false),
        encoder.block(Some(256), &second, false),
    ]
    .concat();
    headers(&mut input, 3, &block, &framing);
    let outcome = serve(vec![rewrite(&input)]);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    assert_eq!(
        outcome.requests,
        [
            seen(Some("localhost"), "/a", &[("x-k", "v1")]),
            seen(Some("localhost"), "/b", &[("x-k", "v2")]),
        ]
    );
}

/// A connection with one good request, then `bad`, then another good
/// request: h2 takes the first, ends the connection with a GOAWAY at `bad`
/// and never sees the last.
fn assert_refused(bad: impl FnOnce(&mut Vec<u8>), why: Refusal) {
    let mut encoder = Encoder::new();
    let framing = Framing {
        end_stream: true,
        ..Framing::default()
    };
    let mut first = preface();
    let good = request_fields(Some("/tmp/fn.sock"), "/a", &[], Repr::Incremental);
    headers(&mut first, 1, &encoder.block(None, &good, false), &framing);
    let mut second = Vec::new();
    bad(&mut second);
    let after = request_fields(Some("localhost"), "/after", &[], Repr::WithoutIndexing);
    headers(
        &mut second,
        101,
        &encoder.block(None, &after, false),
        &framing,
    );

    for chunks in [&[][..], &[1], &[4096, 7]] {
        let (phases, rewriter) = rewrite_phases(&[&first, &second], chunks);
        assert_eq!(rewriter.refusal(), Some(why), "{chunks:?}");
        let outcome = serve(phases);
        assert!(outcome.went_away(), "{why:?}: {:?}", outcome.error);
        assert_eq!(
            outcome.requests,
            [seen(Some("localhost"), "/a", &[])],
            "{why:?}"
        );
    }
}

#[test]
fn what_cannot_be_rewritten_ends_the_connection_through_h2() {
    let end = Framing {
        end_stream: true,
        ..Framing::default()
    };
    // Index 0, and an index past both tables.
    assert_refused(|i| headers(i, 3, &[0x80], &end), Refusal::Hpack);
    assert_refused(|i| headers(i, 3, &[0xff, 0x40], &end), Refusal::Hpack);
    // A size update over the server's table size, a string past its block.
    assert_refused(
        |i| headers(i, 3, &[0x3f, 0xe2, 0x1f, 0x82], &end),
        Refusal::Hpack,
    );
    assert_refused(|i| headers(i, 3, &[0x00, 0x05, b'a'], &end), Refusal::Hpack);
    // A CONTINUATION out of turn; a frame inside a block; a block continued
    // on another stream.
    assert_refused(|i| frame(i, 0x9, 0x4, 3, &[0x82]), Refusal::Continuation);
    assert_refused(
        |i| {
            frame(i, 0x1, 0, 3, &[0x82]);
            frame(i, 0x6, 0, 0, b"pingping");
        },
        Refusal::Continuation,
    );
    assert_refused(
        |i| {
            frame(i, 0x1, 0, 3, &[0x82]);
            frame(i, 0x9, 0x4, 5, &[0x86]);
        },
        Refusal::Continuation,
    );
    assert_refused(
        |i| frame(i, 0x5, 0x4, 3, &[0, 0, 0, 4, 0x82]),
        Refusal::PushPromise,
    );
    // Padding longer than the frame; a priority that does not fit.
    assert_refused(
        |i| frame(i, 0x1, 0x4 | 0x8, 3, &[9, 0x82]),
        Refusal::BadPadding,
    );
    assert_refused(
        |i| frame(i, 0x1, 0x4 | 0x20, 3, &[0, 0]),
        Refusal::BadPadding,
    );
    // A block over the limit, in CONTINUATION frames.
    assert_refused(
        |i| {
            frame(i, 0x1, 0, 3, &[0x82]);
            for _ in 0..=MAX_BLOCK / 16_384 {
                frame(i, 0x9, 0, 3, &[0x00; 16_384]);
            }
        },
        Refusal::BlockTooLarge,
    );
    // A small block whose list is huge: one 4 KiB entry referred to again
    // and again.
    assert_refused(
        |i| {
            let mut block = Vec::new();
            client::integer(&mut block, 6, 0x40, 0);
            client::integer(&mut block, 7, 0, 3);
            block.extend_from_slice(b"x-a");
            client::integer(&mut block, 7, 0, 3000);
            block.extend(std::iter::repeat_n(b'v', 3000));
            for _ in 0..MAX_HEADER_LIST / 3000 {
                block.push(0x80 | 62);
            }
            headers(i, 3, &block, &end);
        },
        Refusal::ListTooLarge,
    );
}

/// The rewriter lets a client's HPACK table be as large as
/// [`SERVER_HEADER_TABLE_SIZE`]: tonic's server must not advertise more.
#[test]
fn tonics_server_advertises_no_larger_header_table() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let (_, health) = tonic_health::server::health_reporter();
        let incoming = futures::stream::iter([Ok::<_, std::io::Error>(server)]);
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        client.write_all(&preface()).await.expect("preface");
        let mut head = [0; 9];
        client
            .read_exact(&mut head)
            .await
            .expect("the server's SETTINGS");
        assert_eq!(head[3], 0x4, "SETTINGS first");
        let len = usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut settings = vec![0; len];
        client
            .read_exact(&mut settings)
            .await
            .expect("its parameters");
        for parameter in settings.chunks(6) {
            let id = u16::from_be_bytes([parameter[0], parameter[1]]);
            let value =
                u32::from_be_bytes([parameter[2], parameter[3], parameter[4], parameter[5]]);
            if id == 0x1 {
                assert!(value as usize <= SERVER_HEADER_TABLE_SIZE, "{value}");
            }
        }
        serving.abort();
    });
}

/// The reproducer: a block of literals with empty Huffman-coded
/// names and values (`00 80 80`), as large as a block may be. The rewriter
/// stops at the header list's limit, a few KiB in: the index 0 at the end of
/// the block, which it would find if it went on, is never reached.
#[test]
fn a_block_is_refused_at_the_first_limit_it_exceeds() {
    let fields = (MAX_BLOCK - 1) / 3;
    let mut block = [0x00, 0x80, 0x80].repeat(fields);
    block.push(0x80);
    assert!(block.len() <= MAX_BLOCK);
    let end = Framing {
        end_stream: true,
        cuts: vec![16_000, 32_000, 48_000, 64_000, 80_000, 96_000, 112_000],
        ..Framing::default()
    };
    assert_refused(|i| headers(i, 3, &block, &end), Refusal::ListTooLarge);
}

/// Many small Huffman-coded fields in one block, each as large as a block may
/// weigh: every field reaches h2, in order, from a connection of many such
/// requests.
#[test]
fn many_huffman_coded_fields_go_through() {
    let per_request = (MAX_HEADER_LIST - 200) / (b"user-agent".len() + 32);
    let mut input = preface();
    for i in 0..4u32 {
        let mut block = Vec::new();
        // :method POST, :scheme http, :path /a.S/M, :authority a unix path.
        block.extend_from_slice(&[0x83, 0x86, 0x44, 0x06]);
        block.extend_from_slice(b"/a.S/M");
        client::integer(&mut block, 4, 0x00, 1);
        client::integer(&mut block, 7, 0, 12);
        block.extend_from_slice(b"/tmp/fn.sock");
        for _ in 0..per_request {
            // user-agent (static 58), without indexing, an empty Huffman value.
            block.extend_from_slice(&[0x0f, 0x2b, 0x80]);
        }
        let framing = Framing {
            end_stream: true,
            ..Framing::default()
        };
        headers(&mut input, 1 + 2 * i, &block, &framing);
    }
    let (out, rewriter) = rewrite_chunked(&input, &[1000]);
    assert_eq!(rewriter.refusal(), None);
    let outcome = serve(vec![out]);
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    let agents = vec![("user-agent", ""); per_request];
    assert_eq!(
        outcome.requests,
        vec![seen(Some("localhost"), "/a.S/M", &agents); 4]
    );
}

/// Once a block is refused, the server reads the refusal, then the end of
/// the connection: nothing more the client sends is read or held.
#[test]
fn after_a_refusal_the_server_reads_the_end() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut server = NormalizeAuthority::new(server);
        let mut input = preface();
        headers(&mut input, 1, &[0x80], &Framing::default());
        client.write_all(&input).await.expect("write");
        // More, and the client never ends its side.
        client.write_all(&[0; 64 << 10]).await.expect("write");
        let mut read = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            server.read_to_end(&mut read),
        )
        .await
        .expect("the end, while the client is still there")
        .expect("read");
        let refusal = [0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x80];
        assert!(read.ends_with(&refusal), "{read:?}");
        assert_eq!(read.len(), preface().len() + refusal.len());
        assert_eq!(server.rewriter.refusal(), Some(Refusal::Hpack));
        drop(client);
    });
}
