//! Lays out the `foldgate` binary's request path together.
//!
//! A proxied request runs code from a few hundred functions spread over the binary's
//! 9 MB of text. Between two requests the client, the upstream and the kernel evict
//! it from the caches, so every request fetches its code again, one 4 KiB page at a
//! time: spread out, about 160 pages. `linker/hot-functions.txt` lists those
//! functions (`scripts/hot-functions.sh` writes it from a profile of the request path),
//! and the linker places them first, side by side. The request then needs fewer pages
//! and cache lines; see docs/PERFORMANCE.md for what it saves.
//!
//! Only a linker that takes a symbol ordering file is given one (LLD, which Rust uses on
//! x86-64 Linux since 1.90, and mold): a small program is linked with it first, with the
//! same compiler, target and flags as the build. When that fails, or with
//! `FOLDGATE_LINK_ORDER=off`, the binary is linked as it would be without this script.
//! A listed function the binary lacks is skipped: a stale list costs speed, never a
//! build.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIST: &str = "linker/hot-functions.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-env-changed=FOLDGATE_LINK_ORDER");
    if std::env::var("FOLDGATE_LINK_ORDER").is_ok_and(|v| v == "off") {
        return;
    }
    let list = Path::new(env("CARGO_MANIFEST_DIR").as_str()).join(LIST);
    if !list.is_file() {
        return;
    }
    let args = [
        format!("-Wl,--symbol-ordering-file={}", list.display()),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    if links_with(&args) {
        for arg in &args {
            println!("cargo:rustc-link-arg-bin=foldgate={arg}");
        }
    }
}

/// True when a small program links with `args` added, as the build would link.
fn links_with(args: &[String]) -> bool {
    let out = PathBuf::from(env("OUT_DIR"));
    let source = out.join("link_probe.rs");
    if std::fs::write(&source, "fn main() {}\n").is_err() {
        return false;
    }
    let mut rustc = Command::new(env("RUSTC"));
    rustc
        .arg(&source)
        .args(["--crate-type", "bin", "--crate-name", "link_probe", "--target"])
        .arg(env("TARGET"))
        .arg("-o")
        .arg(out.join("link_probe"));
    // The build's own flags (a linker chosen there changes what links).
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    rustc.args(flags.split('\u{1f}').filter(|f| !f.is_empty()));
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        rustc.arg("-C").arg(format!("linker={linker}"));
    }
    for arg in args {
        rustc.arg("-C").arg(format!("link-arg={arg}"));
    }
    rustc.stdout(Stdio::null()).stderr(Stdio::null());
    rustc.status().is_ok_and(|status| status.success())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}
