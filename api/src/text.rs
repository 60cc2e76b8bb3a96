//! Bounded text for messages.
//!
//! fnrun quotes text that comes from elsewhere: a caller's input in a validation
//! error, a function's stderr and output, a registry's answer. Any of these can
//! be megabytes long, and a message that carries it whole is refused by gRPC
//! clients (a status message travels in a header), floods a terminal and bloats
//! a log. [`bounded`] cuts such text to a few KiB: it keeps the head and the
//! tail, where the useful part of an error usually is, and says in between how
//! many bytes it left out.

use std::borrow::Cow;

/// `text` if it is at most `max` bytes long; otherwise its head and its tail
/// around a marker that says how many bytes were left out of how many, e.g.
/// `config: invalid type: string "aaa…[11999000 of 12000043 bytes elided]…aaa",
/// expected a map`.
///
/// The result is at most `max` bytes long, cut on UTF-8 character boundaries.
/// A `max` too small to hold the marker (under about 40 bytes) gives the marker
/// alone.
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    let total = text.len();
    if total <= max {
        return Cow::Borrowed(text);
    }
    // The marker's length depends on the count it gives; reserve room for the
    // longest it can be (nothing kept: every byte elided).
    let budget = max.saturating_sub(marker(total, total).len());
    let head_end = floor_char_boundary(text, budget - budget / 2);
    let tail_start = ceil_char_boundary(text, total - budget / 2);
    let mut out = String::with_capacity(max);
    out.push_str(&text[..head_end]);
    out.push_str(&marker(tail_start - head_end, total));
    out.push_str(&text[tail_start..]);
    Cow::Owned(out)
}

/// What stands for the bytes left out.
fn marker(elided: usize, total: usize) -> String {
    format!("…[{elided} of {total} bytes elided]…")
}

/// The largest character boundary at or before `i`.
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary at or after `i`.
fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a bounded text into head, (elided, total) and tail.
    fn parse(out: &str) -> (&str, usize, usize, &str) {
        let (head, rest) = out.split_once("…[").expect("a marker");
        let (counts, tail) = rest.split_once(" bytes elided]…").expect("a marker");
        let (elided, total) = counts.split_once(" of ").expect("two counts");
        (head, elided.parse().unwrap(), total.parse().unwrap(), tail)
    }

    #[test]
    fn short_text_is_kept_as_is() {
        assert!(matches!(bounded("", 0), Cow::Borrowed("")));
        assert!(matches!(bounded("abc", 3), Cow::Borrowed("abc")));
        assert!(matches!(bounded("abc", 100), Cow::Borrowed("abc")));
    }

    #[test]
    fn long_text_keeps_head_and_tail_and_counts_the_rest() {
        let text = format!("head-{}-tail", "x".repeat(10_000));
        let out = bounded(&text, 100);
        assert!(out.len() <= 100, "{} bytes: {out}", out.len());
        assert!(out.starts_with("head-xx"), "{out}");
        assert!(out.ends_with("xx-tail"), "{out}");
        let (head, elided, total, tail) = parse(&out);
        assert_eq!(total, text.len());
        assert_eq!(head.len() + elided + tail.len(), total);
        // The head and tail share the room left by the marker.
        assert!(head.len().abs_diff(tail.len()) <= 1, "{out}");
        assert_eq!(
            out,
            format!("{head}…[{elided} of {total} bytes elided]…{tail}")
        );
    }

    #[test]
    fn a_twelve_megabyte_value_becomes_a_few_kib() {
        let text = format!(
            "invalid type: string \"{}\", expected a map at line 1 column 9",
            "a".repeat(12 << 20)
        );
        let out = bounded(&text, 1024);
        assert!(out.len() <= 1024);
        assert!(out.starts_with("invalid type: string \"aaa"), "{out}");
        assert!(
            out.ends_with("\", expected a map at line 1 column 9"),
            "{out}"
        );
        assert!(out.contains(&format!(" of {} bytes elided]", text.len())));
    }

    #[test]
    fn every_cut_is_on_a_char_boundary_and_within_max() {
        // One-, two-, three- and four-byte characters in every alignment.
        let alphabet = ["a", "é", "€", "𝄞"];
        let mut texts = Vec::new();
        for start in 0..alphabet.len() {
            let mut s = String::new();
            for i in 0..200 {
                s.push_str(alphabet[(start + i * 7 / 3) % alphabet.len()]);
            }
            texts.push(s);
        }
        texts.push("𝄞".repeat(100));
        texts.push("\u{0}\n\t\"\\".repeat(50));
        for text in &texts {
            let min = marker(text.len(), text.len()).len();
            for max in 0..=text.len() + 4 {
                // Slicing off a char boundary would have panicked already.
                let out = bounded(text, max);
                if text.len() <= max {
                    assert_eq!(out, text.as_str());
                    continue;
                }
                assert!(out.len() <= max.max(min), "max {max}: {} bytes", out.len());
                let (head, elided, total, tail) = parse(&out);
                assert_eq!(total, text.len());
                assert_eq!(head.len() + elided + tail.len(), total, "max {max}");
                assert!(text.starts_with(head) && text.ends_with(tail), "max {max}");
                // Nothing is given up that the room allowed to keep but a
                // character that did not fit.
                if max >= min {
                    assert!(max - out.len() < 8, "max {max}: {} bytes", out.len());
                }
            }
        }
    }

    #[test]
    fn a_max_too_small_for_the_marker_gives_the_marker() {
        let out = bounded("abcdefghijklmnopqrstuvwxyz", 5);
        assert_eq!(out, "…[26 of 26 bytes elided]…");
    }
}
