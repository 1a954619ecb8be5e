//! Human-friendly durations (`"30s"`, `"500ms"`, `"5m"`, or a number of seconds) and byte sizes
//! (`"256MB"`, `"1GB"`, or a number of bytes) for configuration values.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as `"30s"`, `"250ms"`, `"5m"`, `"1h"` or a bare number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seconds(pub Duration);

/// A size in bytes written as `"256MB"`, `"64kB"`, `"1GB"` or a bare number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub usize);

impl Seconds {
    /// Parses the textual form.
    pub fn parse(s: &str) -> Result<Seconds, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration {s:?} (use e.g. \"30s\", \"500ms\", \"5m\")"))?;
        let factor = match unit.trim() {
            "" | "s" | "sec" => 1.0,
            "ms" => 0.001,
            "us" => 0.000_001,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            other => return Err(format!("invalid duration unit {other:?} in {s:?}")),
        };
        // A value past what a Duration holds is refused, not a panic (a reload must not
        // take the process down).
        Duration::try_from_secs_f64(value * factor)
            .map(Seconds)
            .map_err(|_| format!("duration {s:?} is too large"))
    }
}

impl ByteSize {
    /// Parses the textual form.
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: usize = num
            .parse()
            .map_err(|_| format!("invalid size {s:?} (use e.g. \"256MB\", \"64kB\")"))?;
        let factor = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            other => return Err(format!("invalid size unit {other:?} in {s:?}")),
        };
        value
            .checked_mul(factor)
            .map(ByteSize)
            .ok_or_else(|| format!("size {s:?} is too large"))
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
            write!(f, "{}GB", b >> 30)
        } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
            write!(f, "{}MB", b >> 20)
        } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
            write!(f, "{}kB", b >> 10)
        } else {
            write!(f, "{b}")
        }
    }
}

struct UnitVisitor<T>(fn(&str) -> Result<T, String>, fn(u64) -> T, &'static str);

impl<T> Visitor<'_> for UnitVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.2)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.0)(v).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v)
            .map(self.1)
            .map_err(|_| E::custom("must not be negative"))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Ok((self.1)(v))
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor(
            Seconds::parse,
            |n| Seconds(Duration::from_secs(n)),
            "a duration such as \"30s\" or a number of seconds",
        ))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UnitVisitor(
            ByteSize::parse,
            |n| ByteSize(n as usize),
            "a size such as \"256MB\" or a number of bytes",
        ))
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enormous_duration_is_an_error() {
        let e = Seconds::parse("99999999999999999999999999d").unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(Seconds::parse("30s").unwrap().0, Duration::from_secs(30));
        assert_eq!(
            Seconds::parse("250ms").unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!(Seconds::parse("2m").unwrap().0, Duration::from_secs(120));
        assert_eq!(Seconds::parse("15").unwrap().0, Duration::from_secs(15));
        assert!(Seconds::parse("soon").is_err());
        assert!(Seconds::parse("3 weeks").is_err());
        assert_eq!(Seconds::parse("250ms").unwrap().to_string(), "250ms");
    }

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("256MB").unwrap().0, 256 << 20);
        assert_eq!(ByteSize::parse("64kB").unwrap().0, 64 << 10);
        assert_eq!(ByteSize::parse("100").unwrap().0, 100);
        assert!(ByteSize::parse("1TB").is_err());
        assert_eq!(ByteSize(1 << 30).to_string(), "1GB");
    }
}
