#![no_main]
//! Fuzz target: see `foldgate_fuzz::compaction_item`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| foldgate_fuzz::compaction_item(data));
