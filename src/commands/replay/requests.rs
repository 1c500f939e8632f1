//! Replaying one conversation request by request (one request per assistant reply,
//! holding the history before that reply), carrying fold blocks and token counts from
//! request to request, and accounting what each forwarded request kept and cost.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{Conversation, ReplayError, ReplayStats};
use crate::commands::cost::{Meter, Prompt};
use crate::commands::trail_check;
use crate::compaction::check::verify_pinned;
use crate::compaction::steer::Pins;
use crate::compaction::tokens::{Counter, Encoding};
use crate::compaction::{
    Budget, CompactionError, Engine, Forward, Options, SessionState, TokenCache,
};
use crate::model::{ChatRequest, Message, Role, is_user_words};
use crate::summarizer::{ModelPrompt, Summarizer, SummarizerError, SummaryInput};

/// Records what a model summarizer sends, for pricing.
struct Metered<'a> {
    inner: &'a dyn Summarizer,
    prompts: Mutex<Vec<ModelPrompt>>,
}

#[async_trait]
impl Summarizer for Metered<'_> {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        self.inner.kind()
    }

    async fn summarize(&self, input: SummaryInput<'_>) -> Result<String, SummarizerError> {
        if let Some(prompt) = self.inner.prompt(&input) {
            if let Ok(mut prompts) = self.prompts.lock() {
                prompts.push(prompt);
            }
        }
        self.inner.summarize(input).await
    }

    fn prompt(&self, input: &SummaryInput<'_>) -> Option<ModelPrompt> {
        self.inner.prompt(input)
    }
}

/// Replays one conversation through `engine`.
pub async fn replay_conversation(
    engine: &Engine,
    conv: &Conversation,
    summarizer: &dyn Summarizer,
    opts: &Options,
) -> Result<ReplayStats, ReplayError> {
    let mut replay = Replay::new(engine, conv);
    replay.pins = opts.steer.pins.clone();
    let engine_err = |source| ReplayError::Engine { id: conv.id.clone(), source };
    let metered = Metered { inner: summarizer, prompts: Mutex::new(Vec::new()) };
    for (i, m) in conv.messages.iter().enumerate() {
        if i > 0 {
            trail_check::add_paths_named(&conv.messages[i - 1], &mut replay.named);
        }
        if i == 0 || m.role() != Role::Assistant {
            continue;
        }
        let request = ChatRequest::from_parts(&conv.fields, conv.messages[..i].to_vec())
            .map_err(|e| engine_err(e.into()))?;
        let outcome =
            match engine.compact_request(&request, &mut replay.state, &metered, opts).await {
                Ok(outcome) => outcome,
                // Pinned messages that cannot fit: the request goes as sent (failed open).
                Err(CompactionError::PinsDoNotFit { .. }) => {
                    replay.stats.sent_whole += 1;
                    Forward::Unchanged { report: engine.unplanned(&request, opts) }
                }
                Err(e) => return Err(engine_err(e)),
            };
        replay.account(i, &request, &outcome, &metered);
    }
    Ok(replay.finish())
}

/// What the replay of one conversation carries from request to request.
struct Replay<'e> {
    /// The engine replayed through.
    engine: &'e Engine,
    /// The results so far.
    stats: ReplayStats,
    /// The session: fold blocks and token counts.
    state: SessionState,
    /// The provider's view of the forwarded requests (and summarizer calls), for pricing.
    sent: Meter,
    /// The same for every request sent whole.
    whole: Meter,
    /// Token counts of priced prompts.
    prices: TokenCache,
    /// File paths the agent named in the messages so far.
    named: BTreeSet<String>,
    /// Every forwarded body so far, each after its length.
    bodies: Sha256,
    /// The pin patterns the requests are planned with (for the guarantees' check).
    pins: Option<Arc<Pins>>,
}

