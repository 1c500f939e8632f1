//! The tracing subscriber: text by default, JSON when configured, written to stderr by a
//! thread of its own.

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber; `RUST_LOG` overrides `log.level` when set.
///
/// Lines are handed to a writer thread, so a request never waits for a `write` to
/// stderr (a slow log consumer would otherwise slow every request); when a large backlog
/// is pending the caller waits instead of dropping lines. Keep the returned guard until
/// exit: dropping it writes out what is still queued.
pub fn init(config: &LogConfig) -> WorkerGuard {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("foldgate-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    // A second init (e.g. in tests) keeps the first subscriber.
    let _ = match config.format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    guard
}
