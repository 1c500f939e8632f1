//! `[admin]`: the session inspector (an API and a page on an address of its own, and
//! each tenant's view of its own sessions on the proxy port). Off by default.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::Secret;

/// `[admin]`: the session inspector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the inspection API and page; unset: the inspector is off (nothing is
    /// recorded, and `/foldgate/sessions` is not served).
    pub listen: Option<SocketAddr>,
    /// Bearer token of the inspection API; required when `listen` is not a loopback
    /// address. Never printed.
    pub token: Secret,
    /// Requests (and folds) kept per conversation for the inspector.
    pub history: usize,
    /// Serve each tenant its own sessions at `/foldgate/sessions` on the proxy port,
    /// authorized by its API key (when the inspector is on).
    pub tenant_view: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { listen: None, token: Secret::default(), history: 200, tenant_view: true }
    }
}

impl AdminConfig {
    /// True when the inspector is on.
    pub fn enabled(&self) -> bool {
        self.listen.is_some()
    }

    /// Checks what serde cannot.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if let Some(addr) = self.listen {
            if !addr.ip().is_loopback() && self.token.is_empty() {
                return Err((
                    "admin.token",
                    format!("required when admin.listen ({addr}) is not a loopback address"),
                ));
            }
        }
        if !(1..=100_000).contains(&self.history) {
            return Err(("admin.history", "must be between 1 and 100000".to_owned()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_required_off_loopback() {
        let open =
            AdminConfig { listen: Some("0.0.0.0:9000".parse().unwrap()), ..Default::default() };
        let (key, message) = open.validate().unwrap_err();
        assert_eq!(key, "admin.token");
        assert!(message.contains("0.0.0.0:9000"), "{message}");
        let local =
            AdminConfig { listen: Some("127.0.0.1:9000".parse().unwrap()), ..Default::default() };
        assert!(local.validate().is_ok());
        let guarded = AdminConfig { token: Secret::new("t"), ..open };
        assert!(guarded.validate().is_ok());
        assert!(
            format!("{guarded:?}").contains("********")
                && !format!("{guarded:?}").contains("\"t\"")
        );
    }
}
