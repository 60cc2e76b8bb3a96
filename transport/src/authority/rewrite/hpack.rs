//! The HPACK side of the rewriter: a header block in, the same fields out,
//! with an `:authority` that is not a URI authority replaced.
//!
//! It decodes only what it must. A field that neither refers to nor adds to
//! the client's dynamic table, and is not `:authority`, goes out as the bytes
//! the client wrote (Huffman strings stay coded). A field from the dynamic
//! table goes out as a literal of the strings that added it; a field that
//! added itself goes out as a literal without indexing. So the server's own
//! table stays empty and can never disagree with the client's, whatever size
//! the server keeps; this side follows the client's table (entries, sizes,
//! size updates) to know what its indices mean. Huffman strings are decoded
//! (through a static table: see [`super::huffman`]) only to measure them, and
//! to read names and `:authority` values.
//!
//! Every limit stops the block at once: the decoded list's weight
//! ([`MAX_HEADER_LIST`]), integers (at most five bytes, as h2's decoder), the
//! table size the server allows ([`SERVER_HEADER_TABLE_SIZE`]).

use std::collections::VecDeque;

use super::huffman;
use super::limits::{LOCALHOST, MAX_HEADER_LIST, Refusal, SERVER_HEADER_TABLE_SIZE};

/// The static table (RFC 7541, Appendix A), from index 1.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The static table's index of `:authority`.
const AUTHORITY: usize = 1;

/// An HPACK field's overhead in a table or a header list (RFC 7541, 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Representations (RFC 7541, 6).
const INDEXED: u8 = 0x80;
const WITH_INDEXING: u8 = 0x40;
const SIZE_UPDATE: u8 = 0x20;
const NEVER_INDEXED: u8 = 0x10;
const WITHOUT_INDEXING: u8 = 0x00;

/// [`LOCALHOST`] as an HPACK string literal (its length, then itself).
const LOCALHOST_LITERAL: &[u8] = b"\x09localhost";
const _: () = {
    assert!(LOCALHOST_LITERAL.len() == LOCALHOST.len() + 1);
    assert!(LOCALHOST_LITERAL[0] as usize == LOCALHOST.len());
    let mut i = 0;
    while i < LOCALHOST.len() {
        assert!(LOCALHOST_LITERAL[i + 1] == LOCALHOST[i]);
        i += 1;
    }
};

/// How a field's name goes out.
#[derive(Debug, Clone)]
enum Name {
    /// An index in the static table.
    Static(usize),
    /// A string literal, as the client wrote it.
    Literal(Vec<u8>),
}

/// An entry of the client's dynamic table.
#[derive(Debug)]
struct Entry {
    name: Name,
    /// The value as a string literal: the client's, or `localhost`.
    value: Vec<u8>,
    /// Whether the name is `:authority`.
    authority: bool,
    /// The decoded lengths of the client's name and value.
    name_len: usize,
    value_len: usize,
}

impl Entry {
    /// Its size as the client counts it (RFC 7541, 4.1).
    fn size(&self) -> usize {
        self.name_len + self.value_len + ENTRY_OVERHEAD
    }
}

/// The client's HPACK state, as far as the rewriter follows it.
#[derive(Debug)]
pub struct Hpack {
    /// The client's dynamic table, newest first.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// The last Huffman string decoded, to be read.
    scratch: Vec<u8>,
}

/// A string literal in a block.
struct Str {
    /// Where its length prefix starts.
    start: usize,
    /// Where its octets start.
    data: usize,
    end: usize,
    huffman: bool,
    /// Its decoded length.
    len: usize,
}

impl Hpack {
    pub fn new() -> Self {
        Hpack {
            table: VecDeque::new(),
            size: 0,
            max_size: SERVER_HEADER_TABLE_SIZE,
            scratch: Vec::new(),
        }
    }

