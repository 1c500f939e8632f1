#![no_main]
//! Fuzz target: see `foldgate_fuzz::event_stream`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::event_stream(data));
