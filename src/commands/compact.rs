//! `foldgate compact`.

use std::process::ExitCode;

/// Runs `foldgate compact`.
pub fn run(_args: &crate::cli::CompactArgs) -> ExitCode {
    ExitCode::FAILURE
}
