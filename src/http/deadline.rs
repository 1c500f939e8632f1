//! Coarse deadlines for the timeouts every request arms and almost never reaches (the
//! upstream's first byte, the client's request head): a slot in a list of the
//! connection thread's, checked by the thread's once-a-second tick, instead of an entry
//! in the runtime's timer wheel, whose insertion, removal and lock cost more than the
//! rest of the timeout. A deadline fires up to a second late, which timeouts of seconds
//! and minutes do not notice.
//!
//! On a thread without a tick (tests, the compaction runtime) a deadline is a tokio
//! timer, exact.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The deadlines of one connection thread.
#[derive(Default)]
pub struct Deadlines {
    slots: Mutex<Slots>,
    /// Cleared when the tick stops: deadlines made from then on are exact.
    ticking: AtomicBool,
}

#[derive(Default)]
struct Slots {
    entries: Vec<Option<(Instant, Waker)>>,
    free: Vec<usize>,
}

thread_local! {
    static TICKED: RefCell<Option<Arc<Deadlines>>> = const { RefCell::new(None) };
}

impl Deadlines {
    /// Makes this thread's deadlines coarse until the returned guard is dropped; the
    /// caller calls [`Deadlines::tick`] on [`Ticking::deadlines`] at least once a second
    /// meanwhile.
    pub fn install() -> Ticking {
        let deadlines = Arc::new(Self { ticking: AtomicBool::new(true), ..Self::default() });
        TICKED.with(|t| *t.borrow_mut() = Some(deadlines.clone()));
        Ticking(deadlines)
    }

    /// Wakes the tasks whose deadlines have passed.
    pub fn tick(&self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (at, waker) in lock(&self.slots).entries.iter().flatten() {
            if *at <= now {
                due.push(waker.clone());
            }
        }
        due.into_iter().for_each(Waker::wake);
    }

    fn insert(&self, at: Instant, waker: Waker) -> usize {
        let mut slots = lock(&self.slots);
        match slots.free.pop() {
            Some(slot) => {
                slots.entries[slot] = Some((at, waker));
                slot
            }
            None => {
                slots.entries.push(Some((at, waker)));
                slots.entries.len() - 1
            }
        }
    }

    fn update(&self, slot: usize, waker: &Waker) {
        if let Some(Some((_, held))) = lock(&self.slots).entries.get_mut(slot)
            && !held.will_wake(waker)
        {
            held.clone_from(waker);
        }
    }

    fn remove(&self, slot: usize) {
        let mut slots = lock(&self.slots);
        if let Some(entry) = slots.entries.get_mut(slot) {
            *entry = None;
            slots.free.push(slot);
        }
    }
}

/// Keeps a thread's deadlines coarse while it lives (see [`Deadlines::install`]).
pub struct Ticking(Arc<Deadlines>);

impl Ticking {
    /// The list to tick.
    pub fn deadlines(&self) -> Arc<Deadlines> {
        self.0.clone()
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.0.ticking.store(false, Ordering::Release);
        TICKED.with(|t| {
            let mut t = t.borrow_mut();
            if t.as_ref().is_some_and(|d| Arc::ptr_eq(d, &self.0)) {
                *t = None;
            }
        });
    }
}

fn lock(slots: &Mutex<Slots>) -> MutexGuard<'_, Slots> {
    // The slots stay consistent even if a holder panicked.
    slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A future that completes at (or, on a ticked thread, up to a second after) an instant.
pub struct Deadline {
    at: Instant,
    kind: Kind,
}

enum Kind {
    Coarse { deadlines: Arc<Deadlines>, slot: Option<usize> },
    Exact(Pin<Box<tokio::time::Sleep>>),
}

impl Deadline {
    /// Completes at `at`.
    pub fn at(at: Instant) -> Self {
        let ticked = TICKED.with(|t| t.borrow().clone());
        let kind = match ticked.filter(|d| d.ticking.load(Ordering::Acquire)) {
            Some(deadlines) => Kind::Coarse { deadlines, slot: None },
            None => Kind::Exact(Box::pin(tokio::time::sleep_until(at.into()))),
        };
        Self { at, kind }
    }

    /// Completes `after` from now.
    pub fn after(after: Duration) -> Self {
        let now = Instant::now();
        Self::at(now.checked_add(after).unwrap_or(now + Duration::from_secs(86_400 * 365)))
    }
}

impl Future for Deadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        match &mut self.kind {
            Kind::Exact(sleep) => sleep.as_mut().poll(cx),
            // The first poll only registers: deadlines are seconds away, and a clock
            // read per request is what this saves.
            Kind::Coarse { deadlines, slot: slot @ None } => {
                *slot = Some(deadlines.insert(at, cx.waker().clone()));
                Poll::Pending
            }
            Kind::Coarse { deadlines, slot: Some(slot) } => {
                if Instant::now() >= at {
                    return Poll::Ready(());
                }
                deadlines.update(*slot, cx.waker());
                Poll::Pending
            }
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Kind::Coarse { deadlines, slot: Some(slot) } = &self.kind {
            deadlines.remove(*slot);
        }
    }
}

/// A [`timeout`] ran out.
#[derive(Debug, PartialEq, Eq)]
pub struct Elapsed;

/// `future`, or [`Elapsed`] once `after` has passed (see [`Deadline`]).
pub fn timeout<F: Future>(after: Duration, future: F) -> Timeout<F> {
    Timeout { future, deadline: Deadline::after(after) }
}

pin_project_lite::pin_project! {
    /// The future of [`timeout`]: the future it bounds and the deadline, side by side (an
    /// `async fn` would hold the future twice, as its argument and pinned, and every
    /// future awaiting it would be as much larger, copied on each move).
    pub struct Timeout<F> {
        #[pin]
        future: F,
        deadline: Deadline,
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        Pin::new(this.deadline).poll(cx).map(|()| Err(Elapsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_tick_a_deadline_is_exact() {
        let started = Instant::now();
        Deadline::after(Duration::from_millis(30)).await;
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(
            timeout(Duration::from_millis(10), std::future::pending::<()>()).await,
            Err(Elapsed)
        );
        assert_eq!(timeout(Duration::from_secs(5), async { 7 }).await, Ok(7));
    }

    #[tokio::test]
    async fn with_a_tick_a_deadline_fires_at_the_first_tick_past_it() {
        let ticking = Deadlines::install();
        let (deadlines, ticker) = (ticking.deadlines(), ticking.deadlines());
        let ticks = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ticker.tick();
            }
        });
        let started = Instant::now();
        let waited = timeout(Duration::from_millis(50), std::future::pending::<()>()).await;
        assert_eq!(waited, Err(Elapsed));
        assert!(started.elapsed() >= Duration::from_millis(50));
        // Finished or dropped, a deadline gives its slot back for the next one.
        assert_eq!(timeout(Duration::from_secs(60), async { 1 }).await, Ok(1));
        let slots = lock(&deadlines.slots);
        assert!(slots.entries.iter().all(Option::is_none));
        assert_eq!(slots.free.len(), slots.entries.len());
        drop(slots);
        ticks.abort();
        drop(ticking);
        assert!(matches!(Deadline::after(Duration::ZERO).kind, Kind::Exact(_)), "exact again");
    }
}