impl<'e> Replay<'e> {
    /// A replay of `conv` that has sent nothing yet.
    fn new(engine: &'e Engine, conv: &Conversation) -> Self {
        Self {
            engine,
            stats: ReplayStats {
                id: conv.id.clone(),
                family: conv.family.clone(),
                conversations: 1,
                ..ReplayStats::default()
            },
            state: SessionState::default(),
            sent: Meter::default(),
            whole: Meter::default(),
            prices: TokenCache::default(),
            named: BTreeSet::new(),
            bodies: Sha256::new(),
            pins: None,
        }
    }

    /// Accounts request `i` (the history before message `i`) and the `outcome` the
    /// engine made of it, with the summarizer calls `metered` recorded meanwhile.
    fn account(
        &mut self,
        i: usize,
        request: &ChatRequest,
        outcome: &Forward,
        metered: &Metered<'_>,
    ) {
        let report = outcome.report();
        let budget: Budget = report.budget.clone();
        let before = if report.tokens_before_exact {
            report.tokens_before
        } else {
            self.engine.count_prompt(request, &budget, &mut self.state.token_cache)
        };
        let (forwarded, after) = self.forwarded(request, outcome, before);
        let encoding = budget.encoding;
        // Summarizer calls go out before the request they compact, after the previous one.
        let calls = std::mem::take(&mut *metered.prompts.lock().unwrap_or_else(|e| e.into_inner()));
        self.price(&calls, request, forwarded, encoding);
        self.count(outcome, before, after);
        self.check(i, request, forwarded, &budget);
        if let Forward::Compacted { request: fwd, .. } = outcome {
            self.check_trail(i, request, fwd);
        }
        self.check_user_words(i, request, forwarded, encoding);
    }

