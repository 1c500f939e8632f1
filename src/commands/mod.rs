//! Offline commands on the compaction engine: `compact` and `replay`.

pub mod compact;
pub mod replay;

use std::process::ExitCode;

use crate::config::{CompactionConfig, Config, ConfigSource, resolve_file};

/// Loads the `[compaction]` section like `serve` loads the whole file, printing the
/// error (exit code 2) on failure.
fn load_compaction(file: Option<&std::path::Path>) -> Result<CompactionConfig, ExitCode> {
    let mut source = ConfigSource::from_process(None);
    source.file = resolve_file(file, &source.env);
    match Config::load(&source) {
        Ok(c) => Ok(c.compaction),
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("foldgate: configuration error: {e}");
            }
            Err(ExitCode::from(2))
        }
    }
}

/// A single-threaded runtime for the one async step (the summarizer call).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_time().build()
}
