#![no_main]
//! Fuzz target: see `foldgate_fuzz::sse_events`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::sse_events(data));
