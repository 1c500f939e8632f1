//! The session inspector's page in a real headless browser (Debian `chromium`, which
//! `.ci/run` installs): after a long compacted conversation the page renders the
//! session, its chart has one point per request, and its digests are shown. The
//! screenshot is kept at `target/tmp/inspector-page.png`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::{ProviderStats, chat_config, chat_request, conversation, provider, requests};
use common::*;
use foldgate::config::Secret;
use http::StatusCode;

const TOKEN: &str = "page-test-token";

/// Runs chromium headless on `url` with `args`; its stdout. A fresh profile every time,
/// nothing fetched but `url`.
fn chromium(url: &str, args: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!("foldgate-chromium-{}", uuid::Uuid::new_v4()));
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        out
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&profile);
    reader.join().unwrap()
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_charts_a_compacted_conversation_and_shows_its_digests() {
    if !common::tools::tool_available("chromium", "chromium") {
        return;
    }
    let stats = Arc::new(ProviderStats::default());
    let mock = MockUpstream::start(provider(stats)).await;
    let mut config = chat_config(&mock.url());
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Secret::new(TOKEN);
    let proxy = Proxy::start(config).await;
    let bodies = requests(&conversation(40, 4), &[]);
    let mut key = String::new();
    let mut compacted = 0;
    for body in &bodies {
        let (status, headers, _) =
            send(chat_request(&proxy, body.clone(), "Bearer sk-page", "page-1")).await;
        assert_eq!(status, StatusCode::OK);
        key = headers["x-foldgate-session"].to_str().unwrap().to_owned();
        compacted += usize::from(headers["x-foldgate-outcome"] == "compacted");
    }
    assert!(compacted > 0, "the conversation was compacted");

    let url = format!("http://{}/#session={key}&token={TOKEN}", proxy.admin_addr.unwrap());
    let dom = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"])).await.unwrap()
    };
    assert!(dom.contains(&format!("data-loaded=\"{key}\"")), "the session rendered:\n{dom}");
    assert_eq!(count(&dom, "class=\"pt pt-after\""), bodies.len(), "one point per request");
    assert_eq!(count(&dom, "class=\"pt pt-before\""), bodies.len());
    assert!(dom.contains(&format!("data-points=\"{}\"", bodies.len())));
    assert!(count(&dom, "class=\"mark-fold\"") >= 1, "folds are marked");
    assert!(count(&dom, "class=\"block\"") >= 1, "fold blocks are listed");
    assert!(dom.contains("I read the modules"), "a digest is shown");
    assert!(dom.contains("messages 0–"), "beside the range it replaced");
    assert!(dom.contains(&format!("data-key=\"{key}\"")), "the sessions table lists it");

    let shot: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspector-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || chromium(&url, &[&arg, "--window-size=1280,1600"]))
        .await
        .unwrap();
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "a screenshot at {} ({size} bytes)", shot.display());
}
