#![no_main]
//! Fuzz target: see `foldgate_fuzz::anthropic_edits`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::anthropic_edits(data));
