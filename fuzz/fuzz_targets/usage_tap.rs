#![no_main]
//! Fuzz target: see `foldgate_fuzz::usage_tap`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::usage_tap(data));
