#![no_main]
//! Fuzz target: see `foldgate_fuzz::upstream_response`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::upstream_response(data));
