//! Offline commands on the compaction engine: `compact` and `replay`.

pub mod compact;
pub mod cost;
pub mod replay;
pub mod trail_check;

use std::process::ExitCode;

use crate::api::Api;
use crate::cli::ApiShape;
use crate::compaction::steer::Steer;
use crate::config::{Config, ConfigSource, resolve_file};

/// The API shape `--api` names.
fn api_of(shape: ApiShape) -> Api {
    match shape {
        ApiShape::Chat => Api::Chat,
        ApiShape::Responses => Api::Responses,
        ApiShape::Messages => Api::Messages,
    }
}

/// The instructions (`summarizer.instructions`) and pins (`compaction.pin`) of
/// `config`, as `serve` applies them (validated when the configuration was loaded).
fn steer_of(config: &Config) -> Result<Steer, ExitCode> {
    Steer::new(&config.summarizer.instructions, &config.compaction.pin).map_err(|e| {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("foldgate: compaction.pin: {e}");
        }
        ExitCode::from(2)
    })
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
