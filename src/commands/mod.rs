//! Offline commands on the compaction engine: `compact` and `replay`.

pub mod compact;
pub mod cost;
pub mod replay;

use std::process::ExitCode;

use crate::api::Api;
use crate::cli::ApiShape;
use crate::config::{CompactionConfig, Config, ConfigSource, resolve_file};

/// The API shape `--api` names; `Err` (exit code 2, after printing why) for a shape the
/// offline commands cannot read yet.
fn api_of(shape: ApiShape, command: &str) -> Result<Api, ExitCode> {
    match shape {
        ApiShape::Chat => Ok(Api::Chat),
        ApiShape::Responses => Ok(Api::Responses),
        ApiShape::Messages => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "foldgate {command}: --api messages is not yet supported (Anthropic Messages \
                     bodies are not converted yet); use --api chat or --api responses"
                );
            }
            Err(ExitCode::from(2))
        }
    }
}

/// Loads the `[compaction]` section like `serve` loads the whole file, printing the
/// error (exit code 2) on failure.
fn load_compaction(file: Option<&std::path::Path>) -> Result<CompactionConfig, ExitCode> {
    load_config(file).map(|c| c.compaction)
}

/// Loads the configuration like `serve` does, printing the error (exit code 2) on
/// failure.
fn load_config(file: Option<&std::path::Path>) -> Result<Config, ExitCode> {
    let mut source = ConfigSource::from_process(None);
    source.file = resolve_file(file, &source.env);
    match Config::load(&source) {
        Ok(c) => Ok(c),
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("foldgate: configuration error: {e}");
            }
            Err(ExitCode::from(2))
        }
    }
}

/// A single-threaded runtime for the async steps (summarizer calls).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}
