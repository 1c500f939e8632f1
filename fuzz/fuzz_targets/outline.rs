#![no_main]
//! Fuzz target: see `foldgate_fuzz::outline`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::outline(data));
