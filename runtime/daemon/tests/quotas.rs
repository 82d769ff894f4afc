//! Per-account quotas (issue 21): one tenant cannot hold every step, run or
//! deployment of a flowd. flowd runs as its own process; the model is a
//! fake on loopback that answers slowly, so that what is in flight at once
//! can be counted.

mod common;

use std::time::Duration;

use common::{ACME, CONFIG, Flowd, GLOBEX};
use flow_tests::TempDir;
use flow_tests::fake_llm::FakeLlm;
use reqwest::Method;
use serde_json::json;

const RECIPE: &str = "recipe answer { model \"default\" input { q: string } output { text: string } prompt \"{{input.q}}\" }\n";

/// A workflow of one step on the (slow) fake model, `slow`: each run
/// holds its place among the runs in flight for as long as the model takes.
fn slow_workflow() -> String {
    format!("{RECIPE}workflow slow {{\n  step a = answer {{ q: \"x\" }}\n}}\n")
}

/// `CONFIG` with the fake model and `acme`'s own quotas.
fn config(server: &FakeLlm, acme_quotas: &str) -> String {
    CONFIG.replace("id = \"acme\"\n", &format!("id = \"acme\"\n{acme_quotas}"))
        + &common::fake_model(&server.url)
}

/// A loop at `concurrency 20` runs at most the account's `steps_in_flight`
/// steps at once, whatever its own concurrency says.
#[tokio::test]
async fn an_accounts_steps_in_flight_bound_its_loops() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_millis(200)).await;
    let dir = TempDir::new("quota-steps");
    let flowd = Flowd::start_with(
        &dir,
        &config(&server, "steps_in_flight = 3\nllm_concurrency = 50\n"),
    );
    let source = format!(
        "{RECIPE}workflow fan {{\n  input {{ items: list<string> }}\n  for workflow_input.items as each concurrency 20 {{\n    step a = answer {{ q: loop_item }}\n  }}\n}}\n"
    );
    flowd.deploy(ACME, &source).await;
    let items: Vec<String> = (0..12).map(|i| format!("item {i}")).collect();
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "fan", "input": { "items": items } }),
        )
        .await;
    let record = flowd
        .settled_within(&run, ACME, Duration::from_secs(30))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(server.requests(), 12);
    assert_eq!(server.most_at_once(), 3, "steps at once");
}

/// Regression: a step waiting out a rate limit held its place among the
/// account's `steps_in_flight`, so that a provider limiting sixteen steps
/// stalled every other run of the account for as long as it asked. The
/// place is given back for the wait: with one place, the other branch's
/// step runs while the first waits two seconds.
#[tokio::test]
async fn a_step_waiting_to_retry_holds_no_place() {
    use flow_tests::fake_llm::Reply;
    let server = FakeLlm::start(
        vec![Reply::Answer(
            429,
            vec![("retry-after", "2")],
            "slow down".into(),
        )],
        json!({ "text": "t" }),
        Duration::from_millis(10),
    )
    .await;
    let dir = TempDir::new("quota-backoff");
    let flowd = Flowd::start_with(
        &dir,
        &config(
            &server,
            "steps_in_flight = 1
llm_concurrency = 50
",
        ),
    );
    let source = format!(
        "{RECIPE}workflow two {{\n  parallel p {{\n    branch one {{ step a = answer {{ q: \"a\" }} retry 3 backoff 1s..2s }}\n    branch two {{ step b = answer {{ q: \"b\" }} retry 3 backoff 1s..2s }}\n  }}\n}}\n"
    );
    flowd.deploy(ACME, &source).await;
    let run = flowd
        .start_run(ACME, json!({ "workflow": "two", "input": {} }))
        .await;
    let record = flowd
        .settled_within(&run, ACME, Duration::from_secs(30))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    let calls = server.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    let (limited, other) = (&calls[0], &calls[1]);
    assert_ne!(limited.prompt, other.prompt, "{calls:?}");
    assert!(
        other.at_ms < limited.at_ms + 1_000,
        "the other step went during the wait: {calls:?}"
    );
}

