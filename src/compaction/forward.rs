//! What the engine says to forward for one request: the original bytes, or a compacted
//! body; with the report of what was measured and done either way.

use super::report::Report;
use crate::model::ChatRequest;

/// What to forward for a request.
#[derive(Debug, Clone)]
pub enum Forward {
    /// Forward the original bytes untouched.
    Unchanged {
        /// What was measured.
        report: Report,
    },
    /// Forward `body` instead.
    Compacted {
        /// The serialized request to forward.
        body: Vec<u8>,
        /// The same request, structured.
        request: ChatRequest,
        /// What was done.
        report: Report,
    },
}

impl Forward {
    /// The report.
    pub fn report(&self) -> &Report {
        match self {
            Self::Unchanged { report } | Self::Compacted { report, .. } => report,
        }
    }

    /// The report, to complete.
    pub(super) fn report_mut(&mut self) -> &mut Report {
        match self {
            Self::Unchanged { report } | Self::Compacted { report, .. } => report,
        }
    }
}
