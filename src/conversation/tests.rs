//! The conversation stage's transaction: fail open, store failures, shared stores,
//! background folds.

use async_trait::async_trait;
use serde_json::json;

use super::*;
use crate::config::CompactionConfig;
use crate::session::{
    LearnedStore, Lease, LeaseStore, Loaded, MemoryStore, RecordStore, Saved, StateStore,
    StoreError,
};
use crate::summarizer::{SummarizerError, SummaryInput};

/// A conversation far over a 4,000-token window.
fn long_request() -> ChatRequest {
    let mut messages = vec![json!({"role": "user", "content": "Find the bug."})];
    for i in 0..40 {
        let id = format!("c{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "read", "arguments": "{}"}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": id, "content": "line of output ".repeat(60)}),
        );
    }
    messages.push(json!({"role": "user", "content": "Go on."}));
    let body = json!({"model": "gpt-4o", "messages": messages});
    ChatRequest::parse(body.to_string().as_bytes()).unwrap()
}

fn conversations(store: Arc<dyn SessionStore<SessionState>>) -> Conversations {
    let cfg = CompactionConfig {
        max_context_tokens: Some(4000),
        prefetch: false,
        ..CompactionConfig::default()
    };
    Conversations::new(Engine::new(cfg), store, CompactionMode::Enforce)
}

struct Panicking;

#[async_trait]
impl Summarizer for Panicking {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        crate::vocab::SummarizerKind::Llm
    }
    #[allow(clippy::panic)]
    async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
        panic!("summarizer bug")
    }
}

struct Broken;

#[async_trait]
impl StateStore<SessionState> for Broken {
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
    let decision = conversations(store)
        .compact_with(
            &SessionKey::from_digest("k"),
            &long_request(),
            Arc::new(Panicking),
            &inline(),
        )
        .await;
    assert_eq!(decision.outcome, crate::vocab::Outcome::FailedOpen);
    assert!(decision.rewritten.is_none(), "the original is forwarded");
    let error = decision.error.unwrap();
    assert!(error.contains("summarizer bug"), "{error}");
}

#[tokio::test]
async fn a_failing_store_still_compacts_and_is_reported() {
    let decision = conversations(Arc::new(Broken))
        .compact_with(
            &SessionKey::from_digest("k"),
            &long_request(),
            Arc::new(crate::summarizer::ExtractiveSummarizer),
            &Options::default(),
        )
        .await;
    assert_eq!(decision.outcome, crate::vocab::Outcome::Compacted);
    assert!(decision.store_error);
    assert!(decision.rewritten.is_some());
}

impl LeaseStore for Broken {}

impl LearnedStore for Broken {}

impl RecordStore for Broken {}

impl crate::session::ChainStore for Broken {}

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
impl StateStore<SessionState> for SharedMemory {
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

    fn active_sessions(&self) -> usize {
        0
    }
}

#[async_trait]
impl LeaseStore for SharedMemory {
    async fn try_lease(&self, key: &SessionKey, _: Duration) -> Result<Option<Lease>, StoreError> {
        let fresh = self.leases.lock().unwrap().insert(key.clone());
        Ok(fresh.then(|| Lease { token: "t".into() }))
    }

    async fn release(&self, key: &SessionKey, _: Lease) -> Result<(), StoreError> {
        self.leases.lock().unwrap().remove(key);
        Ok(())
    }

    async fn leased(&self, key: &SessionKey) -> Result<bool, StoreError> {
        Ok(self.leases.lock().unwrap().contains(key))
    }
}

/// Counts its calls; answers a fixed digest.
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicUsize);

impl LearnedStore for SharedMemory {}

impl RecordStore for SharedMemory {}

impl crate::session::ChainStore for SharedMemory {}

#[async_trait]
impl Summarizer for Counting {
    fn kind(&self) -> crate::vocab::SummarizerKind {
        crate::vocab::SummarizerKind::Llm
    }
    async fn summarize(&self, _: SummaryInput<'_>) -> Result<String, SummarizerError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok("## Milestones\n- I read the files.".into())
    }
}

fn conversations_waiting(
    store: Arc<dyn SessionStore<SessionState>>,
    wait: Duration,
) -> Conversations {
    let cfg = CompactionConfig {
        max_context_tokens: Some(4000),
        prefetch: false,
        ..CompactionConfig::default()
    };
    Conversations::from_setup(Setup {
        engine: Engine::new(cfg),
        store,
        mode: CompactionMode::Enforce,
        sharing: Sharing { digest_wait: wait, ..Sharing::default() },
        summarizers: Summarizers::Extractive,
        metrics: None,
        runtime: None,
    })
}

