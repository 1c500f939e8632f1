#![no_main]
//! Fuzz target: see `foldgate_fuzz::error_readers`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::error_readers(data));
