//! End-to-end tests of the `flow` binary on the examples: every example runs
//! to completion with the offline provider, or parks and completes after
//! `flow approve`; exit codes and the `--json` run record are the interface.

use flow_tests::mcp_servers::{PageServer, local_examples};
use std::path::Path;
use std::time::Duration;

use flow_tests::{Run, TempDir, flow_path, flowc_path, root, run_bounded, run_in};
use serde_json::Value;

fn flow(dir: &TempDir, args: &[&str]) -> Run {
    run_in(&flow_path(), dir.path(), args)
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.all()))
}

#[test]
fn every_example_completes_after_flow_approve() {
    // The browser steps run for real, on loopback pages (see flow_tests::mcp_servers).
    flow_tests::require!(McpServers, Chromium);
    let pages = PageServer::start();
    let copy = TempDir::new("flow-examples");
    let examples = local_examples(copy.path(), &pages.base);
    let mut names: Vec<String> = std::fs::read_dir(&examples)
        .expect("examples/ exists")
        .map(|e| {
            e.expect("readable")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        // A test file (`flowc test`) declares no workflow to run.
        .filter(|n| n.ends_with(".flow") && !n.ends_with(".test.flow"))
        .collect();
    names.sort();
    assert!(names.len() >= 4);
    for name in names {
        let dir = TempDir::new("flow-run");
        let source = examples.join(&name);
        let input = examples.join(name.replace(".flow", ".input.json"));
        let mut run = flow(
            &dir,
            &[
                "run",
                source.to_str().unwrap(),
                "--input",
                input.to_str().unwrap(),
                "--json",
            ],
        );
        let mut record = json(&run);
        let run_id = record["run_id"].as_str().expect("a run id").to_string();
        let mut decisions = 0;
        while run.code == 3 {
            assert_eq!(record["status"], "pending_approval", "{name}: {record}");
            let pending = record["pending_approvals"]
                .as_array()
                .expect("pending approvals")
                .clone();
            assert!(!pending.is_empty(), "{name}");
            for approval in pending {
                let path = approval["path"].as_str().unwrap();
                let approver = approval["approvers"][0].as_str().unwrap();
                run = flow(
                    &dir,
                    &["approve", &run_id, path, "--as", approver, "--json"],
                );
                decisions += 1;
                if run.code != 3 {
                    break;
                }
            }
            record = json(&run);
            assert!(decisions < 50, "{name}: keeps parking");
        }
        assert_eq!(run.code, 0, "{name}: {}", run.all());
        assert_eq!(record["status"], "completed", "{name}: {record}");
        assert!(record["output"].is_object(), "{name}: {record}");
        assert!(
            run.stderr.contains("offline provider"),
            "{name}: the offline provider says so"
        );

        // The trace lists the steps that ran, and `flow runs` the run.
        let show = flow(&dir, &["show", &run_id, "--json"]);
        assert_eq!(show.code, 0, "{}", show.all());
        let records = json(&show);
        assert!(!records.as_array().expect("records").is_empty());
        // A decision's time is an RFC 3339 UTC timestamp, as `decided_at: string` promises.
        let mut timestamps = 0;
        for record in records.as_array().unwrap() {
            if let Some(decided_at) = record["output"]["decided_at"].as_str() {
                timestamps += 1;
                let shape: String = decided_at
                    .chars()
                    .map(|c| if c.is_ascii_digit() { '0' } else { c })
                    .collect();
                assert_eq!(shape, "0000-00-00T00:00:00Z", "{name}: {decided_at}");
            }
        }
        assert_eq!(
            timestamps, decisions,
            "{name}: one decision time per decision"
        );
        let runs = flow(&dir, &["runs", "--json"]);
        assert_eq!(json(&runs)[0]["status"], "completed");
    }
}

#[test]
fn a_test_file_given_to_run_names_flowc_test() {
    let dir = TempDir::new("flow-run-test-file");
    dir.write("w.flow", "workflow w { output { x: 1 } }\n");
    dir.write(
        "w.test.flow",
        "import \"w.flow\"\ntest \"runs\" {\n  workflow w\n  expect output.x == 1\n}\n",
    );
    let run = flow(&dir, &["run", "w.test.flow"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(
        run.stderr
            .contains("w.test.flow declares no workflow: it holds tests, and `flowc test w.test.flow` runs them"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_decision_is_refused_when_it_cannot_apply() {
    let dir = TempDir::new("flow-approve");
    dir.write(
        "gate.flow",
        "workflow w { step g = approval { approvers: [\"a@x.io\"], message: \"m\" } }\n",
    );
    dir.write("in.json", "{}");
    let run = flow(&dir, &["run", "gate.flow", "--input", "in.json", "--json"]);
    assert_eq!(run.code, 3, "{}", run.all());
    let run_id = json(&run)["run_id"].as_str().unwrap().to_string();

    let wrong = flow(&dir, &["approve", &run_id, "g", "--as", "eve@x.io"]);
    assert_eq!(wrong.code, 2);
    assert!(
        wrong.stderr.contains("eve@x.io may not decide"),
        "{}",
        wrong.stderr
    );
    let unknown = flow(&dir, &["approve", &run_id, "nope", "--as", "a@x.io"]);
    assert_eq!(unknown.code, 2);
    let no_run = flow(&dir, &["approve", "run-x", "g", "--as", "a@x.io"]);
    assert_eq!(no_run.code, 2);

    // The comment's escape sequences would clear the screen and forge a
    // line of the trace.
    let forged = "no\u{1b}[2J\u{1b}[1A\nby eve@x.io: \"approved\"";
    let rejected = flow(
        &dir,
        &[
            "approve",
            &run_id,
            "g",
            "--as",
            "a@x.io",
            "--reject",
            "--comment",
            forged,
            "--json",
        ],
    );
    assert_eq!(
        rejected.code,
        1,
        "a rejection fails the run by default: {}",
        rejected.all()
    );
    // Regression: `flow show` printed a decision's comment as written.
    let shown = flow(&dir, &["show", &run_id]);
    assert!(
        !shown.stdout.contains('\u{1b}') && !shown.stdout.contains("\nby eve"),
        "{}",
        shown.stdout
    );
    assert!(shown.stdout.contains("no\\u{1b}[2J"), "{}", shown.stdout);
    // The rejection failed the run: nothing of it can be decided any more.
    let again = flow(&dir, &["approve", &run_id, "g", "--as", "a@x.io"]);
    assert_eq!(again.code, 2);
    assert!(
        again.stderr.contains("can no longer be decided"),
        "{}",
        again.stderr
    );
}

/// Regression (review): an approval past its expiry could still be approved.
#[test]
fn an_expired_approval_cannot_be_decided() {
    let dir = TempDir::new("flow-expired");
    dir.write(
        "gate.flow",
        "workflow w { step g = approval { approvers: [\"a\"], message: \"m\", expires: 10ms, on_expire: \"fail\" } }\n",
    );
    dir.write("in.json", "{}");
    let run = flow(&dir, &["run", "gate.flow", "--input", "in.json", "--json"]);
    assert_eq!(run.code, 3, "{}", run.all());
    let run_id = json(&run)["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let late = flow(&dir, &["approve", &run_id, "g", "--as", "a"]);
    assert_eq!(late.code, 2, "{}", late.all());
    assert!(late.stderr.contains("has expired"), "{}", late.stderr);
    // Regression (an audit): it did not say what resumes the run here.
    assert!(
        late.stderr.contains("`flow recover --db"),
        "{}",
        late.stderr
    );
    // Regression (an audit): the expired gate was listed and shown with
    // the commands that decide it, which are refused.
    let listed = flow(&dir, &["approvals"]);
    assert!(
        listed.stdout.contains("no approval is waiting"),
        "{}",
        listed.all()
    );
    assert!(listed.stderr.contains("flow recover"), "{}", listed.all());
    let shown = flow(&dir, &["show", &run_id]);
    assert!(shown.stdout.contains("expired"), "{}", shown.stdout);
    assert!(!shown.stdout.contains("flow approve"), "{}", shown.stdout);
    let recovered = flow(&dir, &["recover", "--json"]);
    assert_eq!(
        recovered.code,
        1,
        "the expiry fails the run: {}",
        recovered.all()
    );
}

/// Regression: a `--db` naming no file (a typo) left an empty store
/// behind; a listing of it lists nothing, a command about a run says that
/// no store is there.
#[test]
fn a_db_that_names_no_file_is_not_created() {
    let dir = TempDir::new("flow-no-store");
    let runs = flow(&dir, &["runs", "--db", "typo.db"]);
    assert_eq!(runs.code, 0, "{}", runs.all());
    assert!(runs.stdout.contains("no runs"), "{}", runs.all());
    // Said on stderr, where a typo is noticed and a script's reading is not.
    assert!(
        runs.stderr.contains("no store at typo.db: nothing to list"),
        "{}",
        runs.all()
    );
    let show = flow(&dir, &["show", "--last", "--db", "typo.db"]);
    assert_eq!(show.code, 2, "{}", show.all());
    assert!(
        show.stderr.contains("no store at typo.db"),
        "{}",
        show.all()
    );
    // What lists a store's contents lists none; what is about one item
    // says there is no store.
    for listing in [
        &["approvals", "--db", "typo.db"][..],
        &["notifications", "--db", "typo.db"],
        &["kb", "list", "--db", "typo.db"],
        &["kb", "search", "refund", "--db", "typo.db"],
        &["recover", "--db", "typo.db"],
    ] {
        let listed = flow(&dir, listing);
        assert_eq!(listed.code, 0, "{listing:?}: {}", listed.all());
    }
    let document = flow(&dir, &["kb", "show", "notes/a", "--db", "typo.db"]);
    assert_eq!(document.code, 2, "{}", document.all());
    assert!(
        document.stderr.contains("no store at typo.db"),
        "{}",
        document.all()
    );
    assert!(!dir.path().join("typo.db").exists(), "nothing was made");
}

/// A gate waits since it opened: a run parked at two gates parks again as
/// one is decided, and the other still says when it opened (regression, an
/// audit: "waiting since" became the time of the other decision).
#[test]
fn a_gate_waits_since_it_opened_when_another_is_decided() {
    let dir = TempDir::new("flow-waiting-since");
    let source = root().join("examples/content_pipeline.flow");
    let input = root().join("examples/content_pipeline.input.json");
    let parked = flow(
        &dir,
        &[
            "run",
            source.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
    );
    assert_eq!(parked.code, 3, "{}", parked.all());
    let gates = |dir: &TempDir| json(&flow(dir, &["approvals", "--json"]));
    let before = gates(&dir);
    let list = before.as_array().expect("a list of gates");
    assert!(list.len() >= 2, "{before}");
    let opened = |gates: &Value, path: &str| {
        gates
            .as_array()
            .unwrap()
            .iter()
            .find(|gate| gate["step_path"] == path)
            .map(|gate| gate["opened_ms"].clone())
    };
    let (first, second) = (
        list[0]["step_path"].as_str().unwrap().to_string(),
        list[1]["step_path"].as_str().unwrap().to_string(),
    );
    let waiting_since = opened(&before, &second).expect("the second gate");
    assert!(waiting_since.as_u64().is_some(), "{before}");
    let run_id = list[0]["run_id"].as_str().unwrap();
    let decided = flow(
        &dir,
        &["approve", run_id, &first, "--as", "dana.whitfield@acme.io"],
    );
    assert_eq!(decided.code, 3, "{}", decided.all());
    let after = gates(&dir);
    assert_eq!(opened(&after, &second), Some(waiting_since), "{after}");
}

/// Regression (an audit): `flow cancel RUN --db postgres://...` said "no
/// store at postgres://..."; a PostgreSQL store is a flowd's, driven
/// through it.
#[test]
fn a_db_that_is_a_postgres_url_leads_to_flowd() {
    let dir = TempDir::new("flow-db-url");
    for command in [
        &[
            "cancel",
            "run-1",
            "--db",
            "postgres://flow@db.internal/flow",
        ][..],
        &["runs", "--db", "POSTGRESQL://127.0.0.1:5432/test"],
    ] {
        let refused = flow(&dir, command);
        assert_eq!(refused.code, 2, "{command:?}: {}", refused.all());
        assert!(
            refused.stderr.contains("open a SQLite file")
                && refused.stderr.contains("flow --server URL --api-key KEY"),
            "{command:?}: {}",
            refused.all()
        );
    }
}

#[test]
fn a_mismatched_input_is_refused_with_every_mismatch() {
    let dir = TempDir::new("flow-input");
    let source = root().join("examples/support_triage.flow");
    dir.write("in.json", r#"{ "ticket_id": 7, "subject": "s" }"#);
    let run = flow(
        &dir,
        &[
            "run",
            source.to_str().unwrap(),
            "--input",
            "in.json",
            "--json",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.all());
    let message = json(&run)["error"]["message"].as_str().unwrap().to_string();
    for field in ["/ticket_id", "/body", "/customer"] {
        assert!(message.contains(field), "{field} in {message}");
    }
    let bad_json = flow(
        &dir,
        &["run", source.to_str().unwrap(), "--input", "missing.json"],
    );
    assert_eq!(bad_json.code, 2);
    // An empty `--input ""` (a shell variable left unset) says so, rather
    // than "--input : no such file".
    let empty = flow(&dir, &["run", source.to_str().unwrap(), "--input", ""]);
    assert_eq!(empty.code, 2, "{}", empty.all());
    assert!(empty.stderr.contains("--input is empty"), "{}", empty.all());
}

/// `flow run FILE.flow` reads sources as flowc does: an import out of the
/// file's folder is refused (E119) before anything is read, so the secret
/// in the environment never shows, and nothing runs; `--root` widens the
/// project.
#[test]
fn flow_run_refuses_an_import_outside_the_project() {
    let dir = TempDir::new("flow-confined");
    dir.write("shared.flow", "type Note = string\n");
    dir.write(
        "project/main.flow",
        "import \"/proc/self/environ\"\nimport \"../shared.flow\"\n\nworkflow w {\n  input { note: Note }\n  output { note: workflow_input.note }\n}\n",
    );
    dir.write("in.json", r#"{ "note": "hi" }"#);
    let secret = format!("flow-run-secret-{}", std::process::id());
    let run = run_bounded(
        &flow_path(),
        dir.path(),
        &["run", "project/main.flow", "--input", "in.json"],
        &[("CI_SECRET", secret.as_str())],
        Duration::from_secs(20),
    );
    assert_eq!(run.code, 1, "{}", run.all());
    assert!(
        run.stderr
            .contains("project/main.flow:1:8: error E119: cannot import `/proc/self/environ`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("`flow run --root DIR`"),
        "{}",
        run.stderr
    );
    assert!(!run.all().contains(&secret), "{}", run.all());
    assert!(!dir.path().join("flow.db").exists(), "nothing ran");

    dir.write(
        "project/main.flow",
        "import \"../shared.flow\"\n\nworkflow w {\n  input { note: Note }\n  output { note: workflow_input.note }\n}\n",
    );
    let wider = flow(
        &dir,
        &[
            "run",
            "project/main.flow",
            "--root",
            ".",
            "--input",
            "in.json",
        ],
    );
    assert_eq!(wider.code, 0, "{}", wider.all());
}

/// A workflow of `steps` recipe steps in a row (`chain.flow`, input
/// `in.json`) against a fake model that answers each call in 150 ms, and
/// `flow` commands in its folder that use that model.
struct Chain {
    server: flow_tests::fake_llm::FakeLlm,
    dir: TempDir,
    _runtime: tokio::runtime::Runtime,
}

impl Chain {
    fn new(name: &str, steps: usize) -> Chain {
        let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let server = runtime.block_on(flow_tests::fake_llm::FakeLlm::start(
            vec![],
            serde_json::json!({ "text": "t", "score": 1 }),
            std::time::Duration::from_millis(150),
        ));
        let dir = TempDir::new(name);
        let mut source = String::from(
            "recipe answer { model \"default\" input { q: string } output { text: string, score: int } prompt \"{{input.q}}\" }\nworkflow chain {\n",
        );
        for i in 0..steps {
            source.push_str(&format!("  step s{i} = answer {{ q: \"step {i}\" }}\n"));
        }
        source.push_str(&format!(
            "  output {{ last: step.s{}.text }}\n}}\n",
            steps - 1
        ));
        dir.write("chain.flow", source);
        dir.write("in.json", "{}");
        Chain {
            server,
            dir,
            _runtime: runtime,
        }
    }

    /// Waits (30 s at most) until the model has had `calls` calls.
    fn await_calls(&self, calls: usize, what: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.server.requests() < calls {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn flow(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(flow_path());
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("FLOW_LLM_BASE_URL", &self.server.url)
            .env("FLOW_LLM_MODEL", "fake");
        command
    }
}

/// A `flow` process killed (SIGKILL) in the middle of a run against a real
/// HTTP provider: `flow recover` completes the run, and the provider sees each
/// completed step's call exactly once; only the step in flight may run twice.
#[test]
fn a_killed_run_resumes_without_repeating_completed_steps() {
    use std::process::Stdio;

    let chain = Chain::new("flow-crash", 8);
    let (server, flow) = (&chain.server, |args: &[&str]| chain.flow(args));
    let mut child = flow(&["run", "chain.flow", "--input", "in.json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("flow starts");
    chain.await_calls(4, "the run did not reach its fourth step");
    child.kill().expect("SIGKILL");
    child.wait().expect("the child is reaped");

    // Regression: a shell without the provider's settings finished the run
    // with the offline provider's made-up answers, `completed`.
    let offline = std::process::Command::new(flow_path())
        .args(["recover", "--json"])
        .current_dir(chain.dir.path())
        .env_remove("FLOW_LLM_BASE_URL")
        .output()
        .expect("flow recover runs");
    let said = String::from_utf8_lossy(&offline.stderr);
    assert_eq!(offline.status.code(), Some(2), "{said}");
    assert!(
        said.contains("began with the `openai` provider, and none is configured here"),
        "{said}"
    );

    let recovered = flow(&["recover", "--json"])
        .output()
        .expect("flow recover runs");
    assert_eq!(
        recovered.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&recovered.stderr)
    );
    let record: Value = serde_json::from_slice(&recovered.stdout).expect("the run record");
    assert_eq!(record["status"], "completed", "{record}");

    let prompts = server.prompts();
    let mut repeated = 0;
    for i in 0..8 {
        let calls = prompts
            .iter()
            .filter(|p| **p == format!("step {i}"))
            .count();
        assert!(
            (1..=2).contains(&calls),
            "step {i} was called {calls} times: {prompts:?}"
        );
        repeated += calls - 1;
    }
    assert!(
        repeated <= 1,
        "only the step in flight may run again: {prompts:?}"
    );
}

/// Regression: a run cancelled by another process (`flow cancel`, flowd)
/// while `flow run` drove it ended that process with exit 2 and "the run
/// was cancelled or taken over by another process"; it is reported as
/// cancelled, a run that did not complete (exit 1).
#[test]
fn a_run_cancelled_meanwhile_is_reported_cancelled() {
    use std::process::Stdio;

    let chain = Chain::new("flow-cancelled", 8);
    let flow = |args: &[&str]| chain.flow(args);
    let child = flow(&["run", "chain.flow", "--input", "in.json", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flow starts");
    chain.await_calls(2, "the run did not start");
    let listed = flow(&["runs", "--json"]).output().expect("flow runs");
    let runs: Value = serde_json::from_slice(&listed.stdout).expect("runs as JSON");
    let run_id = runs[0]["run_id"].as_str().expect("the run is listed");
    let cancelled = flow(&["cancel", run_id]).output().expect("flow cancel");
    assert_eq!(cancelled.status.code(), Some(0));
    let ended = child.wait_with_output().expect("flow exits");
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert_eq!(ended.status.code(), Some(1), "{stderr}");
    let record: Value = serde_json::from_slice(&ended.stdout).expect("the run record");
    assert_eq!(
        (record["run_id"].as_str(), record["status"].as_str()),
        (Some(run_id), Some("cancelled")),
        "{record}"
    );
}

/// A loop of approvals, one per item: a run parks at each iteration's.
const LOOPED_APPROVALS: &str = r#"workflow looped {
  input { texts: list<string> }
  for workflow_input.texts as each {
    step check = approval { approvers: ["lead@example.com"] message: "{{loop_item}}?" }
  }
  output { checks: step.each }
}
"#;

/// Regression: `flow show` of a run cancelled while parked in a loop's
/// second iteration showed its gate `pending`, with the `flow approve`
/// commands that the cancel refuses and a wait that grew for ever, and
/// the loop `completed`, as the worst of its steps so far. The gate is
/// undecided, the loop cancelled with the run.
#[test]
fn a_cancelled_runs_trace_offers_no_decision() {
    let dir = TempDir::new("flow-show-cancelled");
    dir.write("looped.flow", LOOPED_APPROVALS);
    let started = flow(
        &dir,
        &[
            "run",
            "looped.flow",
            "--input",
            r#"{"texts": ["a", "b"]}"#,
            "--json",
        ],
    );
    let run = json(&started)["run_id"].as_str().unwrap().to_string();
    let first = flow(
        &dir,
        &["approve", &run, "each[0]/check", "--as", "lead@example.com"],
    );
    assert_eq!(first.code, 3, "{}", first.all());
    assert_eq!(flow(&dir, &["cancel", &run]).code, 0);
    let shown = flow(&dir, &["show", &run]);
    assert_eq!(shown.code, 0, "{}", shown.all());
    let lines: Vec<&str> = shown.stdout.lines().collect();
    let row = |name: &str| {
        lines
            .iter()
            .find(|line| line.contains(name))
            .copied()
            .unwrap_or_default()
    };
    assert!(row("each ").contains("cancelled"), "{}", shown.stdout);
    assert!(
        lines
            .iter()
            .any(|line| line.contains("undecided") && line.contains("the run is cancelled")),
        "{}",
        shown.stdout
    );
    assert!(!shown.stdout.contains("flow approve"), "{}", shown.stdout);
}

/// Regression (issue 13): after Ctrl-C or SIGTERM a run stayed `running`,
/// with no hint, and `flow runs` could not tell it from a live one. Now
/// `flow` gives the run up, says how to resume it, and exits 130 (143 for
/// SIGTERM); `flow runs` shows it interrupted; `flow recover` completes it.
#[test]
fn an_interrupted_run_says_how_to_resume_and_resumes() {
    use std::process::Stdio;

    let chain = Chain::new("flow-interrupt", 6);
    let (server, flow) = (&chain.server, |args: &[&str]| chain.flow(args));
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let child = flow(&["run", "chain.flow", "--input", "in.json"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("flow starts");
        chain.await_calls(server.requests() + 2, "the run did not start");
        flow_tests::signal(child.id(), signal);
        let stopped = child.wait_with_output().expect("flow exits");
        let stderr = String::from_utf8_lossy(&stopped.stderr);
        assert_eq!(stopped.status.code(), Some(code), "{stderr}");
        assert!(
            stderr.contains("stopped before it ended") && stderr.contains("flow recover --db"),
            "{stderr}"
        );
    }

    let listed = flow(&["runs", "--json"]).output().expect("flow runs");
    let runs: Value = serde_json::from_slice(&listed.stdout).expect("the runs");
    let runs = runs.as_array().expect("a list");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs.iter()
            .all(|run| run["status"] == "running" && run["interrupted"] == true),
        "{runs:?}"
    );
    let human = flow(&["runs"]).output().expect("flow runs");
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("running (interrupted)"),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    let recovered = flow(&["recover", "--json"])
        .output()
        .expect("flow recover runs");
    assert_eq!(
        recovered.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&recovered.stderr)
    );
    let listed = flow(&["runs", "--json"]).output().expect("flow runs");
    let runs: Value = serde_json::from_slice(&listed.stdout).expect("the runs");
    assert!(
        runs.as_array()
            .expect("a list")
            .iter()
            .all(|run| run["status"] == "completed" && run["interrupted"] == false),
        "{runs}"
    );
}

/// A plan edited after `flowc build`, or written by a flowc of another format
/// version, is refused before anything runs or is stored.
#[test]
fn a_changed_or_foreign_plan_is_refused() {
    let dir = TempDir::new("flow-plan");
    dir.write(
        "w.flow",
        "workflow w {\n  input { q: string }\n  step g = approval { approvers: [\"a@x.io\"], message: \"{{workflow_input.q}}\" }\n}\n",
    );
    dir.write("in.json", r#"{ "q": "go?" }"#);
    let build = run_in(
        &flowc_path(),
        dir.path(),
        &["build", "w.flow", "-o", "w.json"],
    );
    assert_eq!(build.code, 0, "{}", build.all());
    let built = dir.read("w.json");
    let run = flow(&dir, &["run", "w.json", "--input", "in.json", "--json"]);
    assert_eq!(run.code, 3, "the plan as built runs: {}", run.all());

    dir.write("changed.json", built.replace("a@x.io", "eve@x.io"));
    let changed = flow(&dir, &["run", "changed.json", "--input", "in.json"]);
    assert_eq!(changed.code, 2, "{}", changed.all());
    assert!(
        changed.stderr.contains("changed.json")
            && changed.stderr.contains("does not match its hash"),
        "{}",
        changed.stderr
    );

    let mut foreign: Value = serde_json::from_str(&built).expect("the plan is JSON");
    foreign["format_version"] = 99.into();
    dir.write("foreign.json", foreign.to_string());
    let refused = flow(&dir, &["run", "foreign.json", "--input", "in.json"]);
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused
            .stderr
            .contains("format version 99 is not supported"),
        "{}",
        refused.stderr
    );
    let runs = flow(&dir, &["runs", "--json"]);
    assert_eq!(
        json(&runs).as_array().map(Vec::len),
        Some(1),
        "only the plan as built made a run"
    );
}

/// The offline provider's answers depend on the input, the step's path,
/// the recipe and `--seed`, never on the run id: two runs of one input end
/// alike (this test and `a_closed_stdout_ends_flow_quietly` counted on a
/// run id that kept support_triage away from its refund gate, and once in
/// a while it parked there), and other seeds give other answers.
#[test]
fn offline_runs_of_one_input_answer_alike_and_seeds_vary_them() {
    let dir = TempDir::new("flow-offline-seed");
    let output = |seed: &str| {
        let record = json(&run_support_triage(&dir, &["--json", "--seed", seed]));
        (record["status"].clone(), record["output"].clone())
    };
    let first = output("0");
    assert_eq!(first.0, "completed");
    assert_eq!(output("0"), first);
    let others: Vec<_> = ["1", "2", "3"].into_iter().map(output).collect();
    assert!(others.iter().any(|other| other != &first), "{others:?}");
}

/// `flow run` of the support_triage example with its input file, in `dir`,
/// which must complete.
fn run_support_triage(dir: &TempDir, args: &[&str]) -> Run {
    let example = root().join("examples/support_triage.flow");
    let input = root().join("examples/support_triage.input.json");
    let mut all = vec![
        "run",
        example.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let run = flow(dir, &all);
    assert_eq!(run.code, 0, "{}", run.all());
    run
}

/// Regression: `flow ... | head` panicked ("failed printing to stdout") when
/// the reader closed the pipe; it now ends as a process killed by SIGPIPE.
#[test]
fn a_closed_stdout_ends_flow_quietly() {
    let dir = TempDir::new("flow-closed-stdout");
    for _ in 0..3 {
        run_support_triage(&dir, &[]);
    }
    let run =
        flow_tests::run_with_stdout_closed(&flow_path(), dir.path(), &["runs", "--db", "flow.db"]);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(run.code, 141, "{}", run.stderr);
}

/// `flow run` runs what its file declares (the person runs their own file),
/// but says first which commands it starts, naming `env` variables and not
/// their values; `--no-mcp-from-file` starts nothing a file declares, for CI
/// jobs that run files from pull requests.
#[test]
fn flow_run_names_the_commands_it_starts_and_can_refuse_them() {
    let dir = TempDir::new("flow-mcp-from-file");
    let touched = dir.path().join("started");
    dir.write(
        "tool.flow",
        format!(
            "mcp tool {{ command \"sh\" args [\"-c\", \"touch {}\"] env {{ TOKEN: \"s3cret-value\" }} }}\n\
             workflow w {{\n  step a = tool.anything {{}} retry 1\n  output {{ ok: true }}\n}}\n",
            touched.display()
        ),
    );
    dir.write("input.json", "{}");

    let refused = flow(
        &dir,
        &[
            "run",
            "tool.flow",
            "--input",
            "input.json",
            "--no-mcp-from-file",
        ],
    );
    assert_eq!(refused.code, 1, "{}", refused.all());
    assert!(
        refused
            .all()
            .contains("no MCP server `tool` is configured here"),
        "{}",
        refused.all()
    );
    assert!(!touched.exists(), "the file's command ran");

    let announced = flow(&dir, &["run", "tool.flow", "--input", "input.json"]);
    let stderr = &announced.stderr;
    let line = format!(
        "flow: MCP server `tool` starts sh -c 'touch {}' (environment: TOKEN)",
        touched.display()
    );
    assert!(stderr.contains(&line), "{stderr}");
    assert!(
        !announced.all().contains("s3cret-value"),
        "{}",
        announced.all()
    );
    assert!(
        touched.exists(),
        "without the flag the declared command runs"
    );
}

/// Regression (issue 13): `flow run` took a 50 MB input, sent it to the
/// model and stored it three times. An input over the bound (2 MiB by
/// default, `--max-input-bytes`) is refused before anything is stored.
#[test]
fn an_input_over_the_bound_is_refused_before_anything_runs() {
    let dir = TempDir::new("flow-big-input");
    dir.write(
        "w.flow",
        "workflow w {\n  input { text: string }\n  output { n: 1 }\n}\n",
    );
    let big = format!("{{\"text\": \"{}\"}}", "x".repeat(3 * 1024 * 1024));
    dir.write("big.json", &big);
    let refused = flow(&dir, &["run", "w.flow", "--input", "big.json"]);
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused.stderr.contains("--max-input-bytes"),
        "{}",
        refused.stderr
    );
    assert!(!dir.path().join("flow.db").exists(), "nothing was stored");
    let allowed = flow(
        &dir,
        &[
            "run",
            "w.flow",
            "--input",
            "big.json",
            "--max-input-bytes",
            "4000000",
        ],
    );
    assert_eq!(allowed.code, 0, "{}", allowed.all());
}

/// What changes from one run to the next, replaced so that a snapshot
/// holds: the run ids given (`<run1>`...), RFC 3339 times (`<time>`),
/// durations as `flow` writes them (`<dur>`) and plan hashes.
fn normalised(text: &str, runs: &[&str]) -> String {
    let mut text = text.to_string();
    for (i, run) in runs.iter().enumerate() {
        text = text.replace(run, &format!("<run{}>", i + 1));
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let two_digits = |s: &str| s.len() == 2 && digits(s);
    let is_duration = |t: &str| {
        let split = |unit: &str, inner: char| {
            t.strip_suffix(unit)
                .and_then(|body| body.split_once(inner))
                .is_some_and(|(a, b)| {
                    digits(a) && (two_digits(b) || (inner == '.' && b.len() == 1 && digits(b)))
                })
        };
        t.strip_suffix("ms").is_some_and(digits)
            || split("s", '.')
            || split("s", 'm')
            || split("m", 'h')
            || split("h", 'd')
    };
    let is_time = |t: &str| {
        let shape: String = t
            .chars()
            .map(|c| if c.is_ascii_digit() { '0' } else { c })
            .collect();
        shape == "0000-00-00T00:00:00Z"
    };
    text.lines()
        .map(|line| {
            line.split(' ')
                .map(|token| {
                    let core = token.trim_matches(|c: char| "(),:\"".contains(c));
                    if core.starts_with("sha256:") {
                        token.replace(core, "sha256:<hash>")
                    } else if is_time(core) {
                        token.replace(core, "<time>")
                    } else if is_duration(core) {
                        token.replace(core, "<dur>")
                    } else {
                        token.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A workflow of every nesting `flow show` draws: a retried step, a loop,
/// a parallel, a handoff, a KB write, an approval rejected without failing
/// the run and one left pending.
const TRIAGE: &str = r#"type Item = { name: string }
recipe answer { model "default" input { q: string } output { text: string } prompt "{{input.q}}" }
workflow triage {
  input { items: list<Item> }
  step classify = answer { q: "classify" } retry 3 backoff 10ms..20ms
  for workflow_input.items as scans {
    step page = answer { q: "{{loop_item.name}}" }
  }
  parallel lookups {
    branch crm { step account = answer { q: "crm" } }
    branch billing { step invoices = answer { q: "billing" } }
  }
  step note = handoff "tier2" { message: "look at {{step.classify.text}}" }
  step save = kb_write "resolutions" { title: "Ticket 1", content: "The router firmware was reset.\nThen it worked." }
  step refund = approval { approvers: ["ana@acme.io"], message: "Refund?", on_reject: "continue" }
  step legal = approval { approvers: ["lee@acme.io", "legal"], message: "Legal ok?" }
  output { text: step.classify.text }
}
"#;

/// `flow show` (issue 17): a header, then a tree that nests as the
/// workflow does, with each step's kind, status, time and attempts (their
/// error classes); a rejected approval says `rejected` and who decided, a
/// pending one the command that decides it, naming the store; `--output`
/// adds outputs; `--last`; `--json` keeps its records, versioned.
#[test]
fn flow_show_draws_the_trace_as_a_tree() {
    use flow_tests::fake_llm::{FakeLlm, Reply};
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = runtime.block_on(FakeLlm::start(
        vec![Reply::Answer(429, vec![], "slow down".into())],
        serde_json::json!({ "text": "t" }),
        Duration::ZERO,
    ));
    let dir = TempDir::new("flow-show");
    dir.write("triage.flow", TRIAGE);
    let flow = |args: &[&str]| {
        run_bounded(
            &flow_path(),
            dir.path(),
            args,
            &[
                ("FLOW_LLM_BASE_URL", server.url.as_str()),
                ("FLOW_LLM_MODEL", "fake"),
            ],
            Duration::from_secs(60),
        )
    };
    let input = r#"{"items": [{"name": "a"}, {"name": "b"}]}"#;
    let run = flow(&["run", "triage.flow", "--input", input, "--db", "runs.db"]);
    assert_eq!(run.code, 3, "{}", run.all());
    let last = flow(&["runs", "--db", "runs.db", "--json"]);
    let run_id = json(&last)[0]["run_id"].as_str().unwrap().to_string();
    assert!(
        run.stdout.contains(&format!(
            "flow approve {run_id} refund --as ana@acme.io --db runs.db"
        )),
        "the hint names the store: {}",
        run.stdout
    );
    let rejected = flow(&[
        "approve",
        &run_id,
        "refund",
        "--as",
        "ana@acme.io",
        "--reject",
        "--comment",
        "too much",
        "--db",
        "runs.db",
    ]);
    assert_eq!(rejected.code, 3, "{}", rejected.all());

    let shown = flow(&["show", &run_id, "--db", "runs.db"]);
    assert_eq!(shown.code, 0, "{}", shown.all());
    // The fake model's port changes from run to run.
    let shown = shown.stdout.replace(&server.url, "<llm>");
    insta::assert_snapshot!("show_parked", normalised(&shown, &[&run_id]));

    let approved = flow(&[
        "approve", &run_id, "legal", "--as", "legal", "--db", "runs.db",
    ]);
    assert_eq!(approved.code, 0, "{}", approved.all());
    let last = flow(&["show", "--last", "--output", "--db", "runs.db"]);
    assert_eq!(last.code, 0, "{}", last.all());
    let last = last.stdout.replace(&server.url, "<llm>");
    insta::assert_snapshot!("show_completed_with_outputs", normalised(&last, &[&run_id]));

    let records = json(&flow(&["show", &run_id, "--db", "runs.db", "--json"]));
    let records = records.as_array().expect("the records, as before");
    assert!(
        records
            .iter()
            .all(|r| r["trace_version"] == 1 && r["path"].is_string())
    );
    let classify = records.iter().find(|r| r["path"] == "classify").unwrap();
    assert_eq!(classify["attempts"].as_array().map(Vec::len), Some(2));
}

/// `flow runs` (issue 17): times, workflow, status as every other place
/// spells it, newest first; `--status`, `--workflow`, `--limit`.
#[test]
fn flow_runs_lists_and_filters() {
    let dir = TempDir::new("flow-runs");
    dir.write("done.flow", "workflow done { output { ok: true } }\n");
    dir.write(
        "gate.flow",
        "workflow gate { step g = approval { approvers: [\"a@x.io\"], message: \"m\" } }\n",
    );
    assert_eq!(
        flow(&dir, &["run", "done.flow"]).code,
        0,
        "no --input for a workflow without inputs"
    );
    assert_eq!(flow(&dir, &["run", "gate.flow"]).code, 3);
    assert_eq!(flow(&dir, &["run", "done.flow"]).code, 0);
    let all = json(&flow(&dir, &["runs", "--json"]));
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 3);
    for run in all {
        for field in [
            "run_id",
            "workflow",
            "status",
            "interrupted",
            "created_ms",
            "updated_ms",
        ] {
            assert!(!run[field].is_null(), "{field} in {run}");
        }
    }
    let ids: Vec<&str> = all.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    let listed = flow(&dir, &["runs"]);
    assert_eq!(listed.code, 0);
    insta::assert_snapshot!("runs", normalised(&listed.stdout, &ids));

    let parked = json(&flow(
        &dir,
        &["runs", "--status", "pending_approval", "--json"],
    ));
    assert_eq!(parked.as_array().map(Vec::len), Some(1));
    assert_eq!(parked[0]["workflow"], "gate");
    let done = json(&flow(
        &dir,
        &["runs", "--workflow", "done", "--limit", "1", "--json"],
    ));
    assert_eq!(done.as_array().map(Vec::len), Some(1));
    assert_eq!(done[0]["run_id"], all[0]["run_id"], "newest first");
    let wrong = flow(&dir, &["runs", "--status", "parked"]);
    assert_eq!(wrong.code, 2);
    assert!(
        wrong
            .stderr
            .contains("running, pending_approval, completed, failed, cancelled"),
        "{}",
        wrong.stderr
    );
}

/// A folder holding `TRIAGE` and a store with one run of it, parked at
/// its approval, and the run's id.
fn parked_triage(name: &str) -> (TempDir, String) {
    let dir = TempDir::new(name);
    dir.write("triage.flow", TRIAGE);
    let input = r#"{"items": [{"name": "a"}]}"#;
    let run = flow(&dir, &["run", "triage.flow", "--input", input, "--json"]);
    assert_eq!(run.code, 3, "{}", run.all());
    let run_id = json(&run)["run_id"].as_str().unwrap().to_string();
    (dir, run_id)
}

/// `flow approvals`, `flow approve` with a misspelt path, `flow kb`,
/// `flow notifications` and `flow cancel` (issue 17), on one parked run.
#[test]
fn the_everyday_commands_read_the_store_flow_run_writes() {
    let (dir, run_id) = parked_triage("flow-everyday");

    let approvals = flow(&dir, &["approvals"]);
    assert_eq!(approvals.code, 0, "{}", approvals.all());
    insta::assert_snapshot!("approvals", normalised(&approvals.stdout, &[&run_id]));
    let mine = json(&flow(&dir, &["approvals", "--as", "ana@acme.io", "--json"]));
    assert_eq!(mine[0]["step_path"], "refund");
    let theirs = json(&flow(&dir, &["approvals", "--as", "eve@acme.io", "--json"]));
    assert_eq!(theirs.as_array().map(Vec::len), Some(0));

    let misspelt = flow(&dir, &["approve", &run_id, "refnd", "--as", "ana@acme.io"]);
    assert_eq!(misspelt.code, 2);
    assert!(
        misspelt.stderr.contains("did you mean `refund`?"),
        "{}",
        misspelt.stderr
    );

    let kb = flow(&dir, &["kb", "list"]);
    assert_eq!(
        kb.stdout,
        "resolutions/Ticket 1  v1  The router firmware was reset.\n"
    );
    let found = flow(&dir, &["kb", "search", "firmware", "--json"]);
    assert_eq!(json(&found)[0]["title"], "Ticket 1", "{}", found.all());
    assert_eq!(
        flow(&dir, &["kb", "search", "nothing-like-it", "--json"])
            .stdout
            .trim(),
        "[]"
    );
    let shown = flow(&dir, &["kb", "show", "resolutions/Ticket 1"]);
    assert_eq!(
        shown.stdout,
        "resolutions/Ticket 1  v1\n\nThe router firmware was reset.\nThen it worked.\n"
    );
    let missing = flow(&dir, &["kb", "show", "resolutions/Ticket"]);
    assert_eq!(missing.code, 2);
    assert!(
        missing
            .stderr
            .contains("did you mean `resolutions/Ticket 1`?"),
        "{}",
        missing.stderr
    );

    let notes = json(&flow(&dir, &["notifications", "--json"]));
    let kinds: Vec<(&str, &str)> = notes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["kind"].as_str().unwrap(), n["audience"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("approval", "ana@acme.io"), ("handoff", "tier2")]);
    let tier2 = json(&flow(&dir, &["notifications", "--to", "tier2", "--json"]));
    assert_eq!(tier2.as_array().map(Vec::len), Some(1));
    assert!(
        tier2[0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("look at offline-")),
        "{tier2}"
    );

    let cancelled = flow(&dir, &["cancel", &run_id]);
    assert_eq!(cancelled.code, 0, "{}", cancelled.all());
    assert_eq!(cancelled.stdout, format!("run {run_id} cancelled\n"));
    let again = flow(&dir, &["cancel", &run_id]);
    assert_eq!(again.code, 2);
    assert!(
        again.stderr.contains("has already ended (cancelled)"),
        "{}",
        again.stderr
    );
    assert_eq!(
        json(&flow(&dir, &["runs", "--json"]))[0]["status"],
        "cancelled"
    );
    assert_eq!(flow(&dir, &["cancel", "run-nope"]).code, 2);
}

/// A store its user may read but not write, nor the folder that holds it
/// (a service user's store, read by someone on call): the commands that
/// list and show read it and make nothing beside it, and those that write
/// say why they cannot; with the `-wal` and `-shm` a writer left beside it,
/// and with none. Regression: `flow runs` failed "attempt to write a
/// readonly database". Root may write anything, so as root the commands
/// run as `nobody`, through util-linux's setpriv.
#[test]
fn a_store_its_user_may_only_read_is_read() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, run_id) = parked_triage("flow-read-only");

    let root = run_in(Path::new("id"), dir.path(), &["-u"]).stdout.trim() == "0";
    // Where `nobody` may run it: the build's folder may be root's alone.
    let binary = dir.path().join("flow");
    std::fs::copy(flow_path(), &binary).expect("the binary can be copied");
    let reader = |args: &[&str]| -> Run {
        if !root {
            return run_in(&binary, dir.path(), args);
        }
        let mut as_nobody = vec!["--reuid=65534", "--regid=65534", "--clear-groups"];
        as_nobody.push(binary.to_str().unwrap());
        as_nobody.extend_from_slice(args);
        run_in(Path::new("setpriv"), dir.path(), &as_nobody)
    };
    let store = dir.path().join("flow.db");
    let modes = |file: u32, folder: u32| {
        for (path, mode) in [(&store, file), (&dir.path().to_path_buf(), folder)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .expect("permissions can be set");
        }
    };
    let beside = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("flow.db"))
            .collect();
        names.sort();
        names
    };
    let reads_and_refuses = || {
        let runs = reader(&["runs", "--json"]);
        assert_eq!(runs.code, 0, "{}", runs.all());
        assert_eq!(json(&runs)[0]["run_id"], run_id.as_str());
        let shown = reader(&["show", &run_id]);
        assert_eq!(shown.code, 0, "{}", shown.all());
        assert!(shown.stdout.contains("refund"), "{}", shown.stdout);
        let approvals = reader(&["approvals", "--json"]);
        assert_eq!(
            json(&approvals)[0]["step_path"],
            "refund",
            "{}",
            approvals.all()
        );
        let notes = reader(&["notifications", "--json"]);
        assert_eq!(notes.code, 0, "{}", notes.all());
        let kb = reader(&["kb", "list"]);
        assert!(
            kb.stdout.starts_with("resolutions/Ticket 1"),
            "{}",
            kb.all()
        );
        let test = reader(&["test-from", &run_id]);
        assert_eq!(test.code, 0, "{}", test.all());
        let approved = reader(&["approve", &run_id, "refund", "--as", "ana@acme.io"]);
        assert_eq!(approved.code, 2, "{}", approved.all());
        assert!(
            approved.stderr.contains("this user may not write"),
            "{}",
            approved.stderr
        );
    };

    // As a live writer keeps it: its `-wal` and `-shm` beside it, which the
    // reader may read and not write (one is held open meanwhile, so that
    // they stay).
    let writer = rusqlite::Connection::open(&store).expect("the store opens");
    writer
        .pragma_query_value(None, "user_version", |row| row.get::<_, i64>(0))
        .expect("the store reads");
    assert_eq!(beside(), ["flow.db", "flow.db-shm", "flow.db-wal"]);
    modes(0o444, 0o555);
    reads_and_refuses();
    assert_eq!(beside(), ["flow.db", "flow.db-shm", "flow.db-wal"]);
    drop(writer);

    // As a writer that ended cleanly leaves it: the last connection folded
    // its `-wal` in and removed it, and none may be made beside it.
    modes(0o644, 0o755);
    let last = rusqlite::Connection::open(&store).expect("the store opens");
    last.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("the store's `-wal` is folded in");
    drop(last);
    assert_eq!(beside(), ["flow.db"]);
    modes(0o444, 0o555);
    reads_and_refuses();
    assert_eq!(beside(), ["flow.db"]);
    // In a folder anyone may write (a review: SQLite made a `-wal` and
    // `-shm` of the reader's there, which the owner could not write).
    modes(0o444, 0o777);
    reads_and_refuses();
    assert_eq!(beside(), ["flow.db"]);

    modes(0o644, 0o755);
    assert_eq!(
        json(&flow(&dir, &["runs", "--json"]))[0]["status"],
        "pending_approval"
    );
}

/// `--input` (issue 17): a file, `-` for standard input, or JSON itself;
/// none for a workflow without inputs, and a usage error naming the fields
/// for one with.
#[test]
fn the_input_is_a_file_standard_input_or_json() {
    use std::io::Write as _;
    let dir = TempDir::new("flow-input-forms");
    dir.write(
        "echo.flow",
        "workflow echo {\n  input { note: string }\n  output { note: workflow_input.note }\n}\n",
    );
    dir.write("in.json", r#"{"note": "from a file"}"#);
    let output = |run: &Run| {
        json(run)["output"]["note"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let file = flow(&dir, &["run", "echo.flow", "--input", "in.json", "--json"]);
    assert_eq!(output(&file), "from a file", "{}", file.all());
    let inline = flow(
        &dir,
        &[
            "run",
            "echo.flow",
            "--input",
            r#"{"note": "inline"}"#,
            "--json",
        ],
    );
    assert_eq!(output(&inline), "inline", "{}", inline.all());

    let mut child = std::process::Command::new(flow_path())
        .args(["run", "echo.flow", "--input", "-", "--json"])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"note": "piped"}"#)
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    let piped: Value = serde_json::from_slice(&piped.stdout).expect("a run record");
    assert_eq!(piped["output"]["note"], "piped");

    let missing = flow(&dir, &["run", "echo.flow"]);
    assert_eq!(missing.code, 2);
    assert!(
        missing
            .stderr
            .contains("workflow `echo` takes an input (note)"),
        "{}",
        missing.stderr
    );
    let broken = flow(&dir, &["run", "echo.flow", "--input", "{nope"]);
    assert_eq!(broken.code, 2);
    assert!(
        broken.stderr.contains("--input is not JSON"),
        "{}",
        broken.stderr
    );
    let twice = flow(
        &dir,
        &[
            "run",
            "echo.flow",
            "--input",
            r#"{"note": "a", "note": "b"}"#,
        ],
    );
    assert_eq!(twice.code, 2);
    assert!(
        twice
            .stderr
            .contains("the key `note` is given twice in one object"),
        "{}",
        twice.stderr
    );
}

/// Regression (issue 17): a flowd that is not there was reported as "error
/// sending request for url"; now the host and port, the request and the
/// system's words.
#[test]
fn an_unreachable_flowd_is_named_with_what_was_tried() {
    let dir = TempDir::new("flow-unreachable");
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let run = flow(&dir, &["--server", &server, "--api-key", "k", "runs"]);
    assert_eq!(run.code, 2, "{}", run.all());
    assert!(
        run.stderr.contains(&format!(
            "cannot reach flowd at 127.0.0.1:{port} (GET {server}/v1/runs"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.to_lowercase().contains("refused"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("error sending request"),
        "{}",
        run.stderr
    );
}

/// Shell completions and man pages come from the commands' definitions
/// (issue 17), for `flow` and `flowc`; `flowd` answers `--help` and
/// `--version`.
#[test]
fn completions_man_pages_help_and_versions() {
    let dir = TempDir::new("flow-completions");
    for (binary, name) in [(flow_path(), "flow"), (flowc_path(), "flowc")] {
        for shell in ["bash", "zsh", "fish"] {
            let script = run_in(&binary, dir.path(), &["completions", shell]);
            assert_eq!(script.code, 0, "{name} {shell}: {}", script.all());
            assert!(script.stdout.contains(name), "{name} {shell}");
        }
        let bash = run_in(&binary, dir.path(), &["completions", "bash"]).stdout;
        let first = if name == "flow" { "approvals" } else { "check" };
        assert!(bash.contains(first), "{name}: {first} completes");
        let man = run_in(&binary, dir.path(), &["man", "--dir", "."]);
        assert_eq!(man.code, 0, "{}", man.all());
        assert!(
            man.stdout
                .contains(&format!("wrote {name}.1 and a page for each command")),
            "{}",
            man.all()
        );
        let page = dir.read(&format!("{name}.1"));
        assert!(page.contains(".TH"), "{name}.1 is a man page");
    }
    assert!(dir.path().join("flow-show.1").exists());
    assert!(dir.path().join("flowc-check.1").exists());

    let flowd = flow_tests::flowd_path();
    for args in [&["--help"][..], &["serve", "--help"], &["-h"]] {
        let help = run_in(&flowd, dir.path(), args);
        assert_eq!(help.code, 0, "{args:?}: {}", help.all());
        assert!(
            help.stdout.contains("Usage: flowd <COMMAND>"),
            "{}",
            help.stdout
        );
    }
    let version = run_in(&flowd, dir.path(), &["--version"]);
    assert_eq!(version.code, 0);
    assert!(version.stdout.starts_with("flowd "), "{}", version.stdout);
    let unknown = run_in(&flowd, dir.path(), &["nope"]);
    assert_eq!(unknown.code, 2);
}

/// Issue 15: `flow migrate` moves a parked run to a version where it can go
/// on (a step added after its gate), refuses one where it cannot (a step
/// added before it), and the moved run completes on the new version.
#[test]
fn a_parked_run_migrates_to_a_compatible_version() {
    let dir = TempDir::new("flow-migrate");
    let gate = "step g = approval { approvers: [\"a\"], message: \"m\" }";
    dir.write(
        "v1.flow",
        format!("workflow w {{ {gate} output {{ v: 1 }} }}\n"),
    );
    dir.write(
        "v2.flow",
        format!("workflow w {{ {gate} step after = handoff \"ops\" {{ message: \"done\" }} output {{ v: 2 }} }}\n"),
    );
    dir.write(
        "v3.flow",
        format!("workflow w {{ step before = handoff \"ops\" {{ message: \"asked\" }} {gate} output {{ v: 3 }} }}\n"),
    );
    let parked = flow(&dir, &["run", "v1.flow", "--json"]);
    assert_eq!(parked.code, 3, "{}", parked.all());
    let run_id = json(&parked)["run_id"].as_str().unwrap().to_string();

    let refused = flow(&dir, &["migrate", &run_id, "v3.flow"]);
    assert_eq!(refused.code, 1, "{}", refused.all());
    assert!(refused.stderr.contains("D006"), "{}", refused.stderr);
    let dry = flow(&dir, &["migrate", &run_id, "v2.flow", "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.all());
    let moved = flow(&dir, &["migrate", &run_id, "v2.flow"]);
    assert_eq!(moved.code, 0, "{}", moved.all());
    // Regression: a move to the plan it is on said "moved" again.
    let again = flow(&dir, &["migrate", &run_id, "v2.flow"]);
    assert_eq!(again.code, 0, "{}", again.all());
    assert!(
        again.stdout.contains("is on that version already"),
        "{}",
        again.all()
    );
    // The move is in the trace (regression: `flow show` listed no history).
    let shown = flow(&dir, &["show", &run_id]);
    assert!(
        shown.stdout.contains("moved       from plan sha256:"),
        "{}",
        shown.stdout
    );
    let done = flow(&dir, &["approve", &run_id, "g", "--as", "a", "--json"]);
    assert_eq!(done.code, 0, "{}", done.all());
    assert_eq!(json(&done)["output"]["v"], 2, "{}", done.all());
}

/// `flow run` answers, then delivers the destinations it can (a KB
/// document, once per delivery id) and says in one line each one it
/// cannot; `flow show` lists every attempt.
#[test]
fn flow_run_delivers_what_it_can_and_names_the_rest() {
    let dir = TempDir::new("flow-destinations");
    dir.write(
        "notes.flow",
        r#"workflow notes {
  input { id: string, note: string }
  deliver on completed to kb "notes" title "{{workflow_input.id}}" content output.note
  deliver on completed, failed to webhook "crm"
  deliver on completed to email ["leads"] subject "{{workflow_input.id}}" body "{{output.note}}"
  deliver on failed to kb "failures" title "{{workflow_input.id}}" content workflow_input.note
  output { note: "Noted: {{workflow_input.note}}" }
}
"#,
    );
    let run = flow(
        &dir,
        &[
            "run",
            "notes.flow",
            "--input",
            r#"{"id": "N-1", "note": "hi"}"#,
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.all());
    assert_eq!(json(&run)["output"]["note"], "Noted: hi");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|line| line.starts_with("flow: destination"))
        .collect();
    assert_eq!(
        lines,
        [
            "flow: destination 0 (kb `notes` on completed) delivered to the KB: notes/N-1 (version 1)",
            "flow: destination 1 (webhook `crm` on completed) not delivered: the local CLI has no webhook endpoints; flowd posts it",
            "flow: destination 2 (email to leads on completed) not delivered: the local CLI has no SMTP server; flowd mails it",
        ],
        "{}",
        run.all()
    );
    let document = flow(&dir, &["kb", "show", "notes/N-1"]);
    assert!(document.stdout.contains("Noted: hi"), "{}", document.all());
    let run_id = json(&run)["run_id"].as_str().unwrap().to_string();
    let shown = flow(&dir, &["show", &run_id]);
    assert!(
        shown
            .stdout
            .contains("destination 0 (kb, on completed)  delivered"),
        "{}",
        shown.all()
    );
    assert!(
        shown
            .stdout
            .contains("destination 2 (email, on completed)  not_delivered"),
        "{}",
        shown.all()
    );

    // Regression (an audit): `flow cancel` delivered nothing on cancelled.
    dir.write(
        "held.flow",
        r#"workflow held {
  input { id: string }
  deliver on cancelled to kb "cancelled" title "{{workflow_input.id}}" content "cancelled"
  step ok = approval { approvers: ["a"], message: "go?" }
}
"#,
    );
    let parked = flow(
        &dir,
        &["run", "held.flow", "--input", r#"{"id": "H-1"}"#, "--json"],
    );
    assert_eq!(parked.code, 3, "{}", parked.all());
    let held = json(&parked)["run_id"].as_str().unwrap().to_string();
    let cancel = flow(&dir, &["cancel", &held]);
    assert_eq!(cancel.code, 0, "{}", cancel.all());
    assert!(
        cancel.stderr.contains(
            "destination 0 (kb `cancelled` on cancelled) delivered to the KB: cancelled/H-1"
        ),
        "{}",
        cancel.all()
    );
}

/// `flow test-from RUN` writes a recorded run as a `test` block that
/// `flowc check` accepts and `flowc test` passes against the workflow's
/// source: an example run as it is, a run with a loop, floats, optionals
/// and an approval decided with `flow approve` whose output holds the
/// decision (regression: its `decided_at` was expected, and a test dates
/// decisions on its own clock), and a run parked in a loop's second
/// iteration (regression: the first's decision decided the second too,
/// and the test's run went on past where the run parked).
#[test]
fn a_recorded_run_becomes_a_test_that_passes() {
    let dir = TempDir::new("flow-test-from");
    for file in ["support_triage.flow", "recipes/support.flow"] {
        let text = std::fs::read_to_string(root().join("examples").join(file)).unwrap();
        dir.write(file, text);
    }
    dir.write(
        "gate.flow",
        r#"recipe score {
  model "default"
  input { text: string }
  output { level: "low" | "high", n: int, share: float, note: string? }
  prompt "Score {{input.text}}"
}
workflow gate {
  input { texts: list<string> }
  for workflow_input.texts as each {
    step rate = score { text: loop_item }
  }
  step ok = approval { approvers: ["lead@example.com"] message: "Go on?" }
  output { approved: step.ok.approved, decision: step.ok, scores: step.each }
}
"#
        .to_string()
            + LOOPED_APPROVALS,
    );
    let looped = flow(
        &dir,
        &[
            "run",
            "gate.flow",
            "--workflow",
            "looped",
            "--input",
            r#"{"texts": ["a", "b"]}"#,
            "--json",
        ],
    );
    let looped = json(&looped)["run_id"].as_str().unwrap().to_string();
    let first = flow(
        &dir,
        &[
            "approve",
            &looped,
            "each[0]/check",
            "--as",
            "lead@example.com",
        ],
    );
    assert_eq!(first.code, 3, "parks at the second: {}", first.all());
    let gated = flow(
        &dir,
        &[
            "run",
            "gate.flow",
            "--workflow",
            "gate",
            "--input",
            r#"{"texts": ["a", "b {{c}}"]}"#,
            "--json",
        ],
    );
    let gated = json(&gated)["run_id"].as_str().unwrap().to_string();
    let approved = flow(
        &dir,
        &[
            "approve",
            &gated,
            "ok",
            "--as",
            "lead@example.com",
            "--comment",
            "fine \"by me\"",
        ],
    );
    assert_eq!(approved.code, 0, "{}", approved.all());
    let example = json(&run_support_triage(&dir, &["--json"]))["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    for (run, file) in [
        (&example, "support_triage.run.test.flow"),
        (&gated, "gate.run.test.flow"),
        (&looped, "looped.run.test.flow"),
    ] {
        let written = flow(&dir, &["test-from", run, "--out", file]);
        assert_eq!(written.code, 0, "{}", written.all());
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let checked = run_in(&flowc_path(), dir.path(), &["check", file]);
        assert_eq!(checked.code, 0, "{text}\n{}", checked.all());
        let tested = run_in(&flowc_path(), dir.path(), &["test", file]);
        assert_eq!(tested.code, 0, "{text}\n{}", tested.all());
        assert!(
            tested.stdout.contains("1 test: 1 passed"),
            "{}",
            tested.all()
        );
    }
    let gate = std::fs::read_to_string(dir.path().join("gate.run.test.flow")).unwrap();
    assert!(
        gate.contains(r#"decide step.ok approve by "lead@example.com" comment "fine \"by me\"""#),
        "{gate}"
    );
    assert!(
        gate.contains("mock step.rate = {") && gate.contains(" then {"),
        "{gate}"
    );
    assert!(gate.contains(r#""b \{\{c\}\}""#), "{gate}");
    assert!(
        gate.contains("expect output.decision.approved == true")
            && !gate.contains("expect output.decision =="),
        "{gate}"
    );
    let looped = std::fs::read_to_string(dir.path().join("looped.run.test.flow")).unwrap();
    assert!(
        looped.contains(r#"decide step.check approve by "lead@example.com" then wait"#)
            && looped.contains("expect status parked"),
        "{looped}"
    );
    // The printed test is what `flow --server` answers too, from the same
    // function; the same run twice writes the same text.
    let again = flow(&dir, &["test-from", &gated]);
    assert_eq!(again.stdout.trim_end(), gate.trim_end());
}

/// A run whose input was no object failed before its first step, and no
/// test can be written from it: said in words. Regression (an audit): "the
/// test written from the run does not parse: expected `{`, found `[`".
#[test]
fn a_run_whose_input_was_no_object_gets_no_test() {
    let dir = TempDir::new("flow-test-from-list");
    let example = root().join("examples/support_triage.flow");
    let run = flow(
        &dir,
        &[
            "run",
            example.to_str().unwrap(),
            "--input",
            "[1, 2]",
            "--json",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.all());
    let id = json(&run)["run_id"].as_str().unwrap().to_string();
    let written = flow(&dir, &["test-from", &id]);
    assert_eq!(written.code, 2, "{}", written.all());
    assert!(
        written
            .stderr
            .contains("the run's input is a list, not an object"),
        "{}",
        written.all()
    );
}
