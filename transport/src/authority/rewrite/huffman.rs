//! HPACK's Huffman code (RFC 7541, 5.2 and Appendix B), decoded four bits at
//! a time through one table that the compiler builds from the code: no table
//! is built at run time, and a string costs two table lookups a byte.
//!
//! The code is a complete prefix code of 257 symbols (the 256 octets and EOS),
//! so its tree has 256 inner nodes; a decoder state is one of them (0 is the
//! root). From a state, four bits lead to another state and complete at most
//! one symbol, as every code is at least five bits long.

/// Each symbol's code and its length in bits, the 256 octets then EOS
/// (RFC 7541, Appendix B).
#[rustfmt::skip]
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28),
    (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24),
    (0x3ffffffc, 30), (0xfffffe9, 28), (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28),
    (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28), (0xffffff4, 28),
    (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10), (0xf9, 8),
    (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6), (0x0, 5), (0x1, 5), (0x2, 5),
    (0x19, 6), (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7),
    (0xfb, 8), (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7), (0x63, 7), (0x64, 7),
    (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7),
    (0x6d, 7), (0x6e, 7), (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6), (0x7ffd, 15),
    (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6), (0x27, 6),
    (0x6, 5), (0x74, 7), (0x75, 7), (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6),
    (0x76, 7), (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7), (0x79, 7),
    (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13),
    (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22),
    (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23),
    (0xffffeb, 24), (0x7fffdf, 23), (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22),
    (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23), (0x3fffd9, 22),
    (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23),
    (0x1fffde, 21), (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21),
    (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21), (0x7fffed, 23), (0x3fffe1, 22),
    (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22),
    (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22),
    (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26),
    (0x3ffffe4, 26), (0x7ffffde, 27), (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24),
    (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24), (0x1fffe4, 21),
    (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20),
    (0x1fffe6, 21), (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24),
    (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23), (0x3ffffeb, 26), (0x7ffffe6, 27),
    (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27),
    (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), (0x3fffffff, 30),
];

/// The symbol that must not appear in a string (RFC 7541, 5.2).
const EOS: u16 = 256;

/// A child in the tree: an inner node, or (from [`LEAF`] on) a symbol.
const LEAF: u16 = 256;
const UNSET: u16 = u16::MAX;

/// A step's flags.
const EMITS: u8 = 1;
const FAILS: u8 = 2;

/// Where four bits lead from one state.
#[derive(Clone, Copy)]
struct Step {
    next: u8,
    flags: u8,
    symbol: u8,
}

/// The decoder: a step for each state and four bits, and whether a string
/// may end in each state (at the root, or inside EOS's code, whose leading
/// ones are the only padding allowed, after at most seven bits).
struct Table {
    steps: [[Step; 16]; 256],
    accepts: [bool; 256],
}

static TABLE: Table = build();

/// Builds the tree from [`CODES`], then the steps from the tree.
// A const fn has no `try_from`: its casts are of symbols (below 257) and
// states (below 256, asserted), which fit.
#[allow(clippy::cast_possible_truncation)]
const fn build() -> Table {
    let mut children = [[UNSET; 2]; 256];
    let mut depth = [0u8; 256];
    let mut ones = [false; 256];
    ones[0] = true;
    let mut nodes: u16 = 1;
    let mut symbol = 0;
    while symbol < CODES.len() {
        let (code, len) = CODES[symbol];
        let mut node = 0usize;
        let mut bit = len;
        while bit > 1 {
            bit -= 1;
            let b = ((code >> bit) & 1) as usize;
            if children[node][b] == UNSET {
                let new = nodes as usize;
                children[node][b] = nodes;
                depth[new] = depth[node] + 1;
                ones[new] = ones[node] && b == 1;
                nodes += 1;
            }
            node = children[node][b] as usize;
        }
        children[node][(code & 1) as usize] = LEAF + symbol as u16;
        symbol += 1;
    }
    assert!(
        nodes == 256,
        "a complete code of 257 symbols has 256 inner nodes"
    );

    let empty = Step {
        next: 0,
        flags: 0,
        symbol: 0,
    };
    let mut steps = [[empty; 16]; 256];
    let mut accepts = [false; 256];
    let mut state = 0;
    while state < 256 {
        accepts[state] = state == 0 || (ones[state] && depth[state] <= 7);
        let mut bits = 0;
        while bits < 16 {
            let mut node = state;
            let mut step = empty;
            let mut i = 4;
            while i > 0 {
                i -= 1;
                let child = children[node][(bits >> i) & 1];
                if child >= LEAF {
                    if child - LEAF == EOS {
                        step.flags = FAILS;
                        node = 0;
                        break;
                    }
                    step.flags = EMITS;
                    step.symbol = (child - LEAF) as u8;
                    node = 0;
                } else {
                    node = child as usize;
                }
            }
            step.next = node as u8;
            steps[state][bits] = step;
            bits += 1;
        }
        state += 1;
    }
    Table { steps, accepts }
}

