//! Properties of the rewriter, on generated connections, with h2's server as
//! the oracle; and h2's own client through [`NormalizeAuthority`].

use proptest::prelude::*;

use super::client::{Encoder, Framing, REPRS, Repr, frame, headers, preface};
use super::oracle::{self, Seen, serve};
use super::{NormalizeAuthority, UNIX_AUTHORITIES, rewrite, rewrite_chunked};

/// Authorities a client may send: valid ones, unix paths and names, and any
/// printable text.
fn authority() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        prop::sample::select(UNIX_AUTHORITIES).prop_map(|a| Some(a.to_owned())),
        prop::sample::select(
            &[
                "localhost",
                "[::1]:50051",
                "10.1.2.3:9443",
                "www.example.com"
            ][..]
        )
        .prop_map(|a| Some(a.to_owned())),
        "/[a-z0-9./_-]{1,60}".prop_map(Some),
        "(%2F[a-z0-9._-]{1,12}){1,5}".prop_map(Some),
        "[ -~]{0,40}".prop_map(Some),
    ]
}

/// Field names a request may carry (none that h2 refuses, such as
/// `connection`), including some of the static table's and Huffman-known ones.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(&["content-type", "user-agent", "custom-key", "grpc-timeout"][..])
            .prop_map(str::to_owned),
        "x-[a-z0-9-]{1,20}",
    ]
}

fn field_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(&["custom-value", "no-cache", "private", "302", "", "trailers"][..])
            .prop_map(str::to_owned),
        "[!-~]([ -~]{0,30}[!-~])?",
        "[a-z]{100,3000}",
    ]
}

#[derive(Debug, Clone)]
struct GenRequest {
    authority: Option<String>,
    path: String,
    fields: Vec<(String, String, Repr)>,
    body: Option<Vec<u8>>,
    trailers: Option<Vec<(String, String, Repr)>>,
    size_update: Option<usize>,
    huffman: bool,
    framing: Framing,
    ping_after: bool,
}

fn repr() -> impl Strategy<Value = Repr> {
    prop::sample::select(&REPRS[..])
}

fn gen_request() -> impl Strategy<Value = GenRequest> {
    (
        authority(),
        "/[a-z]{1,8}\\.[A-Z][a-z]{0,8}/[A-Z][a-z]{0,8}",
        prop::collection::vec((field_name(), field_value(), repr()), 0..6),
        prop::option::of(prop::collection::vec(any::<u8>(), 1..2000)),
        prop::option::of(prop::collection::vec(
            (field_name(), field_value(), repr()),
            0..3,
        )),
        prop::option::of(0usize..=4096),
        any::<bool>(),
        (
            prop::option::of(any::<u8>()),
            prop::option::of((0u32..8, any::<u8>())),
            prop::collection::vec(any::<usize>(), 0..4),
        ),
        any::<bool>(),
    )
        .prop_map(
            |(authority, path, fields, body, trailers, size_update, huffman, f, ping_after)| {
                GenRequest {
                    authority,
                    path,
                    fields,
                    body,
                    trailers,
                    size_update,
                    huffman,
                    framing: Framing {
                        end_stream: false,
                        padding: f.0,
                        priority: f.1,
                        cuts: f.2,
                    },
                    ping_after,
                }
            },
        )
}

/// What h2 should hand over for a generated request.
fn expected(request: &GenRequest) -> Seen {
    let authority = request.authority.as_ref().map(|a| {
        if http::uri::Authority::try_from(a.as_str()).is_ok() {
            a.clone()
        } else {
            "localhost".to_owned()
        }
    });
    let pairs = |fields: &[(String, String, Repr)]| {
        let mut v: Vec<(String, String)> = fields
            .iter()
            .map(|(n, v, _)| (n.clone(), v.clone()))
            .collect();
        v.sort();
        v
    };
    Seen {
        method: "POST".to_owned(),
        authority,
        path: request.path.clone(),
        fields: pairs(&request.fields),
        body: request.body.clone().unwrap_or_default(),
        trailers: request.trailers.as_deref().map(pairs),
    }
}

