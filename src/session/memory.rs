//! The embedded store: a dashmap bounded by TTL and a maximum number of sessions
//! (least recently used evicted first). Inspection records (see [`super::record`]) live
//! in a second map under the same bounds.

use super::{ChainStore, LearnedStore, LeaseStore, RecordStore, StateStore};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::time::Instant;

use super::{Loaded, Record, RecordUpdate, Saved, SessionKey, StoreError, Summary};

struct Entry<S> {
    state: S,
    last_seen: Instant,
    revision: u64,
}

/// An inspection record and when it was last added to.
struct Recorded {
    record: Record,
    last_seen: Instant,
}

/// The most bytes of Responses chains one process keeps (the oldest go first past it).
pub const CHAINS_MAX_BYTES: usize = 256 << 20;

/// A Responses chain's items and when they were stored.
struct Chained {
    items: bytes::Bytes,
    stored: Instant,
}

/// In-memory session store for one process.
pub struct MemoryStore<S> {
    map: DashMap<SessionKey, Entry<S>>,
    records: DashMap<SessionKey, Recorded>,
    chains: DashMap<SessionKey, Chained>,
    /// Bytes of every chain held (kept as chains come and go, so a save need not add
    /// them up).
    chain_bytes: std::sync::atomic::AtomicUsize,
    ttl: Duration,
    max_sessions: usize,
}

impl<S> MemoryStore<S> {
    /// A store keeping sessions for `ttl` after last use, at most `max_sessions` of them.
    pub fn new(ttl: Duration, max_sessions: usize) -> Self {
        let max_sessions = max_sessions.max(1);
        let (map, records, chains) = (DashMap::new(), DashMap::new(), DashMap::new());
        let chain_bytes = std::sync::atomic::AtomicUsize::new(0);
        Self { map, records, chains, chain_bytes, ttl, max_sessions }
    }

    /// Drops the chains `keep` says no to, minding the bytes held.
    fn retain_chains(&self, keep: impl Fn(&Chained) -> bool) {
        self.chains.retain(|_, c| {
            let kept = keep(c);
            if !kept {
                self.chain_bytes.fetch_sub(c.items.len(), std::sync::atomic::Ordering::Relaxed);
            }
            kept
        });
    }

