//! What a pin pattern (`compaction.pin`, `x-foldgate-pin`) may be: a regular
//! expression, at most [`MAX_PINS`] of them, each at most [`MAX_PIN_BYTES`] long.

use regex::{RegexSet, RegexSetBuilder};

/// At most this many pin patterns (configuration and header together).
pub const MAX_PINS: usize = 64;
/// A pin pattern is at most this many bytes.
pub const MAX_PIN_BYTES: usize = 1024;
/// The compiled patterns are at most this large (the regex engine's own limit).
const PIN_SIZE_LIMIT: usize = 1 << 20;

/// A pin pattern that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// More patterns than [`MAX_PINS`].
    #[error("at most {MAX_PINS} pin patterns are allowed, {0} given")]
    TooMany(usize),
    /// A pattern longer than [`MAX_PIN_BYTES`].
    #[error("pin pattern {index} is {len} bytes long; at most {MAX_PIN_BYTES} are allowed")]
    TooLong {
        /// Its place in the list.
        index: usize,
        /// Its length.
        len: usize,
    },
    /// A pattern that does not compile.
    #[error("pin pattern {pattern:?} is not a valid regular expression: {message}")]
    Invalid {
        /// The pattern.
        pattern: String,
        /// Why.
        message: String,
    },
}

/// `patterns` compiled into one set; `None` when there are none.
pub fn compile(patterns: &[String]) -> Result<Option<RegexSet>, PinError> {
    if patterns.is_empty() {
        return Ok(None);
    }
    if patterns.len() > MAX_PINS {
        return Err(PinError::TooMany(patterns.len()));
    }
    for (index, p) in patterns.iter().enumerate() {
        if p.len() > MAX_PIN_BYTES {
            return Err(PinError::TooLong { index, len: p.len() });
        }
        // Each alone, so that the error names the pattern at fault.
        RegexSetBuilder::new([p])
            .size_limit(PIN_SIZE_LIMIT)
            .build()
            .map_err(|e| PinError::Invalid { pattern: p.clone(), message: e.to_string() })?;
    }
    let set = RegexSetBuilder::new(patterns)
        .size_limit(PIN_SIZE_LIMIT)
        .build()
        .map_err(|e| PinError::Invalid { pattern: patterns.join(" | "), message: e.to_string() })?;
    Ok(Some(set))
}
