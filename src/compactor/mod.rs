//! One chat request of a conversation through the engine: take the session's lock,
//! load its state, compact, save, and decide what to forward. Never fails: any error
//! inside compaction forwards the original request (fail open) and says so.
//!
//! Knows sessions and the engine, not HTTP: the caller brings the session key, the
//! parsed request and a summarizer bound to the client's credential.

mod counts;
mod gate;
mod lease;
pub mod windows;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use futures_util::FutureExt;
use tokio::sync::watch;

use self::counts::LocalCounts;
use self::gate::Gate;
use self::lease::Leased;
use self::windows::LearnedWindows;
use crate::compaction::engine::Ahead;
use crate::compaction::{Engine, Options, Outcome, Report, SessionState, TokenRatio};
use crate::config::CompactionMode;
use crate::model::ChatRequest;
use crate::session::{
    Loaded, Saved, SessionKey, SessionLocks, SessionStore, StoreError, StoredState,
};
use crate::summarizer::{ExtractiveSummarizer, Summarizer};

/// Version 1: fold blocks and the pending block as `compaction::SessionState` serializes
/// them (token counts are never stored). Bump on any change that a reader of the current
/// layout cannot read (a new field with a default it ignores is not one).
impl StoredState for SessionState {
    const SCHEMA_VERSION: u32 = 1;
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatOutcome {
    /// Below the trigger (or compaction disabled): the original bytes are forwarded.
    Passthrough,
    /// A compacted body is forwarded.
    Compacted,
    /// Shadow mode: compaction was computed but the original bytes are forwarded.
    Observed,
    /// Compaction failed; the original bytes are forwarded.
    FailedOpen,
}

impl ChatOutcome {
    /// The value of `x-foldgate-outcome` and of the log field (the metric label is
    /// `metrics::Outcome`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::Compacted => "compacted",
            Self::Observed => "observed",
            Self::FailedOpen => "failed_open",
        }
    }
}

/// The decision for one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// What happened.
    pub outcome: ChatOutcome,
    /// The compacted request to forward, when it is not the original.
    pub rewritten: Option<Rewritten>,
    /// The engine's report, when the engine ran to the end.
    pub report: Option<Report>,
    /// The session store failed; the request was handled without stored state.
    pub store_error: bool,
    /// Why compaction failed, for the log.
    pub error: Option<String>,
    /// How long the request waited for a digest (a summarizer call, or a background
    /// fold of its conversation to land); zero when it did not.
    pub fold_wait: Duration,
    /// The original message ranges `[start, end)` of the fold blocks this request made
    /// (for the session inspector).
    pub new_blocks: Vec<(usize, usize)>,
    /// The conversation's own token ratio as stored when the request was decided (see
    /// [`SessionState::token_ratio`]); `None` without one, or without a session load.
    pub token_ratio: Option<TokenRatio>,
    /// A fold was needed while a background fold of the conversation ran.
    blocked: bool,
}

impl Decision {
    /// The chat-completions body to forward: the rewritten one, or `original`.
    pub fn body(&self, original: &Bytes) -> Bytes {
        self.rewritten.as_ref().map_or_else(|| original.clone(), |r| r.body.clone())
    }
}

/// A compacted request: the neutral (chat-completions) body the engine wrote, and the
/// same request structured, from which other API shapes render their own body.
#[derive(Debug, Clone)]
pub struct Rewritten {
    /// The neutral request serialized.
    pub body: Bytes,
    /// The neutral request.
    pub request: Arc<ChatRequest>,
}

/// Runs the engine per conversation with stored state. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Compactor {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    store: Arc<dyn SessionStore<SessionState>>,
    locks: SessionLocks,
    mode: CompactionMode,
    /// Sessions with a background fold running; the receiver turns true when it ends.
    background: DashMap<SessionKey, watch::Receiver<bool>>,
    /// Token counts kept here when the store is shared with other processes.
    counts: Option<LocalCounts>,
    /// How long a summarization lease lasts (a summarizer call and a save).
    lease_ttl: Duration,
    /// The longest a request that does not fit waits for a digest.
    digest_wait: Duration,
    /// Context windows learned from providers' overflow errors.
    windows: LearnedWindows,
}