    /// Rewrites one whole header block into `out`; `replaced` gets every
    /// `:authority` value replaced. Stops at the first error or limit.
    pub fn rewrite(
        &mut self,
        block: &[u8],
        out: &mut Vec<u8>,
        replaced: &mut Vec<Vec<u8>>,
    ) -> Result<(), Refusal> {
        let mut pos = 0;
        let mut weight = 0;
        let mut fields = false;
        while let Some(&first) = block.get(pos) {
            let start = pos;
            if first & INDEXED != 0 {
                fields = true;
                let index = integer(block, &mut pos, 7)?;
                if index == 0 {
                    return Err(Refusal::Hpack);
                }
                if let Some((name, value)) = STATIC.get(index - 1) {
                    add_weight(&mut weight, name.len() + value.len())?;
                    if index == AUTHORITY {
                        // `:authority` with an empty value is no authority.
                        replaced.push(Vec::new());
                        put_name(out, WITHOUT_INDEXING, &Name::Static(AUTHORITY));
                        out.extend_from_slice(LOCALHOST_LITERAL);
                    } else {
                        out.extend_from_slice(&block[start..pos]);
                    }
                } else {
                    let entry = self.dynamic(index)?;
                    add_weight(&mut weight, entry.name_len + entry.value_len)?;
                    put_name(out, WITHOUT_INDEXING, &entry.name);
                    out.extend_from_slice(&entry.value);
                }
                continue;
            }
            if first & WITH_INDEXING == 0 && first & SIZE_UPDATE != 0 {
                // A size update: only before the block's first field (h2
                // takes them nowhere else), within the size the server allows.
                let size = integer(block, &mut pos, 5)?;
                if fields || size > SERVER_HEADER_TABLE_SIZE {
                    return Err(Refusal::Hpack);
                }
                self.max_size = size;
                self.evict(0);
                continue;
            }
            fields = true;
            let indexing = first & WITH_INDEXING != 0;
            let (prefix, kind) = if indexing {
                (6, WITHOUT_INDEXING)
            } else {
                (4, first & NEVER_INDEXED)
            };
            let name_index = integer(block, &mut pos, prefix)?;
            let (name, name_len, authority) = match name_index {
                0 => {
                    let s = self.string(block, &mut pos)?;
                    let authority = self.read(block, &s) == b":authority";
                    (
                        Name::Literal(block[s.start..s.end].to_vec()),
                        s.len,
                        authority,
                    )
                }
                i if i <= STATIC.len() => (Name::Static(i), STATIC[i - 1].0.len(), i == AUTHORITY),
                i => {
                    let entry = self.dynamic(i)?;
                    (entry.name.clone(), entry.name_len, entry.authority)
                }
            };
            let value = self.string(block, &mut pos)?;
            add_weight(&mut weight, name_len + value.len)?;
            let keep = !authority || is_authority(self.read(block, &value));
            if !keep {
                replaced.push(self.read(block, &value).to_vec());
            }
            if keep && !indexing && name_index <= STATIC.len() {
                // Nothing to change: the client's bytes.
                out.extend_from_slice(&block[start..pos]);
                continue;
            }
            let name = if authority {
                Name::Static(AUTHORITY)
            } else {
                name
            };
            let value_literal = if keep {
                &block[value.start..value.end]
            } else {
                LOCALHOST_LITERAL
            };
            put_name(out, kind, &name);
            out.extend_from_slice(value_literal);
            if indexing {
                let entry = Entry {
                    name,
                    value: value_literal.to_vec(),
                    authority,
                    name_len,
                    value_len: value.len,
                };
                self.insert(entry);
            }
        }
        Ok(())
    }

    /// The dynamic table's entry at `index` (62 is the newest).
    fn dynamic(&self, index: usize) -> Result<&Entry, Refusal> {
        self.table
            .get(index - STATIC.len() - 1)
            .ok_or(Refusal::Hpack)
    }

    /// Adds an entry (RFC 7541, 4.4): older ones are evicted to make room; one
    /// larger than the table empties it and is not added.
    fn insert(&mut self, entry: Entry) {
        let size = entry.size();
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.table.push_front(entry);
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit, or none is left.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some(oldest) = self.table.pop_back() else {
                break;
            };
            self.size -= oldest.size();
        }
    }

    /// Reads a string literal at `pos` (RFC 7541, 5.2); a Huffman one is
    /// decoded into the scratch buffer.
    fn string(&mut self, block: &[u8], pos: &mut usize) -> Result<Str, Refusal> {
        let start = *pos;
        let huffman = block.get(start).ok_or(Refusal::Hpack)? & 0x80 != 0;
        let len = integer(block, pos, 7)?;
        let data = *pos;
        let end = data.checked_add(len).ok_or(Refusal::Hpack)?;
        let octets = block.get(data..end).ok_or(Refusal::Hpack)?;
        *pos = end;
        let len = if huffman {
            self.scratch.clear();
            huffman::decode(octets, &mut self.scratch).map_err(|_| Refusal::Hpack)?;
            self.scratch.len()
        } else {
            len
        };
        Ok(Str {
            start,
            data,
            end,
            huffman,
            len,
        })
    }

    /// The octets of the string [`Self::string`] read last.
    fn read<'a>(&'a self, block: &'a [u8], s: &Str) -> &'a [u8] {
        if s.huffman {
            &self.scratch
        } else {
            &block[s.data..s.end]
        }
    }
}

