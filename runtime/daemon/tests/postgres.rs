//! flowd on PostgreSQL: `store = "postgres://...?schema=NAME"`, two flowds
//! sharing one database, and a flowd that dies while its runs are in flight
//! taken over by the one that lives (its leases run out).
//!
//! They need the server at 127.0.0.1:5432 (or `FLOW_TEST_POSTGRES_URL`);
//! each test's flowds use a schema of their own, dropped after.

mod common;

use std::time::Duration;

use common::{ACME, CONFIG, Flowd};
use flow_tests::postgres::TestSchema;
use flow_tests::{TempDir, run_in};
use reqwest::Method;
use serde_json::json;

/// The test configuration on the schema's store, plus `extra`.
fn config_on(schema: &TestSchema, extra: &str) -> String {
    format!("store = \"{}\"\n{CONFIG}{extra}", schema.url())
}

/// Deployed on one flowd, started on the other, approved over HTTP on the
/// first, completed as both see it: two flowds share one database.
#[tokio::test]
async fn two_flowds_share_deployments_runs_and_approvals() {
    flow_tests::require!(Postgres);
    let schema = TestSchema::new();
    let (dir_a, dir_b) = (TempDir::new("flowd-pg-a"), TempDir::new("flowd-pg-b"));
    let config = config_on(&schema, "");
    let a = Flowd::start_with(&dir_a, &config);
    let b = Flowd::start_with(&dir_b, &config);
    let gated = r#"workflow refund {
  step ok = approval { approvers: ["leads"], message: "Refund?" }
  output { approved: step.ok.approved, by: step.ok.approver }
}
"#;
    // A start on b right after a deploy on a runs the new version: b keeps
    // no stale copy of the deployments.
    for version in [1, 2] {
        let source = gated.replace("Refund?", &format!("Refund (v{version})?"));
        let (status, body) = a.try_deploy(ACME, json!({ "source": source })).await;
        assert_eq!(status, 201, "{body}");
        let run_id = b.start_run(ACME, json!({ "workflow": "refund" })).await;
        let parked = b.settled(&run_id, ACME).await;
        assert_eq!(parked["status"], "pending_approval", "{parked}");
        assert_eq!(
            parked["pending_approvals"][0]["message"],
            format!("Refund (v{version})?")
        );

        let gate = format!("/v1/runs/{run_id}/approvals/ok");
        let decision = json!({ "approver": "ana@acme.io", "approved": true });
        let (status, body) = a
            .send(Method::POST, &gate, Some(ACME), Some(decision.clone()))
            .await;
        assert_eq!(status, 202, "{body}");
        let done = b.settled(&run_id, ACME).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(
            done["output"],
            json!({ "approved": true, "by": "ana@acme.io" })
        );
        let (status, body) = b
            .send(Method::POST, &gate, Some(ACME), Some(decision))
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("decision_refused")),
            "decided once, whichever flowd is asked: {body}"
        );
    }
    let (_, listed) = a
        .send(Method::GET, "/v1/runs?status=completed", Some(ACME), None)
        .await;
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(a.stop(), Some(0));
    assert_eq!(b.stop(), Some(0));
}

const STEPS: usize = 6;
const RUNS: usize = 3;

/// Two flowds sharing a schema, and `RUNS` runs of a chain of `STEPS` model
/// calls (a fake model answering each in `answer_in`) started on the first
/// and under way. Fields drop in order: the flowds before their folders and
/// the schema.
struct Chains {
    /// `None` once killed.
    first: Option<Flowd>,
    second: Flowd,
    ids: Vec<String>,
    server: flow_tests::fake_llm::FakeLlm,
    _dirs: (TempDir, TempDir),
    schema: TestSchema,
}

async fn chains_under_way(name: &str, answer_in: Duration) -> Chains {
    let server = common::chain_model(answer_in).await;
    let schema = TestSchema::new();
    let config = config_on(&schema, &common::fake_model(&server.url));
    let source = common::model_chain(STEPS);
    let dirs = (
        TempDir::new(&format!("flowd-pg-{name}-first")),
        TempDir::new(&format!("flowd-pg-{name}-second")),
    );
    let first = Flowd::start_with(&dirs.0, &config);
    let second = Flowd::start_with(&dirs.1, &config);
    first.deploy(ACME, &source).await;
    let mut ids = Vec::new();
    for r in 0..RUNS {
        ids.push(
            first
                .start_run(
                    ACME,
                    json!({ "workflow": "chain", "input": { "tag": format!("run{r}") } }),
                )
                .await,
        );
    }
    server.until_requests(RUNS * 2).await;
    Chains {
        first: Some(first),
        second,
        ids,
        server,
        _dirs: dirs,
        schema,
    }
}

impl Chains {
    /// Waits for the second flowd to finish every run: the 10 s lease,
    /// then up to one 5 s sweep, then the remaining steps.
    async fn finished_by_the_second(&self) {
        for id in &self.ids {
            let record = self
                .second
                .settled_within(id, ACME, Duration::from_secs(60))
                .await;
            assert_eq!(record["status"], "completed", "{record}");
        }
    }

