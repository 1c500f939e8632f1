//! `foldgate replay`.

use std::process::ExitCode;

/// Runs `foldgate replay`.
pub fn run(_args: &crate::cli::ReplayArgs) -> ExitCode {
    ExitCode::FAILURE
}
