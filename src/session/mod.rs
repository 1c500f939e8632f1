//! Conversation state between requests: the store trait, the in-memory store, and the
//! per-session locks that keep concurrent requests of one conversation from doing the
//! same work twice.
//!
//! Stores are generic over the state they keep, so this module depends on nothing else
//! of the crate; keys are hashes, never raw session ids or credentials.

pub mod locks;
pub mod memory;

use async_trait::async_trait;

pub use locks::{SessionGuard, SessionLocks};
pub use memory::MemoryStore;

/// A conversation's key: a hex digest scoped by tenant (see `http::session_key`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(String);

impl SessionKey {
    /// Wraps an already hashed key.
    pub fn from_digest(hex: impl Into<String>) -> Self {
        Self(hex.into())
    }

    /// The key as text (safe to show: it is a hash).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A store failure; the proxy keeps serving without stored state and counts it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or answered with an error.
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    /// Stored state could not be decoded.
    #[error("stored session state is unreadable: {0}")]
    Corrupt(String),
}

/// Where conversation state lives between requests.
#[async_trait]
pub trait SessionStore<S>: Send + Sync {
    /// A short name for logs (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// The state of `key`, if any and not expired; refreshes its last-seen time.
    async fn load(&self, key: &SessionKey) -> Result<Option<S>, StoreError>;

    /// Stores the state of `key`.
    async fn save(&self, key: &SessionKey, state: S) -> Result<(), StoreError>;

    /// Conversations currently held (for the active-sessions gauge).
    fn active_sessions(&self) -> usize;

    /// Drops expired conversations now; returns how many. Stores whose backend expires
    /// keys by itself keep the default, which does nothing.
    fn sweep(&self) -> usize {
        0
    }
}
