//! B10: a noisy neighbour. One account floods flowd with a
//! `kb_write` loop at `concurrency 1000`; another starts trivial runs one
//! after another. The victim's start-to-completion latency is measured
//! alone, then during the flood; the goal is a p50 within 2x of alone.
//!
//! flowd runs as a process of its own on loopback (SQLite store, full
//! durability, the offline provider). This process is both clients; each
//! victim run is started, then polled every millisecond until it ends.
//!
//! `cargo bench -p flow-daemon --bench noisy [-- --quick]`

mod common;

use std::time::{Duration, Instant};

use common::{Flowd, ms};
use serde_json::{Value, json};

const VICTIM: &str = "victim-key-0123456789";
const FLOOD: &str = "flood-key-0123456789";

const PING: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow ping {
  input { q: string }
  step one = r { q: workflow_input.q }
  output { a: step.one.a }
}
"#;

const FLOOD_SOURCE: &str = r#"workflow flood {
  input { items: list<string> }
  for workflow_input.items as each concurrency 1000 {
    step w = kb_write "flood" { title: loop_item, content: "x" } idempotency "{{loop_item}}"
  }
}
"#;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (victims, flood_runs, items) = if quick {
        (20, 1, 5_000)
    } else {
        (200, 2, 100_000)
    };
    let dir = std::env::temp_dir().join(format!("flow-bench-noisy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("flowd.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"{}\"\nlink_secret = \"0123456789abcdef0123456789abcdef\"\n\
             [[accounts]]\nid = \"victim\"\napi_keys = [\"{VICTIM}\"]\n\
             [[accounts]]\nid = \"flood\"\napi_keys = [\"{FLOOD}\"]\n",
            dir.join("flowd.db").display()
        ),
    )
    .expect("the bench config is written");
    let mut flowd = Flowd::start(&dir);
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let client = reqwest::Client::new();
    let base = flowd.url.clone();
    let send = |key: &'static str, path: String, body: Option<Value>| {
        let request = match body {
            Some(body) => client
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.to_string()),
            None => client.get(format!("{base}{path}")),
        };
        async move {
            let response = request.bearer_auth(key).send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    runtime.block_on(async {
        for (key, source) in [(VICTIM, PING), (FLOOD, FLOOD_SOURCE)] {
            let (status, body) = send(
                key,
                "/v1/workflows".into(),
                Some(json!({ "source": source })),
            )
            .await;
            assert_eq!(status, 201, "{body}");
        }
    });

    // One victim run: started, then polled until it ends.
    let victim_run = || async {
        let start = Instant::now();
        let (status, body) = send(
            VICTIM,
            "/v1/runs".into(),
            Some(json!({ "workflow": "ping", "input": { "q": "x" } })),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        let id = body["run_id"].as_str().unwrap().to_string();
        loop {
            let (_, run) = send(VICTIM, format!("/v1/runs/{id}"), None).await;
            if run["status"] != "running" {
                assert_eq!(run["status"], "completed", "{run}");
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let p50 = |mut latencies: Vec<Duration>| {
        latencies.sort();
        latencies[latencies.len() / 2]
    };

    let alone = runtime.block_on(async {
        let mut latencies = Vec::new();
        for _ in 0..victims {
            latencies.push(victim_run().await);
        }
        p50(latencies)
    });

    let (during, flood_steps, flood_time) = runtime.block_on(async {
        let started = Instant::now();
        let mut flood_ids = Vec::new();
        for run in 0..flood_runs {
            let items: Vec<String> = (0..items).map(|i| format!("r{run}-item-{i}")).collect();
            let (status, body) = send(
                FLOOD,
                "/v1/runs".into(),
                Some(json!({ "workflow": "flood", "input": { "items": items } })),
            )
            .await;
            assert_eq!(status, 202, "{body}");
            flood_ids.push(body["run_id"].as_str().unwrap().to_string());
        }
        // Let the flood get going before the victim measures.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut latencies = Vec::new();
        let mut flooding = true;
        while latencies.len() < victims && flooding {
            latencies.push(victim_run().await);
            let (_, run) = send(FLOOD, format!("/v1/runs/{}", flood_ids[0]), None).await;
            flooding = run["status"] == "running";
        }
        for id in &flood_ids {
            loop {
                let (_, run) = send(FLOOD, format!("/v1/runs/{id}"), None).await;
                if run["status"] != "running" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        (p50(latencies), flood_runs * items, started.elapsed())
    });
    println!(
        "| B10 | a victim's 1-step runs one after another, alone and while another account runs {flood_runs} kb_write loop(s) of {items} items at concurrency 1000, SQLite full durability | victim p50 alone {:.1} ms, during the flood {:.1} ms ({:.1}x; goal <= 2x) | flood {:.0} steps/s |",
        ms(alone),
        ms(during),
        during.as_secs_f64() / alone.as_secs_f64(),
        flood_steps as f64 / flood_time.as_secs_f64(),
    );
    flowd.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
