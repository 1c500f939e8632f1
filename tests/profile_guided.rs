//! Profile-guided optimization (`pgo/`): cargo's rustc wrapper gives the recorded
//! profile to optimized compilations the compiler can read it for, and to nothing else;
//! the profile in the tree is one LLVM reads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The LLVM major version that wrote the profile in the tree.
fn profile_llvm() -> u32 {
    let text = std::fs::read_to_string(root().join("pgo/llvm-major")).unwrap();
    text.trim().parse().unwrap()
}

/// A stand-in for rustc in a directory of its own: `-vV` reports LLVM `llvm`, anything
/// else prints its arguments one per line.
fn fake_rustc(name: &str, llvm: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("foldgate-pgo-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rustc");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = -vV ]; then echo 'rustc 1.99.0'; echo 'LLVM version: {llvm}.1.0'; \
         exit 0; fi\nfor a in \"$@\"; do echo \"$a\"; done\n"
    );
    std::fs::write(&path, script).unwrap();
    let status = Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    assert!(status.success());
    path
}

/// The arguments the wrapper hands the compiler for `args`.
fn wrapped(rustc: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let mut command = Command::new(root().join("pgo/rustc-wrapper"));
    command.arg(rustc).args(args).env_remove("FOLDGATE_PGO");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

fn profile_flag() -> String {
    format!("-Cprofile-use={}", root().join("pgo/foldgate.profdata").display())
}

const RELEASE: &[&str] = &["--crate-name", "foldgate", "src/lib.rs", "-C", "opt-level=3"];

#[test]
fn an_optimized_compilation_gets_the_profile_after_its_own_arguments() {
    let rustc = fake_rustc("same", profile_llvm());
    let args = wrapped(&rustc, RELEASE, &[]);
    assert_eq!(&args[..RELEASE.len()], RELEASE, "the compilation's own arguments first, as given");
    assert_eq!(args[RELEASE.len()..], [profile_flag(), "-Cllvm-args=-no-pgo-warn-mismatch".into()]);

    // A newer LLVM reads an older profile.
    let rustc = fake_rustc("newer", profile_llvm() + 1);
    assert!(wrapped(&rustc, RELEASE, &[]).contains(&profile_flag()));
}

#[test]
fn other_compilations_are_left_as_they_were() {
    let rustc = fake_rustc("others", profile_llvm());
    for level in ["opt-level=0", "opt-level=2"] {
        let args = ["--crate-name", "foldgate", "src/lib.rs", "-C", level];
        assert_eq!(wrapped(&rustc, &args, &[]), args, "tests and their dependencies");
    }
    let queries = ["-", "--print=cfg", "--crate-type", "bin"];
    assert_eq!(wrapped(&rustc, &queries, &[]), queries, "cargo's questions to the compiler");
    for own in ["-Cprofile-generate=/tmp/raw", "-Cpasses=sancov-module", "-Cinstrument-coverage"] {
        let args: Vec<&str> = RELEASE.iter().copied().chain([own]).collect();
        assert_eq!(wrapped(&rustc, &args, &[]), args, "{own}: instruments itself");
    }
    assert_eq!(wrapped(&rustc, RELEASE, &[("FOLDGATE_PGO", "off")]), RELEASE, "turned off");
    let older = fake_rustc("older", profile_llvm() - 1);
    assert_eq!(wrapped(&older, RELEASE, &[]), RELEASE, "an LLVM that cannot read the profile");
}

#[test]
fn the_tree_holds_an_indexed_llvm_profile_and_cargo_uses_the_wrapper() {
    let profile = std::fs::read(root().join("pgo/foldgate.profdata")).unwrap();
    // The indexed profile's magic number: 0xff "lprofi" 0x81.
    assert_eq!(profile.get(..8), Some(&b"\xfflprofi\x81"[..]));
    assert!(profile.len() > 100_000, "a profile of {} bytes", profile.len());
    assert!(profile_llvm() >= 17);
    let config = std::fs::read_to_string(root().join(".cargo/config.toml")).unwrap();
    assert!(config.lines().any(|l| l.trim() == "rustc-wrapper = \"pgo/rustc-wrapper\""));
}

/// Cargo builds every crate again only when their flags change: the configuration's
/// flags carry the profile's digest, so that a new profile reaches every crate (crates
/// built with two profiles do not link).
#[test]
fn the_build_flags_carry_the_profile_digest() {
    use sha2::Digest;
    let profile = std::fs::read(root().join("pgo/foldgate.profdata")).unwrap();
    let digest: String =
        sha2::Sha256::digest(&profile).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let config = std::fs::read_to_string(root().join(".cargo/config.toml")).unwrap();
    let expected = format!("rustflags = [\"--cfg=foldgate_profile=\\\"{digest}\\\"\"]");
    assert!(
        config.lines().any(|l| l.trim() == expected),
        "{expected} missing from .cargo/config.toml: run scripts/pgo-profile.sh, or write it"
    );
}