    /// The request forwarded for `request` and its prompt tokens (`before` when it went
    /// unchanged), its body added to the hash.
    fn forwarded<'r>(
        &mut self,
        request: &'r ChatRequest,
        outcome: &'r Forward,
        before: usize,
    ) -> (&'r ChatRequest, usize) {
        match outcome {
            Forward::Unchanged { .. } => {
                let body = request.to_vec();
                self.bodies.update((body.len() as u64).to_le_bytes());
                self.bodies.update(body);
                (request, before)
            }
            Forward::Compacted { request: fwd, report, body } => {
                self.bodies.update((body.len() as u64).to_le_bytes());
                self.bodies.update(body);
                (fwd, report.tokens_after)
            }
        }
    }

    /// Prices the summarizer `calls`, then `forwarded` as sent and `request` as sent whole.
    fn price(
        &mut self,
        calls: &[ModelPrompt],
        request: &ChatRequest,
        forwarded: &ChatRequest,
        encoding: Encoding,
    ) {
        let stats = &mut self.stats;
        for call in calls {
            let prompt =
                Prompt::of(&call.messages, call.tools.as_deref(), encoding, &mut self.prices);
            stats.summarizer.add(self.sent.side_call(&prompt));
            stats.summarizer_calls += 1;
        }
        let (charge, repeats) = self.sent.send(Prompt::of(
            forwarded.messages(),
            forwarded.tools_raw(),
            encoding,
            &mut self.prices,
        ));
        stats.forwarded.add(charge);
        stats.prefix_repeats += usize::from(repeats);
        let whole = Prompt::of(request.messages(), request.tools_raw(), encoding, &mut self.prices);
        stats.whole.add(self.whole.send(whole).0);
    }

    /// Counts one request: compacted or not, its prompt tokens `before` and `after`,
    /// the folds it made and its tier.
    fn count(&mut self, outcome: &Forward, before: usize, after: usize) {
        let report = outcome.report();
        let stats = &mut self.stats;
        stats.requests += 1;
        stats.compacted += usize::from(matches!(outcome, Forward::Compacted { .. }));
        stats.peak_before = stats.peak_before.max(before);
        stats.peak_after = stats.peak_after.max(after);
        stats.tokens_before += before as u64;
        stats.tokens_after += after as u64;
        stats.folds += report.blocks_new;
        *stats.tiers.entry(report.tier.number()).or_default() += 1;
    }

    /// Counts the guarantees `forwarded` breaks (request `i`), keeping the first.
    fn check(&mut self, i: usize, request: &ChatRequest, forwarded: &ChatRequest, budget: &Budget) {
        let config = self.engine.config();
        let stats = &mut self.stats;
        let (cache, pins) = (&mut self.state.token_cache, self.pins.as_deref());
        for v in verify_pinned(request, forwarded, config, budget, cache, pins) {
            *stats.violations.entry(v.check).or_default() += 1;
            if stats.first_violation.is_none() {
                stats.first_violation =
                    Some(format!("request {i}: check {}: {}", v.check, v.detail));
            }
        }
    }

    /// Counts the file paths named so far that the compacted request `fwd` (request `i`)
    /// still names, and the trail entries it holds that no action produced.
    fn check_trail(&mut self, i: usize, request: &ChatRequest, fwd: &ChatRequest) {
        let stats = &mut self.stats;
        let named = &self.named;
        let still = trail_check::with_suffixes(trail_check::paths_anywhere(fwd.messages()));
        stats.paths_named += named.len() as u64;
        let lost: Vec<&String> = named.iter().filter(|p| !still.contains(*p)).collect();
        stats.paths_kept += (named.len() - lost.len()) as u64;
        let lost = lost.first();
        if let (Some(lost), None) = (lost, &stats.first_path_lost) {
            stats.first_path_lost = Some(format!("request {i}: {lost}"));
        }
        let foreign = trail_check::foreign_entries(request.messages(), fwd.messages());
        stats.trail_foreign += foreign.len() as u64;
        if let (Some(first), None) = (foreign.first(), &stats.first_trail_foreign) {
            stats.first_trail_foreign = Some(format!("request {i}: {first}"));
        }
    }

    /// Counts the user's small messages of request `i` that `forwarded` does not hold
    /// verbatim, keeping the first.
    fn check_user_words(
        &mut self,
        i: usize,
        request: &ChatRequest,
        forwarded: &ChatRequest,
        encoding: Encoding,
    ) {
        let mut counter = Counter { encoding, cache: &mut self.state.token_cache };
        let small = self.engine.config().user_verbatim_max_tokens;
        let lost = user_words_lost(request.messages(), forwarded.messages(), small, &mut counter);
        let stats = &mut self.stats;
        if let Some(&first) = lost.first() {
            stats.user_words_lost += lost.len();
            stats.requests_losing_user_words += 1;
            if stats.first_user_words_lost.is_none() {
                stats.first_user_words_lost =
                    Some(format!("request {i}: user message {first} not forwarded verbatim"));
            }
        }
    }

    /// The results, with the hash of every forwarded body.
    fn finish(mut self) -> ReplayStats {
        self.stats.forwarded_sha256 = hex(&self.bodies.finalize());
        self.stats
    }
}

/// Lower-case hexadecimal of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The indices of the user's own small messages of `original` (at most `max_tokens`
/// tokens, neither digests nor text-mode tool output) that `forwarded` does not hold
/// verbatim, in order.
fn user_words_lost(
    original: &[Arc<Message>],
    forwarded: &[Arc<Message>],
    max_tokens: usize,
    counter: &mut Counter<'_>,
) -> Vec<usize> {
    let mut lost = Vec::new();
    let mut from = 0;
    for (i, m) in original.iter().enumerate() {
        if !is_user_words(original, i) || counter.message(m) > max_tokens {
            continue;
        }
        let same = |f: &Arc<Message>| f.hash() == m.hash() && f.raw() == m.raw();
        match forwarded[from..].iter().position(same) {
            Some(at) => from += at + 1,
            None => lost.push(i),
        }
    }
    lost
}
