//! The log lines' writer: a request thread formats its line and appends it to a shared
//! buffer, written to stderr by a thread of its own in batches.
//!
//! Appending is no system call and no wake-up of another thread per line (on a busy
//! two-core machine a wake-up per access-log line cost more than the rest of a small
//! request's handling). While lines keep coming, the writer thread runs on its own
//! clock: every [`FLUSH_EVERY`] it writes what gathered in one go, and no request thread
//! wakes it. Only the first line after a quiet spell wakes it (or [`WAKE_AT`] bytes
//! waiting); with nothing queued for a whole interval it sleeps without a timeout, so an
//! idle proxy spends no CPU on its log. Logging never blocks a request: past
//! [`MAX_BACKLOG`] bytes waiting (a log consumer that stopped reading), lines are dropped
//! and counted, and the count is written once the consumer reads again.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// A line waits at most about this long before the writer thread writes it (the batch
/// gathers meanwhile: under load, one wake-up and one `write` per this interval).
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// This many waiting bytes wake the writer thread at once.
pub const WAKE_AT: usize = 256 * 1024;
/// Past this many waiting bytes, lines are dropped (and counted).
pub const MAX_BACKLOG: usize = 16 * 1024 * 1024;

/// Lines waiting for the writer thread, and whether it sleeps until woken.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// The writer waits without a timeout: the next line must wake it.
    asleep: bool,
}

/// The queue between the request threads and the writer thread.
#[derive(Default)]
struct Queue {
    pending: Mutex<Pending>,
    wake: Condvar,
    dropped: AtomicU64,
    /// Wake-ups sent by appends (a request thread's system call each).
    wakes: AtomicU64,
    closed: AtomicBool,
}

/// Appends formatted lines to the queue (one `write` per line, as the formatter does).
#[derive(Clone)]
pub struct QueueWriter(Arc<Queue>);

impl QueueWriter {
    /// Appends `data` (one or more whole lines), or drops and counts it past
    /// [`MAX_BACKLOG`].
    pub fn append(&self, data: &[u8]) {
        let Ok(mut pending) = self.0.pending.lock() else { return };
        let buf = &mut pending.buf;
        if buf.len() + data.len() > MAX_BACKLOG {
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_below = buf.len() < WAKE_AT;
        buf.extend_from_slice(data);
        // A writer on its clock comes by itself; a sleeping one, or a batch grown this
        // large, needs the wake-up.
        if pending.asleep || (was_below && pending.buf.len() >= WAKE_AT) {
            pending.asleep = false;
            self.0.wakes.fetch_add(1, Ordering::Relaxed);
            self.0.wake.notify_one();
        }
    }
}

impl Write for QueueWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.append(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for QueueWriter {
    type Writer = QueueWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Ends the writer thread when dropped, after it wrote what was queued.
pub struct LogGuard {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::Release);
        if let Ok(mut pending) = self.queue.pending.lock() {
            pending.asleep = false;
        }
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A queue writer and the thread that drains it into `out`.
pub fn spawn<W: Write + Send + 'static>(out: W) -> (QueueWriter, LogGuard) {
    let queue = Arc::new(Queue::default());
    let drain = queue.clone();
    let thread = std::thread::Builder::new()
        .name("foldgate-log".to_owned())
        .spawn(move || drain_into(&drain, out))
        .ok();
    (QueueWriter(queue.clone()), LogGuard { queue, thread })
}

fn drain_into<W: Write>(queue: &Queue, mut out: W) {
    let mut spare = Vec::new();
    loop {
        let closed = queue.closed.load(Ordering::Acquire);
        {
            let Ok(mut pending) = queue.pending.lock() else { return };
            // Let the batch gather for an interval, unless it is already large or the
            // log closes: appends do not wake the writer meanwhile.
            let gather_until = Instant::now() + FLUSH_EVERY;
            while pending.buf.len() < WAKE_AT && !queue.closed.load(Ordering::Acquire) {
                let left = gather_until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                pending = match queue.wake.wait_timeout(pending, left) {
                    Ok((pending, _)) => pending,
                    Err(_) => return,
                };
            }
            // A whole interval without a line: sleep until the next one wakes us.
            while pending.buf.is_empty() && !queue.closed.load(Ordering::Acquire) {
                pending.asleep = true;
                pending = match queue.wake.wait(pending) {
                    Ok(pending) => pending,
                    Err(_) => return,
                };
            }
            pending.asleep = false;
            std::mem::swap(&mut pending.buf, &mut spare);
        }
        if !spare.is_empty() {
            // A failing stderr has nowhere to report to: the lines are lost.
            let _ = out.write_all(&spare);
            spare.clear();
        }
        let dropped = queue.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "foldgate: {dropped} log lines dropped: the log consumer fell behind"
            );
        }
        let _ = out.flush();
        if closed && queue.pending.lock().map_or(true, |p| p.buf.is_empty()) {
            return;
        }
        // Keep the allocation, but not a huge one from a burst.
        if spare.capacity() > 4 * WAKE_AT {
            spare = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects what the writer thread writes, and how many writes it made.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            let mut sink = self.0.lock().unwrap();
            sink.0.extend_from_slice(data);
            sink.1 += 1;
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_in_batches_and_all_of_them_by_the_guard() {
        let sink = Sink::default();
        let (writer, guard) = spawn(sink.clone());
        for i in 0..1000 {
            writer.make_writer().write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(guard);
        let (text, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text.lines().count(), 1000);
        assert!(text.starts_with("line 0\n") && text.ends_with("line 999\n"));
        assert!(writes < 50, "{writes} writes for 1000 lines");
    }

    #[test]
    fn a_steady_trickle_is_written_on_the_writers_clock() {
        let sink = Sink::default();
        let (writer, guard) = spawn(sink.clone());
        // 100 lines over about a second: a handful of batches, not a write per line.
        for i in 0..100 {
            writer.make_writer().write_all(format!("line {i}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let (_, writes) = sink.0.lock().unwrap().clone();
        assert!((1..=12).contains(&writes), "{writes} writes for 100 lines over a second");
        // Only the first line woke the writer: the others waited for its clock.
        let wakes = writer.0.wakes.load(Ordering::Relaxed);
        assert!(wakes <= 2, "{wakes} wake-ups for a steady trickle");
        // After a quiet spell the writer sleeps; the next line wakes it.
        std::thread::sleep(FLUSH_EVERY * 3);
        writer.make_writer().write_all(b"after the pause\n").unwrap();
        let started = Instant::now();
        while !String::from_utf8_lossy(&sink.0.lock().unwrap().0).ends_with("after the pause\n") {
            assert!(started.elapsed() < Duration::from_secs(10), "the line after a pause waits");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().0.clone()).unwrap();
        assert_eq!(text.lines().count(), 101);
    }

    /// A consumer that does not read: writing a line never waits.
    struct Stuck;

    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(0)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_consumer_never_blocks_a_writer() {
        let (writer, guard) = spawn(Stuck);
        let line = vec![b'x'; 64 * 1024];
        let started = std::time::Instant::now();
        for _ in 0..(2 * MAX_BACKLOG / line.len()) {
            writer.make_writer().write_all(&line).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(writer.0.dropped.load(Ordering::Relaxed) > 0, "lines past the backlog dropped");
        std::mem::forget(guard); // its thread is stuck in the consumer
    }
}
