//! The layering rules: the engine, the conversation stage and the leaf modules never
//! import the HTTP stack, and the stages depend one way (the edge on the dialects and
//! the conversation, the conversation on the engine, the engine on the leaves).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;

/// Paths that only the HTTP side may name.
const HTTP_PATHS: [&str; 5] = ["hyper::", "hyper_util::", "http::", "http_body", "tower::"];
/// The engine and the leaf modules (those present are checked).
const PURE_MODULES: [&str; 10] = [
    "src/api",
    "src/model.rs",
    "src/outline.rs",
    "src/config",
    "src/compaction",
    "src/conversation",
    "src/learned",
    "src/session",
    "src/summarizer/extractive.rs",
    "src/vocab.rs",
];

/// Each stage or leaf, and the modules of the crate it must never name: the arrows
/// point from the edge (`src/http`) to the dialects and the conversation stage, from the
/// conversation to the engine (`src/compaction`), the store and what is learned from
/// providers, and from all of them to the leaves (`model`, `config`, `vocab`).
const ARROWS: [(&str, &[&str]); 9] = [
    ("src/vocab.rs", &["crate::"]),
    ("src/model.rs", &["crate::"]),
    ("src/config", &["crate::compaction", "crate::conversation", "crate::http", "crate::session"]),
    ("src/compaction", &["crate::conversation", "crate::http", "crate::session", "crate::learned"]),
    ("src/learned", &["crate::conversation", "crate::http", "crate::session"]),
    ("src/session", &["crate::compaction", "crate::conversation", "crate::http"]),
    ("src/conversation", &["crate::http", "crate::api", "crate::app", "crate::commands"]),
    ("src/api", &["crate::conversation", "crate::http", "crate::session"]),
    // Dialects are stateless shapes: they never walk a request themselves.
    ("src/http/dialect", &["super::exchange", "crate::http::exchange"]),
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
fn stages_depend_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut offenders = Vec::new();
    for (module, forbidden) in ARROWS {
        let mut files = Vec::new();
        rust_files(&root.join(module), &mut files);
        assert!(!files.is_empty(), "{module} is gone: update the arrows");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text.lines().map(str::trim_start).filter(|l| !l.starts_with("//"));
            for line in code {
                if let Some(name) = forbidden.iter().find(|name| line.contains(*name)) {
                    offenders.push(format!("{} names {name}: {line}", file.display()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "arrows pointing back:\n{}", offenders.join("\n"));
}

#[test]
fn the_edge_reaches_the_engine_only_through_the_conversation_stage() {
    // What the edge needs of the engine passes through the stage's face (the types it
    // re-exports, `Conversations::clearly_below` for the quick decision); unit tests of
    // the edge may build an engine of their own.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/http"), &mut files);
    let mut offenders = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
            if line.contains("crate::compaction") {
                offenders.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "the edge names the engine:\n{}", offenders.join("\n"));
}

#[test]
fn at_the_edge_only_the_recorder_writes_metrics() {
    // Every per-request metric is written once, by the exchange's recorder, from what the
    // exchange learned; the rest of the edge passes `Metrics` on and renders it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let metrics = std::fs::read_to_string(root.join("src/metrics.rs")).unwrap();
    let definition = metrics.split("pub struct Metrics {").nth(1).unwrap();
    let fields = definition.split("\n}").next().unwrap();
    let reading = ["render", "team", "team_header", "new", "with_teams"];
    let writers: Vec<String> = fields
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub ")?.split(':').next())
        .chain(
            metrics
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("pub fn ")?.split(['(', '<']).next()),
        )
        .filter(|name| !reading.contains(name))
        .map(|name| format!("metrics.{name}"))
        .collect();
    assert!(writers.len() > 20, "the writers of metrics.rs are found: {writers:?}");
    let mut files = Vec::new();
    rust_files(&root.join("src/http"), &mut files);
    let mut offenders = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("src/http/record.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
            let written = writers.iter().find(|w| {
                line.match_indices(w.as_str()).any(|(at, _)| {
                    let next = line[at + w.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            });
            if let Some(written) = written {
                offenders.push(format!("{}: {written}: {line}", file.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "metrics written outside the recorder:\n{}",
        offenders.join("\n")
    );
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
    // Its labels are its own types or the crate's vocabulary (`src/vocab.rs`, a leaf):
    // it imports no other module of the crate, so that a change of the service never
    // changes a metric's labels unseen.
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs"))
            .unwrap();
    let offenders: Vec<&str> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//") && l.contains("crate::") && !l.contains("crate::vocab::"))
        .collect();
    assert!(offenders.is_empty(), "metrics.rs names other modules:\n{}", offenders.join("\n"));
}

#[test]
fn no_import_cycle_between_modules_or_files() {
    // The crate's top-level modules and the edge's modules, then every file (see the
    // script's header).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/module-cycles.py");
    let out = std::process::Command::new("python3").arg(&script).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
}