    /// Drops the chain of `key`, if any, minding the bytes held.
    fn remove_chain(&self, key: &SessionKey) {
        if let Some((_, c)) = self.chains.remove(key) {
            self.chain_bytes.fetch_sub(c.items.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Drops expired sessions (and records); returns how many sessions.
    fn sweep_expired(&self) -> usize {
        let before = self.map.len();
        let now = Instant::now();
        self.map.retain(|_, e| now.duration_since(e.last_seen) < self.ttl);
        self.records.retain(|_, r| now.duration_since(r.last_seen) < self.ttl);
        self.retain_chains(|c| now.duration_since(c.stored) < self.ttl);
        before.saturating_sub(self.map.len())
    }

    /// Evicts least recently recorded conversations until there is room for one more
    /// record, a sixteenth of the capacity at once (as [`Self::make_room`]).
    fn make_room_for_record(&self) {
        if self.records.len() < self.max_sessions {
            return;
        }
        let now = Instant::now();
        self.records.retain(|_, r| now.duration_since(r.last_seen) < self.ttl);
        let excess = (self.records.len() + 1).saturating_sub(self.max_sessions);
        if excess == 0 {
            return;
        }
        let batch = excess.max(self.max_sessions / 16).min(self.records.len());
        let mut by_age: Vec<(Instant, SessionKey)> =
            self.records.iter().map(|e| (e.last_seen, e.key().clone())).collect();
        by_age.sort_unstable();
        for (_, key) in by_age.into_iter().take(batch) {
            self.records.remove(&key);
        }
    }

    /// The live record of `key`, if any.
    fn live_record(&self, key: &SessionKey) -> Option<Record> {
        let now = Instant::now();
        let entry = self.records.get(key)?;
        (now.duration_since(entry.last_seen) < self.ttl).then(|| entry.record.clone())
    }

    /// Evicts least recently used sessions until there is room for one more. Evicts a
    /// sixteenth of the capacity at once so that the scan is amortized over many inserts.
    fn make_room(&self) {
        if self.map.len() < self.max_sessions {
            return;
        }
        self.sweep_expired();
        let excess = (self.map.len() + 1).saturating_sub(self.max_sessions);
        if excess == 0 {
            return;
        }
        let batch = excess.max(self.max_sessions / 16).min(self.map.len());
        let mut by_age: Vec<(Instant, SessionKey)> =
            self.map.iter().map(|e| (e.last_seen, e.key().clone())).collect();
        by_age.sort_unstable();
        for (_, key) in by_age.into_iter().take(batch) {
            self.map.remove(&key);
        }
    }
}

#[async_trait]
impl<S: Clone + Send + Sync + 'static> StateStore<S> for MemoryStore<S> {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn load(&self, key: &SessionKey) -> Result<Option<Loaded<S>>, StoreError> {
        let now = Instant::now();
        let found = match self.map.get_mut(key) {
            Some(mut entry) if now.duration_since(entry.last_seen) < self.ttl => {
                entry.last_seen = now;
                Some(Loaded { state: entry.state.clone(), revision: entry.revision })
            }
            Some(_) => None,
            None => return Ok(None),
        };
        if found.is_none() {
            self.map.remove_if(key, |_, e| now.duration_since(e.last_seen) >= self.ttl);
        }
        Ok(found)
    }

    async fn save(&self, key: &SessionKey, state: S, revision: u64) -> Result<Saved, StoreError> {
        if !self.map.contains_key(key) {
            self.make_room();
        }
        let now = Instant::now();
        match self.map.entry(key.clone()) {
            dashmap::Entry::Occupied(mut e) => {
                let live = now.duration_since(e.get().last_seen) < self.ttl;
                let current = if live { e.get().revision } else { 0 };
                if current != revision {
                    return Ok(Saved::Conflict);
                }
                let next = e.get().revision + 1;
                e.insert(Entry { state, last_seen: now, revision: next });
            }
            dashmap::Entry::Vacant(e) => {
                if revision != 0 {
                    return Ok(Saved::Conflict);
                }
                e.insert(Entry { state, last_seen: now, revision: 1 });
            }
        }
        Ok(Saved::Written)
    }

    fn active_sessions(&self) -> usize {
        self.map.len()
    }

    fn sweep(&self) -> usize {
        self.sweep_expired()
    }

    async fn forget(&self, key: &SessionKey) -> Result<bool, StoreError> {
        let state = self.map.remove(key).is_some();
        let record = self.records.remove(key).is_some();
        Ok(state || record)
    }
}

#[async_trait]
impl<S: Clone + Send + Sync + 'static> RecordStore for MemoryStore<S> {
    fn record(&self, key: &SessionKey, update: RecordUpdate) {
        if !self.records.contains_key(key) {
            self.make_room_for_record();
        }
        let now = Instant::now();
        let mut entry = self
            .records
            .entry(key.clone())
            .or_insert_with(|| Recorded { record: Record::default(), last_seen: now });
        if now.duration_since(entry.last_seen) >= self.ttl {
            entry.record = Record::default();
        }
        entry.last_seen = now;
        entry.record.apply(update);
    }

    async fn records(
        &self,
        tenant: Option<&str>,
        max: usize,
    ) -> Result<Vec<(SessionKey, Summary)>, StoreError> {
        let now = Instant::now();
        let mut found: Vec<(SessionKey, Summary)> = self
            .records
            .iter()
            .filter(|e| now.duration_since(e.last_seen) < self.ttl)
            .filter(|e| tenant.is_none() || e.record.summary.tenant.as_deref() == tenant)
            .map(|e| (e.key().clone(), e.record.summary.clone()))
            .collect();
        found.sort_unstable_by(|a, b| b.1.last_seen.cmp(&a.1.last_seen).then(a.0.cmp(&b.0)));
        found.truncate(max);
        Ok(found)
    }

