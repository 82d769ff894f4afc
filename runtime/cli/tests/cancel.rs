//! A run another process cancels while `flow run` drives it: the driving
//! process writes nothing more for it and starts no other step.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flow_tests::fake_llm::FakeLlm;
use flow_tests::{TempDir, run_in, signal};
use serde_json::json;

/// Three model calls, each on the last one's answer.
const WORKFLOW: &str = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string }
  prompt "Answer {{input.q}}"
}
workflow w {
  input { q: string }
  step s1 = answer { q: workflow_input.q } retry 1 timeout 30s
  step s2 = answer { q: step.s1.text } retry 1 timeout 30s
  step s3 = answer { q: step.s2.text } retry 1 timeout 30s
  output { text: step.s3.text }
}
"#;

/// `flow run` of `WORKFLOW` in `dir` against `server`, once it has sent
/// `calls` requests to the model, and the run's id.
fn running(dir: &TempDir, server: &FakeLlm, calls: usize) -> (std::process::Child, String) {
    dir.write("w.flow", WORKFLOW);
    let flow = Path::new(env!("CARGO_BIN_EXE_flow"));
    let child = Command::new(flow)
        .args(["run", "w.flow", "--input", r#"{"q": "x"}"#])
        .current_dir(dir.path())
        .envs(server.flow_env())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("flow starts");
    let waited = Instant::now();
    while server.requests() < calls {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "no call {calls}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let runs = run_in(flow, dir.path(), &["runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).expect("runs as JSON");
    let run = runs[0]["run_id"].as_str().expect("the run").to_string();
    (child, run)
}

/// Regression: on SQLite only a run's end was fenced by its owner. A
/// `flow run` stopped (SIGSTOP) during its second step while `flow cancel`
/// ran, then continued, wrote that step's record into the cancelled run
/// and sent the third step to the model.
#[test]
fn a_run_cancelled_while_its_process_was_stopped_gets_nothing_more() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime.block_on(FakeLlm::start(
        vec![],
        json!({ "text": "fine" }),
        Duration::from_millis(300),
    ));
    let dir = TempDir::new("cancel-stopped");
    let flow = Path::new(env!("CARGO_BIN_EXE_flow"));
    let (mut child, run) = running(&dir, &server, 2);
    signal(child.id(), "STOP");
    let cancelled = run_in(flow, dir.path(), &["cancel", &run]);
    assert_eq!(cancelled.code, 0, "{}", cancelled.all());
    // Past the second call's answer and the process's heartbeat: both are
    // waiting for it when it goes on.
    std::thread::sleep(Duration::from_millis(1_500));
    signal(child.id(), "CONT");
    let exited = child.wait().expect("flow exits");
    assert_eq!(exited.code(), Some(1), "a cancelled run's exit code");

    assert_eq!(
        server.requests(),
        2,
        "the third step went to the model: {:?}",
        server.prompts()
    );
    let shown = run_in(flow, dir.path(), &["show", &run, "--json"]);
    assert_eq!(shown.code, 0, "{}", shown.all());
    let trace: serde_json::Value = serde_json::from_str(&shown.stdout).expect("a trace");
    let steps: Vec<&str> = trace
        .as_array()
        .expect("the run's records")
        .iter()
        .filter_map(|record| record["path"].as_str())
        .collect();
    assert_eq!(
        steps,
        ["s1"],
        "only the step completed before the cancel: {trace}"
    );
    let runs = run_in(flow, dir.path(), &["runs", "--json"]);
    assert!(runs.stdout.contains("\"cancelled\""), "{}", runs.stdout);
}

/// A run cancelled while its step waits on the model stops at once: the
/// process's next heartbeat is refused and cuts the call. Regression (an
/// audit): the call went on until the step's timeout (a minute, with a real
/// provider's tokens spent), and only then did `flow run` say the run was
/// cancelled.
#[test]
fn a_cancel_cuts_the_call_in_flight() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime.block_on(FakeLlm::start(
        vec![],
        json!({ "text": "fine" }),
        Duration::from_secs(60),
    ));
    let dir = TempDir::new("cancel-in-flight");
    let flow = Path::new(env!("CARGO_BIN_EXE_flow"));
    let (mut child, run) = running(&dir, &server, 1);
    let waited = Instant::now();
    let cancelled = run_in(flow, dir.path(), &["cancel", &run]);
    assert_eq!(cancelled.code, 0, "{}", cancelled.all());
    // The model answers after a minute, the step's timeout is 30 s: an
    // exit before either is the cancel's.
    let exited = loop {
        if let Some(status) = child.try_wait().expect("flow's status") {
            break status;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(25),
            "flow run still waits on the cancelled run's call"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exited.code(), Some(1), "a cancelled run's exit code");
    assert_eq!(server.requests(), 1);
}
