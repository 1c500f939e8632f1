//! The words every stage shares: what happened to a request, how deep the engine went,
//! why a summarizer call failed, which store operation ran, which summarizer wrote a
//! digest, the sections of a digest, the providers' compaction APIs. One enum each, spelled once: headers, logs, metrics, the inspector and the
//! configuration all use these (each value's `as_str` is its label everywhere).
//!
//! A leaf: imports nothing of the crate.

use serde::{Deserialize, Serialize, Serializer};

/// A content coding of a request body that foldgate decodes (`Content-Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// `gzip` (or `x-gzip`): one gzip member or several.
    Gzip,
    /// `deflate`: zlib-wrapped as RFC 9110 says, or raw deflate as some clients send.
    Deflate,
    /// `br`: Brotli.
    Brotli,
    /// `zstd`: one Zstandard frame or several.
    Zstd,
}

impl ContentCoding {
    /// Every coding.
    pub const ALL: [Self; 4] = [Self::Gzip, Self::Deflate, Self::Brotli, Self::Zstd];

    /// The coding's `Content-Encoding` token: the metric label and the name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Deflate => "deflate",
            Self::Brotli => "br",
            Self::Zstd => "zstd",
        }
    }
}

/// The providers' own compaction APIs, which foldgate serves for upstreams without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionApi {
    /// `POST /v1/responses/compact`.
    ResponsesCompact,
    /// `context_management` compaction on `/v1/responses`.
    ResponsesContextManagement,
    /// `context_management.edits` on Anthropic's `/v1/messages`.
    MessagesContextManagement,
}

impl CompactionApi {
    /// Every API.
    pub const ALL: [Self; 3] =
        [Self::ResponsesCompact, Self::ResponsesContextManagement, Self::MessagesContextManagement];

    /// The API's name (a metric label, a part of the stored name).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ResponsesCompact => "responses_compact",
            Self::ResponsesContextManagement => "responses_context_management",
            Self::MessagesContextManagement => "messages_context_management",
        }
    }
}

/// What happened to a request of a compacted route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Forwarded as received (below the trigger, or the provider keeps the state).
    #[default]
    Passthrough,
    /// A compacted body was forwarded.
    Compacted,
    /// Observe mode: compacted, but forwarded as received.
    Observed,
    /// Compaction failed; forwarded as received.
    FailedOpen,
    /// A body foldgate does not understand, forwarded as is.
    NotChat,
    /// Compaction is off.
    Disabled,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Self; 6] = [
        Self::Passthrough,
        Self::Compacted,
        Self::Observed,
        Self::FailedOpen,
        Self::NotChat,
        Self::Disabled,
    ];

    /// The name: the value of `x-foldgate-outcome`, the log field and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::Compacted => "compacted",
            Self::Observed => "observed",
            Self::FailedOpen => "failed_open",
            Self::NotChat => "not_chat",
            Self::Disabled => "disabled",
        }
    }

    /// True when the engine compacted the request (whether or not it was forwarded so).
    pub fn engine_compacted(self) -> bool {
        matches!(self, Self::Compacted | Self::Observed)
    }

    /// Position in [`Outcome::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How deep the engine went for one request; ordered, so a deeper tier compares greater.
/// Serialized, displayed, labelled and compared as its number (0 to 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// 0: nothing new taken out; stored fold blocks, if any, reused.
    #[default]
    Reuse = 0,
    /// 1: tool output replaced by stubs (by the elide tier or the fallback cut), nothing
    /// dropped.
    Elide = 1,
    /// 2: old turns folded into a digest.
    Fold = 2,
    /// 3: old digests and turns batched under the goal.
    GoalBatch = 3,
    /// 4: messages forwarded in no form (the fallback cut dropped them).
    Fallback = 4,
}

impl Tier {
    /// Every tier, shallowest first.
    pub const ALL: [Self; 5] =
        [Self::Reuse, Self::Elide, Self::Fold, Self::GoalBatch, Self::Fallback];

