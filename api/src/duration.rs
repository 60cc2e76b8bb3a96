//! Durations as people write them in flags and files (`30s`, `500ms`,
//! `1m30s`, plain seconds) and as messages show them.

use std::time::Duration;

/// The longest duration a flag or a functions file may give: a year. Longer
/// ones are refused rather than added to a clock reading, where they would
/// overflow (`Instant + Duration` panics past the clock's range).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `30s`, `500ms`, `1m`, `1m30s`, `2h`, or plain seconds; at most
/// [`MAX_DURATION`].
pub fn parse(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 30s, 500ms, 1m)");
    let too_long = || {
        format!(
            "{:?} is longer than a duration may be ({}h)",
            crate::text::bounded(s, 64),
            MAX_DURATION.as_secs() / 3600
        )
    };
    if let Ok(secs) = s.parse::<u64>() {
        let d = Duration::from_secs(secs);
        return if d > MAX_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[u_end..];
        let part = Duration::try_from_secs_f64(n * unit).map_err(|_| too_long())?;
        total = total
            .checked_add(part)
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(too_long)?;
    }
    Ok(total)
}

/// `25s`, `1.5s`, `200ms`.
pub fn format(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "soon", "5x", "s", "-1s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_that_overflow_are_refused() {
        assert_eq!(parse("8760h").unwrap(), MAX_DURATION);
        for long in [
            "18446744073709550000s18446744073709550000s",
            "18446744073709551615",
            "1e300s",
            "8760h1ns",
            "31536001",
            "9999999999999999999999999h",
        ] {
            let err = parse(long).unwrap_err();
            assert!(
                err.contains("is longer than a duration may be (8760h)")
                    || err.contains("is not a duration"),
                "{long}: {err}"
            );
        }
        assert_eq!(
            parse("18446744073709550000s18446744073709550000s").unwrap_err(),
            "\"18446744073709550000s18446744073709550000s\" is longer than a duration may be (8760h)"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format(Duration::from_millis(1500)), "1.500s");
        assert_eq!(format(Duration::from_millis(200)), "200ms");
    }
}
