//! Conversation state between requests: the store trait, the in-memory store, and the
//! per-session locks that keep concurrent requests of one conversation from doing the
//! same work twice.
//!
//! Stores are generic over the state they keep, so this module depends on nothing else
//! of the crate but its vocabulary ([`crate::vocab`]); keys are hashes, never raw
//! session ids or credentials.

pub mod locks;
pub mod memory;
pub mod observed;
pub mod record;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;

pub use locks::{SessionGuard, SessionLocks};
pub use memory::MemoryStore;
pub use observed::Observed;
pub use record::{Record, RecordUpdate, Summary};
pub use redis::{RedisOptions, RedisStore};

/// State a store that serializes (Redis) can keep: JSON with a schema version, so that
/// processes of two releases never misread each other's values.
pub trait StoredState: serde::Serialize + serde::de::DeserializeOwned + Default {
    /// Layout version of the serialized state; bump it on any change an older release
    /// could misread (a value of another version is ignored, never decoded).
    const SCHEMA_VERSION: u32;
}

/// A conversation's key: a hex digest scoped by tenant (see `http::session_key`).
/// Shared, not copied, when cloned: every request holds its conversation's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(std::sync::Arc<str>);

impl SessionKey {
    /// Wraps an already hashed key.
    pub fn from_digest(hex: impl Into<String>) -> Self {
        Self(hex.into().into())
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

/// A conversation's state as loaded, with the revision it was stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded<S> {
    /// The state.
    pub state: S,
    /// Revision of the stored value; pass it back to [`StateStore::save`].
    pub revision: u64,
}

/// What a conditional save did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The state was stored.
    Written,
    /// Someone else stored the conversation since the revision given: nothing was written.
    Conflict,
}

/// A conversation's summarization lease: while one holder has it, no other process
/// summarizes for that conversation. It expires by itself, so a holder that dies delays
/// nobody past the expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// A random token identifying the holder (releasing checks it).
    pub token: String,
}

/// Conversation state between requests, saved conditionally by revision.
#[async_trait]
pub trait StateStore<S>: Send + Sync {
    /// A short name for logs and metrics (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// True when other processes share the store: state may change between two requests
    /// of this process, and what can be recomputed (token counts) is kept locally.
    fn is_shared(&self) -> bool {
        false
    }

    /// The state of `key`, if any and not expired; refreshes its expiry.
    async fn load(&self, key: &SessionKey) -> Result<Option<Loaded<S>>, StoreError>;

    /// Stores the state of `key` if its stored revision is still `revision` (0: nothing
    /// was stored), so that concurrent writers never overwrite each other's work unseen.
    async fn save(&self, key: &SessionKey, state: S, revision: u64) -> Result<Saved, StoreError>;

    /// Conversations currently held (for the active-sessions gauge), when the store can
    /// tell cheaply; a shared store reports the ones this process has seen lately.
    fn active_sessions(&self) -> usize;

    /// Failovers of the backend this process has seen so far (a shared store's primary
    /// replaced); a store without failovers keeps the default, none.
    fn failovers_seen(&self) -> u64 {
        0
    }

    /// Drops expired conversations now; returns how many. Stores whose backend expires
    /// keys by itself keep the default, which does nothing.
    fn sweep(&self) -> usize {
        0
    }

    /// Forgets `key`: its state and its inspection record, so that its next request
    /// starts afresh. True when there was something to forget.
    async fn forget(&self, _key: &SessionKey) -> Result<bool, StoreError> {
        Ok(false)
    }
}

/// Summarization leases: while one process holds a conversation's lease, no other
/// summarizes for it. A store used by one process needs none: the defaults grant them.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes the summarization lease of `key` for `ttl` unless someone else holds it
    /// (`None`). A store used by one process only needs no lease: the default grants it.
    async fn try_lease(
        &self,
        _key: &SessionKey,
        _ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        Ok(Some(Lease { token: String::new() }))
    }

    /// Gives back a lease taken with [`LeaseStore::try_lease`] (if still held by it).
    async fn release(&self, _key: &SessionKey, _lease: Lease) -> Result<(), StoreError> {
        Ok(())
    }

    /// True while someone holds the summarization lease of `key`. A store used by one
    /// process only has no lease to hold: the default says none is.
    async fn leased(&self, _key: &SessionKey) -> Result<bool, StoreError> {
        Ok(false)
    }
}

/// What is learned from providers, shared between the processes of a store: context
/// windows stated by overflow errors, and the APIs an upstream does not serve (which
/// foldgate then serves itself). A store used by one process has none to share: the
/// defaults keep nothing.
#[async_trait]
pub trait LearnedStore: Send + Sync {
    /// Context windows learned from providers, by model key, that other processes
    /// shared through this store. A store used by one process has none to share.
    async fn load_windows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    /// Shares a learned context window with the other processes of this store.
    async fn save_window(&self, _model: &str, _tokens: u64) -> Result<(), StoreError> {
        Ok(())
    }

    /// The APIs other processes found an upstream does not serve, as
    /// `<api>|<upstream>` names.
    async fn load_unserved(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// Shares that an upstream does not serve an API (`<api>|<upstream>`).
    async fn save_unserved(&self, _name: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The inspection records of conversations (see [`self::record`]). The defaults keep
/// nothing.
#[async_trait]
pub trait RecordStore: Send + Sync {
    /// Adds what one request did to the inspection record of `key` (see [`self::record`]).
    /// Best effort and never waits: a store that writes elsewhere does it in the
    /// background, and a failure loses one entry, never a request. The default keeps
    /// nothing.
    fn record(&self, _key: &SessionKey, _update: RecordUpdate) {}

    /// The inspection records' summaries, most recently seen first, at most `max`;
    /// with `tenant`, only that tenant's.
    async fn records(
        &self,
        _tenant: Option<&str>,
        _max: usize,
    ) -> Result<Vec<(SessionKey, Summary)>, StoreError> {
        Ok(Vec::new())
    }

    /// The inspection record of `key`, if any.
    async fn record_of(&self, _key: &SessionKey) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }
}

/// The Responses chains foldgate forwarded: under a key scoped by the caller's credential
/// and naming one response, the conversation's items up to and including that response's
/// output (a JSON array text), so that a request naming it as `previous_response_id` can
/// be read whole. Only the last response of a chain is kept: saving one drops the one it
/// continued. Bounded like conversations (`session.ttl`, `session.max_sessions`). The
/// defaults keep nothing.
#[async_trait]
pub trait ChainStore: Send + Sync {
    /// The items stored under `key`, if any.
    async fn load_chain(&self, _key: &SessionKey) -> Result<Option<bytes::Bytes>, StoreError> {
        Ok(None)
    }

    /// Stores `items` under `key`, dropping `replaces` (the response it continued).
    async fn save_chain(
        &self,
        _key: &SessionKey,
        _items: bytes::Bytes,
        _replaces: Option<&SessionKey>,
    ) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Where conversation state lives between requests: a store of each concern (state,
/// leases, what is learned from providers, inspection records, Responses chains). Every
/// type with all five is one.
pub trait SessionStore<S>:
    StateStore<S> + LeaseStore + LearnedStore + RecordStore + ChainStore
{
}

impl<S, T> SessionStore<S> for T where
    T: StateStore<S> + LeaseStore + LearnedStore + RecordStore + ChainStore + ?Sized
{
}