    /// The tier's number, as headers, logs and reports show it.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The number as text (the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reuse => "0",
            Self::Elide => "1",
            Self::Fold => "2",
            Self::GoalBatch => "3",
            Self::Fallback => "4",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl PartialEq<u8> for Tier {
    fn eq(&self, number: &u8) -> bool {
        self.number() == *number
    }
}

impl Serialize for Tier {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.number())
    }
}

/// What compaction did to some of a request's messages, as reports and records name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Content replaced by a stub that says what was there (tier 1).
    Elided,
    /// Replaced by a digest (tier 2, or 3 for a goal history).
    Folded,
    /// Not forwarded in any form (tier 4).
    Dropped,
}

/// Why compaction made a request's prompt differ from the conversation as last
/// forwarded (a prefix rewrite: the provider writes it to its cache again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RewriteReason {
    /// A new fold (a digest made now or written ahead).
    Fold,
    /// Old turns and digests batched into a goal history.
    GoalBatch,
    /// Tool output stubbed, nothing dropped.
    Stub,
    /// Messages dropped to fit.
    Cut,
    /// A retry after the provider reported an overflow.
    Overflow,
    /// The stored folds or cut no longer matched the history the client sent.
    History,
}

impl RewriteReason {
    /// Every reason, in a fixed order (for metric registration).
    pub const ALL: [Self; 6] =
        [Self::Fold, Self::GoalBatch, Self::Stub, Self::Cut, Self::Overflow, Self::History];

    /// The label: `fold`, `goal_batch`, `stub`, `cut`, `overflow`, `history`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fold => "fold",
            Self::GoalBatch => "goal_batch",
            Self::Stub => "stub",
            Self::Cut => "cut",
            Self::Overflow => "overflow",
            Self::History => "history",
        }
    }
}

/// Where one piece of compaction instructions came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstructionSource {
    /// `summarizer.instructions`: the operator's, for every conversation.
    Config,
    /// A "Compact instructions" section of the conversation itself.
    Conversation,
    /// The `x-foldgate-compact-instructions` request header.
    Header,
    /// A compaction API's own `instructions` (Responses compact, Anthropic compaction).
    Request,
}

impl InstructionSource {
    /// Every source, in merge order (for metric registration).
    pub const ALL: [Self; 4] = [Self::Config, Self::Conversation, Self::Header, Self::Request];

    /// The label: `config`, `conversation`, `header`, `request`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Conversation => "conversation",
            Self::Header => "header",
            Self::Request => "request",
        }
    }
}

/// Why a summarizer call failed: a small closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The call (including the wait for a concurrency permit) exceeded its timeout.
    Timeout,
    /// The model endpoint answered with a non-2xx status.
    Status,
    /// Connect, TLS or I/O error.
    Transport,
    /// A 2xx answer without usable digest text.
    InvalidResponse,
    /// The circuit breaker is open; no call was made.
    CircuitOpen,
    /// Any other failure (a summarizer that gives no reason).
    Other,
}

impl FailureReason {
    /// Every reason, in a fixed order (for counters and metric registration).
    pub const ALL: [Self; 6] = [
        Self::Timeout,
        Self::Status,
        Self::Transport,
        Self::InvalidResponse,
        Self::CircuitOpen,
        Self::Other,
    ];

    /// The label: `timeout`, `status`, `transport`, `invalid_response`, `circuit_open`,
    /// `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Status => "status",
            Self::Transport => "transport",
            Self::InvalidResponse => "invalid_response",
            Self::CircuitOpen => "circuit_open",
            Self::Other => "failed",
        }
    }

    /// Position in [`FailureReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which summarizer writes a digest (also the `summarizer.kind` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummarizerKind {
    /// A model call (falls back to extractive while it fails).
    Llm,
    /// Deterministic digests built without a model.
    Extractive,
}

impl SummarizerKind {
    /// Every kind.
    pub const ALL: [Self; 2] = [Self::Llm, Self::Extractive];

    /// The name: `llm`, `extractive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Llm => "llm",
            Self::Extractive => "extractive",
        }
    }
}