/// Starts sent at the same moment are held to the account's runs in
/// flight. Regression: each was checked against a count taken before any
/// of them was driven, and ten at once against a quota of 3 started five
/// (an audit).
#[tokio::test]
async fn starts_at_once_are_held_to_the_runs_in_flight() {
    // Slow enough that no run ends while the starts are answered, on a
    // loaded machine too.
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_secs(10)).await;
    let dir = TempDir::new("quota-runs-at-once");
    let flowd = Flowd::start_with(&dir, &config(&server, "runs_in_flight = 3\n"));
    flowd.deploy(ACME, &slow_workflow()).await;
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let start = flowd
            .client
            .post(format!("{}/v1/runs", flowd.url))
            .bearer_auth(ACME)
            .header("content-type", "application/json")
            .body(json!({ "workflow": "slow" }).to_string());
        starts.spawn(async move { start.send().await.unwrap().status().as_u16() });
    }
    let mut statuses = starts.join_all().await;
    statuses.sort_unstable();
    assert_eq!(statuses, [202, 202, 202, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(flowd.stop(), Some(0));
}

/// A start beyond the account's runs in flight answers 429 with
/// `Retry-After`, and another account is not held back by it.
#[tokio::test]
async fn a_start_beyond_the_runs_in_flight_is_refused_with_429() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_millis(1500)).await;
    let dir = TempDir::new("quota-runs");
    let flowd = Flowd::start_with(&dir, &config(&server, "runs_in_flight = 1\n"));
    let source = format!(
        "{RECIPE}workflow slow {{\n  step a = answer {{ q: \"x\" }}\n  output {{ text: step.a.text }}\n}}\n"
    );
    flowd.deploy(ACME, &source).await;
    flowd.deploy(GLOBEX, &source).await;
    let first = flowd.start_run(ACME, json!({ "workflow": "slow" })).await;
    let response = flowd
        .client
        .post(format!("{}/v1/runs", flowd.url))
        .bearer_auth(ACME)
        .header("content-type", "application/json")
        .body(json!({ "workflow": "slow" }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "quota_exceeded", "{body}");
    // Another account's quota is its own.
    flowd.start_run(GLOBEX, json!({ "workflow": "slow" })).await;
    let record = flowd
        .settled_within(&first, ACME, Duration::from_secs(30))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    // Room again once the run has ended (its task counts until it is gone).
    let mut started = false;
    for _ in 0..100 {
        let (status, _) = flowd
            .send(
                Method::POST,
                "/v1/runs",
                Some(ACME),
                Some(json!({ "workflow": "slow" })),
            )
            .await;
        if status == 202 {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started, "a start after the first run ended");
}

/// An account keeps at most its quota of deployed versions; deploying a
/// plan it has already deployed adds none.
#[tokio::test]
async fn deployments_beyond_the_quota_are_refused() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::ZERO).await;
    let dir = TempDir::new("quota-deployments");
    let flowd = Flowd::start_with(&dir, &config(&server, "deployments = 2\n"));
    let version = |n: usize| format!("workflow w {{\n  output {{ n: {n} }}\n}}\n");
    flowd.deploy(ACME, &version(1)).await;
    flowd.deploy(ACME, &version(2)).await;
    flowd.deploy(ACME, &version(2)).await;
    let (status, body) = flowd
        .try_deploy(ACME, json!({ "source": version(3) }))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "quota_exceeded", "{body}");
    flowd.deploy(GLOBEX, &version(3)).await;
}

/// What a tenant stores it can delete: an ended run with its trace (not
/// another account's, not a live one), a workflow's deployments (its
/// version numbers are not given again) and a KB document.
#[tokio::test]
async fn runs_deployments_and_documents_can_be_deleted() {
    let dir = TempDir::new("flowd-deletes");
    let flowd = Flowd::start(&dir);
    let source = "workflow w {\n  step k = kb_write \"notes\" { title: \"T\", content: \"words\" } retry 1\n  output { ok: true }\n}\n";
    flowd.deploy(ACME, source).await;
    let run = flowd.start_run(ACME, json!({ "workflow": "w" })).await;
    assert_eq!(flowd.settled(&run, ACME).await["status"], "completed");

    let path = format!("/v1/runs/{run}");
    let (status, body) = flowd.send(Method::DELETE, &path, Some(GLOBEX), None).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("unknown_run")));
    let (status, body) = flowd.send(Method::DELETE, &path, Some(ACME), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = flowd.send(Method::GET, &path, Some(ACME), None).await;
    assert_eq!(status, 404, "the run is gone");
    let (status, _) = flowd
        .send(Method::GET, &format!("{path}/trace"), Some(ACME), None)
        .await;
    assert_eq!(status, 404, "its trace too");

    let documents = "/v1/kb/documents?collection=notes&title=T";
    let (status, _) = flowd
        .send(Method::DELETE, documents, Some(GLOBEX), None)
        .await;
    assert_eq!(status, 404, "another account's document");
    let (status, body) = flowd
        .send(Method::DELETE, documents, Some(ACME), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = flowd
        .send(Method::DELETE, documents, Some(ACME), None)
        .await;
    assert_eq!(status, 404);

    let (status, body) = flowd
        .send(Method::DELETE, "/v1/workflows/w", Some(ACME), None)
        .await;
    assert_eq!((status, body["retired"].as_u64()), (200, Some(1)), "{body}");
    // Regression (an audit): a retired workflow's series stayed in the
    // metrics for good, which grew without bound as workflows came and went.
    let metrics = flowd.metrics().await;
    assert!(
        !metrics.contains("workflow=\"w\""),
        "the retired workflow's series: {metrics}"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "w" })),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_workflow"))
    );
    let (status, body) = flowd.try_deploy(ACME, json!({ "source": source })).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["deployments"][0]["version"], 2, "{body}");
}

