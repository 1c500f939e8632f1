//! One agent run, through foldgate or directly against the scripted model, and what it
//! came to: the figures of the table, and every promise of a run through foldgate.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
#![allow(clippy::print_stderr)] // the figures are the output

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::agent_cli::{self, Agent};
use super::binary;
use super::scripted_model::{Script, ScriptedModel};

/// Shell steps of the task, and output lines of each (about 6 KB).
pub const STEPS: usize = 30;
pub const LINES: usize = 250;
/// Longest an agent run may take.
pub const LIMIT: Duration = Duration::from_secs(150);

/// Where a run happens: foldgate with a summarizer kind, or the model directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Foldgate(&'static str),
    Direct,
}

/// What one run came to.
#[derive(Debug)]
pub struct Outcome {
    pub agent: Agent,
    pub via: Via,
    pub finished: agent_cli::Finished,
    /// The agent's requests at the model (foldgate's summarizer calls apart).
    pub requests: usize,
    pub summaries: usize,
    /// The agent's requests the model saw a digest, goal batch or stub in.
    pub compacted_seen: usize,
    /// foldgate's `chat_requests_total` by outcome.
    pub outcomes: Vec<(String, f64)>,
    /// Conversations foldgate held at the end (`foldgate_active_sessions`).
    pub sessions: Option<f64>,
    /// WebSocket upgrades foldgate refused (426), and the seconds from the first refusal
    /// to the first `POST /v1/responses`.
    pub fallback: Option<(usize, f64)>,
    /// WebSocket upgrades foldgate served (101).
    pub upgrades: usize,
    /// The agent's requests the model got as WebSocket frames.
    pub upstream_frames: usize,
    pub max_tokens: usize,
    pub over_window: usize,
    /// The most thinking blocks or reasoning items one request brought back.
    pub max_signed: usize,
    pub violations: Vec<String>,
    /// Requests not sent the agent's way (path or `stream`).
    pub reshaped: Vec<String>,
    /// foldgate's own warning and error lines.
    pub foldgate_warnings: Vec<String>,
    /// Every kind of request the model received, counted.
    pub sent: Vec<String>,
}

impl Outcome {
    pub fn compacted(&self) -> f64 {
        self.outcomes.iter().filter(|(o, _)| o == "compacted").map(|(_, v)| v).sum()
    }

    pub fn forwarded(&self) -> f64 {
        self.outcomes.iter().map(|(_, v)| v).sum()
    }

    pub fn via(&self) -> String {
        match self.via {
            Via::Foldgate(kind) => format!("foldgate, {kind}"),
            Via::Direct => "direct".into(),
        }
    }

    pub fn row(&self) -> String {
        format!(
            "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            self.agent.name(),
            self.via(),
            self.finished.elapsed.as_secs_f64(),
            self.requests,
            self.compacted_seen,
            self.summaries,
            self.max_tokens,
            self.over_window,
            self.max_signed,
            self.sessions.map_or("-".into(), |n| n.to_string()),
        )
    }

    /// Every promise of a run through foldgate.
    pub fn assert_ok(&self) {
        let what = format!("{} via {}", self.agent.name(), self.via());
        let tail: String = self
            .finished
            .output
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert!(
            self.finished.success,
            "{what}: the agent failed or timed out after {:?}:\n{tail}",
            self.finished.elapsed
        );
        let answer = format!("All {STEPS} steps done.");
        assert!(
            self.finished.output.contains(&answer),
            "{what}: no final answer in its output:\n{tail}"
        );
        assert!(
            self.violations.is_empty(),
            "{what}: invalid requests at the model:\n{}",
            self.violations.join("\n")
        );
        assert!(
            self.reshaped.is_empty(),
            "{what}: requests not forwarded the agent's way:\n{}",
            self.reshaped.join("\n")
        );
        let errors = self.agent.error_lines(&self.finished.output);
        assert!(
            errors.is_empty(),
            "{what}: error lines in the agent's output:\n{}",
            errors.join("\n")
        );
        assert!(self.requests > STEPS, "{what}: only {} requests for {STEPS} steps", self.requests);
        if self.agent == Agent::CodexDefault && matches!(self.via, Via::Foldgate(_)) {
            // Its own transport, served: the socket upgraded, no fallback to HTTP; upstream,
            // a socket when the model has the mode, streamed POSTs when it does not.
            assert!(self.upgrades >= 1, "{what}: Codex's WebSocket was not served");
            assert!(self.fallback.is_none(), "{what}: upgrades refused: {:?}", self.fallback);
            let on_socket = self.via == Via::Foldgate("extractive");
            assert_eq!(
                self.upstream_frames > 0,
                on_socket,
                "{what}: {} frames upstream",
                self.upstream_frames
            );
        }
        // One agent's requests are one conversation, with no setting for the agent.
        if matches!(self.via, Via::Foldgate(_)) {
            assert_eq!(self.sessions, Some(1.0), "{what}: conversations foldgate held");
        }
        // A good share: the task outgrows the window about a third of the way in.
        assert!(
            self.compacted() * 3.0 >= self.forwarded() && self.compacted_seen * 3 >= self.requests,
            "{what}: {} of {} requests compacted (foldgate), {} of {} seen compacted at the model",
            self.compacted(),
            self.forwarded(),
            self.compacted_seen,
            self.requests,
        );
    }
}