    /// Every step went to the model once, but the one in flight when the
    /// first flowd went away, which may have gone twice (at least once).
    fn assert_only_the_step_in_flight_ran_twice(&self) {
        let prompts = self.server.prompts();
        for r in 0..RUNS {
            let mut repeated = 0;
            for i in 0..STEPS {
                let prompt = format!("run{r} step {i}");
                let calls = prompts.iter().filter(|p| **p == prompt).count();
                assert!(
                    (1..=2).contains(&calls),
                    "{prompt} was called {calls} times"
                );
                repeated += calls - 1;
            }
            assert!(
                repeated <= 1,
                "run{r}: only the step in flight may run again"
            );
        }
    }
}

/// A flowd killed mid-run leaves its runs `running` under leases that are
/// no longer renewed; the other flowd takes them over once they run out and
/// finishes them, without asking any step that completed a second time.
#[tokio::test]
async fn a_dead_flowds_runs_are_taken_over_when_their_leases_run_out() {
    flow_tests::require!(Postgres);
    let mut chains = chains_under_way("dies", Duration::from_millis(300)).await;
    chains.first = None; // SIGKILL: its leases are never renewed again.
    assert!(
        chains.server.requests() < RUNS * STEPS,
        "the runs were still in flight when flowd was killed"
    );
    chains.finished_by_the_second().await;
    chains.assert_only_the_step_in_flight_ran_twice();
}
/// A flowd stopped (SIGTERM) lets its runs finish the steps they are in
/// and start no other, then gives them up in the store as it exits rather
/// than leave them under its leases: the other flowd takes them at its
/// next sweep, not once the leases run out, and finishes them without
/// running any step a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_flowd_hands_its_runs_over_between_two_steps() {
    flow_tests::require!(Postgres);
    // Six steps of 3 s: the stop comes during the second.
    let mut chains = chains_under_way("stopped", Duration::from_secs(3)).await;
    let first = chains.first.take().expect("started");
    let code = tokio::task::spawn_blocking(move || first.stop())
        .await
        .unwrap();
    assert_eq!(code, Some(0), "a stop is a clean exit");
    let client = flow_tests::postgres::client()
        .await
        .expect("the test database");
    assert!(
        chains.server.requests() < RUNS * STEPS,
        "the runs were still in flight when flowd stopped"
    );
    // Created by the first flowd, the runs are in their first epoch (0)
    // while it holds them; given up, they have no owner and a new epoch,
    // and a claim by the second starts another.
    let held = client
        .query(
            &format!(
                "SELECT id, status FROM {}.runs WHERE owner IS NOT NULL AND epoch = 0",
                chains.schema.name()
            ),
            &[],
        )
        .await
        .expect("the runs");
    let held: Vec<(String, String)> = held.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert!(
        held.is_empty(),
        "still under the stopped flowd's lease: {held:?}"
    );
    chains.finished_by_the_second().await;
    let prompts = chains.server.prompts();
    for r in 0..RUNS {
        for i in 0..STEPS {
            let prompt = format!("run{r} step {i}");
            let calls = prompts.iter().filter(|p| **p == prompt).count();
            assert_eq!(calls, 1, "{prompt} went to the model {calls} times");
        }
    }
}

/// Regression (issue 13): a flowd stopped with SIGSTOP past its lease, whose
/// runs another flowd took over and finished, ran their next steps again
/// once continued (every run's later steps went to the model twice). Now it
/// drops them: the step in flight at the pause may run twice (at least
/// once, as after a crash), no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flowd_paused_past_its_lease_does_not_repeat_the_new_owners_steps() {
    flow_tests::require!(Postgres);
    let chains = chains_under_way("paused", Duration::from_millis(300)).await;
    let paused = chains.first.as_ref().expect("started");
    let signal = |name: &str| flow_tests::signal(paused.child.id(), name);
    signal("STOP");
    chains.finished_by_the_second().await;
    let before_continue = chains.server.requests();
    signal("CONT");
    // Long enough for the paused flowd to run every remaining step of
    // every run, had it gone on with them.
    tokio::time::sleep(Duration::from_millis(300 * STEPS as u64 + 2_000)).await;
    chains.assert_only_the_step_in_flight_ran_twice();
    assert_eq!(
        chains.server.requests(),
        before_continue,
        "the continued flowd called the model again"
    );
    for id in &chains.ids {
        let (_, record) = chains
            .second
            .send(Method::GET, &format!("/v1/runs/{id}"), Some(ACME), None)
            .await;
        assert_eq!(record["status"], "completed", "{record}");
    }
}

/// A database that cannot be reached stops `flowd serve` with exit code 2
/// and a message that names the store without its password.
#[test]
fn an_unreachable_database_is_reported_without_its_password() {
    let dir = TempDir::new("flowd-pg-unreachable");
    dir.write(
        "flowd.toml",
        format!("store = \"postgres://flow:hunter2-secret@127.0.0.1:1/test\"\n{CONFIG}"),
    );
    let served = run_in(
        std::path::Path::new(env!("CARGO_BIN_EXE_flowd")),
        dir.path(),
        &["serve"],
    );
    assert_eq!(served.code, 2, "{}", served.all());
    assert!(
        served
            .stderr
            .contains("cannot open the store postgres://flow:***@127.0.0.1:1/test"),
        "{}",
        served.stderr
    );
    assert!(!served.all().contains("hunter2"), "{}", served.all());
}