    async fn record_of(&self, key: &SessionKey) -> Result<Option<Record>, StoreError> {
        Ok(self.live_record(key))
    }
}

impl<S: Send + Sync> LeaseStore for MemoryStore<S> {}

impl<S: Send + Sync> LearnedStore for MemoryStore<S> {}

#[async_trait]
impl<S: Send + Sync> ChainStore for MemoryStore<S> {
    async fn load_chain(&self, key: &SessionKey) -> Result<Option<bytes::Bytes>, StoreError> {
        let now = Instant::now();
        let found = self.chains.get(key).map(|c| (c.items.clone(), c.stored));
        Ok(found.filter(|(_, stored)| now.duration_since(*stored) < self.ttl).map(|(i, _)| i))
    }

    async fn save_chain(
        &self,
        key: &SessionKey,
        items: bytes::Bytes,
        replaces: Option<&SessionKey>,
    ) -> Result<(), StoreError> {
        if let Some(old) = replaces {
            self.remove_chain(old);
        }
        let held = self.chain_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if self.chains.len() >= self.max_sessions || held + items.len() > CHAINS_MAX_BYTES {
            // The expired go, then the oldest, until there is room.
            let now = Instant::now();
            self.retain_chains(|c| now.duration_since(c.stored) < self.ttl);
            let mut by_age: Vec<(Instant, SessionKey, usize)> =
                self.chains.iter().map(|c| (c.stored, c.key().clone(), c.items.len())).collect();
            by_age.sort_unstable_by_key(|(stored, _, _)| *stored);
            let mut held: usize = by_age.iter().map(|(_, _, len)| len).sum();
            let mut count = by_age.len();
            for (_, old, len) in by_age {
                if count < self.max_sessions && held + items.len() <= CHAINS_MAX_BYTES {
                    break;
                }
                self.remove_chain(&old);
                held -= len;
                count -= 1;
            }
        }
        let len = items.len();
        let chained = Chained { items, stored: Instant::now() };
        if let Some(old) = self.chains.insert(key.clone(), chained) {
            self.chain_bytes.fetch_sub(old.items.len(), std::sync::atomic::Ordering::Relaxed);
        }
        self.chain_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> SessionKey {
        SessionKey::from_digest(format!("k{n}"))
    }

    async fn state<S: Clone + Send + Sync + 'static>(
        store: &MemoryStore<S>,
        n: usize,
    ) -> Option<S> {
        store.load(&key(n)).await.unwrap().map(|l| l.state)
    }