/// Counts a field in the header list's weight; past [`MAX_HEADER_LIST`], the
/// block is refused.
fn add_weight(weight: &mut usize, len: usize) -> Result<(), Refusal> {
    *weight += len + ENTRY_OVERHEAD;
    if *weight > MAX_HEADER_LIST {
        return Err(Refusal::ListTooLarge);
    }
    Ok(())
}

/// Whether the server's HTTP stack takes `value` as an `:authority`.
fn is_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// An integer with an `n`-bit prefix at `pos` (RFC 7541, 5.1), in at most
/// five bytes, as h2's decoder takes them.
fn integer(block: &[u8], pos: &mut usize, n: u8) -> Result<usize, Refusal> {
    const MAX_BYTES: usize = 5;
    let mask = (1u8 << n) - 1;
    let first = block.get(*pos).ok_or(Refusal::Hpack)?;
    *pos += 1;
    let mut value = usize::from(first & mask);
    if value < usize::from(mask) {
        return Ok(value);
    }
    let mut shift = 0;
    for _ in 1..MAX_BYTES {
        let byte = *block.get(*pos).ok_or(Refusal::Hpack)?;
        *pos += 1;
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Refusal::Hpack)
}

/// Writes the start of a literal field: its representation and its name
/// (an index with a four-bit prefix, or a literal after a zero index).
fn put_name(out: &mut Vec<u8>, kind: u8, name: &Name) {
    match name {
        Name::Static(index) => put_integer(out, 4, kind, *index),
        Name::Literal(literal) => {
            out.push(kind);
            out.extend_from_slice(literal);
        }
    }
}

/// An integer with an `n`-bit prefix, the rest of the first byte `flags`.
fn put_integer(out: &mut Vec<u8>, n: u8, flags: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | low_byte(value));
        return;
    }
    out.push(flags | low_byte(max));
    value -= max;
    while value >= 0x80 {
        out.push(0x80 | low_byte(value & 0x7f));
        value >>= 7;
    }
    out.push(low_byte(value));
}

/// The low byte of a value already masked to fit.
fn low_byte(value: usize) -> u8 {
    u8::try_from(value & 0xff).expect("masked to a byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_constants_are_rfc_7541s() {
        for (index, name) in [
            (1, ":authority"),
            (16, "accept-encoding"),
            (31, "content-type"),
            (58, "user-agent"),
            (59, "vary"),
            (61, "www-authenticate"),
        ] {
            assert_eq!(STATIC[index - 1].0, name.as_bytes());
        }
    }

    #[test]
    fn integers_take_at_most_five_bytes() {
        // 2^28 - 1 + 31 in five bytes; one more continuation is refused.
        let mut pos = 0;
        let five = [0x1f, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(integer(&five, &mut pos, 5), Ok(31 + (1 << 28) - 1));
        assert_eq!(pos, 5);
        let six = [0x1f, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert_eq!(integer(&six, &mut 0, 5), Err(Refusal::Hpack));
        assert_eq!(integer(&[0x1f, 0x80], &mut 0, 5), Err(Refusal::Hpack));
        for value in [0, 14, 15, 16, 127, 128, 4096, 1 << 20] {
            let mut out = Vec::new();
            put_integer(&mut out, 4, 0x10, value);
            let mut pos = 0;
            assert_eq!(integer(&out, &mut pos, 4), Ok(value), "{value}");
            assert_eq!((pos, out[0] & 0xf0), (out.len(), 0x10));
        }
    }
}
