//! The passthrough codec: a gRPC message is the bytes it came as, never
//! decoded and encoded again. The host forwards v1 and v1beta1 calls with it,
//! so fields fnrun does not know (a newer Crossplane's) reach the function,
//! and the function's fields reach Crossplane, as they were sent.

use bytes::{Buf, BufMut, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Bytes in, bytes out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Passthrough;

impl Codec for Passthrough {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Passthrough;
    type Decoder = Passthrough;

    fn encoder(&mut self) -> Self::Encoder {
        Passthrough
    }

    fn decoder(&mut self) -> Self::Decoder {
        Passthrough
    }
}

impl Encoder for Passthrough {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Passthrough {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // Zero-copy: the message's bytes are split off the receive buffer.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
