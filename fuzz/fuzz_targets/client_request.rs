#![no_main]
//! Fuzz target: see `foldgate_fuzz::client_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::client_request(data));
