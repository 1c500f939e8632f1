//! One async lock per conversation, created on demand and removed when unused.
//!
//! Holding a session's lock across load → compact → save means concurrent requests of
//! one conversation never summarize the same range twice: the second waits, then finds
//! the first one's fold blocks stored and reuses them.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::SessionKey;

/// The set of per-session locks.
#[derive(Debug, Default, Clone)]
pub struct SessionLocks {
    map: Arc<DashMap<SessionKey, Arc<Mutex<()>>>>,
}

/// Holds a session's lock; dropping it releases the lock (and the entry when unused).
#[derive(Debug)]
pub struct SessionGuard {
    map: Arc<DashMap<SessionKey, Arc<Mutex<()>>>>,
    key: SessionKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl SessionLocks {
    /// Waits for and takes the lock of `key`.
    pub async fn lock(&self, key: &SessionKey) -> SessionGuard {
        // Clone the Arc out before awaiting: no map guard is held across `.await`.
        let mutex = self.map.entry(key.clone()).or_default().clone();
        let guard = mutex.lock_owned().await;
        SessionGuard { map: self.map.clone(), key: key.clone(), guard: Some(guard) }
    }

    /// Sessions with a lock held or awaited.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no lock is held or awaited.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Under the shard lock no one can clone the Arc, so a count of 1 (the map's own)
        // means nobody holds or awaits this lock.
        self.map.remove_if(&self.key, |_, mutex| Arc::strong_count(mutex) == 1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_holder_at_a_time_and_entries_are_removed() {
        let locks = SessionLocks::default();
        let key = SessionKey::from_digest("k");
        let inside = Arc::new(AtomicUsize::new(0));
        let max_inside = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (locks, key, inside, max_inside) =
                (locks.clone(), key.clone(), inside.clone(), max_inside.clone());
            tasks.push(tokio::spawn(async move {
                let _g = locks.lock(&key).await;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(max_inside.load(Ordering::SeqCst), 1);
        assert!(locks.is_empty(), "unused locks are removed");
    }

    #[tokio::test]
    async fn different_sessions_do_not_wait_for_each_other() {
        let locks = SessionLocks::default();
        let _a = locks.lock(&SessionKey::from_digest("a")).await;
        let b = SessionKey::from_digest("b");
        assert!(tokio::time::timeout(Duration::from_secs(1), locks.lock(&b)).await.is_ok());
    }
}
