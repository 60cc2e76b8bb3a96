//! Which API reaches the function, and what passes through unchanged: a v1
//! call that a v1beta1-only function answers with UNIMPLEMENTED is sent
//! again as v1beta1 (same bytes, other path); a v1beta1 call reaches a
//! function that serves both; request and response bytes are forwarded as
//! they are, fields fnrun does not know included; the function's own error
//! status passes through with its code and message.

use fnrun_api::v1;
use fnrun_tests::crossplane::{Api, GoFunction, SAMPLE_REQUEST, Variant};
use fnrun_tests::function_host::{Entry, FunctionHost, HostOpts};
use fnrun_tests::image::BuiltImage;
use fnrun_tests::user::require_root;
use prost::Message;

fn image(variant: Variant) -> BuiltImage {
    GoFunction::new(variant).image().unwrap().build().unwrap()
}

/// The API version the label function says it was called on.
fn called_on(outcome: &fnrun_tests::crossplane::Outcome) -> String {
    assert!(outcome.is_ok(), "{outcome:?}");
    let message = &outcome.results()[0].1;
    message
        .split(['(', ')'])
        .nth(1)
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn v1_calls_fall_back_to_v1beta1_and_v1beta1_calls_get_through() {
    if !require_root("v1_calls_fall_back_to_v1beta1_and_v1beta1_calls_get_through") {
        return;
    }
    let beta_only = image(Variant::V1beta1Only);
    let both = image(Variant::Label);
    let host = FunctionHost::start(HostOpts::insecure(vec![
        Entry::new("fn-beta", &beta_only.oci_ref()),
        Entry::new("fn-both", &both.oci_ref()),
    ]))
    .unwrap();
    // A v1 client (no fallback of its own) reaches a v1beta1-only function:
    // fnrun retried the call as v1beta1. Twice: then fnrun knows and goes
    // there first.
    for _ in 0..2 {
        let outcome = host
            .call("fn-beta")
            .api(Api::V1)
            .request(SAMPLE_REQUEST)
            .run()
            .unwrap();
        assert_eq!(outcome.version, "v1");
        assert!(!outcome.fallback);
        assert_eq!(called_on(&outcome), "v1beta1");
    }
    // A v1beta1 call (Crossplane v1.14 to v1.16) to a function serving both.
    let outcome = host
        .call("fn-both")
        .api(Api::V1beta1)
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(outcome.version, "v1beta1");
    assert_eq!(called_on(&outcome), "v1beta1");
    // And v1 to it stays v1.
    let outcome = host
        .call("fn-both")
        .api(Api::V1)
        .request(SAMPLE_REQUEST)
        .run()
        .unwrap();
    assert_eq!(called_on(&outcome), "v1");
}

#[test]
fn the_functions_own_status_passes_through() {
    if !require_root("the_functions_own_status_passes_through") {
        return;
    }
    let both = image(Variant::Label);
    let host = FunctionHost::start(HostOpts::insecure(vec![Entry::new(
        "fn-a",
        &both.oci_ref(),
    )]))
    .unwrap();
    for (code, message) in [
        (3, "bad input: spec.size is negative"),
        (9, "the database is not ready yet"),
        (8, "quota"),
        (12, "this function does not do that"),
    ] {
        let request = format!("input: {{failWith: {{code: {code}, message: {message:?}}}}}\n");
        let outcome = host
            .call("fn-a")
            .api(Api::V1)
            .request(&request)
            .run()
            .unwrap();
        assert_eq!(outcome.code as i32, code, "{outcome:?}");
        assert_eq!(outcome.message, message);
    }
}

/// A codec that sends and receives messages as the bytes they are.
#[derive(Clone, Copy, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

/// Field 1000 of `State`, a varint: no version of the API has it.
const UNKNOWN_FIELD: [u8; 4] = [0xc0, 0x3e, 0xb9, 0x60];

#[test]
fn request_and_response_bytes_pass_through_unchanged() {
    if !require_root("request_and_response_bytes_pass_through_unchanged") {
        return;
    }
    let both = image(Variant::Label);
    let host = FunctionHost::start(HostOpts::insecure(vec![Entry::new(
        "fn-a",
        &both.oci_ref(),
    )]))
    .unwrap();
    // A request whose desired state carries a field fnrun does not know:
    // the Go function keeps unknown fields and sends its desired state back,
    // so the field survives only if fnrun forwards bytes both ways.
    let mut state = v1::State {
        composite: None,
        resources: [("bucket".to_owned(), v1::Resource::default())].into(),
    }
    .encode_to_vec();
    state.extend_from_slice(&UNKNOWN_FIELD);
    let mut request = v1::RunFunctionRequest {
        meta: Some(v1::RequestMeta {
            tag: "raw".into(),
            capabilities: Vec::new(),
        }),
        ..Default::default()
    }
    .encode_to_vec();
    // desired = field 3, length-delimited.
    request.push(0x1a);
    prost::encoding::encode_varint(state.len() as u64, &mut request);
    request.extend_from_slice(&state);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let response = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", host.addr()))
            .unwrap()
            .origin("http://fn-a.crossplane-system:9443".parse().unwrap())
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        grpc.unary(
            tonic::Request::new(request.clone()),
            http::uri::PathAndQuery::from_static(
                "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction",
            ),
            Raw,
        )
        .await
        .map(tonic::Response::into_inner)
    });
    let response = response.unwrap();
    assert!(
        response
            .windows(UNKNOWN_FIELD.len())
            .any(|w| w == UNKNOWN_FIELD),
        "the unknown field did not come back: {response:02x?}"
    );
    let decoded = v1::RunFunctionResponse::decode(response.as_slice()).unwrap();
    assert_eq!(decoded.meta.unwrap().tag, "raw");
    assert!(decoded.desired.unwrap().resources.contains_key("bucket"));
}