#[tokio::test]
async fn a_fold_another_process_is_summarizing_is_awaited_not_duplicated_nor_cut() {
    let store = Arc::new(SharedMemory::new());
    let compactor = conversations(store.clone());
    let key = SessionKey::from_digest("k");
    let summarizer = Arc::new(Counting::default());
    // Another replica holds the conversation's lease, and gives it back without having
    // stored a fold (its call failed).
    let other = store.try_lease(&key, Duration::from_secs(1)).await.unwrap().unwrap();
    let releasing = {
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            store.release(&key, other).await.unwrap();
        })
    };
    let decision =
        compactor.compact_with(&key, &long_request(), summarizer.clone(), &inline()).await;
    releasing.await.unwrap();
    assert!(decision.fold_wait >= Duration::from_millis(100), "{:?}", decision.fold_wait);
    let report = decision.report.unwrap();
    // As one process would: no cut now and rewrite later, but the fold, made once.
    assert!(!report.fold_deferred, "{report:?}");
    assert_eq!(summarizer.0.load(std::sync::atomic::Ordering::SeqCst), 1, "one call");
    let stored = store.store().load(&key).await.unwrap().unwrap();
    assert_eq!(stored.state.blocks.len(), 1);
    assert!(stored.state.token_cache.is_empty(), "token counts stay in the process");
    assert!(store.leases.lock().unwrap().is_empty(), "the lease was released");
}

#[tokio::test]
async fn the_wait_for_another_process_s_fold_is_bounded_by_the_digest_wait() {
    let store = Arc::new(SharedMemory::new());
    let compactor = conversations_waiting(store.clone(), Duration::from_millis(200));
    let key = SessionKey::from_digest("k");
    let summarizer = Arc::new(Counting::default());
    // The lease is never given back (its holder hangs).
    let _other = store.try_lease(&key, Duration::from_secs(60)).await.unwrap().unwrap();
    let started = std::time::Instant::now();
    let decision =
        compactor.compact_with(&key, &long_request(), summarizer.clone(), &inline()).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert!(decision.fold_wait >= Duration::from_millis(150), "{:?}", decision.fold_wait);
    // Past the wait, the extractive digest: no second model call for the range.
    assert_eq!(summarizer.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    let report = decision.report.unwrap();
    assert_eq!(report.summarizer.as_deref(), Some("extractive"), "{report:?}");
    assert!(report.tokens_after <= report.budget.budget, "fits: {report:?}");
}

#[tokio::test]
async fn a_conflicting_save_keeps_the_other_writers_folds() {
    let store = Arc::new(SharedMemory::new());
    let compactor = conversations(store.clone());
    let key = SessionKey::from_digest("k");
    let decision = compactor
        .compact_with(&key, &long_request(), Arc::new(Counting::default()), &inline())
        .await;
    assert_eq!(decision.outcome, crate::vocab::Outcome::Compacted);
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
async fn settled(compactor: &Conversations, key: &SessionKey) {
    while compactor.inner.background.contains_key(key) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_fold_due_while_the_request_fits_is_made_in_the_background_and_applied_later() {
    let store = Arc::new(SharedMemory::new());
    let compactor = conversations(store.clone());
    let key = SessionKey::from_digest("k");
    let summarizer = Arc::new(Counting::default());
    let calls = || summarizer.0.load(std::sync::atomic::Ordering::SeqCst);
    // Another replica holds the lease: the request is cut to fit, the fold postponed,
    // and the background fold defers to the other replica.
    let other = store.try_lease(&key, Duration::from_secs(1)).await.unwrap().unwrap();
    let decision = compactor
        .compact_with(&key, &long_request(), summarizer.clone(), &Options::default())
        .await;
    let report = decision.report.unwrap();
    assert!(report.fold_postponed, "{report:?}");
    assert!(report.tokens_after <= report.budget.fit_limit(), "fits: {report:?}");
    assert_eq!(decision.fold_wait, Duration::ZERO);
    settled(&compactor, &key).await;
    assert_eq!(calls(), 0, "no duplicate of the other replica's call");
    // Lease free: the next request postpones again and its fold is summarized behind it.
    store.release(&key, other).await.unwrap();
    let decision = compactor
        .compact_with(&key, &long_request(), summarizer.clone(), &Options::default())
        .await;
    assert!(decision.report.unwrap().fold_postponed);
    settled(&compactor, &key).await;
    assert_eq!(calls(), 1);
    let stored = store.store().load(&key).await.unwrap().unwrap();
    assert!(stored.state.pending.is_some(), "the digest landed as the pending fold");
    // The first request after it lands applies it, without another call or a wait.
    let decision = compactor
        .compact_with(&key, &long_request(), summarizer.clone(), &Options::default())
        .await;
    let report = decision.report.unwrap();
    assert!(report.used_prefetched && !report.fold_postponed, "{report:?}");
    assert_eq!(calls(), 1);
    assert_eq!(decision.fold_wait, Duration::ZERO);
    assert!(store.leases.lock().unwrap().is_empty(), "the lease was released");
}
