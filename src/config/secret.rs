//! A string that never prints: API keys and tokens in configuration.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A secret value; `Debug`, `Display` and `Serialize` all print a mask.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when no value is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const MASK: &str = "********";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "" } else { MASK })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn never_prints() {
        let s = Secret::new("sk-live-123");
        assert!(!format!("{s:?} {s}").contains("sk-live"));
        assert!(
            !toml::to_string(&std::collections::BTreeMap::from([("k", s.clone())]))
                .unwrap()
                .contains("sk-live")
        );
        assert_eq!(s.expose(), "sk-live-123");
    }
}
