//! Every input a fuzz target ever failed on (kept under `fuzz/regressions/<target>/`),
//! replayed through the same check the target runs (`fuzz/src/lib.rs`), without
//! libFuzzer: a crash fixed once stays fixed. A few hand-written inputs per target run
//! too, so that each check is exercised even before it has failed on anything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "../fuzz/src/lib.rs"]
mod checks;

use std::path::Path;

/// Inputs every check sees: empty, not JSON, truncated JSON, and small valid bodies.
const ALWAYS: &[&[u8]] = &[
    b"",
    b"\xff\xfe",
    b"{",
    b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}",
    br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#,
    br#"{"model":"gpt-4.1","input":[{"type":"message","role":"user","content":"hi"}]}"#,
    br#"{"model":"claude","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
    // Long enough to be kept with its outline (and resumed when it comes again).
    br#"{"model":"gpt-4o","messages":[{"role":"system","content":"You are a careful agent who reads every file before changing it, runs the tests after each change, and reports what it did in the past tense with the exact files, commands and errors."},{"role":"user","content":"Fix the failing test in src/parser.rs; the error is an index out of bounds when the input ends inside a string."},{"role":"assistant","content":"I read src/parser.rs and found the string scanner reads one byte past the end."},{"role":"user","content":"Go on."}]}"#,
    b"data: {\"usage\":{\"prompt_tokens\":5}}\n\n",
    b"\x01\x00data: {\"usage\":{\"prompt_tokens\":5}}\n\n",
];

#[test]
fn every_kept_reproducer_passes_its_target_s_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut replayed = 0;
    for (target, check) in checks::CHECKS {
        for input in ALWAYS {
            check(input);
        }
        let Ok(entries) = std::fs::read_dir(root.join(target)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&input));
            assert!(outcome.is_ok(), "{target}: {} fails again", path.display());
            replayed += 1;
        }
    }
    println!("{replayed} kept reproducer(s) replayed, {} checks", checks::CHECKS.len());
}
