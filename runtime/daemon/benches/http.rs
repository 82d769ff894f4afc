//! B7: starting runs over HTTP, and reading one under that load.
//!
//! flowd runs as a process of its own on loopback (SQLite store in a
//! temporary directory, full durability, the offline provider: no model
//! latency). This process is the load generator: 64 connections start runs
//! of a 3-step workflow, while a reader on a thread of its own sends
//! `GET /v1/runs/{id}` one after another and keeps each latency. `--quick`
//! runs a small count (CI shows that it works).
//!
//! `cargo bench -p flow-daemon --bench http [-- --quick]`

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{Flowd, config, ms, start_runs, until_none_running};
use serde_json::json;

const KEY: &str = "bench-key-0123456789";
const WORKFLOW: &str = r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }
workflow three {
  input { q: string }
  step one = r { q: workflow_input.q }
  step two = r { q: step.one.a }
  step three = r { q: step.two.a }
  output { a: step.three.a }
}
"#;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs: usize = if quick { 200 } else { 20_000 };
    let dir = std::env::temp_dir().join(format!("flow-bench-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Every run may be in flight at once, as before the account quotas
    // (issue 21): with flowd's defaults (1,000 runs and 16 steps in flight
    // an account) the full count's starts past 1,000 answered 429 and the
    // bench failed, and the completions would measure the quotas.
    let limits = format!(
        "[limits]\nllm_concurrency = 1000\nsteps_in_flight = 1000\nruns_in_flight = {}\n",
        runs + 1
    );
    std::fs::write(
        dir.join("flowd.toml"),
        config(&dir.join("flowd.db").display().to_string(), KEY) + &limits,
    )
    .expect("the bench config is written");
    let mut flowd = Flowd::start(&dir);
    let base = flowd.url.clone();

    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let client = reqwest::Client::new();
    let probe = runtime.block_on(async {
        let post = |path: &str, body: serde_json::Value| {
            client
                .post(format!("{base}{path}"))
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
        };
        let deployed = post("/v1/workflows", json!({ "source": WORKFLOW }))
            .await
            .unwrap();
        assert_eq!(deployed.status(), 201);
        let first = post(
            "/v1/runs",
            json!({ "workflow": "three", "input": { "q": "x" } }),
        )
        .await
        .unwrap();
        let probe: serde_json::Value = first.json().await.unwrap();
        probe["run_id"].as_str().unwrap().to_string()
    });

    // The reader: GET one run again and again while the load runs, from a
    // thread and runtime of its own, so that its latencies are flowd's and
    // not the wait for a turn among the load generator's tasks.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (base, done) = (base.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let client = reqwest::Client::new();
                let mut latencies = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let start = Instant::now();
                    let response = client
                        .get(format!("{base}/v1/runs/{probe}"))
                        .bearer_auth(KEY)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200);
                    let _ = response.bytes().await;
                    latencies.push(start.elapsed());
                }
                latencies
            })
        })
    };

    const CONNECTIONS: usize = 64;
    let (started, finished) = runtime.block_on(async {
        let start = Instant::now();
        let body = r#"{"workflow":"three","input":{"q":"x"}}"#.to_string();
        start_runs(std::slice::from_ref(&base), KEY, body, runs, CONNECTIONS).await;
        let started = start.elapsed();
        // Started is not finished: wait until no run is left running.
        until_none_running(&client, &base, KEY).await;
        (started, start.elapsed())
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut latencies = reader.join().expect("the reader finishes");
    latencies.sort();
    let p = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "| B7 | {runs} runs of a 3-step workflow started over HTTP, {CONNECTIONS} connections, SQLite full durability | started {:.0} runs/s, all completed at {:.0} runs/s | GET /v1/runs/{{id}} under load: p50 {:.2} ms, p99 {:.2} ms ({} requests) |",
        runs as f64 / started.as_secs_f64(),
        runs as f64 / finished.as_secs_f64(),
        ms(p(0.50)),
        ms(p(0.99)),
        latencies.len()
    );
    flowd.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
