//! The chaos test (issue 13): three flowds on one PostgreSQL and one Redis,
//! a fake model that notes every call and when it came, two accounts each
//! with its own webhook endpoint, and workflows with a loop, an approval,
//! a handoff and a kb_write. While runs start and approvals are decided on
//! whichever flowd is up, flowds are killed (SIGKILL) and restarted,
//! paused (SIGSTOP) past their lease and continued, and stopped (SIGTERM)
//! and restarted, at random, for `FLOW_CHAOS_SECS` (120 by default). Then:
//!
//! * every accepted run ends, completed;
//! * no run completes twice (one `completed` event per run);
//! * no step is sent to the model after it completed (the step in flight
//!   when its flowd died may have been sent twice: at least once);
//! * each handoff and kb_write with an idempotency key happened once;
//! * each run's `completed` webhook reached its account's endpoint, every
//!   delivery of it with one message id, and no other account's;
//! * every row of the store belongs to the account that started its run.
//!
//! `FLOW_CHAOS_SEED` replays a run's choices (the seed is printed).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::Flowd;
use flow_tests::TempDir;
use flow_tests::fake_llm::FakeLlm;
use flow_tests::postgres::TestSchema;
use reqwest::Method;
use serde_json::{Value, json};

const ACME: &str = "acme-key-0123456789";
const GLOBEX: &str = "globex-key-0123456789";
const ACCOUNTS: [(&str, &str, &str); 2] = [
    ("acme", ACME, "ana@acme.io"),
    ("globex", GLOBEX, "gus@globex.io"),
];

/// The PostgreSQL store's lease: a pause longer than it hands a flowd's
/// runs to the others.
const LEASE: Duration = Duration::from_secs(10);

const SOURCE: &str = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string, score: int }
  prompt "{{input.q}}"
}

workflow gated {
  input { tag: string, items: list<string> }
  step first = answer { q: "{{workflow_input.tag}} first" }
  for workflow_input.items as each concurrency 2 {
    step per = answer { q: "{{workflow_input.tag}} item {{loop_item}}" }
  }
  step gate = approval { approvers: ["leads"], message: "{{workflow_input.tag}}" }
  step tell = handoff "support" {
    message: "{{workflow_input.tag}} decided"
  } idempotency "{{workflow_input.tag}}-tell"
  step save = kb_write "chaos" {
    title: workflow_input.tag
    content: step.first.text
  } idempotency "{{workflow_input.tag}}-save"
  step last = answer { q: "{{workflow_input.tag}} last" }
  output { last: step.last.text, approved: step.gate.approved }
}

workflow plain {
  input { tag: string, items: list<string> }
  step first = answer { q: "{{workflow_input.tag}} first" }
  for workflow_input.items as each concurrency 2 {
    step per = answer { q: "{{workflow_input.tag}} item {{loop_item}}" }
  }
  step tell = handoff "support" {
    message: "{{workflow_input.tag}} done"
  } idempotency "{{workflow_input.tag}}-tell"
  step save = kb_write "chaos" {
    title: workflow_input.tag
    content: step.first.text
  } idempotency "{{workflow_input.tag}}-save"
  step last = answer { q: "{{workflow_input.tag}} last" }
  output { last: step.last.text }
}
"#;

/// A small xorshift generator: the test's choices, replayable by seed.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// One of the three flowds: up, paused, or down.
struct Slot {
    dir: Arc<TempDir>,
    flowd: Option<Flowd>,
    paused: bool,
}

/// The three flowds and what was done to them.
struct Cluster {
    slots: Mutex<Vec<Slot>>,
    config: String,
    kills: AtomicUsize,
    pauses: AtomicUsize,
    restarts: AtomicUsize,
}

impl Cluster {
    /// The URL of a flowd that is up and not paused, picked by `pick`.
    fn any_url(&self, pick: u64) -> Option<String> {
        let slots = self.slots.lock().unwrap();
        let up: Vec<&String> = slots
            .iter()
            .filter(|slot| !slot.paused)
            .filter_map(|slot| slot.flowd.as_ref().map(|f| &f.url))
            .collect();
        (!up.is_empty()).then(|| up[pick as usize % up.len()].clone())
    }

