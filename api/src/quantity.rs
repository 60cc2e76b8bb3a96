//! Kubernetes resource quantities (`128Mi`, `1G`, `500m`, `2`, `1e3`).
//!
//! Parsed exactly (no floating point) and rounded up to the unit asked for,
//! as Kubernetes does when it turns a quantity into bytes or millicores.
//!
//! Limits are checked as well: a memory limit of at least
//! [`MIN_MEMORY_BYTES`] ([`parse_memory_limit`]) and a cpu limit above 0
//! ([`parse_cpu_limit`]). On the command line, podman's spellings of a
//! memory size are taken too ([`parse_memory_limit_cli`]).

use std::borrow::Cow;
use std::fmt;

use crate::Quoted;

/// A quantity that is not a Kubernetes quantity, or not a limit fnrun can
/// enforce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input} {reason}")]
pub struct Error {
    /// The input, quoted and cut short.
    input: Quoted,
    reason: Cow<'static, str>,
}

impl Error {
    fn new(input: &str, reason: &'static str) -> Self {
        Error {
            input: Quoted::new(input),
            reason: Cow::Owned(format!("is not a valid quantity: {reason}")),
        }
    }

    fn limit(input: &str, reason: String) -> Self {
        Error {
            input: Quoted::new(input),
            reason: Cow::Owned(reason),
        }
    }
}

/// The smallest memory limit accepted. Measured on cgroup v1 (kernel 6.18)
/// with a static busybox in a fresh sandbox: `true` is OOM-killed with a
/// limit of 768 KiB and runs with 832 KiB; below about 400 KiB the limit
/// cannot even be written (EBUSY: the run's cgroup already holds more, init
/// included), which is the internal error `128m` used to give. Docker's
/// floor is 6 MB; fnrun's is 4 MiB, about five times what the smallest
/// process needs, so that a limit typed wrong (`128m` in Kubernetes'
/// notation) is caught and a small real one is not (README.md,
/// docs/crossplane.md).
pub const MIN_MEMORY_BYTES: u64 = 4 << 20;

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

/// Parses a memory limit (a Kubernetes quantity) into bytes, refusing one
/// below [`MIN_MEMORY_BYTES`], with what was probably meant: `128m` is 128
/// thousandths of a byte in Kubernetes' notation, where `128Mi` was meant.
pub fn parse_memory_limit(input: &str) -> Result<u64, Error> {
    let bytes = parse_memory(input)?;
    at_least_min_memory(input, bytes)?;
    Ok(bytes)
}

/// Parses a memory limit as given on the command line: a Kubernetes
/// quantity (`128Mi`, `1G`), or podman's and docker's spelling of one, in
/// binary units as podman reads them: a number and `b`, `k`, `m`, `g` or
/// `t`, or one of `KB MB GB TB` in either case (`128m` is 128 MiB, `1g` 1
/// GiB, `100k` 100 KiB, `512b` 512 bytes). `M`, `G` and `T` alone keep
/// their Kubernetes meaning (10^6, 10^9, 10^12). Refused below
/// [`MIN_MEMORY_BYTES`].
pub fn parse_memory_limit_cli(input: &str) -> Result<u64, Error> {
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let unit = match suffix {
        "b" | "B" => Some(""),
        "k" | "K" => Some("Ki"),
        "m" => Some("Mi"),
        "g" => Some("Gi"),
        "t" => Some("Ti"),
        _ => match suffix.to_ascii_lowercase().as_str() {
            "kb" => Some("Ki"),
            "mb" => Some("Mi"),
            "gb" => Some("Gi"),
            "tb" => Some("Ti"),
            _ => None,
        },
    };
    let bytes = match unit {
        Some(unit) if !number.is_empty() => {
            parse_memory(&format!("{number}{unit}")).map_err(|e| Error {
                input: Quoted::new(input),
                reason: e.reason,
            })?
        }
        _ => parse_memory(input)?,
    };
    at_least_min_memory(input, bytes)?;
    Ok(bytes)
}

