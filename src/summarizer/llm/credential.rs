//! The client's credential, bound per request: which header it came in and its value,
//! which never prints.

use std::fmt;

use http::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};

const API_KEY: HeaderName = HeaderName::from_static("api-key");
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// A client's credential as it sent it: the header (`authorization`, `api-key` or
/// Anthropic's `x-api-key`) and its value. The value never prints.
#[derive(Clone)]
pub struct Credential {
    name: HeaderName,
    value: HeaderValue,
}

impl Credential {
    /// The request's `Authorization` header, else its `api-key`, else its `x-api-key`.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        [AUTHORIZATION, API_KEY, X_API_KEY].into_iter().find_map(|name| {
            let value = headers.get(&name).filter(|v| !v.is_empty())?.clone();
            Some(Self::new(name, value))
        })
    }

    fn new(name: HeaderName, mut value: HeaderValue) -> Self {
        value.set_sensitive(true);
        Self { name, value }
    }

    /// An `Authorization` credential (e.g. `Bearer sk-…`).
    pub fn authorization(value: HeaderValue) -> Self {
        Self::new(AUTHORIZATION, value)
    }

    /// An `api-key` credential (Azure style).
    pub fn api_key(value: HeaderValue) -> Self {
        Self::new(API_KEY, value)
    }

    /// The header it is sent in.
    pub fn header_name(&self) -> &HeaderName {
        &self.name
    }

    /// Header name and value, for the one place that sends it.
    pub(super) fn header(&self) -> (&HeaderName, &HeaderValue) {
        (&self.name, &self.value)
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("header", &self.name)
            .field("value", &"********")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_prefers_authorization_and_never_prints() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("sk-ant-secret"));
        let c = Credential::from_headers(&h).unwrap();
        assert_eq!(c.header_name().as_str(), "x-api-key");
        h.insert("api-key", HeaderValue::from_static("azure-secret"));
        let c = Credential::from_headers(&h).unwrap();
        assert_eq!(c.header_name().as_str(), "api-key");
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer sk-secret"));
        let c = Credential::from_headers(&h).unwrap();
        assert_eq!(c.header_name(), AUTHORIZATION);
        let shown = format!("{c:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(Credential::from_headers(&HeaderMap::new()).is_none());
    }
}
