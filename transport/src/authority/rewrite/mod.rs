//! The rewriter: reads what a client sends on one HTTP/2 connection and gives
//! back the same bytes, except that in every header block an `:authority`
//! that is not a URI authority is replaced by [`LOCALHOST`](limits::LOCALHOST).
//!
//! It does no I/O: [`Rewriter::feed`] takes the bytes read so far and appends
//! what the server should read. Only header blocks change: the connection
//! preface, DATA, SETTINGS, PING, WINDOW_UPDATE, RST_STREAM, PRIORITY, GOAWAY
//! and unknown frames go through byte for byte, so flow control and every
//! other check stays the server's.
//!
//! HPACK state: a header block may use the client's dynamic table, so every
//! block (a request's headers and its trailers alike) goes through one
//! [`hpack::Hpack`] that follows the client's table, and comes out referring
//! to no dynamic table at all (see [`hpack`]), so it can never disagree with
//! the server about what an index means, whatever table size the server
//! keeps. The client's dynamic table size updates are followed and not passed
//! on.
//!
//! Work is linear in what the client sends and stops at the first limit: a
//! block is held up to [`MAX_BLOCK`] bytes and refused as soon as its frames
//! would pass it; its fields are read once, Huffman strings through a static
//! table ([`huffman`]), and the block is refused at the first field that takes
//! the list past [`MAX_HEADER_LIST`](limits::MAX_HEADER_LIST) or does not decode.
//!
//! What the rewriter cannot decode it does not pass on either: the server would
//! decode the raw block against a table that is no longer the client's. It
//! hands the server instead one header block that every HPACK decoder refuses
//! (an indexed field with index 0), so h2 ends the connection with a GOAWAY as
//! it would have for the client's own bad block, and drops the rest of the
//! input.

mod hpack;
mod huffman;
mod limits;

use bytes::{Buf, BufMut, BytesMut};
use hpack::Hpack;
#[cfg(test)]
pub(super) use limits::{LOCALHOST, MAX_HEADER_LIST, SERVER_HEADER_TABLE_SIZE};
pub use limits::{MAX_BLOCK, Refusal};

/// The HTTP/2 connection preface a client sends first (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame header.
const FRAME_HEADER_LEN: usize = 9;

/// The largest frame payload the rewriter writes: the smallest
/// SETTINGS_MAX_FRAME_SIZE a server may advertise, so always acceptable.
const MAX_FRAME_PAYLOAD: usize = 16_384;

