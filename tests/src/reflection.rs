//! gRPC server reflection with tonic's client, in both of its versions.

use prost::Message;
use prost_types::FileDescriptorProto;
use tonic::transport::Channel;

macro_rules! reflect {
    ($v:ident) => {
        /// Asks server reflection (`grpc.reflection.
        #[doc = stringify!($v)]
        /// `) on `channel` for its services and, for each of `symbols`, the
        /// file that defines it: the service names and the files, in the
        /// order they came. Panics if reflection fails or answers otherwise.
        pub async fn $v(
            channel: Channel,
            symbols: &[&str],
        ) -> (Vec<String>, Vec<FileDescriptorProto>) {
            use tonic_reflection::pb::$v::ServerReflectionRequest;
            use tonic_reflection::pb::$v::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$v::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$v::server_reflection_response::MessageResponse;

            let requests = std::iter::once(MessageRequest::ListServices(String::new()))
                .chain(
                    symbols
                        .iter()
                        .map(|s| MessageRequest::FileContainingSymbol((*s).to_owned())),
                )
                .map(|request| ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(request),
                })
                .collect::<Vec<_>>();
            let mut responses = ServerReflectionClient::new(channel)
                .server_reflection_info(tokio_stream::iter(requests))
                .await
                .expect(concat!("reflection ", stringify!($v), " answers"))
                .into_inner();
            let (mut names, mut files) = (Vec::new(), Vec::new());
            while let Some(response) = responses.message().await.expect("a response") {
                match response.message_response {
                    Some(MessageResponse::ListServicesResponse(list)) => {
                        names.extend(list.service.into_iter().map(|s| s.name));
                    }
                    Some(MessageResponse::FileDescriptorResponse(fd)) => {
                        files.extend(fd.file_descriptor_proto.iter().map(|bytes| {
                            FileDescriptorProto::decode(bytes.as_slice())
                                .expect("a file descriptor")
                        }));
                    }
                    other => panic!("unexpected reflection response {other:?}"),
                }
            }
            (names, files)
        }
    };
}

reflect!(v1);
reflect!(v1alpha);
