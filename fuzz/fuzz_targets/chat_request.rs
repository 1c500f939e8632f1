#![no_main]
//! Fuzz target: see `foldgate_fuzz::chat_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::chat_request(data));
