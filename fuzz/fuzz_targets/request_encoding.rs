#![no_main]
//! Fuzz target: see `foldgate_fuzz::request_encoding`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::request_encoding(data));