pub const HEADER: &str = "| agent | via | wall s | requests | compacted | digests asked | largest prompt (tokens) | over the window | signed blocks sent back | conversations foldgate held |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |";

/// A fresh directory for one run under the target directory (Codex refuses helper
/// binaries under /tmp).
pub fn run_dir(agent: Agent, via: Via) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let tag = match via {
        Via::Foldgate(kind) => kind,
        Via::Direct => "direct",
    };
    let name: String =
        agent.name().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("agents/{name}-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A page of foldgate's (`/metrics`, or the inspector's `/sessions`).
pub fn scrape(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page
}

/// From foldgate's access log: the WebSocket upgrades it answered 426, and the seconds
/// from the first to the start of the first `POST /v1/responses` after it.
pub fn websocket_fallback(log: &[String]) -> Option<(usize, f64)> {
    // `2026-11-27T08:49:35.898115Z ... duration_ms=14.8` → seconds of the day.
    let second = |line: &str| -> Option<f64> {
        let time = line.split('T').nth(1)?.split('Z').next()?;
        let mut parts = time.split(':');
        let (h, m, s): (f64, f64, f64) =
            (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
        Some(h * 3600.0 + m * 60.0 + s)
    };
    let duration = |line: &str| -> Option<f64> {
        line.split("duration_ms=")
            .nth(1)?
            .split(' ')
            .next()?
            .parse::<f64>()
            .ok()
            .map(|ms| ms / 1000.0)
    };
    let refused: Vec<&String> =
        log.iter().filter(|l| l.contains("path=/v1/responses status=426")).collect();
    let first = second(refused.first()?)?;
    let post = log.iter().find(|l| {
        l.contains("method=POST path=/v1/responses ")
            && second(l).zip(duration(l)).is_some_and(|(end, d)| end - d >= first)
    })?;
    Some((refused.len(), second(post)? - duration(post)? - first))
}

/// `foldgate_chat_requests_total` by outcome.
pub fn outcomes(page: &str) -> Vec<(String, f64)> {
    page.lines()
        .filter(|l| l.starts_with("foldgate_chat_requests_total{"))
        .filter_map(|l| {
            let outcome = l.split("outcome=\"").nth(1)?.split('"').next()?.to_owned();
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some((outcome, value))
        })
        .collect()
}

pub async fn run(agent: Agent, via: Via) -> Outcome {
    let script = Script {
        steps: STEPS,
        lines: LINES,
        finish: agent.finish(),
        window: agent.window(),
        // Codex's default mode has a model with the WebSocket mode directly and behind
        // foldgate with the extractive summarizer; behind foldgate with the model
        // summarizer, an HTTP-only one.
        websocket: agent == Agent::CodexDefault
            && matches!(via, Via::Direct | Via::Foldgate("extractive")),
    };
    let model = ScriptedModel::start(script).await;
    let dir = run_dir(agent, via);
    let mut foldgate = None;
    let trace = std::env::var_os("FOLDGATE_AGENTS_TRACE").is_some();
    // Tracing, the session inspector lists foldgate's conversations at the end.
    let admin = trace.then(|| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        port.to_string()
    });
    let root = match via {
        Via::Direct => model.root(),
        Via::Foldgate(kind) => {
            let models = format!(
                "[{{pattern = \"{}\", encoding = \"o200k_base\", context_window = {}}}]",
                agent.model(),
                agent.window()
            );
            let anthropic = model.root();
            let mut env = vec![
                ("FOLDGATE_UPSTREAM__ANTHROPIC_URL", anthropic.as_str()),
                ("FOLDGATE_COMPACTION__MODELS", models.as_str()),
                ("FOLDGATE_SUMMARIZER__KIND", kind),
                ("FOLDGATE_SUMMARIZER__TIMEOUT", "10s"),
            ];
            if let Some(admin) = &admin {
                env.push(("FOLDGATE_ADMIN__LISTEN", admin.as_str()));
            }
            let (child, addr, logs) = binary::spawn_serve(&model.v1(), &env);
            let root = format!("http://{addr}");
            foldgate = Some((child, addr, logs));
            root
        }
    };
    let cmd = agent.command(&root, &dir);
    let finished = tokio::task::spawn_blocking(move || agent_cli::run(cmd, LIMIT)).await.unwrap();
    let (mut outcomes_seen, mut foldgate_warnings, mut sessions) = (Vec::new(), Vec::new(), None);
    let mut fallback = None;
    let mut upgrades = 0;
    if let Some((mut child, addr, logs)) = foldgate {
        if let Some(admin) = admin.clone() {
            let page = tokio::task::spawn_blocking(move || scrape(&admin, "/sessions")).await;
            eprintln!("foldgate's sessions: {}", page.unwrap());
        }
        let page = tokio::task::spawn_blocking(move || scrape(&addr, "/metrics")).await.unwrap();
        outcomes_seen = outcomes(&page);
        sessions = page
            .lines()
            .find_map(|l| l.strip_prefix("foldgate_active_sessions "))
            .and_then(|v| v.trim().parse().ok());
        child.kill().unwrap();
        child.wait().unwrap();
        let log = logs.after_exit();
        fallback = websocket_fallback(&log);
        upgrades = log.iter().filter(|l| l.contains("path=/v1/responses status=101")).count();
        foldgate_warnings =
            log.into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    }
    let seen = model.seen();
    if trace {
        for s in &seen {
            eprintln!(
                "{:>8.3}s {} {} stream {:?} summary {} tokens {}",
                s.at.as_secs_f64(),
                s.method,
                s.path,
                s.stream,
                s.summary,
                s.tokens
            );
        }
    }
    let (path, stream) = agent.sends();
    let conversation: Vec<_> = seen.iter().filter(|s| s.api.is_some() && !s.summary).collect();
    let upstream_frames = conversation.iter().filter(|s| s.method == "WS").count();
    let reshaped = conversation
        .iter()
        .filter(|s| (s.path != path && s.method != "WS") || s.stream != stream)
        .map(|s| {
            format!(
                "{} {} stream {:?} (the agent sends {path} stream {stream:?})",
                s.method, s.path, s.stream
            )
        })
        .collect();
    let mut sent: Vec<String> = Vec::new();
    for s in &seen {
        let who = if s.summary { "foldgate's summarizer" } else { "agent" };
        sent.push(format!(
            "{who}: {} {} (stream {:?}, status {})",
            s.method, s.path, s.stream, s.status
        ));
    }
    sent.sort();
    let mut counted: Vec<(String, usize)> = Vec::new();
    for line in sent {
        match counted.last_mut() {
            Some((l, n)) if *l == line => *n += 1,
            _ => counted.push((line, 1)),
        }
    }
    let sent = counted.into_iter().map(|(l, n)| format!("{n} x {l}")).collect();
    let violations = model.violations();
    let outcome = Outcome {
        agent,
        via,
        requests: conversation.len(),
        summaries: seen.iter().filter(|s| s.summary).count(),
        compacted_seen: conversation.iter().filter(|s| s.compacted).count(),
        outcomes: outcomes_seen,
        sessions,
        fallback,
        upgrades,
        upstream_frames,
        max_tokens: conversation.iter().map(|s| s.tokens).max().unwrap_or(0),
        over_window: conversation.iter().filter(|s| s.tokens > agent.window()).count(),
        max_signed: conversation.iter().map(|s| s.signed).max().unwrap_or(0),
        violations,
        reshaped,
        foldgate_warnings,
        sent,
        finished,
    };
    if outcome.finished.success {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

pub fn report(outcome: &Outcome) {
    eprintln!("{HEADER}\n{}", outcome.row());
    let counted: Vec<_> = outcome.outcomes.iter().filter(|(_, v)| *v > 0.0).collect();
    eprintln!("foldgate outcomes: {counted:?}, conversations held: {:?}", outcome.sessions);
    if let Some((refused, after)) = outcome.fallback {
        eprintln!("WebSocket upgrades refused: {refused}; first POST {after:.3} s after the first");
    }
    for line in &outcome.foldgate_warnings {
        eprintln!("foldgate: {line}");
    }
}
