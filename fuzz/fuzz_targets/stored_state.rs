#![no_main]
//! Fuzz target: see `foldgate_fuzz::stored_state`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::stored_state(data));
