//! The run inspector in a real browser: flowd serves the page, headless
//! Chromium (driven by `tests/browser/inspector.mjs` with playwright-core)
//! opens a run parked at an approval, reads its steps and approves it.
//! `tests/setup.sh` (at the repository root) installs Chromium and the npm
//! package; without them the test says it was skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ACME, CONFIG, Flowd};
use flow_tests::TempDir;
use flow_tests::fake_llm::{FakeLlm, Reply};
use reqwest::Method;
use serde_json::json;

/// A recipe step that the model answers after one rate limit (two
/// attempts and a backoff on the timeline), a loop and a parallel (for the
/// tree's nesting) under a condition, a gate for boss@acme.io whose message holds markup (shown as
/// text, not run), then a step after the gate. The condition's literal and
/// the run's input (`MARKUP`, which the output repeats) hold markup too:
/// the graph's labels, the steps' inputs and the run's output must show it
/// as text.
const RELEASE: &str = r#"recipe draft { model "default" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow release {
  input { topics: list<string>, note: string }
  step outline = draft { q: workflow_input.note } retry 3 backoff 400ms..500ms
  if workflow_input.note != "\"><img src=x onerror=alert(1) data-injected=1>" {
    for workflow_input.topics as sections concurrency 2 {
      step section = draft { q: loop_item }
    }
  }
  parallel checks {
    branch legal { step terms = draft { q: "the terms" } }
    branch style { step tone = draft { q: "the tone" } }
  }
  step signoff = approval { approvers: ["boss@acme.io"], message: "Publish <img src=x data-injected=1>?" }
  step publish = draft { q: step.outline.a }
  output { text: step.publish.a, approver: step.signoff.approver, note: workflow_input.note }
}
"#;

/// What the run's input note says: a script and an attribute breakout.
const MARKUP: &str = r#"<script>document.body.dataset.injected = 1</script>"><img src=x onerror="document.body.dataset.injected = 1" data-injected=1>"#;

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Where the screenshot goes: under the build's target directory, where CI
/// and a developer both look for a build's artifacts. The browser script
/// writes the timeline's and the graph's pictures beside it
/// (`inspector-run-timeline.png`, `inspector-run-graph.png`).
fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    target.join("test-artifacts/inspector-run.png")
}

fn transcript(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

// Two workers: the fake model answers on them while this test's thread
// waits for the browser script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_shows_a_parked_run_and_approves_it_in_a_browser() {
    flow_tests::require!(Playwright, Chromium);

    // The model: a rate limit first (the outline's first attempt), then
    // answers that take a little while, so that bars have some length.
    let model = FakeLlm::start(
        vec![Reply::Answer(429, vec![], "slow down".to_string())],
        json!({ "a": "a draft" }),
        std::time::Duration::from_millis(60),
    )
    .await;
    let config = format!("{CONFIG}{}", common::fake_model(&model.url));
    let dir = TempDir::new("flowd-inspector");
    let flowd = Flowd::start_with(&dir, &config);

    // The page and its files are served without a key, and may not run
    // inline script (the policy) or be cached past a flowd upgrade.
    for (path, content_type) in [
        ("/inspector", "text/html"),
        ("/inspector/app.js", "text/javascript"),
        ("/inspector/app.css", "text/css"),
        ("/inspector/icon.svg", "image/svg+xml"),
    ] {
        let response = flowd
            .client
            .get(format!("{}{path}", flowd.url))
            .send()
            .await
            .expect("flowd answers");
        assert_eq!(response.status(), 200, "{path}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            header("content-type").starts_with(content_type),
            "{path}: {}",
            header("content-type")
        );
        assert!(
            header("content-security-policy").starts_with("default-src 'self'"),
            "{path}: {}",
            header("content-security-policy")
        );
        assert_eq!(header("cache-control"), "no-cache", "{path}");
    }

    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": RELEASE, "path": "release.flow" }))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "release", "input": { "topics": ["pricing", "support"], "note": MARKUP } })),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["run_id"].as_str().expect("a run id").to_string();
    let parked = flowd.settled(&run_id, ACME).await;
    assert_eq!(parked["status"], "pending_approval", "{parked}");

    let screenshot = screenshot_path();
    std::fs::create_dir_all(screenshot.parent().expect("a parent directory"))
        .expect("the artifacts directory can be created");
    let pictures = ["timeline", "graph"]
        .map(|name| screenshot.with_file_name(format!("inspector-run-{name}.png")));
    // A screenshot left by an earlier run must not pass for this one's.
    for file in std::iter::once(&screenshot).chain(&pictures) {
        let _ = std::fs::remove_file(file);
    }
    let started = std::time::Instant::now();
    let browser = Command::new("node")
        .arg(browser_dir().join("inspector.mjs"))
        .args([&flowd.url, ACME, &run_id])
        .arg(&screenshot)
        .env("MARKUP", MARKUP)
        .current_dir(browser_dir())
        .output()
        .expect("node runs");
    assert!(
        browser.status.success(),
        "the browser test failed\n{}",
        transcript(&browser)
    );
    println!(
        "the browser test took {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // What the page did is what the API holds: the run went on and
    // completed, approved by the approver entered in the page.
    let done = flowd.settled(&run_id, ACME).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["output"]["approver"], "boss@acme.io", "{done}");
    assert_eq!(done["output"]["note"], MARKUP, "{done}");
    let (status, trace) = flowd
        .send(
            Method::GET,
            &format!("/v1/runs/{run_id}/trace"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{trace}");
    let signoff = trace["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["path"] == "signoff"))
        .unwrap_or_else(|| panic!("no signoff step in {trace}"));
    assert_eq!(signoff["status"], "completed", "{signoff}");
    assert_eq!(signoff["output"]["approver"], "boss@acme.io", "{signoff}");
    assert_eq!(signoff["output"]["comment"], "Ship it.", "{signoff}");

    for file in std::iter::once(&screenshot).chain(&pictures) {
        let png = std::fs::read(file)
            .unwrap_or_else(|e| panic!("no screenshot at {}: {e}", file.display()));
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{} is not a PNG",
            file.display()
        );
        println!("screenshot: {}", file.display());
    }
    assert_eq!(flowd.stop(), Some(0));
}