/// Why a Huffman-coded string does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid;

/// Appends the decoding of `src` to `dst`: an error if it holds EOS, or ends
/// in anything but at most seven bits of EOS's leading ones.
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), Invalid> {
    // At most 8 symbols in 5 bytes.
    dst.reserve(src.len() * 8 / 5);
    let mut state = 0usize;
    for &byte in src {
        for bits in [byte >> 4, byte & 0xf] {
            let step = TABLE.steps[state][usize::from(bits)];
            if step.flags & FAILS != 0 {
                return Err(Invalid);
            }
            if step.flags & EMITS != 0 {
                dst.push(step.symbol);
            }
            state = usize::from(step.next);
        }
    }
    if TABLE.accepts[state] {
        Ok(())
    } else {
        Err(Invalid)
    }
}

/// The Huffman coding of `src`, padded with ones (what an encoder writes).
#[cfg(test)]
pub fn encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut bits: u64 = 0;
    let mut held = 0u32;
    for &byte in src {
        let (code, len) = CODES[usize::from(byte)];
        bits = bits << len | u64::from(code);
        held += u32::from(len);
        while held >= 8 {
            held -= 8;
            out.push(low_byte(bits >> held));
        }
    }
    if held > 0 {
        let pad = 8 - held;
        out.push(low_byte(bits << pad | ((1 << pad) - 1)));
    }
    out
}

#[cfg(test)]
fn low_byte(bits: u64) -> u8 {
    u8::try_from(bits & 0xff).expect("masked to a byte")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn decoded(src: &[u8]) -> Result<Vec<u8>, Invalid> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    #[test]
    fn the_rfc_7541_strings_decode() {
        // RFC 7541, C.4.1 to C.4.3 and C.6.1.
        let cases: [(&[u8], &str); 6] = [
            (
                &[
                    0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
                ],
                "www.example.com",
            ),
            (&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf], "no-cache"),
            (
                &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f],
                "custom-key",
            ),
            (&[0x64, 0x02], "302"),
            (&[0xae, 0xc3, 0x77, 0x1a, 0x4b], "private"),
            (
                &[
                    0xd0, 0x7a, 0xbe, 0x94, 0x10, 0x54, 0xd4, 0x44, 0xa8, 0x20, 0x05, 0x95, 0x04,
                    0x0b, 0x81, 0x66, 0xe0, 0x82, 0xa6, 0x2d, 0x1b, 0xff,
                ],
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
        ];
        for (coded, plain) in cases {
            assert_eq!(decoded(coded).as_deref(), Ok(plain.as_bytes()), "{plain}");
            assert_eq!(encode(plain.as_bytes()), coded, "{plain}");
        }
        assert_eq!(decoded(&[]), Ok(Vec::new()));
    }

    #[test]
    fn eos_and_bad_padding_are_refused() {
        // EOS itself (30 ones), padded.
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), Err(Invalid));
        // Eight bits of padding: '0' (00000) then eleven ones.
        assert_eq!(decoded(&[0x07, 0xff]), Err(Invalid));
        // Padding that is not EOS's leading ones: '0' then 000.
        assert_eq!(decoded(&[0x00]), Err(Invalid));
        // A byte of ones alone is padding longer than seven bits.
        assert_eq!(decoded(&[0xff]), Err(Invalid));
        // '0' then 111: fine.
        assert_eq!(decoded(&[0x07]), Ok(b"0".to_vec()));
    }

    #[test]
    fn every_state_steps_somewhere_and_the_root_accepts() {
        assert!(TABLE.accepts[0]);
        let accepting = TABLE.accepts.iter().filter(|a| **a).count();
        // The root and the seven nodes on EOS's path at depths 1 to 7.
        assert_eq!(accepting, 8);
    }

    proptest! {
        #[test]
        fn any_octets_round_trip(src in prop::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(decoded(&encode(&src)), Ok(src));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panic(src in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(plain) = decoded(&src) {
                prop_assert_eq!(encode(&plain), src);
            }
        }
    }
}