/// A run that has not ended is not deleted.
#[tokio::test]
async fn a_parked_run_is_not_deleted() {
    let dir = TempDir::new("flowd-delete-parked");
    let flowd = Flowd::start(&dir);
    flowd
        .deploy(
            ACME,
            "workflow g {\n  step ok = approval { approvers: [\"ana@acme.io\"], message: \"go?\" }\n}\n",
        )
        .await;
    let run = flowd.start_run(ACME, json!({ "workflow": "g" })).await;
    assert_eq!(
        flowd.settled(&run, ACME).await["status"],
        "pending_approval"
    );
    let (status, body) = flowd
        .send(Method::DELETE, &format!("/v1/runs/{run}"), Some(ACME), None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("run_not_ended")),
        "{body}"
    );
}

/// Regression (issue 21): nothing bounded what one account stored (40
/// deploys of 1.4 MB sources grew the store by 400 MB). Past its
/// `stored_bytes`, an account's starts and deploys answer 429 and say
/// what to delete; another account is not held back.
#[tokio::test]
async fn an_account_past_its_stored_bytes_is_refused_new_data() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::ZERO).await;
    let dir = TempDir::new("quota-stored");
    let flowd = Flowd::start_with(&dir, &config(&server, "stored_bytes = 60000\n"));
    let source = format!(
        "{RECIPE}workflow keep {{\n  input {{ note: string }}\n  step a = answer {{ q: workflow_input.note }}\n}}\n"
    );
    flowd.deploy(ACME, &source).await;
    flowd.deploy(GLOBEX, &source).await;
    let note = "x".repeat(10_000);
    let start = json!({ "workflow": "keep", "input": { "note": note } });
    let mut refused = None;
    for _ in 0..10 {
        let (status, body) = flowd
            .send(Method::POST, "/v1/runs", Some(ACME), Some(start.clone()))
            .await;
        if status == 429 {
            refused = Some(body);
            break;
        }
        assert_eq!(status, 202, "{body}");
        flowd.settled(body["run_id"].as_str().unwrap(), ACME).await;
    }
    let refused = refused.expect("refused before 10 runs of 10 KB in 60 KB");
    assert_eq!(refused["code"], "quota_exceeded", "{refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("stored_bytes"),
        "{refused}"
    );
    // A version whose plan holds 20 KB of text.
    let bigger = format!(
        "{RECIPE}workflow keep2 {{\n  step a = answer {{ q: \"{}\" }}\n}}\n",
        "y".repeat(20_000)
    );
    let (status, body) = flowd.try_deploy(ACME, json!({ "source": bigger })).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{body}"
    );
    let (status, body) = flowd
        .send(Method::POST, "/v1/runs", Some(GLOBEX), Some(start))
        .await;
    assert_eq!(status, 202, "another account's quota: {body}");
    assert_eq!(flowd.stop(), Some(0));
}

/// A run stops once its account's data is past `stored_bytes`, with an
/// error of kind `quota`, and the account's next start is refused at once.
/// Regression: the quota was checked at starts and deploys only, and one
/// run of a loop stored a hundred times its account's quota (an audit).
#[tokio::test]
async fn a_run_stops_once_its_accounts_data_is_past_its_quota() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::ZERO).await;
    let dir = TempDir::new("quota-stored-run");
    let flowd = Flowd::start_with(&dir, &config(&server, "stored_bytes = 60000\n"));
    let source = format!(
        "{RECIPE}workflow grow {{\n  input {{ note: string, items: list<string> }}\n  for workflow_input.items as each max 1000 {{\n    step a = answer {{ q: \"{{{{workflow_input.note}}}} {{{{loop_item}}}}\" }}\n  }}\n}}\n"
    );
    flowd.deploy(ACME, &source).await;
    let items: Vec<String> = (0..100).map(|i| format!("item {i}")).collect();
    let start =
        json!({ "workflow": "grow", "input": { "note": "x".repeat(2_000), "items": items } });
    let run = flowd.start_run(ACME, start.clone()).await;
    let record = flowd
        .settled_within(&run, ACME, Duration::from_secs(60))
        .await;
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error"]["kind"], "quota", "{record}");
    // About 60 KB of records of 2 KB each: far from the loop's 100.
    let asked = server.requests();
    assert!((20..40).contains(&asked), "{asked} steps ran");
    let (status, body) = flowd
        .send(Method::POST, "/v1/runs", Some(ACME), Some(start))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{body}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// A redrive drives a run as a start does, so it is held to the same
