//! The layering rule: the engine and the leaf modules never import the HTTP stack.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;

/// Paths that only the HTTP side may name.
const HTTP_PATHS: [&str; 5] = ["hyper::", "hyper_util::", "http::", "http_body", "tower::"];
/// The engine and the leaf modules (those present are checked).
const PURE_MODULES: [&str; 7] = [
    "src/api",
    "src/model.rs",
    "src/outline.rs",
    "src/config",
    "src/compaction",
    "src/session",
    "src/summarizer/extractive.rs",
];

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if !path.exists() {
        return;
    }
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

#[test]
fn engine_and_leaves_do_not_import_http() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for module in PURE_MODULES {
        rust_files(&root.join(module), &mut files);
    }
    assert!(!files.is_empty());
    let mut offenders = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
            if HTTP_PATHS.iter().any(|p| line.contains(p)) {
                offenders.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "HTTP types in pure modules:\n{}", offenders.join("\n"));
}

#[test]
fn only_the_http_module_and_composition_root_import_hyper() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut offenders = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("http/")
            || rel == "app.rs"
            || rel == "client.rs"
            || rel.starts_with("summarizer/llm")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        if text.lines().any(|l| {
            let l = l.trim_start();
            !l.starts_with("//")
                && (l.contains("hyper::") || l.contains("hyper_util::") || l.contains("tower::"))
        }) {
            offenders.push(rel);
        }
    }
    assert!(offenders.is_empty(), "hyper/tower outside src/http: {offenders:?}");
}

#[test]
fn the_metrics_module_owns_its_labels() {
    // Its labels are its own types: it imports no other module of the crate, so that a
    // change of the service never changes a metric's labels unseen.
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"))
            .unwrap();
    let offenders: Vec<&str> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//") && l.contains("crate::"))
        .collect();
    assert!(offenders.is_empty(), "metrics.rs names other modules:\n{}", offenders.join("\n"));
}