fn at_least_min_memory(input: &str, bytes: u64) -> Result<(), Error> {
    if bytes >= MIN_MEMORY_BYTES {
        return Ok(());
    }
    let min = format_memory(MIN_MEMORY_BYTES);
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    // What was probably meant: the same number of MiB, if that is enough.
    let meant = parse_memory(&format!("{number}Mi"))
        .ok()
        .filter(|b| *b >= MIN_MEMORY_BYTES)
        .map(|_| format!(": did you mean {number}Mi?"))
        .unwrap_or_default();
    let what = if suffix == "m" {
        format!(
            "is {number} thousandths of a byte (in a Kubernetes quantity, m is milli), \
             below the smallest memory limit, {min}{meant}"
        )
    } else {
        format!(
            "is {}, below the smallest memory limit, {min} (a process needs more to start){}",
            match bytes {
                1 => "1 byte".to_owned(),
                b => format!("{b} bytes"),
            },
            if matches!(suffix, "" | "k" | "K" | "b" | "B") {
                meant
            } else {
                String::new()
            }
        )
    };
    Err(Error::limit(input, what))
}

/// Parses a cpu limit into millicores, refusing 0: a limit of no cpu at
/// all stops the function, where none was probably meant.
pub fn parse_cpu_limit(input: &str) -> Result<u64, Error> {
    let millis = parse_cpu_millis(input)?;
    if millis == 0 {
        return Err(Error::limit(
            input,
            "is no cpu at all: a cpu limit must be more than 0 (500m is half a core, 2 \
             two cores); leave it out for no limit"
                .to_owned(),
        ));
    }
    Ok(millis)
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
    fn memory_limits_have_a_floor_and_say_what_was_meant() {
        assert_eq!(parse_memory_limit("128Mi"), Ok(128 << 20));
        assert_eq!(parse_memory_limit("4Mi"), Ok(MIN_MEMORY_BYTES));
        let e = parse_memory_limit("128m").unwrap_err().to_string();
        assert_eq!(
            e,
            "\"128m\" is 128 thousandths of a byte (in a Kubernetes quantity, m is milli), \
             below the smallest memory limit, 4Mi: did you mean 128Mi?"
        );
        let e = parse_memory_limit("0").unwrap_err().to_string();
        assert!(
            e.starts_with("\"0\" is 0 bytes, below the smallest memory limit, 4Mi"),
            "{e}"
        );
        let e = parse_memory_limit("100").unwrap_err().to_string();
        assert!(e.ends_with("did you mean 100Mi?"), "{e}");
        let e = parse_memory_limit("1Ki").unwrap_err().to_string();
        assert!(e.contains("is 1024 bytes") && !e.contains("mean"), "{e}");
        assert!(
            parse_memory_limit("lots")
                .unwrap_err()
                .to_string()
                .contains("is not a valid quantity")
        );
    }

    #[test]
    fn the_command_line_takes_podmans_binary_units() {
        for (given, bytes) in [
            ("128m", 128 << 20),
            ("1g", 1 << 30),
            ("1G", 1_000_000_000),
            ("1Gi", 1 << 30),
            ("5120k", 5 << 20),
            ("5120K", 5 << 20),
            ("10MB", 10 << 20),
            ("10mb", 10 << 20),
            ("1.5g", 3 << 29),
            ("1t", 1 << 40),
            ("8388608b", 8 << 20),
            ("8388608", 8 << 20),
            ("100M", 100_000_000),
        ] {
            assert_eq!(parse_memory_limit_cli(given), Ok(bytes), "{given}");
        }
        for small in ["0", "1", "1Ki", "100k", "512b", "1m"] {
            let e = parse_memory_limit_cli(small).unwrap_err().to_string();
            assert!(
                e.contains("below the smallest memory limit, 4Mi"),
                "{small}: {e}"
            );
        }
        for bad in ["m", "1x", "-1g", "1.2.3m", ""] {
            let e = parse_memory_limit_cli(bad).unwrap_err().to_string();
            assert!(e.contains("is not a valid quantity"), "{bad}: {e}");
            assert!(e.starts_with(&format!("{:?}", bad)), "{bad}: {e}");
        }
    }

    #[test]
    fn cpu_limits_are_more_than_0() {
        assert_eq!(parse_cpu_limit("500m"), Ok(500));
        assert_eq!(parse_cpu_limit("1n"), Ok(1));
        for zero in ["0", "0m", "0.0"] {
            let e = parse_cpu_limit(zero).unwrap_err().to_string();
            assert!(e.contains("a cpu limit must be more than 0"), "{e}");
        }
        assert!(parse_cpu_limit("-1").is_err());
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
