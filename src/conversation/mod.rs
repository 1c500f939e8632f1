//! The conversation stage: one request of one conversation. Takes the session's lock,
//! loads its state, runs the engine, saves, makes folds in the background (prefetched,
//! or postponed while the request fits) and bounds the wait of a request that does not
//! fit; compacts deeper, forced, after the provider reported an overflow; keeps what is
//! learned from providers ([`crate::learned`]). Never fails: any error inside compaction
//! forwards the original request (fail open) and says so.
//!
//! Knows sessions, the engine and the summarizers, not HTTP: the edge brings the session
//! key, the parsed neutral request and a [`Caller`] (who sent it, as digests need it).

mod background;
mod counts;
mod decision;
mod gate;
mod inspection;
mod lease;
mod quick;
mod summarizers;
mod transaction;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use self::counts::LocalCounts;
pub use self::decision::{Decision, Rewritten};
pub use self::inspection::{EdgeFacts, Inspection, PendingRecord};
pub use self::quick::{Measure, below, byte_bound};
pub use self::summarizers::Summarizers;
use self::transaction::log_store_error;
use crate::compaction::engine::Ahead;
pub use crate::compaction::steer::{PinError, Steer};
/// The engine's words the edge speaks in: the stage is the edge's only door to the
/// engine, and these are what passes through it (options of a request, what was done,
/// folds of the whole conversation, the state the inspector shows).
pub use crate::compaction::{
    Change, FoldBlock, FoldWhen, Options, Report, SessionState, WholeFold, tokens::Encoding,
};
use crate::compaction::{Engine, TokenRatio};
use crate::config::CompactionMode;
use crate::learned::{CompactionApi, Learned, unserved_name};
use crate::metrics::Metrics;
use crate::model::ChatRequest;
use crate::session::{SessionKey, SessionLocks, SessionStore, StoredState};
use crate::summarizer::llm::{ClientHeaders, Credential, SummaryApi};
use crate::summarizer::{ExtractiveSummarizer, Summarizer, SummarizerKind};
use crate::telemetry;

/// Version 1: fold blocks and the pending block as `compaction::SessionState` serializes
/// them (token counts are never stored). Bump on any change that a reader of the current
/// layout cannot read (a new field with a default it ignores is not one).
impl StoredState for SessionState {
    const SCHEMA_VERSION: u32 = 1;
}

/// Who sent a request, as far as the conversation needs to know: the edge reads it from
/// the request's headers and hands it over.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The client's credential, for digests asked with it (never stored or logged).
    pub credential: Option<Credential>,
    /// The API the model summarizer speaks with the credential; `None` when the
    /// credential must not be used for digests.
    pub summary_api: Option<SummaryApi>,
    /// The request headers a digest call in that API passes on.
    pub summary_headers: ClientHeaders,
}

/// What an overflow error told about a request that was just rejected.
#[derive(Debug, Clone, Copy)]
pub struct Overflow<'a> {
    /// The context window the error stated, if it did (see
    /// [`Conversations::learn_window`]).
    pub stated: Option<usize>,
    /// The report of the request as it was planned (and rejected), if the engine ran.
    pub planned: Option<&'a Report>,
    /// Provider tokens per engine token assumed for the model (see
    /// [`Conversations::token_ratio`]).
    pub token_ratio: Option<f64>,
    /// The instructions and pins the request was planned with.
    pub steer: &'a crate::compaction::steer::Steer,
}

/// How conversations are shared with other processes through the store, and how long a
/// request may wait for a digest.
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

/// What the conversation stage is built from.
pub struct Setup {
    /// The engine.
    pub engine: Engine,
    /// Where conversation state lives.
    pub store: Arc<dyn SessionStore<SessionState>>,
    /// `compaction.mode`.
    pub mode: CompactionMode,
    /// Sharing with other processes, and the digest wait.
    pub sharing: Sharing,
    /// Who writes digests.
    pub summarizers: Summarizers,
    /// Summarizer calls are timed and counted here, when given.
    pub metrics: Option<Arc<Metrics>>,
    /// Where compaction runs when it should not block the caller's thread (token
    /// counting and folding take milliseconds); `None` runs it on the calling task.
    pub runtime: Option<tokio::runtime::Handle>,
}

