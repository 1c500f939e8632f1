//! The session transaction of one request: take the conversation's lock, load its state,
//! run the engine, save what changed, under the summarization lease when the store is
//! shared. Never fails: an error or panic inside the engine forwards the original
//! request (fail open) and says so.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;

use super::gate::Gate;
use super::lease::Leased;
use super::{Decision, Inner, Rewritten};
use crate::compaction::{Forward, Options, SessionState};
use crate::config::CompactionMode;
use crate::model::ChatRequest;
use crate::session::{Saved, SessionKey, StoreError};
use crate::summarizer::Summarizer;
use crate::vocab::{Outcome, SummarizerKind};

impl Inner {
    /// `summarizer` under this conversation's lease when the store is shared and the
    /// summarizer is a model (the extractive digest is the same everywhere: no lease).
    pub(super) fn leased<'a>(
        &'a self,
        summarizer: &'a dyn Summarizer,
        key: &'a SessionKey,
    ) -> Option<Leased<'a>> {
        (self.store.is_shared() && summarizer.kind() == SummarizerKind::Llm)
            .then(|| Leased::new(summarizer, self.store.as_ref(), key, self.lease_ttl))
    }

    /// One pass of the transaction (`busy`: a background fold of the conversation is
    /// running; a fold it needs is then not made inline but reported as blocked, as it
    /// is when another process holds the conversation's summarization lease).
    pub(super) async fn transact(
        &self,
        key: &SessionKey,
        request: &ChatRequest,
        summarizer: &dyn Summarizer,
        options: &Options,
        busy: bool,
        deadline: Instant,
    ) -> Decision {
        let _guard = self.locks.lock(key).await;
        let (mut state, revision, mut store_error) = self.load(key).await;
        let before = fingerprint(&state);
        let token_ratio = state.token_ratio;
        let leased = self.leased(summarizer, key);
        let leased_summarizer: &dyn Summarizer = leased.as_ref().map_or(summarizer, |l| l);
        let gate = Gate::new(leased_summarizer, busy, Some(deadline));
        let run = self.engine.compact_request(request, &mut state, &gate, options);
        let result = AssertUnwindSafe(run).catch_unwind().await;
        // A fold needed while it is being summarized, here or by another process: the
        // request waits for it as one process would, instead of cutting its prefix now
        // and rewriting it again when the digest lands.
        let elsewhere = leased.as_ref().is_some_and(Leased::held_elsewhere);
        let (fold_wait, blocked) = (gate.waited(), gate.blocked() || elsewhere);
        if let Some(counts) = &self.counts {
            counts.put(key, std::mem::take(&mut state.token_cache));
        }
        store_error |= leased.as_ref().is_some_and(Leased::store_error);
        let outcome = match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                release(leased).await;
                return Decision::failed_open(e.to_string(), store_error);
            }
            Err(panic) => {
                release(leased).await;
                return Decision::failed_open(panic_message(panic.as_ref()), store_error);
            }
        };
        let new_blocks = made_blocks(&state, &outcome);
        // A shared store already refreshed the expiry on load: write only what changed.
        if !self.store.is_shared() || fingerprint(&state) != before {
            if let Err(e) = self.save(key, state, revision).await {
                log_store_error(&e, self.store.name(), "session save failed");
                store_error = true;
            }
        }
        release(leased).await;
        let (outcome, rewritten, report) = match outcome {
            Forward::Unchanged { report } => (Outcome::Passthrough, None, report),
            Forward::Compacted { body, request, report } => match self.mode {
                CompactionMode::Enforce => {
                    let rewritten =
                        Rewritten { body: Bytes::from(body), request: Arc::new(request) };
                    (Outcome::Compacted, Some(rewritten), report)
                }
                CompactionMode::Observe => (Outcome::Observed, None, report),
            },
        };
        Decision {
            outcome,
            rewritten,
            report: Some(Box::new(report)),
            store_error,
            error: None,
            fold_wait,
            new_blocks,
            token_ratio,
            blocked,
        }
    }
}

impl Inner {
    /// The state of `key` with its revision (and the local token counts, with a shared
    /// store); a fresh state, and `true`, when the store failed.
    async fn load(&self, key: &SessionKey) -> (SessionState, u64, bool) {
        let (mut state, revision, failed) = match self.store.load(key).await {
            Ok(found) => found.map_or_else(Default::default, |l| (l.state, l.revision, false)),
            Err(e) => {
                let message = "session load failed; compacting without stored state";
                log_store_error(&e, self.store.name(), message);
                (SessionState::default(), 0, true)
            }
        };
        if let Some(counts) = &self.counts {
            state.token_cache = counts.take(key);
        }
        (state, revision, failed)
    }
}

/// The ranges of the fold blocks `outcome`'s request made: the last ones of `state`.
fn made_blocks(state: &SessionState, outcome: &Forward) -> Vec<(usize, usize)> {
    let (Forward::Unchanged { report } | Forward::Compacted { report, .. }) = outcome;
    let made = &state.blocks[state.blocks.len().saturating_sub(report.blocks_new)..];
    made.iter().map(|b| (b.start, b.end)).collect()
}

impl Inner {
    /// Saves `state` over `revision`. When another process saved meanwhile, its state
    /// wins unless ours only adds folds after its own: a fold once stored is never lost.
    pub(super) async fn save(
        &self,
        key: &SessionKey,
        state: SessionState,
        revision: u64,
    ) -> Result<(), StoreError> {
        let retry = self.store.is_shared().then(|| state.clone());
        if self.store.save(key, state, revision).await? == Saved::Written {
            return Ok(());
        }
        let (Some(ours), Some(latest)) = (retry, self.store.load(key).await?) else {
            return Ok(());
        };
        let extends = ours.blocks.len() > latest.state.blocks.len()
            && ours.blocks.starts_with(&latest.state.blocks);
        if extends {
            let merged = SessionState {
                pending: ours.pending.or(latest.state.pending),
                token_ratio: latest.state.token_ratio.or(ours.token_ratio),
                ..ours
            };
            self.store.save(key, merged, latest.revision).await?;
        }
        Ok(())
    }
}

/// Logs a store failure: an unreachable store at debug level (the store logs the outage
/// once, and every request meets it), anything else as a warning.
pub(super) fn log_store_error(e: &StoreError, store: &str, message: &str) {
    match e {
        StoreError::Unavailable(_) => tracing::debug!(error = %e, store, "{message}"),
        StoreError::Corrupt(_) => tracing::warn!(error = %e, store, "{message}"),
    }
}

pub(super) async fn release(leased: Option<Leased<'_>>) {
    if let Some(leased) = leased {
        leased.release().await;
    }
}

/// What of a state a save would change: its blocks and its pending block (token counts
/// are not shared).
fn fingerprint(state: &SessionState) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for b in state.blocks.iter().chain(state.pending.as_ref()) {
        for n in [b.start as u64, b.end as u64, b.range_hash, b.messages.len() as u64] {
            h.update(&n.to_le_bytes());
        }
        if let Some(last) = b.messages.last() {
            h.update(last.get().as_bytes());
        }
    }
    h.update(&[u8::from(state.pending.is_some())]);
    for c in &state.cut {
        h.update(&(c.pos as u64).to_le_bytes());
        h.update(&[u8::from(c.messages.is_some())]);
    }
    h.digest()
}

pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("panic in compaction: {text}")
}