/// `runs_in_flight`. Regression (a review): a run started, cancelled and
/// redriven passed the quota, again and again.
#[tokio::test]
async fn a_redrive_is_held_to_the_runs_in_flight() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_secs(10)).await;
    let dir = TempDir::new("quota-runs-redrive");
    let flowd = Flowd::start_with(&dir, &config(&server, "runs_in_flight = 1\n"));
    flowd.deploy(ACME, &slow_workflow()).await;
    let cancelled = flowd.start_run(ACME, json!({ "workflow": "slow" })).await;
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{cancelled}/cancel"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Its task lets go of its place as it stops.
    let mut started = None;
    for _ in 0..50 {
        let (status, body) = flowd
            .send(
                Method::POST,
                "/v1/runs",
                Some(ACME),
                Some(json!({ "workflow": "slow" })),
            )
            .await;
        if status == 202 {
            started = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.is_some(),
        "the cancelled run's place was given back"
    );
    let (status, body) = flowd
        .send(
            Method::POST,
            &format!("/v1/runs/{cancelled}/redrive"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{body}"
    );
    assert_eq!(flowd.stop(), Some(0));
}

/// A decision resumes its run only once the account has a place among its
/// runs in flight: it is stored and answered at once, and the run waits
/// for the place rather than the person being told to decide again.
/// Regression (a review): a decision drove its run whatever the quota, so
/// many parked runs decided at once went past it.
#[tokio::test]
async fn a_decided_run_waits_for_a_place_among_the_runs_in_flight() {
    let server = FakeLlm::start(vec![], json!({ "text": "t" }), Duration::from_secs(2)).await;
    let dir = TempDir::new("quota-runs-decided");
    let flowd = Flowd::start_with(&dir, &config(&server, "runs_in_flight = 1\n"));
    let gated = "workflow gated {\n  step ok = approval { approvers: [\"ana@acme.io\"], message: \"Go?\" }\n  step a = answer { q: \"y\" }\n}\n";
    flowd.deploy(ACME, &(slow_workflow() + gated)).await;
    let parked = flowd.start_run(ACME, json!({ "workflow": "gated" })).await;
    assert_eq!(
        flowd.settled(&parked, ACME).await["status"],
        "pending_approval"
    );
    // A parked run holds no place: the slow one takes it.
    let slow = flowd.start_run(ACME, json!({ "workflow": "slow" })).await;
    let (status, body) = flowd.approve(ACME, &parked, "ok").await;
    assert_eq!(status, 202, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.requests(), 1, "the decided run waits for the place");
    let record = flowd
        .settled_within(&parked, ACME, Duration::from_secs(30))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(flowd.settled(&slow, ACME).await["status"], "completed");
    assert_eq!(server.requests(), 2);
    assert_eq!(server.most_at_once(), 1, "runs at once");
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression (an audit): a run of 90 nested loops, which `flowc check`
/// passes, overflowed a tokio worker's stack and killed flowd, every
/// account with it, and again at each restart as it resumed the run (a
/// raw plan of 400 nested loops killed it as it was read, the same way).
/// A run of the deepest blocks a source may nest completes.
#[tokio::test]
async fn a_run_as_deep_as_a_source_may_nest_completes() {
    let dir = TempDir::new("flowd-deep");
    let flowd = Flowd::start(&dir);
    // The parser takes 128 brackets: the workflow's, a loop's each, a
    // step's arguments.
    let depth = 126;
    let mut source = String::from("workflow deep {\n  input { items: list<string> }\n");
    for i in 0..depth {
        source.push_str(&format!(
            "for workflow_input.items as l{i} concurrency 1 max 1 {{\n"
        ));
    }
    source.push_str("step w = kb_write \"d\" { title: \"t\", content: \"c\" } idempotency \"k\"\n");
    source.push_str(&"}\n".repeat(depth + 1));
    flowd.deploy(ACME, &source).await;
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "deep", "input": { "items": ["x"] } }),
        )
        .await;
    let record = flowd.settled(&run, ACME).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(flowd.stop(), Some(0));
}