    /// How many flowds are up and not paused.
    fn serving(&self) -> usize {
        let slots = self.slots.lock().unwrap();
        slots
            .iter()
            .filter(|slot| slot.flowd.is_some() && !slot.paused)
            .count()
    }

    fn signal(flowd: &Flowd, name: &str) {
        flow_tests::signal(flowd.child.id(), name);
    }
}

/// A request with a deadline: a flowd may be down or paused at any moment.
async fn call(
    client: &reqwest::Client,
    url: &str,
    method: Method,
    path: &str,
    key: &str,
    body: Option<Value>,
    idempotency: Option<&str>,
) -> Result<(u16, Value), String> {
    let mut request = client
        .request(method, format!("{url}{path}"))
        .bearer_auth(key)
        .timeout(Duration::from_secs(3));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    if let Some(key) = idempotency {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A started run, as the test knows it.
#[derive(Clone, Debug)]
struct Started {
    id: String,
    account: &'static str,
    key: &'static str,
    tag: String,
    items: Vec<String>,
}

/// One webhook post, as received.
#[derive(Clone, Debug)]
struct Post {
    account_path: String,
    id: String,
    event: Value,
}

async fn webhook_receiver() -> (String, Arc<Mutex<Vec<Post>>>) {
    let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
    let kept = Arc::clone(&posts);
    let router = axum::Router::new().route(
        "/hook/{account}",
        axum::routing::post(
            move |axum::extract::Path(account): axum::extract::Path<String>,
                  headers: HeaderMap,
                  body: String| async move {
                kept.lock().unwrap().push(Post {
                    account_path: account,
                    id: headers["webhook-id"].to_str().unwrap_or("").to_string(),
                    event: serde_json::from_str(&body).unwrap_or(Value::Null),
                });
                StatusCode::OK
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, posts)
}

fn config(schema: &TestSchema, model: &str, hooks: &str, prefix: &str) -> String {
    let mut config = format!(
        "listen = \"127.0.0.1:0\"
store = \"{store}\"
link_secret = \"0123456789abcdef0123456789abcdef\"
[limits]
redis_url = \"{redis}\"
redis_prefix = \"{prefix}\"
llm_concurrency = 8
[provider]
kind = \"openai\"
base_url = \"{model}\"
models = {{ default = \"fake\" }}
",
        store = schema.url(),
        redis = flow_tests::services::redis_url(),
    );
    for (account, key, person) in ACCOUNTS {
        config.push_str(&format!(
            "[[accounts]]
id = \"{account}\"
api_keys = [\"{key}\"]
[accounts.departments]
support = [\"{person}\"]
[accounts.approver_groups]
leads = [\"{person}\"]
[[accounts.webhooks]]
name = \"audit\"
url = \"{hooks}/hook/{account}\"
secret = \"whsec-0123456789abcdef\"
events = [\"completed\"]
"
        ));
    }
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flowds_killed_and_paused_at_random_lose_and_repeat_nothing() {
    flow_tests::require!(Postgres, Redis);
    let chaos_for = Duration::from_secs(
        std::env::var("FLOW_CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let seed = std::env::var("FLOW_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    println!("chaos: seed {seed}, {} s", chaos_for.as_secs());

    let model = FakeLlm::start(
        vec![],
        json!({ "text": "t", "score": 1 }),
        Duration::from_millis(150),
    )
    .await;
    let (hooks, posts) = webhook_receiver().await;
    let schema = TestSchema::new();
    let prefix = format!("flow-test-chaos-{}-{seed}", std::process::id());
    let cluster = Arc::new(Cluster {
        slots: Mutex::new(Vec::new()),
        config: config(&schema, &model.url, &hooks, &prefix),
        kills: AtomicUsize::new(0),
        pauses: AtomicUsize::new(0),
        restarts: AtomicUsize::new(0),
    });
    for n in 0..3 {
        let dir = Arc::new(TempDir::new(&format!("flowd-chaos-{n}")));
        let flowd = Flowd::start_with(&dir, &cluster.config);
        cluster.slots.lock().unwrap().push(Slot {
            dir,
            flowd: Some(flowd),
            paused: false,
        });
    }
    let client = reqwest::Client::new();
    {
        let url = cluster.any_url(0).unwrap();
        for (_, key, _) in ACCOUNTS {
            let (status, body) = call(
                &client,
                &url,
                Method::POST,
                "/v1/workflows",
                key,
                Some(json!({ "source": SOURCE })),
                None,
            )
            .await
            .expect("flowd answers");
            assert_eq!(status, 201, "{body}");
        }
    }

    let chaos_ends = Instant::now() + chaos_for;
    let started: Arc<Mutex<Vec<Started>>> = Arc::default();
    let starting = Arc::new(AtomicBool::new(true));

    // Runs start, one every ~250 ms, on whichever flowd is up; a start that
    // got no answer is sent again with the same idempotency key.
    let starter = {
        let (cluster, client, started, starting) = (
            Arc::clone(&cluster),
            client.clone(),
            Arc::clone(&started),
            Arc::clone(&starting),
        );
        tokio::spawn(async move {
            let mut dice = Dice(seed ^ 0x5151);
            let mut n = 0;
            while starting.load(Ordering::SeqCst) {
                n += 1;
                let (account, key, _) = ACCOUNTS[dice.below(3).min(1) as usize];
                let workflow = if dice.below(2) == 0 { "gated" } else { "plain" };
                let tag = format!("{account}-{n}");
                let items: Vec<String> = (0..2 + dice.below(2)).map(|i| format!("i{i}")).collect();
                let body = json!({ "workflow": workflow, "input": { "tag": tag, "items": items } });
                let id = loop {
                    let Some(url) = cluster.any_url(dice.next()) else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    match call(
                        &client,
                        &url,
                        Method::POST,
                        "/v1/runs",
                        key,
                        Some(body.clone()),
                        Some(&tag),
                    )
                    .await
                    {
                        Ok((200 | 202, answer)) => {
                            break answer["run_id"].as_str().expect("a run id").to_string();
                        }
                        Ok((status, answer)) if status < 500 && status != 429 => {
                            panic!("start refused: {status} {answer}")
                        }
                        _ => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                };
                started.lock().unwrap().push(Started {
                    id,
                    account,
                    key,
                    tag,
                    items,
                });
                tokio::time::sleep(dice.millis(150, 350)).await;
            }
        })
    };

    // Approvals are decided as they come, on whichever flowd is up.
    let deciding = Arc::new(AtomicBool::new(true));
    let decider = {
        let (cluster, client, deciding) =
            (Arc::clone(&cluster), client.clone(), Arc::clone(&deciding));
        tokio::spawn(async move {
            let mut dice = Dice(seed ^ 0xdec1de);
            while deciding.load(Ordering::SeqCst) {
                for (_, key, person) in ACCOUNTS {
                    let Some(url) = cluster.any_url(dice.next()) else {
                        continue;
                    };
                    let path = format!("/v1/approvals?approver={person}");
                    let Ok((200, gates)) =
                        call(&client, &url, Method::GET, &path, key, None, None).await
                    else {
                        continue;
                    };
                    for gate in gates["approvals"].as_array().into_iter().flatten() {
                        let path = format!(
                            "/v1/runs/{}/approvals/{}",
                            gate["run_id"].as_str().unwrap_or_default(),
                            gate["step_path"].as_str().unwrap_or_default()
                        );
                        let decision = json!({ "approver": person, "approved": true });
                        // 409: decided already (through another flowd, or a
                        // request whose answer was lost).
                        let _ = call(
                            &client,
                            &url,
                            Method::POST,
                            &path,
                            key,
                            Some(decision),
                            None,
                        )
                        .await;
                    }
                }
                tokio::time::sleep(dice.millis(200, 600)).await;
            }
        })
    };

    // The chaos: every 2 to 6 s, a flowd is killed and restarted, paused
    // past its lease, or stopped and restarted; one always serves.
    let mut dice = Dice(seed);
    let mut pauses = Vec::new();
    while Instant::now() < chaos_ends {
        tokio::time::sleep(dice.millis(2_000, 6_000)).await;
        if cluster.serving() < 2 {
            continue;
        }
        let victim = dice.below(3) as usize;
        let action = dice.below(3);
        let cluster = Arc::clone(&cluster);
        {
            let slots = cluster.slots.lock().unwrap();
            if slots[victim].flowd.is_none() || slots[victim].paused {
                continue;
            }
        }
        match action {
            0 | 1 => {
                // SIGKILL (0) or SIGTERM (1), then up again within 3 s.
                let down = dice.millis(300, 3_000);
                let old = cluster.slots.lock().unwrap()[victim].flowd.take();
                if let Some(old) = old {
                    if action == 0 {
                        drop(old);
                        cluster.kills.fetch_add(1, Ordering::SeqCst);
                    } else {
                        let _ = tokio::task::spawn_blocking(move || old.stop()).await;
                    }
                }
                tokio::time::sleep(down).await;
                let dir = Arc::clone(&cluster.slots.lock().unwrap()[victim].dir);
                let config = cluster.config.clone();
                let flowd = tokio::task::spawn_blocking(move || Flowd::start_with(&dir, &config))
                    .await
                    .expect("flowd restarts");
                cluster.slots.lock().unwrap()[victim].flowd = Some(flowd);
                cluster.restarts.fetch_add(1, Ordering::SeqCst);
            }
            _ => {
                // SIGSTOP for longer than the lease, SIGCONT in the background.
                let paused_for = LEASE + dice.millis(1_000, 5_000);
                {
                    let mut slots = cluster.slots.lock().unwrap();
                    let slot = &mut slots[victim];
                    Cluster::signal(slot.flowd.as_ref().unwrap(), "STOP");
                    slot.paused = true;
                }
                cluster.pauses.fetch_add(1, Ordering::SeqCst);
                pauses.push(tokio::spawn(async move {
                    tokio::time::sleep(paused_for).await;
                    let mut slots = cluster.slots.lock().unwrap();
                    let slot = &mut slots[victim];
                    if let Some(flowd) = &slot.flowd {
                        Cluster::signal(flowd, "CONT");
                    }
                    slot.paused = false;
                }));
            }
        }
    }
    starting.store(false, Ordering::SeqCst);
    starter.await.expect("the starter ends");
    for pause in pauses {
        pause.await.expect("the pauses end");
    }

    // Every accepted run ends, completed.
    let runs = started.lock().unwrap().clone();
    let settle_by = Instant::now() + Duration::from_secs(90);
    let mut records: HashMap<String, Value> = HashMap::new();
    for run in &runs {
        loop {
            let url = cluster.any_url(dice.next()).expect("a flowd serves");
            if let Ok((200, record)) = call(
                &client,
                &url,
                Method::GET,
                &format!("/v1/runs/{}", run.id),
                run.key,
                None,
                None,
            )
            .await
                && record["status"] != "running"
                && record["status"] != "pending_approval"
            {
                assert_eq!(record["status"], "completed", "{}: {record}", run.tag);
                records.insert(run.id.clone(), record);
                break;
            }
            assert!(
                Instant::now() < settle_by,
                "run {} ({}) has not ended",
                run.id,
                run.tag
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    deciding.store(false, Ordering::SeqCst);
    decider.await.expect("the decider ends");

    // No step went to the model after it completed.
    let calls = model.calls();
    let mut calls_of: HashMap<&str, Vec<u64>> = HashMap::new();
    for call in &calls {
        calls_of
            .entry(call.prompt.as_str())
            .or_default()
            .push(call.at_ms);
    }
    let mut repeated = 0;
    for run in &runs {
        let url = cluster.any_url(dice.next()).expect("a flowd serves");
        let (status, trace) = call(
            &client,
            &url,
            Method::GET,
            &format!("/v1/runs/{}/trace", run.id),
            run.key,
            None,
            None,
        )
        .await
        .expect("flowd answers");
        assert_eq!(status, 200, "{trace}");
        let mut prompts = BTreeSet::new();
        for step in trace["steps"].as_array().expect("steps") {
            if step["kind"] != "recipe" {
                continue;
            }
            let prompt = step["input"]["q"].as_str().expect("a prompt");
            prompts.insert(prompt.to_string());
            let ended = step["ended_ms"].as_u64().expect("ended_ms");
            let at = calls_of.get(prompt).cloned().unwrap_or_default();
            assert!(!at.is_empty(), "{prompt} completed without a call");
            let late: Vec<&u64> = at.iter().filter(|at| **at > ended).collect();
            assert!(
                late.is_empty(),
                "{prompt} was sent to the model after it completed at {ended}: {late:?}"
            );
            let attempts = step["attempts"].as_array().map_or(1, Vec::len);
            repeated += at.len().saturating_sub(attempts);
        }
        let expected = 2 + run.items.len();
        assert_eq!(prompts.len(), expected, "{}: {trace}", run.tag);
    }

    // Each idempotent side effect happened once, in its own account.
    let client_pg = flow_tests::postgres::client()
        .await
        .expect("the test database");
    let in_schema = |sql: &str| sql.replace("{schema}", schema.name());
    let mut notes: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for row in client_pg
        .query(
            &in_schema(
                "SELECT run_id, account, COUNT(*) FROM {schema}.notifications
                 WHERE kind = 'handoff' GROUP BY run_id, account",
            ),
            &[],
        )
        .await
        .expect("the notifications")
    {
        let run: String = row.get(0);
        assert!(
            notes
                .insert(run.clone(), (row.get(1), row.get(2)))
                .is_none(),
            "run {run}: handoffs in two accounts"
        );
    }
    let mut documents: BTreeMap<String, (String, i32)> = BTreeMap::new();
    for row in client_pg
        .query(
            &in_schema("SELECT title, account, version FROM {schema}.kb_documents WHERE collection = 'chaos'"),
            &[],
        )
        .await
        .expect("the documents")
    {
        documents.insert(row.get(0), (row.get(1), row.get(2)));
    }
    for run in &runs {
        assert_eq!(
            notes.get(&run.id),
            Some(&(run.account.to_string(), 1)),
            "{}: one handoff, in its account",
            run.tag
        );
        assert_eq!(
            documents.get(&run.tag),
            Some(&(run.account.to_string(), 1)),
            "{}: one document version, in its account",
            run.tag
        );
    }
    assert_eq!(
        notes.len(),
        runs.len(),
        "no handoff of a run the test did not start"
    );
    let accounts: Vec<(String, String)> = client_pg
        .query(&in_schema("SELECT id, account FROM {schema}.runs"), &[])
        .await
        .expect("the runs")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let account_of: HashMap<&str, &str> = runs.iter().map(|r| (r.id.as_str(), r.account)).collect();
    assert_eq!(accounts.len(), runs.len(), "one run per accepted start");
    for (id, account) in &accounts {
        assert_eq!(
            account_of.get(id.as_str()),
            Some(&account.as_str()),
            "run {id}"
        );
    }

    // Each run completed once, and its event reached its own account's
    // endpoint (at least once, one message id).
    let deliver_by = Instant::now() + Duration::from_secs(30);
    loop {
        let posts = posts.lock().unwrap().clone();
        let mut ids: HashMap<String, BTreeSet<String>> = HashMap::new();
        for post in &posts {
            let run_id = post.event["run"]["run_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let account = account_of.get(run_id.as_str()).copied();
            assert_eq!(account, Some(post.account_path.as_str()), "{post:?}");
            assert_eq!(post.event["account"], post.account_path, "{post:?}");
            assert_eq!(post.event["event"], "completed");
            ids.entry(run_id).or_default().insert(post.id.clone());
        }
        for (run, ids) in &ids {
            assert_eq!(
                ids.len(),
                1,
                "run {run} completed once, one message id: {ids:?}"
            );
        }
        if runs.iter().all(|run| ids.contains_key(&run.id)) {
            break;
        }
        assert!(
            Instant::now() < deliver_by,
            "{} of {} completed events delivered",
            ids.len(),
            runs.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    println!(
        "chaos: seed {seed}: {} runs ({} gated), {} kills, {} pauses past the lease, {} restarts, {} model calls, {} sent again while in flight, 0 after completing, 0 duplicate side effects",
        runs.len(),
        records
            .values()
            .filter(|r| r["output"]["approved"] == true)
            .count(),
        cluster.kills.load(Ordering::SeqCst),
        cluster.pauses.load(Ordering::SeqCst),
        cluster.restarts.load(Ordering::SeqCst),
        calls.len(),
        repeated,
    );
    let slots = std::mem::take(&mut *cluster.slots.lock().unwrap());
    drop(slots);
}
