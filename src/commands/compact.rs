//! `foldgate compact`: a dry run of the engine on one request body (chat completions, or
//! with `--api responses` a Responses body, with `--api messages` an Anthropic Messages
//! body). The body to forward goes to stdout (JSON
//! only), the report to stderr.

use std::io::{Read, Write};
use std::process::ExitCode;

use bytes::Bytes;

use crate::api::{self, Api, Origins};
use crate::cli::CompactArgs;
use crate::compaction::CompactionError;
use crate::compaction::{Engine, Forward, Options, Report, SessionState};
use crate::model::ChatRequest;
use crate::summarizer::ExtractiveSummarizer;

/// Runs `foldgate compact`.
#[allow(clippy::print_stderr)]
pub fn run(args: &CompactArgs) -> ExitCode {
    let api = super::api_of(args.api);
    let config = match super::load_config(args.config.config.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let steer = match super::steer_of(&config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let cfg = config.compaction;
    let body = match read_input(args.input.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("foldgate compact: cannot read input: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("foldgate compact: {e}");
            return ExitCode::FAILURE;
        }
    };
    let engine = Engine::new(cfg);
    let opts =
        Options { window_cap: args.window, model: args.model.clone(), steer, ..Options::default() };
    let mut state = SessionState::default();
    let body = Bytes::from(body);
    let shape = match api {
        Api::Chat => None,
        Api::Messages => Some(Shape {
            name: "Messages",
            parse: api::messages::parse,
            render: |b, o, r| api::messages::render(b, o, r),
        }),
        Api::Responses => Some(Shape {
            name: "Responses",
            parse: api::responses::parse,
            render: api::responses::render,
        }),
    };
    let compacted = match shape {
        None => rt.block_on(engine.compact(&body, &mut state, &ExtractiveSummarizer, &opts)),
        Some(shape) => match shape.compact(&rt, &engine, &mut state, &opts, &body) {
            Ok(compacted) => compacted,
            Err(code) => return code,
        },
    };
    let (out, report) = match &compacted {
        Ok(Forward::Unchanged { report }) => (&body[..], report),
        Ok(Forward::Compacted { body, report, .. }) => (body.as_slice(), report),
        Err(e) => {
            // Never worse than no proxy: the original is what would be forwarded.
            eprintln!("foldgate compact: forwarded unchanged: {e}");
            let _ = std::io::stdout().write_all(&body);
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::io::stdout().write_all(out).and_then(|()| std::io::stdout().flush()) {
        eprintln!("foldgate compact: cannot write output: {e}");
        return ExitCode::FAILURE;
    }
    if args.report_json {
        match serde_json::to_string(report) {
            Ok(j) => eprintln!("{j}"),
            Err(e) => eprintln!("foldgate compact: cannot write report: {e}"),
        }
    } else {
        eprint!("{}", render(report));
    }
    ExitCode::SUCCESS
}

/// An API shape other than chat completions: its conversion to and from the engine's
/// neutral request.
struct Shape {
    name: &'static str,
    parse: fn(&[u8]) -> Option<(ChatRequest, Origins)>,
    render: fn(&Bytes, &Origins, &ChatRequest) -> Bytes,
}

impl Shape {
    /// `body` parsed, compacted and rendered back; a body this shape does not understand,
    /// or one relying on state the provider keeps, goes to stdout as it is (the exit code
    /// then says which).
    #[allow(clippy::print_stderr)]
    fn compact(
        &self,
        rt: &tokio::runtime::Runtime,
        engine: &Engine,
        state: &mut SessionState,
        opts: &Options,
        body: &Bytes,
    ) -> Result<Result<Forward, CompactionError>, ExitCode> {
        let unchanged = |why: &str, code: ExitCode| {
            eprintln!("foldgate compact: forwarded unchanged: {why}");
            let _ = std::io::stdout().write_all(body);
            code
        };
        let Some((request, origins)) = (self.parse)(body) else {
            let why = format!("not a {} request foldgate understands", self.name);
            return Err(unchanged(&why, ExitCode::FAILURE));
        };
        if origins.server_state {
            let why = "the request relies on state the provider keeps \
                       (previous_response_id, conversation or item_reference)";
            return Err(unchanged(why, ExitCode::SUCCESS));
        }
        let run = engine.compact_request(&request, state, &ExtractiveSummarizer, opts);
        Ok(rt.block_on(run).map(|outcome| match outcome {
            Forward::Compacted { request, report, .. } => {
                let body = (self.render)(body, &origins, &request).to_vec();
                Forward::Compacted { body, request, report }
            }
            unchanged @ Forward::Unchanged { .. } => unchanged,
        }))
    }
}

fn read_input(path: Option<&std::path::Path>) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    match path {
        Some(p) if p.as_os_str() != "-" => buf = std::fs::read(p)?,
        _ => {
            std::io::stdin().read_to_end(&mut buf)?;
        }
    }
    Ok(buf)
}

/// The human-readable report.
pub fn render(r: &Report) -> String {
    let b = &r.budget;
    let pct = if r.tokens_before > 0 {
        100.0 * r.tokens_after as f64 / r.tokens_before as f64
    } else {
        100.0
    };
    let approx = if r.tokens_before_exact { "" } else { "~" };
    let mut s = format!(
        "model {} ({}), window {}, reserve {}, budget {} (trigger {}, target {})\n",
        b.model,
        b.encoding.name(),
        b.window,
        b.reserve,
        b.budget,
        b.trigger,
        b.target
    );
    s += &format!(
        "tokens: {approx}{} -> {approx}{} ({pct:.1}%), tier {}{}{}\n",
        r.tokens_before,
        r.tokens_after,
        r.tier,
        if r.forced { ", forced" } else { "" },
        if r.fits { "" } else { ", DOES NOT FIT" }
    );
    s += &format!(
        "messages: {} -> {}: kept {}, elided {}, folded {}, dropped {}\n",
        r.messages_before, r.messages_after, r.kept, r.elided, r.folded, r.dropped
    );
    s += &format!(
        "blocks: {} new, {} reused, {} invalidated",
        r.blocks_new, r.blocks_reused, r.blocks_invalidated
    );
    if let Some(name) = &r.summarizer {
        s += &format!("; summarizer {name}");
    }
    if let Some(err) = &r.summarizer_error {
        s += &format!(" (fallback after: {err})");
    }
    if let Some(recall) = r.artifact_recall {
        s += &format!("; artifact recall {:.0}%", recall * 100.0);
    }
    s.push('\n');
    s
}