    #[tokio::test]
    async fn saves_are_conditional_on_the_revision() {
        let store = MemoryStore::new(Duration::from_secs(60), 10);
        assert_eq!(store.save(&key(1), 1u32, 0).await.unwrap(), Saved::Written);
        assert_eq!(store.save(&key(1), 2u32, 0).await.unwrap(), Saved::Conflict);
        let loaded = store.load(&key(1)).await.unwrap().unwrap();
        assert_eq!((loaded.state, loaded.revision), (1, 1));
        assert_eq!(store.save(&key(1), 3u32, 1).await.unwrap(), Saved::Written);
        assert_eq!(store.save(&key(1), 4u32, 1).await.unwrap(), Saved::Conflict);
        assert_eq!(state(&store, 1).await, Some(3));
        assert_eq!(store.save(&key(2), 5u32, 7).await.unwrap(), Saved::Conflict);
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_after_the_ttl() {
        let store = MemoryStore::new(Duration::from_secs(60), 100);
        store.save(&key(1), 7u32, 0).await.unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(state(&store, 1).await, Some(7), "use refreshes last-seen");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(state(&store, 1).await, Some(7));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(state(&store, 1).await, None);
        assert_eq!(store.active_sessions(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_drops_expired_sessions() {
        let store = MemoryStore::new(Duration::from_secs(10), 100);
        store.save(&key(1), 1u32, 0).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        store.save(&key(2), 2u32, 0).await.unwrap();
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(StateStore::<u32>::sweep(&store), 1);
        assert_eq!(state(&store, 2).await, Some(2));
    }

    fn update(tenant: &str, at: u64) -> RecordUpdate {
        RecordUpdate {
            tenant: Some(tenant.to_owned()),
            request: crate::session::record::RequestEntry { at, ..Default::default() },
            history: 3,
            ..RecordUpdate::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn records_are_bounded_scoped_by_tenant_and_forgotten_with_the_state() {
        let store = MemoryStore::<u32>::new(Duration::from_secs(60), 2);
        for at in 1..=5 {
            store.record(&key(1), update("a", at));
        }
        store.record(&key(2), update("b", 9));
        store.save(&key(1), 7, 0).await.unwrap();
        let record = store.record_of(&key(1)).await.unwrap().unwrap();
        assert_eq!((record.requests.len(), record.summary.requests), (3, 5));
        let listed = |tenant| {
            let store = &store;
            async move {
                let found = store.records(tenant, 10).await.unwrap();
                found.into_iter().map(|(k, _)| k).collect::<Vec<_>>()
            }
        };
        assert_eq!(listed(None).await, [key(2), key(1)]);
        assert_eq!(listed(Some("a")).await, [key(1)]);
        assert!(listed(Some("c")).await.is_empty());
        assert!(store.forget(&key(1)).await.unwrap());
        assert!(store.load(&key(1)).await.unwrap().is_none());
        assert!(store.record_of(&key(1)).await.unwrap().is_none());
        assert!(!store.forget(&key(1)).await.unwrap());
        // At most max_sessions records; expired ones are gone.
        for n in 10..20 {
            store.record(&key(n), update("a", 10));
        }
        assert!(store.records.len() <= 2);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(listed(None).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn least_recently_used_sessions_are_evicted_at_capacity() {
        let store = MemoryStore::new(Duration::from_secs(3600), 32);
        for n in 0..32 {
            store.save(&key(n), n, 0).await.unwrap();
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // Touch session 0 so it is the most recently used.
        assert_eq!(state(&store, 0).await, Some(0));
        store.save(&key(99), 99, 0).await.unwrap();
        assert!(store.active_sessions() <= 32);
        assert_eq!(state(&store, 0).await, Some(0), "recently used survives");
        assert_eq!(state(&store, 1).await, None, "oldest was evicted");
        assert_eq!(state(&store, 99).await, Some(99));
        for n in 100..1000 {
            store.save(&key(n), n, 0).await.unwrap();
        }
        assert!(store.active_sessions() <= 32);
    }

    #[tokio::test]
    async fn a_chain_replaces_the_one_it_continued_and_chains_stay_bounded() {
        let store = MemoryStore::<u32>::new(Duration::from_secs(60), 4);
        let key = |n: u32| SessionKey::from_digest(format!("{n:032x}"));
        let items = |n: usize| bytes::Bytes::from(vec![b'x'; n]);
        store.save_chain(&key(1), items(10), None).await.unwrap();
        store.save_chain(&key(2), items(20), Some(&key(1))).await.unwrap();
        assert!(store.load_chain(&key(1)).await.unwrap().is_none(), "the one continued went");
        assert_eq!(store.load_chain(&key(2)).await.unwrap().unwrap().len(), 20);
        // At most `max_sessions` chains: the oldest goes.
        for n in 3..=6 {
            store.save_chain(&key(n), items(1), None).await.unwrap();
        }
        assert!(store.load_chain(&key(2)).await.unwrap().is_none());
        assert!(store.load_chain(&key(6)).await.unwrap().is_some());
        // Past the byte bound, the oldest go until the new one fits.
        store.save_chain(&key(7), items(CHAINS_MAX_BYTES - 2), None).await.unwrap();
        assert!(store.load_chain(&key(3)).await.unwrap().is_none());
        assert!(store.load_chain(&key(7)).await.unwrap().is_some());
    }
}
