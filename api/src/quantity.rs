//! Kubernetes resource quantities (`128Mi`, `1G`, `500m`, `2`, `1e3`).
//!
//! Parsed exactly (no floating point) and rounded up to the unit asked for,
//! as Kubernetes does when it turns a quantity into bytes or millicores.

use std::fmt;

use crate::Quoted;

/// A quantity that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input} is not a valid quantity: {reason}")]
pub struct Error {
    /// The input, quoted and cut short.
    input: Quoted,
    reason: &'static str,
}

impl Error {
    fn new(input: &str, reason: &'static str) -> Self {
        Error {
            input: Quoted::new(input),
            reason,
        }
    }
}

/// A parsed non-negative quantity: `mantissa * 10^exp10 * 2^exp2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

impl Quantity {
    /// Parses a quantity such as `128Mi`, `0.5`, `500m` or `1e3`.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let err = |reason| Error::new(input, reason);
        let s = input.trim();
        if s.is_empty() {
            return Err(err("it is empty"));
        }
        if s.starts_with('-') {
            return Err(err("it is negative"));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(num_end);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if frac.contains('.') {
            return Err(err("it has more than one decimal point"));
        }
        if int.is_empty() && frac.is_empty() {
            return Err(err("it has no digits"));
        }
        if int.len() + frac.len() > 30 {
            return Err(err("it has too many digits"));
        }
        let mut mantissa: u128 = 0;
        for d in int.bytes().chain(frac.bytes()) {
            mantissa = mantissa * 10 + u128::from(d - b'0');
        }
        let frac_len = i32::try_from(frac.len()).map_err(|_| err("it has too many digits"))?;
        let (exp10, exp2) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            s if s.starts_with(['e', 'E']) => {
                let e: i32 = s[1..]
                    .parse()
                    .map_err(|_| err("its suffix is not a unit or exponent"))?;
                if !(-30..=30).contains(&e) {
                    return Err(err("its exponent is out of range"));
                }
                (e, 0)
            }
            _ => {
                return Err(err(
                    "its suffix is not one of n u m k M G T P E Ki Mi Gi Ti Pi Ei",
                ));
            }
        };
        Ok(Quantity {
            mantissa,
            exp10: exp10 - frac_len,
            exp2,
        })
    }

    /// The quantity times `scale`, rounded up; `None` if it does not fit in u64.
    fn scaled_ceil(self, scale: u128) -> Option<u64> {
        let mut n = self.mantissa.checked_mul(scale)?;
        n = n.checked_mul(1u128.checked_shl(self.exp2)?)?;
        let mut exp10 = self.exp10;
        while exp10 > 0 {
            n = n.checked_mul(10)?;
            exp10 -= 1;
        }
        let mut div: u128 = 1;
        while exp10 < 0 {
            div = div.checked_mul(10)?;
            exp10 += 1;
        }
        u64::try_from(n.div_ceil(div)).ok()
    }

    /// The quantity in bytes, rounded up (for memory).
    pub fn to_bytes(self) -> Option<u64> {
        self.scaled_ceil(1)
    }

    /// The quantity in thousandths, rounded up (for CPU millicores).
    pub fn to_milli(self) -> Option<u64> {
        self.scaled_ceil(1000)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}e{}*2^{}", self.mantissa, self.exp10, self.exp2)
    }
}

/// Parses a memory quantity into bytes.
pub fn parse_memory(input: &str) -> Result<u64, Error> {
    Quantity::parse(input)?
        .to_bytes()
        .ok_or_else(|| Error::new(input, "it is too large"))
}

/// A number of bytes as a Kubernetes memory quantity, in the largest unit
/// that holds it exactly, binary first (`33554432` is `32Mi`, `100000000` is
/// `100M`), as users write limits; `N bytes` when no unit does.
pub fn format_memory(bytes: u64) -> String {
    const BINARY: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    const DECIMAL: [(&str, u64); 6] = [
        ("E", 1_000_000_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("T", 1_000_000_000_000),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
        ("k", 1_000),
    ];
    if bytes == 0 {
        return "0".to_owned();
    }
    for (suffix, shift) in BINARY {
        if bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    for (suffix, unit) in DECIMAL {
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    format!("{bytes} bytes")
}

/// Parses a CPU quantity into millicores.
pub fn parse_cpu_millis(input: &str) -> Result<u64, Error> {
    Quantity::parse(input)?
        .to_milli()
        .ok_or_else(|| Error::new(input, "it is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory() {
        for (q, bytes) in [
            ("128Mi", 128 << 20),
            ("1G", 1_000_000_000),
            ("1Gi", 1 << 30),
            ("1.5Gi", 3 << 29),
            ("64Mi", 64 << 20),
            ("100", 100),
            ("1e3", 1000),
            ("1E3", 1000),
            ("0.5", 1),
            ("1k", 1000),
            ("+2Ki", 2048),
            ("500m", 1),
            ("0", 0),
        ] {
            assert_eq!(parse_memory(q).unwrap(), bytes, "{q}");
        }
    }

    #[test]
    fn memory_is_written_in_the_units_users_write() {
        for (bytes, text) in [
            (32 << 20, "32Mi"),
            (1 << 30, "1Gi"),
            (3 << 29, "1536Mi"),
            (2048, "2Ki"),
            (100_000_000, "100M"),
            (1_000, "1k"),
            (1_500, "1500 bytes"),
            (0, "0"),
            (u64::MAX, "18446744073709551615 bytes"),
        ] {
            assert_eq!(format_memory(bytes), text, "{bytes}");
        }
        for q in ["32Mi", "1Gi", "100M", "2Ki", "64Mi", "1k"] {
            assert_eq!(format_memory(parse_memory(q).unwrap()), q);
        }
    }

    #[test]
    fn cpu() {
        for (q, millis) in [
            ("500m", 500),
            ("2", 2000),
            ("0.1", 100),
            ("100m", 100),
            ("1.5", 1500),
            ("250000u", 250),
            ("1n", 1),
        ] {
            assert_eq!(parse_cpu_millis(q).unwrap(), millis, "{q}");
        }
    }

    #[test]
    fn invalid() {
        for q in [
            "",
            "-1",
            "abc",
            "1Q",
            "1.2.3",
            ".",
            "Mi",
            "1e99",
            "1ee",
            "99999999999999999999999999999999",
        ] {
            assert!(parse_memory(q).is_err(), "{q}");
        }
        assert!(parse_memory("100Ei").is_err(), "overflow");
        let huge = format!("{}Gb", "1".repeat(1 << 20));
        let err = parse_memory(&huge).unwrap_err().to_string();
        assert!(err.len() <= crate::MAX_QUOTED + 64, "{} bytes", err.len());
        assert!(err.contains("bytes elided"), "{err}");
        assert!(
            parse_memory("12Gb")
                .unwrap_err()
                .to_string()
                .contains("\"12Gb\"")
        );
    }
}
