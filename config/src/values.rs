//! Durations (`15s`, `500ms`, `1m30s`) and byte sizes (`16MiB`, `64MB`, `1024`).

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer};

/// Serde helper: reads an explicit `null` (YAML `key:` with nothing after it,
/// JSON `null`) as the type's default, as Prometheus and proto3 JSON do. Use as
/// `#[serde(default, deserialize_with = "proflow_config::null_as_default")]`.
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// A duration written as Go and Prometheus write them: `300ms`, `1.5h`, `2h45m`, `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    pub const fn from_secs(s: u64) -> Self {
        Duration(std::time::Duration::from_secs(s))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }
    pub fn get(self) -> std::time::Duration {
        self.0
    }
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl FromStr for Duration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "invalid duration {s:?}: write a number with a unit, such as 500ms, 15s, 1m30s or 2h"
            )
        };
        let s = s.trim();
        if s == "0" {
            return Ok(Duration::default());
        }
        if s.is_empty() {
            return Err(bad());
        }
        let mut total = 0f64;
        let mut rest = s;
        while !rest.is_empty() {
            let num_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            if num_end == 0 {
                return Err(bad());
            }
            let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
            rest = &rest[num_end..];
            let unit_end = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit = &rest[..unit_end];
            rest = &rest[unit_end..];
            let nanos_per = match unit {
                "ns" => 1.0,
                "us" | "µs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                "d" => 86400e9,
                _ => return Err(bad()),
            };
            total += n * nanos_per;
        }
        if !total.is_finite() || total > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(Duration(std::time::Duration::from_nanos(total as u64)))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A size in bytes: a plain number, or a number with `B`, `KB`/`KiB`, `MB`/`MiB`,
/// `GB`/`GiB` (decimal and binary units as written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn mib(n: u64) -> Self {
        ByteSize(n << 20)
    }
    pub const fn kib(n: u64) -> Self {
        ByteSize(n << 10)
    }
    pub fn bytes(self) -> u64 {
        self.0
    }
    /// As usize, saturating on 32-bit targets.
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "invalid size {s:?}: write a number with an optional unit, such as 512KiB, 16MiB or 1GB"
            )
        };
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let mult: f64 = match unit.trim() {
            "" | "B" => 1.0,
            "KB" | "kB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "TB" => 1e12,
            "KiB" | "Ki" => 1024.0,
            "MiB" | "Mi" => 1024.0 * 1024.0,
            "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
            "TiB" | "Ti" => 1024f64.powi(4),
            _ => return Err(bad()),
        };
        let v = n * mult;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(v as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration as D;

    #[test]
    fn durations() {
        assert_eq!("15s".parse::<Duration>().unwrap().0, D::from_secs(15));
        assert_eq!("500ms".parse::<Duration>().unwrap().0, D::from_millis(500));
        assert_eq!("1m30s".parse::<Duration>().unwrap().0, D::from_secs(90));
        assert_eq!("1.5h".parse::<Duration>().unwrap().0, D::from_secs(5400));
        assert_eq!("0".parse::<Duration>().unwrap().0, D::ZERO);
        for bad in ["", "15", "s", "5x", "1..5s", "-1s"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!("16MiB".parse::<ByteSize>().unwrap().0, 16 << 20);
        assert_eq!("64MB".parse::<ByteSize>().unwrap().0, 64_000_000);
        assert_eq!("1024".parse::<ByteSize>().unwrap().0, 1024);
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().0, 1536);
        for bad in ["", "MiB", "12 parsecs", "-1MiB"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(s in ".{0,24}") {
            let _ = s.parse::<Duration>();
            let _ = s.parse::<ByteSize>();
        }
    }
}
