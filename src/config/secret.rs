//! Strings that never print in full: API keys and tokens, and URLs with a password.

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

/// A URL that may carry a password (`redis://user:password@host:6379/0`); `Debug`,
/// `Display` and `Serialize` print it with the password masked.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The URL itself, password included, for the one place that connects with it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when no URL is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The comma-separated URLs this holds (seed URLs of a cluster, sentinels), trimmed.
    pub fn parts(&self) -> Vec<SecretUrl> {
        self.0.split(',').map(str::trim).filter(|p| !p.is_empty()).map(SecretUrl::new).collect()
    }

    /// The URL (each URL of a comma-separated list) with its password replaced by a mask;
    /// text that is not a URL is masked whole, since it cannot be told where a password
    /// would be.
    pub fn masked(&self) -> String {
        if self.0.contains(',') {
            let parts: Vec<String> = self.parts().iter().map(SecretUrl::masked).collect();
            return parts.join(",");
        }
        match url::Url::parse(&self.0) {
            Ok(mut url) => {
                if url.password().is_some() && url.set_password(Some(MASK)).is_err() {
                    return MASK.to_owned();
                }
                url.to_string()
            }
            Err(_) if self.0.is_empty() => String::new(),
            Err(_) => MASK.to_owned(),
        }
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(SecretUrl)
    }
}

#[cfg(test)]
mod tests {
    use super::{Secret, SecretUrl};

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

    #[test]
    fn urls_print_without_their_password() {
        let url = SecretUrl::new("rediss://app:hunter2@cache.internal:6380/2");
        for shown in [format!("{url:?}"), url.to_string(), url.masked()] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app:********@cache.internal:6380/2"), "{shown}");
        }
        assert_eq!(url.expose(), "rediss://app:hunter2@cache.internal:6380/2");
        assert_eq!(SecretUrl::new("redis://h:6379").masked(), "redis://h:6379");
        assert_eq!(SecretUrl::new("not a url with pw").masked(), "********");
        let seeds = SecretUrl::new("redis://:pw1@a:7000, redis://:pw2@b:7001");
        assert_eq!(seeds.masked(), "redis://:********@a:7000,redis://:********@b:7001");
        assert_eq!(seeds.parts().len(), 2);
    }
}