/// The conversations this process serves. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Conversations {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    store: Arc<dyn SessionStore<SessionState>>,
    locks: SessionLocks,
    mode: CompactionMode,
    /// Sessions with a background fold running; the receiver turns true when it ends.
    background: DashMap<SessionKey, watch::Receiver<bool>>,
    /// Every background fold's task, drained at shutdown.
    tasks: TaskTracker,
    /// Token counts kept here when the store is shared with other processes.
    counts: Option<LocalCounts>,
    /// How long a summarization lease lasts (a summarizer call and a save).
    lease_ttl: Duration,
    /// The longest a request that does not fit waits for a digest.
    digest_wait: Duration,
    /// Context windows and token ratios learned from providers.
    learned: Learned,
    summarizers: Summarizers,
    metrics: Option<Arc<Metrics>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl Conversations {
    /// Conversations over `engine` with state in `store`, extractive digests, on the
    /// calling task, nothing measured.
    pub fn new(
        engine: Engine,
        store: Arc<dyn SessionStore<SessionState>>,
        mode: CompactionMode,
    ) -> Self {
        Self::from_setup(Setup {
            engine,
            store,
            mode,
            sharing: Sharing::default(),
            summarizers: Summarizers::Extractive,
            metrics: None,
            runtime: None,
        })
    }

    /// Conversations as `setup` says.
    pub fn from_setup(setup: Setup) -> Self {
        let Setup { engine, store, mode, sharing, summarizers, metrics, runtime } = setup;
        let counts = store.is_shared().then(|| LocalCounts::new(sharing.ttl, sharing.max_sessions));
        let inner = Inner {
            engine,
            store,
            locks: SessionLocks::default(),
            mode,
            background: DashMap::new(),
            tasks: TaskTracker::new(),
            counts,
            lease_ttl: sharing.lease_ttl,
            digest_wait: sharing.digest_wait,
            learned: Learned::default(),
            summarizers,
            metrics,
            runtime,
        };
        Self { inner: Arc::new(inner) }
    }

    /// The inspection of this stage's conversations, keeping `history` requests each.
    pub fn inspection(&self, history: usize) -> Inspection {
        Inspection::new(self.inner.store.clone(), history)
    }

    /// The engine.
    fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The Responses chain stored under `key` (see [`crate::session::ChainStore`]); `None`
    /// when there is none or the store failed (the request then goes as received).
    pub async fn load_chain(&self, key: &SessionKey) -> Option<bytes::Bytes> {
        match self.inner.store.load_chain(key).await {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%error, "a Responses chain was not read");
                None
            }
        }
    }

    /// Stores a Responses chain's `items` under `key`, dropping `replaces`; a failure is
    /// logged (the next request naming it goes as received).
    pub async fn save_chain(
        &self,
        key: &SessionKey,
        items: bytes::Bytes,
        replaces: Option<&SessionKey>,
    ) {
        if let Err(error) = self.inner.store.save_chain(key, items, replaces).await {
            tracing::debug!(%error, "a Responses chain was not stored");
        }
    }

    /// The conversations in the store (as far as this replica knows).
    pub fn active_sessions(&self) -> usize {
        self.inner.store.active_sessions()
    }

    /// How many failovers of the store this replica has seen.
    pub fn failovers_seen(&self) -> u64 {
        self.inner.store.failovers_seen()
    }

    /// Drops expired conversations; how many were dropped.
    pub fn sweep(&self) -> usize {
        self.inner.store.sweep()
    }

    /// Compacts `request` of conversation `key` from `caller`, with the summarizer the
    /// caller may use, on the compaction runtime when there is one.
    pub async fn compact(
        &self,
        key: &SessionKey,
        request: &Arc<ChatRequest>,
        caller: &Caller,
        options: &Options,
    ) -> Decision {
        let model = request.model().unwrap_or_default();
        let summarizer = self.inner.summarizers.choose(caller, &model, self.inner.metrics.as_ref());
        let Some(runtime) = &self.inner.runtime else {
            // Boxed: the compaction's future is large, and every request's handler future
            // (moved whole when it is boxed and polled) would otherwise carry its size.
            return Box::pin(self.compact_with(key, request, summarizer, options)).await;
        };
        let (this, key, request, options) =
            (self.clone(), key.clone(), request.clone(), options.clone());
        let work = async move { this.compact_with(&key, &request, summarizer, &options).await };
        // The request's span (traces exported) goes along: the store operations and
        // summarizer calls of the compaction are its children. Without one, the future
        // is not moved into a wrapper (it is large).
        let span = telemetry::span::current();
        let task = if span.is_disabled() {
            runtime.spawn(work)
        } else {
            runtime.spawn(work.instrument(span))
        };
        task.await
            .unwrap_or_else(|e| Decision::failed_open(format!("compaction task ended: {e}"), false))
    }

    /// Compacts `request` of session `key` with `summarizer`, on the calling task.
    /// Holding the session's lock for the whole transaction means concurrent requests of
    /// one conversation never summarize one range twice. Past `prefetch_ratio` the next
    /// fold is summarized in the background.
    pub async fn compact_with(
        &self,
        key: &SessionKey,
        request: &ChatRequest,
        summarizer: Arc<dyn Summarizer>,
        options: &Options,
    ) -> Decision {
        let started = Instant::now();
        // An extractive digest takes milliseconds: made inline, never postponed.
        let model = summarizer.kind() == SummarizerKind::Llm;
        let options = Options { postpone_folds: model && !options.force, ..options.clone() };
        let deadline = started + self.inner.digest_wait;
        let inner = &self.inner;
        let busy = inner.background.contains_key(key);
        let mut decision =
            inner.transact(key, request, summarizer.as_ref(), &options, busy, deadline).await;
        if decision.blocked {
            // The request does not fit without the fold its conversation is summarizing
            // in the background: wait for it (within the deadline), then compact again,
            // applying it if it landed, else folding inline (extractive past the deadline).
            let waiting = Instant::now();
            inner.await_background(key, deadline).await;
            let waited = waiting.elapsed();
            let late = Instant::now() >= deadline;
            let fallback: &dyn Summarizer =
                if late { &ExtractiveSummarizer } else { summarizer.as_ref() };
            decision = inner.transact(key, request, fallback, &options, false, deadline).await;
            decision.fold_wait += waited;
        }
        if let Some(ahead) = decision.report.as_ref().and_then(|r| self.ahead(r, &options)) {
            self.spawn_background(key.clone(), request.clone(), summarizer, ahead, &options);
        }
        decision
    }

    /// The fold to make in the background after a request reported as `report`: the one
    /// it postponed; past the trigger, the fold the plan leaves for later (it keeps the
    /// prompt as forwarded and would fold next), so that the request that no longer fits
    /// finds it ready; and with `compaction.prefetch`, the next one once the prompt passed
    /// `prefetch_ratio` of the budget below the trigger.
    fn ahead(&self, report: &Report, options: &Options) -> Option<Ahead> {
        let cfg = self.engine().config();
        if report.fold_postponed {
            return Some(Ahead::Due);
        }
        let threshold = (report.budget.budget as f64 * cfg.prefetch_ratio) as usize;
        // Past the trigger, a prompt kept as forwarded (a rewrite would not pay yet) whose
        // next rewrite is a fold: that fold is made ahead, so that the request that no
        // longer fits finds it ready.
        let kept = report.plan.is_some_and(|p| {
            p.chosen == crate::compaction::PlanKind::Keep
                && p.runner_up == Some(crate::compaction::PlanKind::Fold)
        });
        let growing = cfg.prefetch
            && report.tokens_after > threshold
            && report.tokens_after <= report.budget.trigger;
        (cfg.enabled && (growing || kept) && report.blocks_new == 0 && !options.force)
            .then_some(Ahead::Prefetch { forwarded_tokens: report.tokens_after })
    }

    /// After the provider rejected `request` as too long (`overflow`): compacts deeper,
    /// forced, to half the usual target, within the window the error stated (else within
    /// the prompt size it rejected). Without a rewritten request in the decision, nothing
    /// more could be taken out.
    pub async fn retry(
        &self,
        key: &SessionKey,
        request: &Arc<ChatRequest>,
        caller: &Caller,
        overflow: Overflow<'_>,
    ) -> Decision {
        let mut options = Options::overflow_retry(self.engine().config());
        // Windows are in the provider's tokens; the rejected prompt was counted in the
        // engine's, so it is scaled back by the ratio it was planned with.
        let rejected =
            overflow.planned.map(|r| (r.tokens_after as f64 * r.budget.token_ratio) as usize);
        options.window_cap = overflow.stated.or(rejected).filter(|&n| n > 0);
        options.token_ratio = overflow.token_ratio;
        options.steer = overflow.steer.clone();
        self.compact(key, request, caller, &options).await
    }

    /// The context window learned for the key `model_key` makes (see
    /// [`crate::learned::model_key`]), made only when some window was learned.
    pub fn learned_window_by(&self, model_key: impl FnOnce() -> String) -> Option<usize> {
        self.inner.learned.windows.get_by(model_key)
    }

    /// Remembers the window a provider stated for `model_key` (and shares it through a
    /// shared store); true when it was not known (or was larger).
    pub async fn learn_window(&self, model_key: &str, tokens: usize) -> bool {
        let learned = self.inner.learned.windows.learn(model_key, tokens);
        if learned && self.inner.store.is_shared() {
            if let Err(e) = self.inner.store.save_window(model_key, tokens as u64).await {
                tracing::debug!(error = %e, "learned window not shared");
            }
        }
        learned
    }

    /// Reads the windows and unserved APIs other processes learned, when the store is
    /// shared.
    pub async fn refresh_windows(&self) {
        if !self.inner.store.is_shared() {
            return;
        }
        match self.inner.store.load_windows().await {
            Ok(windows) => {
                for (model_key, tokens) in windows {
                    let tokens = usize::try_from(tokens).unwrap_or(0);
                    self.inner.learned.windows.learn(&model_key, tokens);
                }
            }
            Err(e) => tracing::debug!(error = %e, "learned windows not read"),
        }
        match self.inner.store.load_unserved().await {
            Ok(names) => names.iter().for_each(|name| {
                self.inner.learned.unserved.learn(name);
            }),
            Err(e) => tracing::debug!(error = %e, "unserved APIs not read"),
        }
    }

    /// True when `upstream` was found not to serve `api` (here, or by a replica).
    pub fn unserved(&self, api: CompactionApi, upstream: &str) -> bool {
        self.inner.learned.unserved.contains(&unserved_name(api, upstream))
    }

    /// Remembers that `upstream` does not serve `api`, and shares it through a shared
    /// store.
    pub async fn learn_unserved(&self, api: CompactionApi, upstream: &str) {
        let name = unserved_name(api, upstream);
        if !self.inner.learned.unserved.learn(&name) || !self.inner.store.is_shared() {
            return;
        }
        tracing::info!(
            api = api.as_str(),
            upstream,
            "upstream does not serve the API: foldgate serves it"
        );
        if let Err(e) = self.inner.store.save_unserved(&name).await {
            tracing::debug!(error = %e, "unserved API not shared");
        }
    }

    /// Folds the whole of `request` into one digest for one of the providers' own
    /// compaction APIs, when it is as large as `when` says, with the summarizer `caller`
    /// may use, on the compaction runtime when there is one. `Ok(None)`: not folded
    /// (smaller, or nothing to fold).
    pub async fn fold_whole(
        &self,
        request: &Arc<ChatRequest>,
        caller: &Caller,
        options: &Options,
        when: FoldWhen,
    ) -> Result<Option<WholeFold>, String> {
        let model = request.model().unwrap_or_default();
        let summarizer = self.inner.summarizers.choose(caller, &model, self.inner.metrics.as_ref());
        let this = self.clone();
        let (request, options) = (request.clone(), options.clone());
        let work = async move {
            let engine = this.engine();
            engine
                .fold_whole(&request, summarizer.as_ref(), &options, when)
                .await
                .map_err(|e| e.to_string())
        };
        match &self.inner.runtime {
            Some(runtime) => {
                let span = telemetry::span::current();
                let task = if span.is_disabled() {
                    runtime.spawn(work)
                } else {
                    runtime.spawn(work.instrument(span))
                };
                task.await.map_err(|e| format!("fold task ended: {e}"))?
            }
            None => Box::pin(work).await,
        }
    }

    /// Provider tokens per engine token for a conversation of `model` that has no ratio
    /// of its own yet, once measured (see [`crate::compaction::Options::token_ratio`]);
    /// only for an API whose provider counts with an encoder the engine does not have.
    pub fn token_ratio(&self, model: &str) -> Option<f64> {
        self.inner.learned.calibration.ratio(model)
    }

    /// A forwarded prompt of conversation `key` (of `model`) that the engine counted as
    /// `tokens`, to compare with the usage the provider reports (`known`: the
    /// conversation's ratio as the request was planned with it).
    pub fn counted(
        &self,
        key: &SessionKey,
        model: &str,
        tokens: usize,
        known: Option<TokenRatio>,
    ) -> Counted {
        let conversations = self.clone();
        Counted { model: model.to_owned(), tokens, key: key.clone(), conversations, known }
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
}

/// A forwarded prompt the engine counted exactly: with the usage the upstream reports
/// for it, a sample of how the provider's token counts compare with the engine's.
pub struct Counted {
    model: String,
    tokens: usize,
    key: SessionKey,
    conversations: Conversations,
    /// The conversation's ratio as loaded for the request.
    known: Option<TokenRatio>,
}

impl Counted {
    /// The provider counted `reported` prompt tokens: feeds the model's ratio, and the
    /// conversation's (see [`Conversations::calibrate`]) in a task of its own, as the
    /// store may be remote and this runs as the answer's body ends. A sample that agrees
    /// with the ratio the request was planned with is not worth a store round trip.
    pub fn observe(self, reported: u64) {
        let learned = &self.conversations.inner.learned;
        learned.calibration.observe(&self.model, self.tokens, reported);
        if self.known.is_some_and(|known| known.settled_by(self.tokens, reported)) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let calibrate =
            async move { self.conversations.calibrate(&self.key, self.tokens, reported).await };
        runtime.spawn(calibrate.instrument(telemetry::span::current()));
    }
}
