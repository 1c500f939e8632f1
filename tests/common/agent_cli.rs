//! Real coding agents as processes: where `.ci/run` installs them (`tests/agents/`), the
//! command line, environment and configuration that point each at a base URL with its
//! telemetry, update checks and other outside traffic turned off, one isolated home per
//! run, and what each sends (API path, `stream`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::scripted_model::Finish;

pub const TASK: &str = "Run the scripted steps: one shell command at a time, as the model asks, until it says all steps are done.";

/// The agents under test.
#[allow(clippy::enum_variant_names)] // the agents' own names
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    /// Claude Code asking for a model id it does not know (as behind a gateway): it then
    /// sends its environment as `system` messages inside `messages`.
    ClaudeCodeGatewayModel,
    /// Codex's default mode: a WebSocket to `/v1/responses` first, HTTP after a refusal.
    CodexDefault,
    /// Codex with an HTTP `[model_providers]` entry (`wire_api = "responses"`).
    CodexHttp,
    OpenCode,
    MiniSweAgent,
}

impl Agent {
    pub const ALL: [Agent; 6] = [
        Agent::ClaudeCode,
        Agent::ClaudeCodeGatewayModel,
        Agent::CodexDefault,
        Agent::CodexHttp,
        Agent::OpenCode,
        Agent::MiniSweAgent,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::ClaudeCodeGatewayModel => "claude-code (gateway model id)",
            Agent::CodexDefault => "codex (default: websocket)",
            Agent::CodexHttp => "codex (http provider)",
            Agent::OpenCode => "opencode",
            Agent::MiniSweAgent => "mini-swe-agent",
        }
    }

    /// The model each asks for (one the agent knows, so that it prints no warning).
    pub fn model(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-sonnet-4-5",
            Agent::ClaudeCodeGatewayModel => "gateway-claude",
            Agent::CodexDefault | Agent::CodexHttp => "gpt-5.5",
            Agent::OpenCode => "scripted",
            Agent::MiniSweAgent => "gpt-4o-mini",
        }
    }

    /// The scripted model's window: the agent's system prompt and tools fit comfortably,
    /// thirty 6 KB step outputs do not.
    pub fn window(self) -> usize {
        match self {
            Agent::ClaudeCode => 64_000,
            // Its prompt is smaller for a model it does not know.
            Agent::ClaudeCodeGatewayModel => 48_000,
            Agent::CodexDefault | Agent::CodexHttp | Agent::OpenCode => 32_000,
            Agent::MiniSweAgent => 16_000,
        }
    }

    pub fn finish(self) -> Finish {
        if self == Agent::MiniSweAgent { Finish::SubmitCommand } else { Finish::Answer }
    }

    /// The path (with query) and `stream` value of each of its requests.
    pub fn sends(self) -> (&'static str, Option<bool>) {
        match self {
            Agent::ClaudeCode | Agent::ClaudeCodeGatewayModel => {
                ("/v1/messages?beta=true", Some(true))
            }
            Agent::CodexDefault | Agent::CodexHttp => ("/v1/responses", Some(true)),
            Agent::OpenCode => ("/v1/chat/completions", Some(true)),
            Agent::MiniSweAgent => ("/v1/chat/completions", None),
        }
    }

    /// Its executable where `.ci/run` installs it.
    pub fn program(self) -> PathBuf {
        let agents = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents");
        match self {
            Agent::ClaudeCode | Agent::ClaudeCodeGatewayModel => {
                agents.join("node_modules/.bin/claude")
            }
            Agent::CodexDefault | Agent::CodexHttp => agents.join("node_modules/.bin/codex"),
            Agent::OpenCode => agents.join("node_modules/.bin/opencode"),
            Agent::MiniSweAgent => agents.join(".venv/bin/python"),
        }
    }

    /// True when installed; missing, it fails under CI and skips elsewhere, saying why.
    #[allow(clippy::print_stderr)] // the skip reason is the output
    pub fn installed(self) -> bool {
        let mut check = Command::new(self.program());
        if self == Agent::MiniSweAgent {
            check.args(["-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('minisweagent') is None)"]);
        } else {
            check.arg("--version");
        }
        let ok =
            check.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if !ok {
            let how = if self == Agent::MiniSweAgent {
                "python3 -m venv tests/agents/.venv && tests/agents/.venv/bin/pip install -r tests/agents/requirements.txt"
            } else {
                "npm install --prefix tests/agents"
            };
            assert!(
                std::env::var_os("CI").is_none(),
                "{} is not installed under CI (.ci/run runs `{how}`)",
                self.name()
            );
            eprintln!("SKIPPED: {} is not installed ({how})", self.name());
        }
        ok
    }

    /// The command running the task against `root` (`http://127.0.0.1:P`, foldgate or the
    /// model), isolated in `dir`.
    pub fn command(self, root: &str, dir: &Path) -> Command {
        let home = dir.join("home");
        let work = dir.join("work");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let v1 = format!("{root}/v1");
        let mut cmd = Command::new(self.program());
        cmd.env_clear()
            .current_dir(&work)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .stdin(Stdio::null());
        match self {
            Agent::ClaudeCode | Agent::ClaudeCodeGatewayModel => {
                cmd.args(["-p", TASK, "--dangerously-skip-permissions", "--model", self.model()])
                    .env("ANTHROPIC_BASE_URL", root)
                    .env("ANTHROPIC_API_KEY", "sk-ant-test")
                    // --dangerously-skip-permissions is refused as root otherwise.
                    .env("IS_SANDBOX", "1")
                    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                    .env("DISABLE_TELEMETRY", "1")
                    .env("DISABLE_AUTOUPDATER", "1")
                    .env("DISABLE_ERROR_REPORTING", "1")
                    .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "8192");
            }
            Agent::CodexDefault | Agent::CodexHttp => {
                cmd.args([
                    "exec",
                    "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                    "--color",
                    "never",
                ])
                .args(["-m", self.model()])
                // Plugin and app sync clone from GitHub; analytics off.
                .args(["--disable", "plugins", "--disable", "remote_plugin", "--disable", "apps"])
                .args(["-c", "analytics.enabled=false"])
                .env("CODEX_HOME", dir.join("codex"))
                .env("OPENAI_API_KEY", "sk-test");
                std::fs::create_dir_all(dir.join("codex")).unwrap();
                if self == Agent::CodexDefault {
                    // Codex ignores OPENAI_BASE_URL.
                    cmd.args(["-c", &format!("openai_base_url={}", toml_string(&v1))]);
                } else {
                    let provider = format!(
                        "model_providers.foldgate={{name=\"foldgate\",base_url={},wire_api=\"responses\",env_key=\"OPENAI_API_KEY\"}}",
                        toml_string(&v1)
                    );
                    cmd.args(["-c", "model_provider=\"foldgate\"", "-c", &provider]);
                }
                cmd.arg(TASK);
            }
            Agent::OpenCode => {
                let config = serde_json::json!({
                    "$schema": "https://opencode.ai/config.json",
                    "autoupdate": false,
                    "share": "disabled",
                    "model": format!("foldgate/{}", self.model()),
                    "provider": {"foldgate": {"npm": "@ai-sdk/openai-compatible", "name": "foldgate",
                        "options": {"baseURL": v1, "apiKey": "sk-test"},
                        "models": {(self.model()): {"name": "scripted", "limit": {"context": 200_000, "output": 8192}}}}}
                });
                let path = dir.join("opencode.json");
                std::fs::write(&path, config.to_string()).unwrap();
                cmd.args(["run", TASK])
                    .env("OPENCODE_CONFIG", path)
                    .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
                    .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                    .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
                    // It installs @opencode-ai/plugin into its config directory from the npm
                    // registry at every start; offline, that fails quietly into its log.
                    .env("npm_config_offline", "true");
            }
            Agent::MiniSweAgent => {
                cmd.args(["-m", "minisweagent.run.mini", "-y", "--exit-immediately"])
                    .args(["-m", &format!("openai/{}", self.model())])
                    .args(["-c", "mini.yaml", "-c", &format!("model.model_kwargs.api_base={v1}")])
                    .args(["-o", &dir.join("trajectory.json").to_string_lossy()])
                    .args(["-t", TASK])
                    .env("OPENAI_API_KEY", "sk-test")
                    .env("MSWEA_CONFIGURED", "true")
                    .env("MSWEA_GLOBAL_CONFIG_DIR", dir.join("mini"))
                    .env("MSWEA_COST_TRACKING", "ignore_errors")
                    // litellm fetches its model price list from GitHub otherwise.
                    .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
            }
        }
        cmd
    }

    /// Lines of its output that report an error; Codex's default mode may print one
    /// about the WebSocket it falls back from.
    pub fn error_lines(self, output: &str) -> Vec<String> {
        let mut fallback = usize::from(self == Agent::CodexDefault);
        output
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                ["error", "traceback", "panic", "fatal", "failed"].iter().any(|w| l.contains(w))
            })
            .filter(|l| {
                if fallback > 0 && l.contains("responses_websocket") {
                    fallback -= 1;
                    return false;
                }
                true
            })
            .map(str::to_owned)
            .collect()
    }
}

fn toml_string(s: &str) -> String {
    format!("\"{s}\"")
}

/// What an agent run came to.
#[derive(Debug)]
pub struct Finished {
    pub success: bool,
    pub output: String,
    pub elapsed: Duration,
}

/// Runs `cmd` to its end (killed after `limit`), stdout and stderr collected.
pub fn run(mut cmd: Command, limit: Duration) -> Finished {
    let start = Instant::now();
    // A group of its own, so that a run past its limit ends with everything it started.
    let mut child =
        cmd.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(&mut stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(&mut stderr).unwrap_or_default());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            // The whole group; `--` so that the negative id is read as a group, not an option.
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let output = format!("{}\n--- stderr ---\n{}", out.join().unwrap(), err.join().unwrap());
    Finished { success: status.is_some_and(|s| s.success()), output, elapsed }
}