/// How a compactor shares a conversation with other processes through its store, and
/// how long a request may wait for a digest.
#[derive(Debug, Clone, Copy)]
pub struct Sharing {
    /// Local token counts are kept this long after use (`session.ttl`).
    pub ttl: Duration,
    /// At most this many conversations' local token counts (`session.max_sessions`).
    pub max_sessions: usize,
    /// A summarization lease expires after this long (at least `summarizer.timeout`).
    pub lease_ttl: Duration,
    /// A request that would not fit without its fold waits at most this long for the
    /// digest (`summarizer.timeout`), then takes the extractive one.
    pub digest_wait: Duration,
}

impl Default for Sharing {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3600),
            max_sessions: 10_000,
            lease_ttl: Duration::from_secs(60),
            digest_wait: Duration::from_secs(30),
        }
    }
}

impl Compactor {
    /// A compactor over `engine`, keeping state in `store`.
    pub fn new(
        engine: Engine,
        store: Arc<dyn SessionStore<SessionState>>,
        mode: CompactionMode,
    ) -> Self {
        Self::sharing(engine, store, mode, Sharing::default())
    }

    /// A compactor whose store may be shared with other processes, under `sharing`.
    pub fn sharing(
        engine: Engine,
        store: Arc<dyn SessionStore<SessionState>>,
        mode: CompactionMode,
        sharing: Sharing,
    ) -> Self {
        let locks = SessionLocks::default();
        let counts = store.is_shared().then(|| LocalCounts::new(sharing.ttl, sharing.max_sessions));
        let inner = Inner {
            engine,
            store,
            locks,
            mode,
            background: DashMap::new(),
            counts,
            lease_ttl: sharing.lease_ttl,
            digest_wait: sharing.digest_wait,
            windows: LearnedWindows::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The context window learned for `model_key` (see [`windows::model_key`]).
    pub fn learned_window(&self, model_key: &str) -> Option<usize> {
        self.inner.windows.get(model_key)
    }

    /// Remembers the window a provider stated for `model_key` (and shares it through a
    /// shared store); true when it was not known (or was larger).
    pub async fn learn_window(&self, model_key: &str, tokens: usize) -> bool {
        let learned = self.inner.windows.learn(model_key, tokens);
        if learned && self.inner.store.is_shared() {
            if let Err(e) = self.inner.store.save_window(model_key, tokens as u64).await {
                tracing::debug!(error = %e, "learned window not shared");
            }
        }
        learned
    }

    /// Reads the windows other processes learned, when the store is shared.
    pub async fn refresh_windows(&self) {
        if !self.inner.store.is_shared() {
            return;
        }
        match self.inner.store.load_windows().await {
            Ok(windows) => {
                for (model_key, tokens) in windows {
                    self.inner.windows.learn(&model_key, usize::try_from(tokens).unwrap_or(0));
                }
            }
            Err(e) => tracing::debug!(error = %e, "learned windows not read"),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Records in session `key` that a forwarded prompt the engine counted as `counted`
    /// tokens was `reported` tokens for the provider: the conversation's later requests
    /// are planned with the ratio (see [`SessionState::token_ratio`]). A sample too small
    /// to tell is not stored; a concurrent save wins over this one (the next sample
    /// comes with the next answer).
    pub async fn calibrate(&self, key: &SessionKey, counted: usize, reported: u64) {
        if TokenRatio::first(counted, reported).is_none() {
            return;
        }
        let inner = &self.inner;
        let _guard = inner.locks.lock(key).await;
        let (mut state, revision) = match inner.store.load(key).await {
            Ok(found) => found.map_or_else(Default::default, |l| (l.state, l.revision)),
            Err(e) => return log_store_error(&e, inner.store.name(), "calibration not stored"),
        };
        TokenRatio::observe_into(&mut state.token_ratio, counted, reported);
        if let Err(e) = inner.store.save(key, state, revision).await {
            log_store_error(&e, inner.store.name(), "calibration not stored");
        }
    }

    /// The session store.
    pub fn store(&self) -> &Arc<dyn SessionStore<SessionState>> {
        &self.inner.store
    }

    /// Compacts `request` of session `key`. Holding the session's lock for the whole
    /// step means concurrent requests of one conversation never summarize one range twice.
    /// Past `prefetch_ratio` the next fold is summarized in the background.
    pub async fn decide(
        &self,
        key: &SessionKey,
        request: &ChatRequest,
        summarizer: Arc<dyn Summarizer>,
        options: &Options,
    ) -> Decision {
        let started = Instant::now();
        let cfg = self.engine().config();
        // An extractive digest takes milliseconds: made inline, never postponed.
        let model = summarizer.name() != ExtractiveSummarizer.name();
        let options = Options { postpone_folds: model && !options.force, ..options.clone() };
        let deadline = started + self.inner.digest_wait;
        let summarizer_ref = summarizer.as_ref();
        let busy = self.inner.background.contains_key(key);
        let mut decision =
            self.inner.decide(key, request, summarizer_ref, &options, busy, deadline).await;
        if decision.blocked {
            // The request does not fit without the fold its conversation is summarizing
            // in the background: wait for it (within the deadline), then compact again,
            // applying it if it landed, else folding inline (extractive past the deadline).
            let waiting = Instant::now();
            self.inner.await_background(key, deadline).await;
            let waited = waiting.elapsed();
            let late = Instant::now() >= deadline;
            let fallback: &dyn Summarizer =
                if late { &ExtractiveSummarizer } else { summarizer_ref };
            decision = self.inner.decide(key, request, fallback, &options, false, deadline).await;
            decision.fold_wait += waited;
        }
        if let Some(report) = &decision.report {
            let threshold = (report.budget.budget as f64 * cfg.prefetch_ratio) as usize;
            let growing =
                report.tokens_after > threshold && report.tokens_after <= report.budget.trigger;
            if report.fold_postponed {
                let due = Ahead::Due;
                self.spawn_background(key.clone(), request.clone(), summarizer, due, &options);
            } else if cfg.enabled
                && cfg.prefetch
                && growing
                && report.blocks_new == 0
                && !options.force
            {
                let ahead = Ahead::Prefetch { forwarded_tokens: report.tokens_after };
                self.spawn_background(key.clone(), request.clone(), summarizer, ahead, &options);
            }
        }
        decision
    }

    /// Summarizes a fold outside the request path (see [`Engine::prefetch`]): ahead of
    /// need, or a fold a request postponed. At most one runs per session at a time, and
    /// the session's lock is not held during the model call: the conversation's next
    /// requests must not wait for a digest while they still fit.
    fn spawn_background(
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
        tokio::spawn(async move {
            let _in_flight = InFlight { inner: inner.clone(), key: key.clone(), done };
            let snapshot = {
                let _guard = inner.locks.lock(&key).await;
                inner.store.load(&key).await
            };
            let mut state = match snapshot {
                Ok(Some(Loaded { state, .. })) => state,
                Ok(None) => SessionState::default(),
                Err(_) => return,
            };
            if let Some(counts) = &inner.counts {
                state.token_cache = counts.copy(&key);
            }
            // Other processes must not summarize the same range meanwhile.
            let leased = inner.leased(summarizer.as_ref(), &key);
            let summarizer: &dyn Summarizer = leased.as_ref().map_or(summarizer.as_ref(), |l| l);
            let run = inner.engine.prefetch(&request, &mut state, summarizer, ahead, &options);
            let result = AssertUnwindSafe(run).catch_unwind().await;
            let Some(block) = state.pending.take() else {
                if let Some(leased) = leased {
                    leased.release().await;
                }
                return match result {
                    Ok(Err(e)) => tracing::warn!(error = %e, "prefetch failed"),
                    Err(panic) => {
                        tracing::error!(error = %panic_message(panic.as_ref()), "background fold failed");
                    }
                    Ok(Ok(_)) => {}
                };
            };
            // Keep the block unless the conversation moved past where it starts meanwhile
            // (a block from message 0 takes the place of the stored ones it absorbed, if it
            // reaches past them); whether it still matches the messages is checked again
            // when it is applied.
            let guard = inner.locks.lock(&key).await;
            let continues = |latest: &SessionState| {
                let end = latest.blocks.last().map_or(0, |b| b.end);
                block.start == end || (block.start == 0 && block.end > end)
            };
            let stored = match inner.store.load(&key).await {
                Ok(Some(Loaded { state: mut latest, revision })) if continues(&latest) => {
                    latest.pending = Some(block);
                    inner.store.save(&key, latest, revision).await
                }
                Ok(None) if block.start == 0 => {
                    let fresh = SessionState { pending: Some(block), ..SessionState::default() };
                    inner.store.save(&key, fresh, 0).await
                }
                // The conversation moved past where the block starts meanwhile.
                Ok(_) => Ok(Saved::Conflict),
                Err(e) => Err(e),
            };
            drop(guard);
            if let Some(leased) = leased {
                leased.release().await;
            }
            match stored {
                Ok(Saved::Conflict) => {}
                Ok(Saved::Written) => {
                    tracing::debug!(
                        session = key.as_str(),
                        ?ahead,
                        "fold summarized in the background"
                    )
                }
                Err(e) => tracing::warn!(error = %e, "session save after a background fold failed"),
            }
        });
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

impl Inner {
    /// `summarizer` under this conversation's lease when the store is shared and the
    /// summarizer is a model (the extractive digest is the same everywhere: no lease).
    fn leased<'a>(
        &'a self,
        summarizer: &'a dyn Summarizer,
        key: &'a SessionKey,
    ) -> Option<Leased<'a>> {
        (self.store.is_shared() && summarizer.name() != ExtractiveSummarizer.name())
            .then(|| Leased::new(summarizer, self.store.as_ref(), key, self.lease_ttl))
    }

    /// Waits until the background fold of `key` (if any) ends, at most until `deadline`.
    async fn await_background(&self, key: &SessionKey, deadline: Instant) {
        let Some(mut running) = self.background.get(key).map(|r| r.clone()) else { return };
        let until = tokio::time::Instant::from_std(deadline);
        let _ = tokio::time::timeout_at(until, running.wait_for(|done| *done)).await;
    }

    async fn decide(
        &self,
        key: &SessionKey,
        request: &ChatRequest,
        summarizer: &dyn Summarizer,
        options: &Options,
        busy: bool,
        deadline: Instant,
    ) -> Decision {
        let _guard = self.locks.lock(key).await;
        let mut store_error = false;
        let (mut state, revision) = match self.store.load(key).await {
            Ok(found) => found.map_or_else(Default::default, |l| (l.state, l.revision)),
            Err(e) => {
                log_store_error(
                    &e,
                    self.store.name(),
                    "session load failed; compacting without stored state",
                );
                store_error = true;
                (SessionState::default(), 0)
            }
        };
        if let Some(counts) = &self.counts {
            state.token_cache = counts.take(key);
        }
        let before = fingerprint(&state);
        let token_ratio = state.token_ratio;
        let leased = self.leased(summarizer, key);
        let leased_summarizer: &dyn Summarizer = leased.as_ref().map_or(summarizer, |l| l);
        let gate = Gate::new(leased_summarizer, busy, Some(deadline));
        let run = self.engine.compact_request(request, &mut state, &gate, options);
        let result = AssertUnwindSafe(run).catch_unwind().await;
        let (fold_wait, blocked) = (gate.waited(), gate.blocked());
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
            Outcome::Unchanged { report } => (ChatOutcome::Passthrough, None, report),
            Outcome::Compacted { body, request, report } => match self.mode {
                CompactionMode::Enforce => {
                    let rewritten =
                        Rewritten { body: Bytes::from(body), request: Arc::new(request) };
                    (ChatOutcome::Compacted, Some(rewritten), report)
                }
                CompactionMode::Observe => (ChatOutcome::Observed, None, report),
            },
        };
        Decision {
            outcome,
            rewritten,
            report: Some(report),
            store_error,
            error: None,
            fold_wait,
            new_blocks,
            token_ratio,
            blocked,
        }
    }
}

/// The ranges of the fold blocks `outcome`'s request made: the last ones of `state`.
fn made_blocks(state: &SessionState, outcome: &Outcome) -> Vec<(usize, usize)> {
    let (Outcome::Unchanged { report } | Outcome::Compacted { report, .. }) = outcome;
    let made = &state.blocks[state.blocks.len().saturating_sub(report.blocks_new)..];
    made.iter().map(|b| (b.start, b.end)).collect()
}

impl Inner {
    /// Saves `state` over `revision`. When another process saved meanwhile, its state
    /// wins unless ours only adds folds after its own: a fold once stored is never lost.
    async fn save(
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
fn log_store_error(e: &StoreError, store: &str, message: &str) {
    match e {
        StoreError::Unavailable(_) => tracing::debug!(error = %e, store, "{message}"),
        StoreError::Corrupt(_) => tracing::warn!(error = %e, store, "{message}"),
    }
}

async fn release(leased: Option<Leased<'_>>) {
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

impl Decision {
    /// Nothing to compact: forward the original bytes (`report` says what was measured).
    pub fn unchanged(report: Report) -> Self {
        Self {
            outcome: ChatOutcome::Passthrough,
            rewritten: None,
            report: Some(report),
            store_error: false,
            error: None,
            fold_wait: Duration::ZERO,
            new_blocks: Vec::new(),
            token_ratio: None,
            blocked: false,
        }
    }

    /// Forwarded as received without running the engine: a request that relies on
    /// conversation state the provider keeps.
    pub fn passthrough() -> Self {
        Self {
            outcome: ChatOutcome::Passthrough,
            rewritten: None,
            report: None,
            store_error: false,
            error: None,
            fold_wait: Duration::ZERO,
            new_blocks: Vec::new(),
            token_ratio: None,
            blocked: false,
        }
    }

    /// Compaction did not run to the end: forward the original bytes.
    pub fn failed_open(error: String, store_error: bool) -> Self {
        tracing::error!(%error, "compaction failed; forwarding the original request");
        Self {
            outcome: ChatOutcome::FailedOpen,
            rewritten: None,
            report: None,
            store_error,
            error: Some(error),
            fold_wait: Duration::ZERO,
            new_blocks: Vec::new(),
            token_ratio: None,
            blocked: false,
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("panic in compaction: {text}")
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::config::CompactionConfig;
    use crate::session::{Lease, MemoryStore};
    use crate::summarizer::{SummarizerError, SummaryInput};

    /// A conversation far over a 4,000-token window.
    fn long_request() -> ChatRequest {
        let mut messages = vec![json!({"role": "user", "content": "Find the bug."})];
        for i in 0..40 {
            let id = format!("c{i}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
                "type": "function", "function": {"name": "read", "arguments": "{}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": "line of output ".repeat(60)}));
        }
        messages.push(json!({"role": "user", "content": "Go on."}));
        let body = json!({"model": "gpt-4o", "messages": messages});
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    fn compactor(store: Arc<dyn SessionStore<SessionState>>) -> Compactor {
        let cfg = CompactionConfig {
            max_context_tokens: Some(4000),
            prefetch: false,
            ..CompactionConfig::default()
        };
        Compactor::new(Engine::new(cfg), store, CompactionMode::Enforce)
    }

    struct Panicking;

    #[async_trait]
    impl Summarizer for Panicking {
        fn name(&self) -> &'static str {
            "panicking"
        }
        #[allow(clippy::panic)]
        async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
            panic!("summarizer bug")
        }
    }

    struct Broken;

    #[async_trait]
    impl SessionStore<SessionState> for Broken {
        fn name(&self) -> &'static str {
            "broken"
        }
        async fn load(&self, _: &SessionKey) -> Result<Option<Loaded<SessionState>>, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        async fn save(&self, _: &SessionKey, _: SessionState, _: u64) -> Result<Saved, StoreError> {
            Err(StoreError::Unavailable("connection refused".into()))
        }
        fn active_sessions(&self) -> usize {
            0
        }
    }

    #[tokio::test]
    async fn a_panic_inside_compaction_fails_open() {
        let store = Arc::new(MemoryStore::new(std::time::Duration::from_secs(60), 10));
        let decision = compactor(store)
            .decide(&SessionKey::from_digest("k"), &long_request(), Arc::new(Panicking), &inline())
            .await;
        assert_eq!(decision.outcome, ChatOutcome::FailedOpen);
        assert!(decision.rewritten.is_none(), "the original is forwarded");
        let error = decision.error.unwrap();
        assert!(error.contains("summarizer bug"), "{error}");
    }

    #[tokio::test]
    async fn a_failing_store_still_compacts_and_is_reported() {
        let decision = compactor(Arc::new(Broken))
            .decide(
                &SessionKey::from_digest("k"),
                &long_request(),
                Arc::new(crate::summarizer::ExtractiveSummarizer),
                &Options::default(),
            )
            .await;
        assert_eq!(decision.outcome, ChatOutcome::Compacted);
        assert!(decision.store_error);
        assert!(decision.rewritten.is_some());
    }

    /// A memory store that says it is shared, with leases another holder can take.
    #[derive(Default)]
    struct SharedMemory {
        inner: Option<MemoryStore<SessionState>>,
        leases: std::sync::Mutex<std::collections::HashSet<SessionKey>>,
    }

    impl SharedMemory {
        fn new() -> Self {
            Self {
                inner: Some(MemoryStore::new(std::time::Duration::from_secs(60), 10)),
                ..Self::default()
            }
        }
        fn store(&self) -> &MemoryStore<SessionState> {
            self.inner.as_ref().unwrap()
        }
    }

    #[async_trait]
    impl SessionStore<SessionState> for SharedMemory {
        fn name(&self) -> &'static str {
            "shared-memory"
        }
        fn is_shared(&self) -> bool {
            true
        }
        async fn load(&self, key: &SessionKey) -> Result<Option<Loaded<SessionState>>, StoreError> {
            self.store().load(key).await
        }
        async fn save(
            &self,
            key: &SessionKey,
            state: SessionState,
            revision: u64,
        ) -> Result<Saved, StoreError> {
            self.store().save(key, state, revision).await
        }
        async fn try_lease(
            &self,
            key: &SessionKey,
            _: Duration,
        ) -> Result<Option<Lease>, StoreError> {
            let fresh = self.leases.lock().unwrap().insert(key.clone());
            Ok(fresh.then(|| Lease { token: "t".into() }))
        }
        async fn release(&self, key: &SessionKey, _: Lease) -> Result<(), StoreError> {
            self.leases.lock().unwrap().remove(key);
            Ok(())
        }
        fn active_sessions(&self) -> usize {
            0
        }
    }

    /// Counts its calls; answers a fixed digest.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl Summarizer for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok("## Milestones\n- I read the files.".into())
        }
    }

    #[tokio::test]
    async fn a_fold_another_process_is_summarizing_is_deferred_not_duplicated() {
        let store = Arc::new(SharedMemory::new());
        let compactor = compactor(store.clone());
        let key = SessionKey::from_digest("k");
        let summarizer = Arc::new(Counting::default());
        // Another replica holds the conversation's lease.
        let other = store.try_lease(&key, Duration::from_secs(1)).await.unwrap().unwrap();
        let decision = compactor.decide(&key, &long_request(), summarizer.clone(), &inline()).await;
        let report = decision.report.unwrap();
        assert!(report.fold_deferred, "{report:?}");
        assert_eq!(summarizer.0.load(std::sync::atomic::Ordering::SeqCst), 0, "no duplicate call");
        assert!(report.tokens_after <= report.budget.budget, "still fits: {report:?}");
        assert!(store.store().load(&key).await.unwrap().is_none_or(|l| l.state.blocks.is_empty()));
        // Once the lease is free, the next request folds, once.
        store.release(&key, other).await.unwrap();
        let decision = compactor.decide(&key, &long_request(), summarizer.clone(), &inline()).await;
        assert!(!decision.report.unwrap().fold_deferred);
        assert_eq!(summarizer.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        let stored = store.store().load(&key).await.unwrap().unwrap();
        assert_eq!(stored.state.blocks.len(), 1);
        assert!(stored.state.token_cache.is_empty(), "token counts stay in the process");
        assert!(store.leases.lock().unwrap().is_empty(), "the lease was released");
    }

    #[tokio::test]
    async fn a_conflicting_save_keeps_the_other_writers_folds() {
        let store = Arc::new(SharedMemory::new());
        let compactor = compactor(store.clone());
        let key = SessionKey::from_digest("k");
        let decision =
            compactor.decide(&key, &long_request(), Arc::new(Counting::default()), &inline()).await;
        assert_eq!(decision.outcome, ChatOutcome::Compacted);
        let stored = store.store().load(&key).await.unwrap().unwrap();
        // Another replica stored a state of its own meanwhile (one revision on).
        let theirs = SessionState { blocks: Vec::new(), ..stored.state.clone() };
        store.store().save(&key, theirs, stored.revision).await.unwrap();
        let inner = &compactor.inner;
        inner.save(&key, stored.state.clone(), stored.revision).await.unwrap();
        let now = store.store().load(&key).await.unwrap().unwrap();
        assert_eq!(now.state.blocks, stored.state.blocks, "ours only adds folds: it is kept");
        // A state that does not extend the stored one never replaces it.
        let other = SessionState::default();
        inner.save(&key, other, stored.revision).await.unwrap();
        let after = store.store().load(&key).await.unwrap().unwrap();
        assert_eq!(after.state.blocks, stored.state.blocks);
    }

    /// Options under which a due fold is made inline (as a request that does not fit).
    fn inline() -> Options {
        Options { force: true, ..Options::default() }
    }

    /// Waits until no background fold of `key` runs.
    async fn settled(compactor: &Compactor, key: &SessionKey) {
        while compactor.inner.background.contains_key(key) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_fold_due_while_the_request_fits_is_made_in_the_background_and_applied_later() {
        let store = Arc::new(SharedMemory::new());
        let compactor = compactor(store.clone());
        let key = SessionKey::from_digest("k");
        let summarizer = Arc::new(Counting::default());
        let calls = || summarizer.0.load(std::sync::atomic::Ordering::SeqCst);
        // Another replica holds the lease: the request is cut to fit, the fold postponed,
        // and the background fold defers to the other replica.
        let other = store.try_lease(&key, Duration::from_secs(1)).await.unwrap().unwrap();
        let decision =
            compactor.decide(&key, &long_request(), summarizer.clone(), &Options::default()).await;
        let report = decision.report.unwrap();
        assert!(report.fold_postponed, "{report:?}");
        assert!(report.tokens_after <= report.budget.fit_limit(), "fits: {report:?}");
        assert_eq!(decision.fold_wait, Duration::ZERO);
        settled(&compactor, &key).await;
        assert_eq!(calls(), 0, "no duplicate of the other replica's call");
        // Lease free: the next request postpones again and its fold is summarized behind it.
        store.release(&key, other).await.unwrap();
        let decision =
            compactor.decide(&key, &long_request(), summarizer.clone(), &Options::default()).await;
        assert!(decision.report.unwrap().fold_postponed);
        settled(&compactor, &key).await;
        assert_eq!(calls(), 1);
        let stored = store.store().load(&key).await.unwrap().unwrap();
        assert!(stored.state.pending.is_some(), "the digest landed as the pending fold");
        // The first request after it lands applies it, without another call or a wait.
        let decision =
            compactor.decide(&key, &long_request(), summarizer.clone(), &Options::default()).await;
        let report = decision.report.unwrap();
        assert!(report.used_prefetched && !report.fold_postponed, "{report:?}");
        assert_eq!(calls(), 1);
        assert_eq!(decision.fold_wait, Duration::ZERO);
        assert!(store.leases.lock().unwrap().is_empty(), "the lease was released");
    }
}
