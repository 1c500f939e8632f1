//! What foldgate learns from providers as it serves them, and every conversation then
//! plans with: context windows stated by overflow errors ([`windows`]), how the
//! provider's token counts compare with the engine's ([`calibration`]), and which of the
//! providers' own compaction APIs an upstream does not serve ([`unserved`]). In memory,
//! bounded; the conversation stage shares windows and unserved APIs with other replicas
//! through its store.

pub mod calibration;
pub mod unserved;
pub mod windows;

pub use calibration::Calibration;
pub use unserved::{CompactionApi, Unserved, unserved_name};
pub use windows::{LearnedWindows, model_key};

/// Everything learned so far (shared by every connection thread of a process).
#[derive(Debug, Default)]
pub struct Learned {
    /// Context windows, by model key.
    pub windows: LearnedWindows,
    /// Token count ratios, by model.
    pub calibration: Calibration,
    /// The providers' APIs upstreams do not serve.
    pub unserved: Unserved,
}
