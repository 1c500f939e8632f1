//! The request path's layout (`build.rs`, `linker/hot-functions.txt`): the list names
//! functions without the hashes a build gives their symbols, and the binary the build
//! links has a listed function first in its `.text`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/tools.rs"]
mod tools;

use std::path::Path;
use std::process::Command;

fn list() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("linker/hot-functions.txt");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// True when `name` matches `pattern`, whose `*` stands for any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else { return rest.is_empty() };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[test]
fn the_list_holds_paths_without_build_hashes() {
    let list = list();
    assert!(list.len() > 100, "the list has {} functions", list.len());
    for pattern in &list {
        assert!(
            pattern.bytes().all(|b| b.is_ascii_alphanumeric() || b"_$.*".contains(&b)),
            "{pattern}: not a mangled name"
        );
        let legacy_hash = pattern.find("17h").is_some_and(|at| {
            let hash = &pattern[at + 3..];
            hash.len() >= 16 && hash.bytes().take(16).all(|b| b.is_ascii_hexdigit())
        });
        assert!(!legacy_hash, "{pattern}: holds its build's hash");
        // A v0 name's crate is `Cs<disambiguator>_<name>`.
        let crate_ids = pattern.match_indices("Cs").filter(|(at, _)| {
            let id = &pattern[at + 2..];
            !id.starts_with("*_") && id.split('_').next().is_some_and(|id| id.len() > 4)
        });
        let v0 = pattern.starts_with("_R");
        assert!(!v0 || crate_ids.count() == 0, "{pattern}: holds a crate's disambiguator");
    }
}

#[test]
fn patterns_match_names_with_any_hash() {
    let legacy = "_ZN8foldgate4http5usage9value_end17h*";
    assert!(matches(legacy, "_ZN8foldgate4http5usage9value_end17h8901c697e62c88faE"));
    assert!(!matches(legacy, "_ZN8foldgate4http5usage9value_end_of17h8901c697e62c88faE"));
    let v0 = "_RNvNtNtCs*_4core3str8converts9from_utf8";
    assert!(matches(v0, "_RNvNtNtCsgEmfK2I1SDS_4core3str8converts9from_utf8"));
    assert!(!matches(v0, "_RNvNtNtCsgEmfK2I1SDS_4core3str8converts9from_utf16"));
}

#[test]
fn the_linked_binary_starts_its_text_with_a_listed_function() {
    // binutils come with the C toolchain Rust links with.
    if !tools::tool_available("nm", "binutils") || !tools::tool_available("readelf", "binutils") {
        return;
    }
    let binary = env!("CARGO_BIN_EXE_foldgate");
    let nm = Command::new("nm").args(["--defined-only", "--numeric-sort", binary]).output();
    let nm = nm.expect("nm runs");
    assert!(nm.status.success(), "nm {binary}: {}", String::from_utf8_lossy(&nm.stderr));
    let text = section_start(binary, ".text");
    let first = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let address = u64::from_str_radix(parts.next()?, 16).ok()?;
            let kind = parts.next()?;
            let name = parts.next()?;
            (matches!(kind, "t" | "T") && address >= text).then(|| name.to_owned())
        })
        .next()
        .expect("a function in .text");
    let list = list();
    assert!(
        list.iter().any(|pattern| matches(pattern, &first)),
        "the first function of .text, {first}, is not one of linker/hot-functions.txt: the \
         build did not lay the request path out (build.rs)"
    );
}

/// The address of section `name` of the ELF file at `path` (read by `readelf`).
fn section_start(path: &str, name: &str) -> u64 {
    let out = Command::new("readelf").args(["-SW", path]).output().expect("readelf");
    let sections = String::from_utf8_lossy(&out.stdout).into_owned();
    sections
        .lines()
        .find_map(|line| {
            let after = line.split_once(']')?.1;
            let mut fields = after.split_whitespace();
            (fields.next()? == name).then_some(())?;
            let _kind = fields.next()?;
            u64::from_str_radix(fields.next()?, 16).ok()
        })
        .unwrap_or_else(|| panic!("no {name} section in {path}:\n{sections}"))
}
