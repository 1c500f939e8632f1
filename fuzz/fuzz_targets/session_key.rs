#![no_main]
//! Fuzz target: see `foldgate_fuzz::session_key`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::session_key(data));
