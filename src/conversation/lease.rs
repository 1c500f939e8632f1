//! A summarizer that first takes the conversation's summarization lease, so that of
//! several processes sharing one store only one summarizes a conversation at a time; the
//! others defer their fold ([`SummarizerError::Deferred`]) and go on without waiting.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::session::{Lease, LeaseStore, SessionKey};
use crate::summarizer::{Summarizer, SummarizerError, SummaryInput};

/// Wraps a summarizer for one conversation; the lease, once taken, is held until
/// [`Leased::release`].
pub struct Leased<'a> {
    inner: &'a dyn Summarizer,
    store: &'a dyn LeaseStore,
    key: &'a SessionKey,
    ttl: Duration,
    lease: Mutex<Option<Lease>>,
    store_error: AtomicBool,
    held_elsewhere: AtomicBool,
}

impl<'a> Leased<'a> {
    /// `inner` under the lease of `key` in `store`, taken for `ttl` at the first call.
    pub fn new(
        inner: &'a dyn Summarizer,
        store: &'a dyn LeaseStore,
        key: &'a SessionKey,
        ttl: Duration,
    ) -> Self {
        Self {
            inner,
            store,
            key,
            ttl,
            lease: Mutex::new(None),
            store_error: AtomicBool::new(false),
            held_elsewhere: AtomicBool::new(false),
        }
    }

    /// True when taking the lease failed because the store did (the call went ahead).
    pub fn store_error(&self) -> bool {
        self.store_error.load(Ordering::Relaxed)
    }

    /// True when a call was deferred because another process held the lease: it is
    /// summarizing this conversation now.
    pub fn held_elsewhere(&self) -> bool {
        self.held_elsewhere.load(Ordering::Relaxed)
    }

    /// Gives the lease back, if it was taken.
    pub async fn release(self) {
        let lease = self.lease.lock().map(|mut l| l.take()).unwrap_or(None);
        if let Some(lease) = lease {
            if let Err(e) = self.store.release(self.key, lease).await {
                // It expires by itself.
                tracing::debug!(error = %e, "summarization lease not released");
            }
        }
    }

    fn holds(&self) -> bool {
        self.lease.lock().map(|l| l.is_some()).unwrap_or(false)
    }
}

#[async_trait]
impl Summarizer for Leased<'_> {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        self.inner.kind()
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<crate::summarizer::ModelPrompt> {
        self.inner.prompt(input)
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        if !self.holds() {
            match self.store.try_lease(self.key, self.ttl).await {
                Ok(Some(lease)) => {
                    if let Ok(mut held) = self.lease.lock() {
                        *held = Some(lease);
                    }
                }
                Ok(None) => {
                    self.held_elsewhere.store(true, Ordering::Relaxed);
                    return Err(SummarizerError::Deferred);
                }
                // Without the store nobody can coordinate: summarize, as one process would.
                Err(e) => {
                    tracing::debug!(error = %e, "summarization lease unavailable");
                    self.store_error.store(true, Ordering::Relaxed);
                }
            }
        }
        self.inner.summarize(input).await
    }
}
