//! Folds summarized outside the request path: ahead of need (prefetch), or postponed by a
//! request that still fit. At most one per conversation at a time; every one is tracked,
//! so that shutdown waits for them (bounded) instead of dropping a digest half made.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt;
use tokio::sync::watch;
use tracing::Instrument;

use super::transaction::{panic_message, release};
use super::{Conversations, Inner};
use crate::compaction::engine::Ahead;
use crate::compaction::{FoldBlock, Options, SessionState};
use crate::model::ChatRequest;
use crate::session::{Loaded, Saved, SessionKey, StoreError};
use crate::summarizer::Summarizer;
use crate::telemetry::span;

impl Conversations {
    /// Summarizes a fold outside the request path (see
    /// [`crate::compaction::Engine::prefetch`]): ahead of need, or a fold a request
    /// postponed. At most one runs per session at a time, and the session's lock is not
    /// held during the model call: the conversation's next requests must not wait for a
    /// digest while they still fit. The task is tracked (see [`Conversations::drain`]).
    pub(super) fn spawn_background(
        &self,
        key: SessionKey,
        request: ChatRequest,
        summarizer: Arc<dyn Summarizer>,
        ahead: Ahead,
        options: &Options,
    ) {
        let (done, running) = watch::channel(false);
        match self.inner.background.entry(key.clone()) {
            dashmap::Entry::Occupied(_) => return,
            dashmap::Entry::Vacant(e) => e.insert(running),
        };
        let inner = self.inner.clone();
        let options = options.clone();
        // Traces exported: a trace of its own, linked to the request that started it.
        let span = span::background_fold(match ahead {
            Ahead::Due => "due",
            Ahead::Prefetch { .. } => "prefetch",
        });
        let work = async move {
            let _in_flight = InFlight { inner: inner.clone(), key: key.clone(), done };
            let fold = Fold { key: &key, request: &request, ahead, options: &options };
            inner.fold_in_background(fold, summarizer.as_ref()).await;
        };
        self.inner.tasks.spawn(work.instrument(span));
    }

    /// Waits until the background folds running now have ended, at most `timeout`, and
    /// starts no new one meanwhile (shutdown: a digest half made is not thrown away).
    pub async fn drain(&self, timeout: std::time::Duration) {
        let tasks = &self.inner.tasks;
        tasks.close();
        if tokio::time::timeout(timeout, tasks.wait()).await.is_err() {
            tracing::warn!(running = tasks.len(), "background folds still running at shutdown");
        }
    }
}

/// One fold to make in the background.
struct Fold<'a> {
    key: &'a SessionKey,
    request: &'a ChatRequest,
    ahead: Ahead,
    options: &'a Options,
}

impl Inner {
    /// Makes `fold` from a snapshot of the conversation's state (under the lease when
    /// the store is shared) and stores it as the conversation's pending block.
    async fn fold_in_background(&self, fold: Fold<'_>, summarizer: &dyn Summarizer) {
        let key = fold.key;
        let snapshot = {
            let _guard = self.locks.lock(key).await;
            self.store.load(key).await
        };
        let mut state = match snapshot {
            Ok(Some(Loaded { state, .. })) => state,
            Ok(None) => SessionState::default(),
            Err(_) => return,
        };
        if let Some(counts) = &self.counts {
            state.token_cache = counts.copy(key);
        }
        // Other processes must not summarize the same range meanwhile.
        let leased = self.leased(summarizer, key);
        let summarizer: &dyn Summarizer = leased.as_ref().map_or(summarizer, |l| l);
        let run =
            self.engine.prefetch(fold.request, &mut state, summarizer, fold.ahead, fold.options);
        let result = AssertUnwindSafe(run).catch_unwind().await;
        let Some(block) = state.pending.take() else {
            release(leased).await;
            return match result {
                Ok(Err(e)) => tracing::warn!(error = %e, "prefetch failed"),
                Err(panic) => {
                    tracing::error!(error = %panic_message(panic.as_ref()), "background fold failed");
                }
                Ok(Ok(_)) => {}
            };
        };
        let stored = self.store_pending(key, block).await;
        release(leased).await;
        match stored {
            Ok(Saved::Conflict) => {}
            Ok(Saved::Written) => {
                let ahead = fold.ahead;
                tracing::debug!(session = key.as_str(), ?ahead, "fold summarized in the background")
            }
            Err(e) => tracing::warn!(error = %e, "session save after a background fold failed"),
        }
    }

    /// Stores `block` as the pending block of `key`, unless the conversation moved past
    /// where it starts meanwhile (a block from message 0 takes the place of the stored ones
    /// it absorbed, if it reaches past them); whether it still matches the messages is
    /// checked again when it is applied.
    async fn store_pending(&self, key: &SessionKey, block: FoldBlock) -> Result<Saved, StoreError> {
        let _guard = self.locks.lock(key).await;
        let continues = |latest: &SessionState| {
            let end = latest.blocks.last().map_or(0, |b| b.end);
            block.start == end || (block.start == 0 && block.end > end)
        };
        match self.store.load(key).await? {
            Some(Loaded { state: mut latest, revision }) if continues(&latest) => {
                latest.pending = Some(block);
                self.store.save(key, latest, revision).await
            }
            None if block.start == 0 => {
                let fresh = SessionState { pending: Some(block), ..SessionState::default() };
                self.store.save(key, fresh, 0).await
            }
            // The conversation moved past where the block starts meanwhile.
            _ => Ok(Saved::Conflict),
        }
    }
}

/// Marks a session's background fold as running; dropping it (task end or abort) clears
/// the mark and wakes the requests waiting for it.
struct InFlight {
    inner: Arc<Inner>,
    key: SessionKey,
    done: watch::Sender<bool>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inner.background.remove(&self.key);
        let _ = self.done.send(true);
    }
}

/// How often a request waiting for another process's fold asks the store whether it
/// still summarizes.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_millis(20);

impl Inner {
    /// Waits until the fold of `key` being summarized ends, at most until `deadline`:
    /// this process's background fold when one runs, else the one another process
    /// summarizes under the conversation's lease (asked of the store every
    /// [`LEASE_POLL`]; a store that fails ends the wait).
    pub(super) async fn await_background(&self, key: &SessionKey, deadline: Instant) {
        let until = tokio::time::Instant::from_std(deadline);
        if let Some(mut running) = self.background.get(key).map(|r| r.clone()) {
            let _ = tokio::time::timeout_at(until, running.wait_for(|done| *done)).await;
            return;
        }
        if !self.store.is_shared() {
            return;
        }
        while matches!(self.store.leased(key).await, Ok(true)) && Instant::now() < deadline {
            tokio::time::sleep_until(until.min(tokio::time::Instant::now() + LEASE_POLL)).await;
        }
    }
}
