//! A store whose every operation is timed and reported, so that the metrics see each
//! load, save and lease of whichever backend is configured; with traces exported, each
//! of them is a span (a child of the request or fold it serves).

use super::{ChainStore, LearnedStore, LeaseStore, RecordStore, StateStore};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::Instrument;

use crate::telemetry::span;
use crate::vocab::StoreOp;

use super::{
    Lease, Loaded, Record, RecordUpdate, Saved, SessionKey, SessionStore, StoreError, Summary,
};

/// Receives the duration of each operation and whether it failed.
pub type Observer = Box<dyn Fn(StoreOp, Duration, bool) + Send + Sync>;

/// Wraps a store and reports each of its operations to an observer.
pub struct Observed<S> {
    inner: Arc<dyn SessionStore<S>>,
    observer: Observer,
}

impl<S> Observed<S> {
    /// `inner`, reporting to `observer`.
    pub fn new(inner: Arc<dyn SessionStore<S>>, observer: Observer) -> Self {
        Self { inner, observer }
    }

    /// Runs `work`, the operation `op` of the store, and reports it.
    async fn observe<T>(
        &self,
        op: StoreOp,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = span::store(op, self.inner.name());
        let started = Instant::now();
        let result = work.instrument(span.clone()).await;
        (self.observer)(op, started.elapsed(), result.is_err());
        if let Err(e) = &result {
            // The kind only: a backend's message may name its address.
            span::failed(
                &span,
                match e {
                    StoreError::Unavailable(_) => "unavailable",
                    StoreError::Corrupt(_) => "corrupt",
                },
            );
        }
        result
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> StateStore<S> for Observed<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }

    async fn load(&self, key: &SessionKey) -> Result<Option<Loaded<S>>, StoreError> {
        self.observe(StoreOp::Load, self.inner.load(key)).await
    }

    async fn save(&self, key: &SessionKey, state: S, revision: u64) -> Result<Saved, StoreError> {
        self.observe(StoreOp::Save, self.inner.save(key, state, revision)).await
    }

    fn active_sessions(&self) -> usize {
        self.inner.active_sessions()
    }

    fn failovers_seen(&self) -> u64 {
        self.inner.failovers_seen()
    }

    fn sweep(&self) -> usize {
        self.inner.sweep()
    }

    async fn forget(&self, key: &SessionKey) -> Result<bool, StoreError> {
        self.inner.forget(key).await
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> LeaseStore for Observed<S> {
    async fn try_lease(
        &self,
        key: &SessionKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        self.observe(StoreOp::Lease, self.inner.try_lease(key, ttl)).await
    }

    async fn release(&self, key: &SessionKey, lease: Lease) -> Result<(), StoreError> {
        self.observe(StoreOp::Release, self.inner.release(key, lease)).await
    }

    async fn leased(&self, key: &SessionKey) -> Result<bool, StoreError> {
        self.observe(StoreOp::Lease, self.inner.leased(key)).await
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> LearnedStore for Observed<S> {
    async fn load_windows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.load_windows().await
    }

    async fn save_window(&self, model: &str, tokens: u64) -> Result<(), StoreError> {
        self.inner.save_window(model, tokens).await
    }

    async fn load_unserved(&self) -> Result<Vec<String>, StoreError> {
        self.inner.load_unserved().await
    }

    async fn save_unserved(&self, name: &str) -> Result<(), StoreError> {
        self.inner.save_unserved(name).await
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> ChainStore for Observed<S> {
    async fn load_chain(&self, key: &SessionKey) -> Result<Option<bytes::Bytes>, StoreError> {
        self.inner.load_chain(key).await
    }

    async fn save_chain(
        &self,
        key: &SessionKey,
        items: bytes::Bytes,
        replaces: Option<&SessionKey>,
    ) -> Result<(), StoreError> {
        self.inner.save_chain(key, items, replaces).await
    }
}

#[async_trait]
impl<S: Send + Sync + 'static> RecordStore for Observed<S> {
    fn record(&self, key: &SessionKey, update: RecordUpdate) {
        self.inner.record(key, update);
    }

    async fn records(
        &self,
        tenant: Option<&str>,
        max: usize,
    ) -> Result<Vec<(SessionKey, Summary)>, StoreError> {
        self.inner.records(tenant, max).await
    }

    async fn record_of(&self, key: &SessionKey) -> Result<Option<Record>, StoreError> {
        self.inner.record_of(key).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::session::MemoryStore;

    #[tokio::test]
    async fn every_operation_is_reported() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let store = Observed::new(
            Arc::new(MemoryStore::<u32>::new(Duration::from_secs(60), 10)),
            Box::new(move |op, _, failed| log.lock().unwrap().push((op, failed))),
        );
        let key = SessionKey::from_digest("k");
        store.save(&key, 1, 0).await.unwrap();
        store.load(&key).await.unwrap();
        let lease = store.try_lease(&key, Duration::from_secs(1)).await.unwrap().unwrap();
        store.release(&key, lease).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (StoreOp::Save, false),
                (StoreOp::Load, false),
                (StoreOp::Lease, false),
                (StoreOp::Release, false)
            ]
        );
    }
}
