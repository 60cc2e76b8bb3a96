//! A test client's side of the wire: an HPACK encoder that can write every
//! representation RFC 7541 has (indexed, literal with incremental indexing,
//! without indexing, never indexed; indexed or literal names; Huffman strings;
//! dynamic table size updates) with its own dynamic table, and HTTP/2 frames
//! (padding, priority, CONTINUATION) around the blocks it encodes.

use std::collections::VecDeque;

/// The static table entries the encoder knows (RFC 7541, Appendix A).
const STATIC: &[(usize, &str, &str)] = &[
    (1, ":authority", ""),
    (2, ":method", "GET"),
    (3, ":method", "POST"),
    (4, ":path", "/"),
    (5, ":path", "/index.html"),
    (6, ":scheme", "http"),
    (7, ":scheme", "https"),
    (31, "content-type", ""),
    (58, "user-agent", ""),
];

/// Strings the encoder can write Huffman-coded (RFC 7541, C.4 and C.6).
const HUFFMAN: &[(&str, &[u8])] = &[
    (
        "www.example.com",
        &[
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ],
    ),
    ("no-cache", &[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]),
    (
        "custom-key",
        &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f],
    ),
    (
        "custom-value",
        &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf],
    ),
    ("private", &[0xae, 0xc3, 0x77, 0x1a, 0x4b]),
    ("302", &[0x64, 0x02]),
];

/// How the encoder writes one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// An index into the static or dynamic table if the field is there,
    /// otherwise a literal with incremental indexing.
    Indexed,
    /// A literal added to the dynamic table.
    Incremental,
    /// A literal not added.
    WithoutIndexing,
    /// A literal not added, that intermediaries must not add either.
    NeverIndexed,
}

pub const REPRS: [Repr; 4] = [
    Repr::Indexed,
    Repr::Incremental,
    Repr::WithoutIndexing,
    Repr::NeverIndexed,
];

/// A client-side HPACK encoder with its own dynamic table.
pub struct Encoder {
    table: VecDeque<(String, String)>,
    size: usize,
    max: usize,
}

impl Encoder {
    pub fn new() -> Self {
        Encoder {
            table: VecDeque::new(),
            size: 0,
            max: 4096,
        }
    }

    /// One header block: an optional dynamic table size update, then each
    /// field as asked (`huffman`: Huffman-code the strings that can be).
    pub fn block(
        &mut self,
        size_update: Option<usize>,
        fields: &[(String, String, Repr)],
        huffman: bool,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(size) = size_update {
            integer(&mut out, 5, 0x20, size);
            self.max = size;
            self.evict();
        }
        for (name, value, repr) in fields {
            let full = self.find(|n, v| n == name && v == value);
            let by_name = self.find(|n, _| n == name);
            let (prefix, mask, add) = match (repr, full) {
                (Repr::Indexed, Some(index)) => {
                    integer(&mut out, 7, 0x80, index);
                    continue;
                }
                (Repr::Indexed | Repr::Incremental, _) => (6, 0x40, true),
                (Repr::WithoutIndexing, _) => (4, 0x00, false),
                (Repr::NeverIndexed, _) => (4, 0x10, false),
            };
            match by_name {
                Some(index) => integer(&mut out, prefix, mask, index),
                None => {
                    integer(&mut out, prefix, mask, 0);
                    string(&mut out, name, huffman);
                }
            }
            string(&mut out, value, huffman);
            if add {
                self.size += name.len() + value.len() + 32;
                self.table.push_front((name.clone(), value.clone()));
                self.evict();
            }
        }
        out
    }

    /// The lowest index (static first, then dynamic) whose entry matches.
    fn find(&self, matches: impl Fn(&str, &str) -> bool) -> Option<usize> {
        STATIC
            .iter()
            .find(|(_, n, v)| matches(n, v))
            .map(|(i, _, _)| *i)
            .or_else(|| {
                self.table
                    .iter()
                    .position(|(n, v)| matches(n, v))
                    .map(|p| 62 + p)
            })
    }

    fn evict(&mut self) {
        while self.size > self.max {
            let (n, v) = self.table.pop_back().expect("size counts entries");
            self.size -= n.len() + v.len() + 32;
        }
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541, 5.1).
pub fn integer(out: &mut Vec<u8>, n: u8, mask: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    let byte = |v: usize| u8::try_from(v).expect("below the prefix or 128");
    if value < max {
        out.push(mask | byte(value));
        return;
    }
    out.push(mask | byte(max));
    value -= max;
    while value >= 128 {
        out.push(byte(value % 128) | 0x80);
        value /= 128;
    }
    out.push(byte(value));
}

/// An HPACK string literal, Huffman-coded if asked and known.
fn string(out: &mut Vec<u8>, s: &str, huffman: bool) {
    match HUFFMAN.iter().find(|(plain, _)| *plain == s) {
        Some((_, coded)) if huffman => {
            integer(out, 7, 0x80, coded.len());
            out.extend_from_slice(coded);
        }
        _ => {
            integer(out, 7, 0x00, s.len());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// The connection preface and an empty SETTINGS frame.
pub fn preface() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    out
}

/// One frame.
pub fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a frame payload is under 16 MiB");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
}

/// How a header block is framed.
#[derive(Debug, Clone, Default)]
pub struct Framing {
    pub end_stream: bool,
    /// Padding bytes on the HEADERS frame.
    pub padding: Option<u8>,
    /// Stream dependency and weight on the HEADERS frame.
    pub priority: Option<(u32, u8)>,
    /// Where the block is cut into HEADERS and CONTINUATION frames (offsets,
    /// taken modulo the block's length, in any order).
    pub cuts: Vec<usize>,
}

/// A header block as HEADERS and CONTINUATION frames.
pub fn headers(out: &mut Vec<u8>, stream_id: u32, block: &[u8], framing: &Framing) {
    let mut cuts: Vec<usize> = framing
        .cuts
        .iter()
        .map(|c| c % (block.len() + 1))
        .chain([block.len()])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut start = 0;
    for (i, &end) in cuts.iter().enumerate() {
        let last = i + 1 == cuts.len();
        let mut flags = if last { 0x4 } else { 0 };
        if i == 0 {
            let mut payload = Vec::new();
            if framing.end_stream {
                flags |= 0x1;
            }
            if let Some(pad) = framing.padding {
                flags |= 0x8;
                payload.push(pad);
            }
            if let Some((dependency, weight)) = framing.priority {
                flags |= 0x20;
                payload.extend_from_slice(&dependency.to_be_bytes());
                payload.push(weight);
            }
            payload.extend_from_slice(&block[start..end]);
            payload.extend(std::iter::repeat_n(
                0,
                usize::from(framing.padding.unwrap_or(0)),
            ));
            frame(out, 0x1, flags, stream_id, &payload);
        } else {
            frame(out, 0x9, flags, stream_id, &block[start..end]);
        }
        start = end;
    }
}
