//! A byte count written as an integer or with a unit (`32MiB`, `500KB`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes; deserializes from `1048576`, `"1MiB"`, `"1MB"` or `"512 KiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses a size with an optional unit (B, KB, MB, GB, KiB, MiB, GiB).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a size (e.g. 32MiB)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1000,
            "mb" => 1000 * 1000,
            "gb" => 1000 * 1000 * 1000,
            "kib" | "k" => 1024,
            "mib" | "m" => 1024 * 1024,
            "gib" | "g" => 1024 * 1024 * 1024,
            other => {
                return Err(format!(
                    "unknown size unit `{other}` (use B, KB, MB, GB, KiB, MiB, GiB)"
                ));
            }
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1024 * 1024;
        const KIB: u64 = 1024;
        match self.0 {
            n if n != 0 && n % MIB == 0 => write!(f, "{}MiB", n / MIB),
            n if n != 0 && n % KIB == 0 => write!(f, "{}KiB", n / KIB),
            n => write!(f, "{n}B"),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ByteSize;

    #[test]
    fn parses_units() {
        assert_eq!(ByteSize::parse("32MiB").unwrap().0, 32 * 1024 * 1024);
        assert_eq!(ByteSize::parse("500 KB").unwrap().0, 500_000);
        assert_eq!(ByteSize::parse("7").unwrap().0, 7);
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("MiB").is_err());
    }

    #[test]
    fn displays_round_trip() {
        for n in [1u64, 1024, 32 * 1024 * 1024, 1000] {
            let b = ByteSize(n);
            assert_eq!(ByteSize::parse(&b.to_string()).unwrap(), b);
        }
    }
}