/// The client's bytes for a sequence of generated requests.
fn encode(requests: &[GenRequest]) -> Vec<u8> {
    let mut encoder = Encoder::new();
    let mut input = preface();
    for (i, request) in requests.iter().enumerate() {
        let stream_id = 1 + 2 * u32::try_from(i).expect("a few streams");
        let mut fields = vec![
            (":method".to_owned(), "POST".to_owned(), Repr::Indexed),
            (":scheme".to_owned(), "http".to_owned(), Repr::Indexed),
            (":path".to_owned(), request.path.clone(), Repr::Incremental),
        ];
        if let Some(authority) = &request.authority {
            fields.push((
                ":authority".to_owned(),
                authority.clone(),
                Repr::Incremental,
            ));
        }
        fields.extend(request.fields.iter().cloned());
        let block = encoder.block(request.size_update, &fields, request.huffman);
        let mut framing = request.framing.clone();
        framing.end_stream = request.body.is_none() && request.trailers.is_none();
        // A dependency on the stream itself is a stream error: depend on 0.
        framing.priority = framing.priority.map(|(_, w)| (0, w));
        headers(&mut input, stream_id, &block, &framing);
        if let Some(body) = &request.body {
            let flags = if request.trailers.is_none() { 0x1 } else { 0 };
            frame(&mut input, 0x0, flags, stream_id, body);
        }
        if let Some(trailers) = &request.trailers {
            let block = encoder.block(None, trailers, request.huffman);
            let framing = Framing {
                end_stream: true,
                ..Framing::default()
            };
            headers(&mut input, stream_id, &block, &framing);
        }
        if request.ping_after {
            frame(&mut input, 0x6, 0, 0, b"12345678");
        }
    }
    input
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn any_encoding_of_any_requests_reaches_h2_as_sent(
        requests in prop::collection::vec(gen_request(), 1..8),
        chunks in prop::collection::vec(1usize..300, 0..4),
    ) {
        let input = encode(&requests);
        let (out, rewriter) = rewrite_chunked(&input, &chunks);
        prop_assert_eq!(rewriter.refusal(), None);
        prop_assert_eq!(&out, &rewrite(&input), "chunking changes nothing");
        let outcome = serve(vec![out]);
        prop_assert!(outcome.error.is_none(), "{:?}", outcome.error);
        let want: Vec<Seen> = requests.iter().map(expected).collect();
        prop_assert_eq!(outcome.requests, want);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_chunking_changes_nothing(
        frames in prop::collection::vec(
            (0u8..12, any::<u8>(), 0u32..8, prop::collection::vec(any::<u8>(), 0..64)),
            0..24,
        ),
        tail in prop::collection::vec(any::<u8>(), 0..256),
        chunks in prop::collection::vec(1usize..64, 1..4),
    ) {
        let mut input = preface();
        for (frame_type, flags, stream_id, payload) in &frames {
            frame(&mut input, *frame_type, *flags, *stream_id, payload);
        }
        input.extend_from_slice(&tail);
        let (out, rewriter) = rewrite_chunked(&input, &chunks);
        prop_assert_eq!(&out, &rewrite(&input));
        if rewriter.refusal().is_some() {
            // The refusal is the last thing written: an HPACK block with index 0.
            prop_assert!(out.ends_with(&[0x80]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn damaged_connections_never_panic_and_chunking_changes_nothing(
        requests in prop::collection::vec(gen_request(), 1..4),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        chunks in prop::collection::vec(1usize..512, 1..4),
    ) {
        let mut input = encode(&requests);
        for (at, byte) in &damage {
            let at = 24 + at.index(input.len() - 24);
            input[at] = *byte;
        }
        let (out, _) = rewrite_chunked(&input, &chunks);
        prop_assert_eq!(&out, &rewrite(&input));
    }
}

/// h2's own client, over [`NormalizeAuthority`] to h2's server: Huffman, its
/// dynamic table and its framing, responses on the way back.
#[test]
fn h2_clients_requests_and_the_servers_answers_go_through_unchanged() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(48));
    let fields = prop::collection::vec(
        prop::collection::vec(
            (field_name(), "[!-~]([ -~]{0,30}[!-~])?|[a-z]{1000,9000}"),
            0..5,
        ),
        1..10,
    );
    runner
        .run(&fields, |requests| {
            let got = through_the_wrapper(&requests);
            prop_assert_eq!(got.len(), requests.len());
            for (seen, sent) in got.iter().zip(&requests) {
                let mut sent: Vec<(String, String)> = sent.clone();
                sent.sort();
                prop_assert_eq!(&seen.fields, &sent);
                prop_assert_eq!(seen.authority.as_deref(), Some("fn.example.org:9443"));
            }
            Ok(())
        })
        .unwrap();
}

/// Sends `requests` with h2's client through [`NormalizeAuthority`] to h2's
/// server, which answers each with its path; returns what the server saw.
fn through_the_wrapper(requests: &[Vec<(String, String)>]) -> Vec<Seen> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(NormalizeAuthority::new(server_io))
                .await
                .expect("server handshake");
            let mut seen = Vec::new();
            while let Some(accepted) = connection.accept().await {
                let (request, mut respond) = accepted.expect("a request");
                let request = oracle::read_request(request).await;
                let response = http::Response::builder().status(200).body(()).unwrap();
                let mut body = respond.send_response(response, false).expect("respond");
                body.send_data(request.path.clone().into_bytes().into(), true)
                    .expect("answer");
                seen.push(request);
            }
            seen
        });
        let (client, connection) = h2::client::handshake(client_io).await.expect("handshake");
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        for (i, fields) in requests.iter().enumerate() {
            let path = format!("/p.S/M{i}");
            let mut request = http::Request::post(format!("http://fn.example.org:9443{path}"));
            for (name, value) in fields {
                request = request.header(name.as_str(), value.as_str());
            }
            let (response, _) = client
                .send_request(request.body(()).unwrap(), true)
                .expect("send");
            let response = response.await.expect("response");
            assert_eq!(response.status(), 200);
            let mut body = response.into_body();
            let mut answer = Vec::new();
            while let Some(chunk) = body.data().await {
                answer.extend_from_slice(&chunk.expect("answer"));
            }
            assert_eq!(answer, path.as_bytes());
            client = client.ready().await.expect("ready");
        }
        drop(client);
        let _ = driver.await;
        server.await.expect("server")
    })
}