/// A session store operation (timed and counted per backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// Loading a conversation's state.
    Load,
    /// Saving it (conditionally, by revision).
    Save,
    /// Taking a summarization lease.
    Lease,
    /// Giving one back.
    Release,
}

impl StoreOp {
    /// Every operation.
    pub const ALL: [Self; 4] = [Self::Load, Self::Save, Self::Lease, Self::Release];

    /// The name: `load`, `save`, `lease`, `release`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::Save => "save",
            Self::Lease => "lease",
            Self::Release => "release",
        }
    }

    /// Position in [`StoreOp::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A section of a digest. Fold digests write [`Section::FOLD`] in that order, goal
/// histories [`Section::GOAL_BATCH`]; an empty section is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// What the user asked for that still applies.
    StandingFacts,
    /// What was completed.
    Milestones,
    /// Choices made, with their reasons.
    KeyDecisions,
    /// What was established.
    Findings,
    /// What was tried and dropped.
    Attempted,
    /// Where the work stands.
    CurrentState,
    /// Questions, blockers, next steps.
    OpenItems,
    /// A goal history: what the user wanted, and how it changed.
    GoalArc,
    /// A goal history: every instruction the user gave.
    HumanDirection,
    /// A goal history: what was completed.
    Achieved,
    /// A goal history: what was tried and dropped.
    DeadEnds,
    /// A goal history: what still applies.
    LastingConstraints,
    /// Exact strings, and the work trail.
    KeyArtifacts,
}

impl Section {
    /// The sections of a fold's digest, in order.
    pub const FOLD: [Self; 8] = [
        Self::StandingFacts,
        Self::Milestones,
        Self::KeyDecisions,
        Self::Findings,
        Self::Attempted,
        Self::CurrentState,
        Self::OpenItems,
        Self::KeyArtifacts,
    ];

    /// The sections of a goal history, in order.
    pub const GOAL_BATCH: [Self; 6] = [
        Self::GoalArc,
        Self::HumanDirection,
        Self::Achieved,
        Self::DeadEnds,
        Self::LastingConstraints,
        Self::KeyArtifacts,
    ];

    /// The section's heading line, as digests write it.
    pub const fn heading(self) -> &'static str {
        match self {
            Self::StandingFacts => "## Standing facts & constraints",
            Self::Milestones => "## Milestones",
            Self::KeyDecisions => "## Key decisions",
            Self::Findings => "## Findings",
            Self::Attempted => "## Attempted & abandoned",
            Self::CurrentState => "## Current state",
            Self::OpenItems => "## Open items",
            Self::GoalArc => "## Goal arc",
            Self::HumanDirection => "## Human direction",
            Self::Achieved => "## Achieved",
            Self::DeadEnds => "## Dead ends",
            Self::LastingConstraints => "## Lasting constraints",
            Self::KeyArtifacts => "## Key artifacts",
        }
    }

    /// The section's title (its heading without `## `).
    pub fn title(self) -> &'static str {
        self.heading().trim_start_matches("## ")
    }

    /// The section titled `title`, if any.
    pub fn from_title(title: &str) -> Option<Self> {
        let all = Self::FOLD.into_iter().chain(Self::GOAL_BATCH);
        all.into_iter().find(|s| s.title() == title)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_lists() {
        assert!(Outcome::ALL.iter().enumerate().all(|(i, o)| o.index() == i));
        assert!(FailureReason::ALL.iter().enumerate().all(|(i, r)| r.index() == i));
        assert!(StoreOp::ALL.iter().enumerate().all(|(i, o)| o.index() == i));
        assert!(Tier::ALL.iter().all(|t| t.as_str() == t.number().to_string()));
    }

    #[test]
    fn sections_are_found_by_their_titles() {
        for s in Section::FOLD.into_iter().chain(Section::GOAL_BATCH) {
            assert_eq!(Section::from_title(s.title()), Some(s));
            assert_eq!(s.heading(), format!("## {}", s.title()));
        }
    }

    #[test]
    fn outcomes_serialize_as_their_names() {
        for o in Outcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), o.as_str());
        }
    }
}
