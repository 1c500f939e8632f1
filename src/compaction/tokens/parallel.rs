//! Counting the uncounted messages of one request on several threads.
//!
//! A conversation met for the first time (a new replica, a restart) has every message
//! uncounted. When their text is large, the messages are split into runs of about equal
//! bytes and counted on scoped threads beside the caller. The threads counting across
//! the whole process never outnumber the cores, so the connection threads, which the
//! operating system shares the cores with, keep their turn; when every core is already
//! counting, a request counts on its own thread alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use super::count::message_tokens;
use super::encoding::Encoding;
use crate::model::Message;

/// Uncounted text below which one thread counts it all: spawning a thread costs about
/// what counting 2 KiB does, and a small request is done before a helper would start.
pub const PARALLEL_MIN_BYTES: usize = 64 * 1024;

/// Threads counting right now, across the process (callers and helpers).
static COUNTING: AtomicUsize = AtomicUsize::new(0);

/// Cores of this machine, read once.
static CORES: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));

/// Releases the threads it took from [`COUNTING`] when dropped (a panic included).
struct Taken(usize);

impl Drop for Taken {
    fn drop(&mut self) {
        COUNTING.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// Takes the caller's thread and up to `wanted - 1` helpers, as many as leave the
/// counting threads at most the cores; returns the threads to use, the caller included.
fn take(wanted: usize) -> (usize, Taken) {
    let cores = *CORES;
    let mut now = COUNTING.load(Ordering::Acquire);
    loop {
        // The caller counts in any case; helpers only on cores nothing else counts on.
        let helpers = wanted.saturating_sub(1).min(cores.saturating_sub(now + 1));
        match COUNTING.compare_exchange_weak(
            now,
            now + 1 + helpers,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return (1 + helpers, Taken(1 + helpers)),
            Err(seen) => now = seen,
        }
    }
}

/// Exact tokens of each message of `msgs` (see [`message_tokens`]), in order, counted on
/// up to as many threads as there are cores when their text reaches
/// [`PARALLEL_MIN_BYTES`]. The counts are those of one thread.
pub fn count_messages(encoding: Encoding, msgs: &[&Arc<Message>]) -> Vec<usize> {
    let bytes: usize = msgs.iter().map(|m| m.raw().len()).sum();
    let wanted = (bytes / PARALLEL_MIN_BYTES).clamp(1, msgs.len().max(1));
    if wanted == 1 || *CORES == 1 {
        return msgs.iter().map(|m| message_tokens(encoding, m)).collect();
    }
    let (threads, _taken) = take(wanted);
    if threads == 1 {
        return msgs.iter().map(|m| message_tokens(encoding, m)).collect();
    }
    let runs = split_by_bytes(msgs, threads);
    let mut counts = vec![0; msgs.len()];
    std::thread::scope(|scope| {
        let mut rest = counts.as_mut_slice();
        let mut jobs = Vec::with_capacity(runs.len());
        for run in &runs {
            let (out, tail) = rest.split_at_mut(run.len());
            rest = tail;
            jobs.push((*run, out));
        }
        // The caller counts the first run itself; a helper each of the others.
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        for (run, out) in jobs {
            scope.spawn(move || fill(encoding, run, out));
        }
        if let Some((run, out)) = first {
            fill(encoding, run, out);
        }
    });
    counts
}

fn fill(encoding: Encoding, run: &[&Arc<Message>], out: &mut [usize]) {
    for (slot, msg) in out.iter_mut().zip(run) {
        *slot = message_tokens(encoding, msg);
    }
}

/// `msgs` cut into at most `parts` consecutive runs of about equal JSON bytes.
fn split_by_bytes<'m, 'a>(
    msgs: &'m [&'a Arc<Message>],
    parts: usize,
) -> Vec<&'m [&'a Arc<Message>]> {
    let total: usize = msgs.iter().map(|m| m.raw().len()).sum();
    let share = total.div_ceil(parts.max(1)).max(1);
    let mut runs = Vec::with_capacity(parts);
    let (mut start, mut filled) = (0, 0);
    for (i, msg) in msgs.iter().enumerate() {
        filled += msg.raw().len();
        if filled >= share && runs.len() + 1 < parts {
            runs.push(&msgs[start..=i]);
            start = i + 1;
            filled = 0;
        }
    }
    if start < msgs.len() {
        runs.push(&msgs[start..]);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The tests that read [`COUNTING`] run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn message(i: usize, len: usize) -> Arc<Message> {
        let text = format!("message {i}: ") + &"the parser reads each frame. ".repeat(len / 28 + 1);
        Arc::new(Message::from_value(json!({"role": "user", "content": text})).unwrap())
    }

    #[test]
    fn parallel_counts_equal_one_thread_s() {
        let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let msgs: Vec<Arc<Message>> = (0..300).map(|i| message(i, 100 + (i * 37) % 3000)).collect();
        let refs: Vec<&Arc<Message>> = msgs.iter().collect();
        let one: Vec<usize> = msgs.iter().map(|m| message_tokens(Encoding::O200kBase, m)).collect();
        assert!(refs.iter().map(|m| m.raw().len()).sum::<usize>() > 2 * PARALLEL_MIN_BYTES);
        assert_eq!(count_messages(Encoding::O200kBase, &refs), one);
        assert_eq!(COUNTING.load(Ordering::Acquire), 0, "threads released");
    }

    #[test]
    fn runs_cover_every_message_once() {
        let msgs: Vec<Arc<Message>> = (0..17).map(|i| message(i, 50 * (i + 1))).collect();
        let refs: Vec<&Arc<Message>> = msgs.iter().collect();
        for parts in 1..6 {
            let runs = split_by_bytes(&refs, parts);
            assert!(runs.len() <= parts && !runs.is_empty());
            assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), refs.len());
        }
        assert!(split_by_bytes(&[], 3).is_empty());
    }

    #[test]
    fn counting_threads_never_outnumber_the_cores() {
        let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (first, a) = take(64);
        assert!((1..=*CORES).contains(&first));
        // Every core counts: a second request counts on its own thread alone.
        let (second, b) = take(64);
        assert_eq!(second, 1 + CORES.saturating_sub(first + 1));
        drop((a, b));
        assert_eq!(COUNTING.load(Ordering::Acquire), 0);
    }
}