/// Frame types (RFC 9113, 6).
mod ty {
    pub const HEADERS: u8 = 0x1;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (RFC 9113, 6.2 and 6.10).
mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// Where the rewriter is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Matching the connection preface; this many bytes matched so far.
    Preface(usize),
    /// At a frame boundary.
    Frame,
    /// Inside a frame that goes through as it is; this many bytes to go.
    Raw(usize),
    /// Not HTTP/2 with prior knowledge: everything goes through as it is (the
    /// server refuses it).
    Passthrough,
    /// A header block was refused: nothing more goes through.
    Refused(Refusal),
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct Block {
    stream_id: u32,
    end_stream: bool,
    /// The HEADERS frame's stream dependency and weight, if it had them.
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The rewriter of one connection (see the module documentation).
pub struct Rewriter {
    state: State,
    hpack: Hpack,
    block: Option<Block>,
    /// The block being written, reused.
    encoded: Vec<u8>,
    /// Every `:authority` value replaced so far, for the caller to log; the
    /// caller takes them.
    replaced: Vec<Vec<u8>>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    pub fn new() -> Self {
        Rewriter {
            state: State::Preface(0),
            hpack: Hpack::new(),
            block: None,
            encoded: Vec::new(),
            replaced: Vec::new(),
        }
    }

    /// Why the rewriter stopped passing the connection on, if it did.
    pub fn refusal(&self) -> Option<Refusal> {
        match self.state {
            State::Refused(why) => Some(why),
            _ => None,
        }
    }

    /// The `:authority` values replaced since the last call.
    pub fn take_replaced(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.replaced)
    }

    /// Consumes what it can of `input` (the client's bytes, in order) and
    /// appends to `out` what the server is to read. What is left in `input` is
    /// an incomplete frame header or header block frame: call again with more
    /// appended.
    pub fn feed(&mut self, input: &mut BytesMut, out: &mut BytesMut) {
        loop {
            match self.state {
                State::Preface(matched) => {
                    let n = input.len().min(PREFACE.len() - matched);
                    if input[..n] != PREFACE[matched..matched + n] {
                        // Whatever this is, it is not ours to judge (what
                        // matched so far has gone through already).
                        self.state = State::Passthrough;
                        continue;
                    }
                    out.unsplit(input.split_to(n));
                    if matched + n < PREFACE.len() {
                        self.state = State::Preface(matched + n);
                        return;
                    }
                    self.state = State::Frame;
                }
                State::Passthrough => {
                    out.unsplit(input.split_to(input.len()));
                    return;
                }
                State::Refused(_) => {
                    input.clear();
                    return;
                }
                State::Raw(remaining) => {
                    let n = input.len().min(remaining);
                    out.unsplit(input.split_to(n));
                    if n < remaining {
                        self.state = State::Raw(remaining - n);
                        return;
                    }
                    self.state = State::Frame;
                }
                State::Frame => {
                    if !self.frame(input, out) {
                        return;
                    }
                }
            }
        }
    }

    /// Handles the frame at the start of `input`; false if it is not all
    /// there yet.
    fn frame(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> bool {
        let Some(head) = input.get(..FRAME_HEADER_LEN) else {
            return false;
        };
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let frame_type = head[3];
        let flags = head[4];
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;

        let in_block = self.block.as_ref().map(|b| b.stream_id);
        match (frame_type, in_block) {
            (ty::CONTINUATION, Some(id)) if id == stream_id => {}
            (_, Some(id)) => {
                self.refuse(Refusal::Continuation, id, out);
                return true;
            }
            (ty::CONTINUATION, None) => {
                self.refuse(Refusal::Continuation, stream_id, out);
                return true;
            }
            (ty::PUSH_PROMISE, None) => {
                self.refuse(Refusal::PushPromise, stream_id, out);
                return true;
            }
            (ty::HEADERS, None) => {}
            (_, None) => {
                out.unsplit(input.split_to(FRAME_HEADER_LEN));
                self.state = State::Raw(len);
                return true;
            }
        }

        // A header block frame: held whole, within the block's limit.
        let held = self.block.as_ref().map_or(0, |b| b.fragment.len());
        if held + len > MAX_BLOCK {
            self.refuse(Refusal::BlockTooLarge, stream_id, out);
            return true;
        }
        if input.len() < FRAME_HEADER_LEN + len {
            return false;
        }
        input.advance(FRAME_HEADER_LEN);
        let payload = input.split_to(len);
        if frame_type == ty::HEADERS {
            match headers_fragment(flags, &payload) {
                Some((priority, fragment)) => {
                    self.block = Some(Block {
                        stream_id,
                        end_stream: flags & flag::END_STREAM != 0,
                        priority,
                        fragment: fragment.to_vec(),
                    });
                }
                None => {
                    self.refuse(Refusal::BadPadding, stream_id, out);
                    return true;
                }
            }
        } else if let Some(block) = &mut self.block {
            block.fragment.extend_from_slice(&payload);
        }
        if flags & flag::END_HEADERS != 0
            && let Some(block) = self.block.take()
            && let Err(why) = self.rewrite(&block, out)
        {
            self.refuse(why, block.stream_id, out);
        }
        true
    }

    /// Rewrites a whole header block (see [`hpack`]) and writes it out as
    /// HEADERS and CONTINUATION frames.
    fn rewrite(&mut self, block: &Block, out: &mut BytesMut) -> Result<(), Refusal> {
        let mut encoded = std::mem::take(&mut self.encoded);
        encoded.clear();
        let rewritten = self
            .hpack
            .rewrite(&block.fragment, &mut encoded, &mut self.replaced);
        if rewritten.is_ok() {
            put_block(block, &encoded, out);
        }
        self.encoded = encoded;
        rewritten
    }

    /// Hands the server a header block it refuses (so it ends the connection
    /// with a GOAWAY) and drops everything after.
    fn refuse(&mut self, why: Refusal, stream_id: u32, out: &mut BytesMut) {
        // Index 0 is never valid (RFC 7541, 6.1). The stream id is the
        // client's where it has one, so the server gets as far as decoding.
        put_frame_header(out, 1, ty::HEADERS, flag::END_HEADERS, stream_id.max(1));
        out.put_u8(0x80);
        self.block = None;
        self.state = State::Refused(why);
    }
}

/// Writes a rewritten block as a HEADERS frame, with the client's priority,
/// and CONTINUATION frames.
fn put_block(block: &Block, encoded: &[u8], out: &mut BytesMut) {
    let mut first = true;
    let mut rest = encoded;
    loop {
        let (frame_type, mut flags, room) = if first {
            let mut flags = 0;
            if block.end_stream {
                flags |= flag::END_STREAM;
            }
            let priority_len = if block.priority.is_some() {
                flags |= flag::PRIORITY;
                5
            } else {
                0
            };
            (ty::HEADERS, flags, MAX_FRAME_PAYLOAD - priority_len)
        } else {
            (ty::CONTINUATION, 0, MAX_FRAME_PAYLOAD)
        };
        let n = rest.len().min(room);
        if n == rest.len() {
            flags |= flag::END_HEADERS;
        }
        let priority = block.priority.filter(|_| first);
        let payload_len = n + priority.map_or(0, |p| p.len());
        put_frame_header(out, payload_len, frame_type, flags, block.stream_id);
        if let Some(priority) = priority {
            out.put_slice(&priority);
        }
        out.put_slice(&rest[..n]);
        rest = &rest[n..];
        first = false;
        if rest.is_empty() {
            return;
        }
    }
}

/// Runs one connection's bytes (from the preface on) through a fresh
/// rewriter, fed in pieces of the sizes in `chunks`, cycled (all at once if
/// none); returns what the server reads and the rewriter, to ask why it
/// refused. Panics if the rewriter ever holds more than a block and the frame
/// headers around it. The entry point of the property tests and of the fuzz
/// target `authority`.
pub fn rewrite_chunked(input: &[u8], chunks: &[usize]) -> (Vec<u8>, Rewriter) {
    let mut rewriter = Rewriter::new();
    let mut pending = BytesMut::new();
    let mut out = BytesMut::new();
    let mut rest = input;
    let mut sizes = chunks.iter().copied().filter(|&c| c > 0).cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
        pending.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        rewriter.feed(&mut pending, &mut out);
        assert!(
            pending.len() <= MAX_BLOCK + 2 * FRAME_HEADER_LEN + n,
            "the rewriter holds {} bytes",
            pending.len()
        );
    }
    (out.to_vec(), rewriter)
}

/// A HEADERS frame's priority fields and header block fragment; `None` if
/// the padding or the priority does not fit in the payload.
fn headers_fragment(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & flag::PADDED != 0 {
        let (&len, after) = rest.split_first()?;
        pad = usize::from(len);
        rest = after;
    }
    let mut priority = None;
    if flags & flag::PRIORITY != 0 {
        let (fields, after) = rest.split_first_chunk::<5>()?;
        priority = Some(*fields);
        rest = after;
    }
    let end = rest.len().checked_sub(pad)?;
    Some((priority, &rest[..end]))
}

fn put_frame_header(out: &mut BytesMut, len: usize, frame_type: u8, flags: u8, stream_id: u32) {
    let len = u32::try_from(len).expect("frames the rewriter writes are small");
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream_id & 0x7fff_ffff);
}
