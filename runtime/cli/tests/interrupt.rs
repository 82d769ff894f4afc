//! A `flow run` stopped during its first step (a model's seconds) by a
//! signal or a kill leaves its run for `flow recover`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flow_tests::fake_llm::{FakeLlm, Reply};
use flow_tests::{TempDir, run_bounded, run_in};
use serde_json::json;

const WORKFLOW: &str = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string, score: int }
  prompt "Answer {{input.q}}"
}
workflow w {
  input { q: string }
  step a = answer { q: workflow_input.q } retry 1 timeout 30s
  output { text: step.a.text }
}
"#;

/// `flow run --json` of `w.flow` in `dir` against `server`, once its
/// first model call has come; its output and errors piped.
fn run_until_its_first_call(dir: &TempDir, server: &FakeLlm) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_flow"))
        .args(["run", "w.flow", "--input", r#"{"q": "x"}"#, "--json"])
        .current_dir(dir.path())
        .envs(server.flow_env())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flow starts");
    let waited = Instant::now();
    while server.requests() == 0 {
        assert!(waited.elapsed() < Duration::from_secs(20), "no model call");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// Starts `flow run` against a model that answers its first call after 30 s
/// (and the next at once), stops it with `signal` once the call is out,
/// then answers what `flow run --json` printed, and what `flow runs
/// --json` and `flow recover` said.
fn stopped_during_the_first_call(signal: &str) -> (String, serde_json::Value, flow_tests::Run) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime.block_on(FakeLlm::start(
        vec![Reply::Stall(Duration::from_secs(30))],
        json!({ "text": "fine", "score": 1 }),
        Duration::ZERO,
    ));
    let dir = TempDir::new(&format!("interrupt-{signal}"));
    dir.write("w.flow", WORKFLOW);
    let env = server.flow_env();
    let flow = Path::new(env!("CARGO_BIN_EXE_flow"));
    let child = run_until_its_first_call(&dir, &server);
    let waited = Instant::now();
    // The row is committed a moment after the call goes out (a millisecond
    // and an fsync, longer on a slow disk): the kill comes once it is, as
    // it would any time in a model's seconds. Before the fix it never was.
    while !run_in(flow, dir.path(), &["runs", "--json"])
        .stdout
        .contains("run-")
    {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the run was never stored"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    flow_tests::signal(child.id(), signal);
    let printed = child.wait_with_output().expect("flow ends").stdout;
    let runs = run_in(flow, dir.path(), &["runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).expect("runs as JSON");
    let recovered = run_bounded(
        flow,
        dir.path(),
        &["recover"],
        &env,
        Duration::from_secs(60),
    );
    (
        String::from_utf8_lossy(&printed).into_owned(),
        runs,
        recovered,
    )
}

/// Regression: the run's row waited for its first step's record, so a
/// `flow run` killed (or stopped by Ctrl-C, whose message said to run
/// `flow recover`) while its first model call was out left nothing:
/// "no runs", and the call's work lost.
#[test]
fn a_run_stopped_during_its_first_call_is_left_to_recover() {
    for signal in ["KILL", "INT", "TERM"] {
        let (printed, runs, recovered) = stopped_during_the_first_call(signal);
        let runs = runs.as_array().expect("a list of runs");
        assert_eq!(runs.len(), 1, "{signal}: {runs:?}");
        assert_eq!(runs[0]["status"], "running", "{signal}: {runs:?}");
        // Regression (an audit): `--json` printed nothing when a signal
        // stopped the run, not even its id; now the run's record, as for
        // any end (a kill leaves no chance to print).
        if signal != "KILL" {
            let record: serde_json::Value =
                serde_json::from_str(&printed).expect("one record as JSON");
            assert_eq!(
                (&record["run_id"], &record["status"]),
                (&runs[0]["run_id"], &json!("running")),
                "{signal}: {printed}"
            );
        }
        assert_eq!(recovered.code, 0, "{signal}: {}", recovered.all());
        assert!(
            recovered.all().contains("completed"),
            "{signal}: {}",
            recovered.all()
        );
    }
}

/// Regression (an audit): a `flow run` stopped (SIGSTOP) past its step's
/// timeout, then continued, failed the attempt as timed out though its
/// answer had come meanwhile, and with `retry 1` failed the run; with
/// retries left, the step went to the model again. A stop of the process
/// is not the model's time: the answer that waited is taken.
#[test]
fn a_run_stopped_past_its_steps_timeout_takes_the_answer_that_waited() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime.block_on(FakeLlm::start(
        vec![],
        json!({ "text": "fine", "score": 1 }),
        Duration::from_millis(200),
    ));
    let dir = TempDir::new("stopped-past-timeout");
    dir.write(
        "w.flow",
        WORKFLOW.replace("retry 1 timeout 30s", "retry 1 timeout 2s"),
    );
    let child = run_until_its_first_call(&dir, &server);
    flow_tests::signal(child.id(), "STOP");
    std::thread::sleep(Duration::from_secs(4));
    flow_tests::signal(child.id(), "CONT");
    let ended = child.wait_with_output().expect("flow ends");
    let printed = String::from_utf8_lossy(&ended.stdout);
    assert_eq!(
        ended.status.code(),
        Some(0),
        "{printed}{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    assert_eq!(server.requests(), 1, "the step went to the model again");
}
