//! What foldgate learns from providers as it serves them, and every conversation then
//! plans with: context windows stated by overflow errors ([`windows`]), and how the
//! provider's token counts compare with the engine's ([`calibration`]). In memory,
//! bounded; the conversation stage shares windows with other replicas through its store.

pub mod calibration;
pub mod windows;

pub use calibration::Calibration;
pub use windows::{LearnedWindows, model_key};

/// Everything learned so far (shared by every connection thread of a process).
#[derive(Debug, Default)]
pub struct Learned {
    /// Context windows, by model key.
    pub windows: LearnedWindows,
    /// Token count ratios, by model.
    pub calibration: Calibration,
}
