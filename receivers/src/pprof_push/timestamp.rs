//! The `from` and `until` query values of `/ingest`: unix time in seconds,
//! milliseconds, microseconds or nanoseconds, told apart by the number of
//! digits as Pyroscope does (pyroscope-nodejs sends seconds, pyroscope-go
//! nanoseconds). Pyroscope matches exactly 13/16/19 digits and treats every
//! other length as seconds; we use ranges around those lengths, which agree on
//! every timestamp between 2001 and 2286 and refuse what would overflow instead
//! of wrapping to 1970.

/// Why a timestamp could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TimestampError {
    #[error(
        "{0:?} is not a unix timestamp: send whole seconds, milliseconds, microseconds or nanoseconds since 1970 (digits only)"
    )]
    NotANumber(String),
    #[error("{0:?} is too far in the future to be a timestamp")]
    OutOfRange(String),
}

/// Reads a unix timestamp into nanoseconds. `now` is accepted too (Pyroscope's
/// agents never send relative times, but `now` is harmless and handy by hand).
pub(crate) fn parse_unix_timestamp(text: &str, now_nanos: i64) -> Result<i64, TimestampError> {
    let s = text.trim();
    if s == "now" {
        return Ok(now_nanos);
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TimestampError::NotANumber(text.to_owned()));
    }
    // Leading zeros say nothing about the unit.
    let digits = s.trim_start_matches('0');
    let out_of_range = || TimestampError::OutOfRange(text.to_owned());
    if digits.len() > 19 {
        return Err(out_of_range());
    }
    let value: i64 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| out_of_range())?
    };
    let nanos_per_unit: i64 = match digits.len() {
        0..=11 => 1_000_000_000,
        12..=14 => 1_000_000,
        15..=17 => 1_000,
        _ => 1,
    };
    value.checked_mul(nanos_per_unit).ok_or_else(out_of_range)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 42;
    const T: i64 = 1_700_000_000;

    #[test]
    fn units_by_digit_count() {
        let ns = T * 1_000_000_000;
        assert_eq!(parse_unix_timestamp("1700000000", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp("1700000000000", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp("1700000000000000", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp("1700000000000000000", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp(" 1700000000 ", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp("0", NOW), Ok(0));
        assert_eq!(parse_unix_timestamp("000001700000000", NOW), Ok(ns));
        assert_eq!(parse_unix_timestamp("now", NOW), Ok(NOW));
    }

    #[test]
    fn refuses_what_is_not_a_timestamp() {
        for bad in ["", "abc", "-5", "1.5", "now-1h", "17e9", "+1700000000"] {
            assert!(
                matches!(
                    parse_unix_timestamp(bad, NOW),
                    Err(TimestampError::NotANumber(_))
                ),
                "{bad}"
            );
        }
        for huge in ["99999999999", "99999999999999999999", "9223372036854775808"] {
            assert!(
                matches!(
                    parse_unix_timestamp(huge, NOW),
                    Err(TimestampError::OutOfRange(_))
                ),
                "{huge}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = parse_unix_timestamp(&s, NOW);
        }

        #[test]
        fn every_unit_lands_on_the_same_instant(secs in 1_000_000_000i64..9_000_000_000i64) {
            let ns = secs * 1_000_000_000;
            for (text, want) in [
                (secs.to_string(), ns),
                ((secs * 1_000).to_string(), ns),
                ((secs * 1_000_000).to_string(), ns),
                (ns.to_string(), ns),
            ] {
                proptest::prop_assert_eq!(parse_unix_timestamp(&text, NOW), Ok(want));
            }
        }
    }
}
