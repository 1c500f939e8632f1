//! Lays out the `foldgate` binary's request path together.
//!
//! A proxied request runs code from a few hundred functions spread over the binary's
//! 9 MB of text. Between two requests the client, the upstream and the kernel evict
//! it from the caches, so every request fetches its code again, one 4 KiB page at a
//! time: spread out, about 160 pages. `linker/hot-functions.txt` lists those
//! functions (`scripts/hot-functions.py` writes it from a profile of the request path),
//! and the linker places them first in `.text`, side by side. The request then needs
//! fewer pages and cache lines; see docs/PERFORMANCE.md for what it saves.
//!
//! The list names functions by their mangled path without the hash a build gives each
//! symbol (`…17h*` for the legacy scheme, `Cs*_` for a v0 crate's disambiguator): the
//! hashes change with the compiler, the dependencies and the directory the project is
//! built in, the paths do not. The linker script matches the paths as patterns of
//! section names (each function has its own section).
//!
//! The script is given only to a linker that takes it (LLD, which Rust uses on x86-64
//! Linux since 1.90, and GNU ld read such `INSERT` scripts; mold does not): a small
//! program is linked with it first, with the same compiler, target and flags as the
//! build. When that fails, or with `FOLDGATE_LINK_ORDER=off`, the binary is linked as it
//! would be without this script. A listed function the binary lacks matches nothing: a
//! stale list costs speed, never a build.

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
    let Ok(list) = std::fs::read_to_string(list) else { return };
    let script = PathBuf::from(env("OUT_DIR")).join("hot-functions.ld");
    if std::fs::write(&script, linker_script(&list)).is_err() {
        return;
    }
    let args = [format!("-Wl,-T,{}", script.display())];
    if links_with(&args) {
        for arg in &args {
            println!("cargo:rustc-link-arg-bin=foldgate={arg}");
        }
    }
}

/// A linker script that puts the sections of the listed functions first in `.text`, in
/// the list's order, and every other function's after them; the rest of the layout
/// stays the linker's own (`INSERT` adds to its default layout instead of replacing it,
/// and `.text` keeps its name and place, before `.init`, so that tools that read the
/// binary's text by its section name still find all of it).
fn linker_script(list: &str) -> String {
    let mut script = String::from("SECTIONS\n{\n  .text :\n  {\n");
    for pattern in list.lines().map(str::trim).filter(|line| is_pattern(line)) {
        script.push_str(&format!("    *(.text.{pattern})\n"));
    }
    script.push_str("    *(.text .text.*)\n  }\n}\nINSERT BEFORE .init;\n");
    script
}

/// A mangled name or a pattern of one: nothing a linker script would read otherwise.
fn is_pattern(line: &str) -> bool {
    !line.is_empty() && line.bytes().all(|b| b.is_ascii_alphanumeric() || b"_$.*".contains(&b))
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
