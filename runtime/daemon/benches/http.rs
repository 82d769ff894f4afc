//! B7 (issue 4): starting runs over HTTP, and reading one under that load.
//!
//! flowd runs in this process on loopback (SQLite store in a temporary
//! directory, full durability, the offline provider: no model latency). A
//! load generator with 64 connections starts runs of a 3-step workflow; a
//! reader meanwhile sends `GET /v1/runs/{id}` one after another and keeps
//! each latency. `--quick` runs a small count (CI shows that it works).
//!
//! `cargo bench -p flow-daemon --bench http [-- --quick]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use flow_daemon::{config, server};
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
    let text = format!(
        "listen = \"127.0.0.1:0\"\nstore = \"{}\"\nlink_secret = \"0123456789abcdef0123456789abcdef\"\n[[accounts]]\nid = \"bench\"\napi_keys = [\"{KEY}\"]\n",
        dir.join("flowd.db").display()
    );
    let config = config::load("bench.toml", &text, &|_| None).expect("the bench config is valid");
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async move {
        let daemon = server::Daemon::open(config).expect("flowd opens");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, address) = tokio::sync::oneshot::channel();
        let served = tokio::spawn(server::serve(
            daemon,
            async move {
                let _ = stopped.await;
            },
            move |address| {
                let _ = ready.send(address);
            },
        ));
        let base = format!("http://{}", address.await.expect("flowd listens"));
        let client = reqwest::Client::new();
        let post = |path: &str, body: serde_json::Value| {
            client
                .post(format!("{base}{path}"))
                .bearer_auth(KEY)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
        };
        let deployed = post("/v1/workflows", json!({ "source": WORKFLOW })).await.unwrap();
        assert_eq!(deployed.status(), 201);
        let first = post("/v1/runs", json!({ "workflow": "three", "input": { "q": "x" } }))
            .await
            .unwrap();
        let probe: serde_json::Value = first.json().await.unwrap();
        let probe = probe["run_id"].as_str().unwrap().to_string();

        // The reader: GET one run again and again while the load runs.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (client, base, done) = (client.clone(), base.clone(), Arc::clone(&done));
            tokio::spawn(async move {
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
        };

        const CONNECTIONS: usize = 64;
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..CONNECTIONS {
            let (client, base, next) = (client.clone(), base.clone(), Arc::clone(&next));
            workers.push(tokio::spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < runs {
                    let response = client
                        .post(format!("{base}/v1/runs"))
                        .bearer_auth(KEY)
                        .header("content-type", "application/json")
                        .body(r#"{"workflow":"three","input":{"q":"x"}}"#)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 202);
                }
            }));
        }
        for worker in workers {
            worker.await.unwrap();
        }
        let elapsed = start.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut latencies = reader.await.unwrap();
        latencies.sort();
        let p = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
        println!(
            "| B7 | start {runs} runs of a 3-step workflow over HTTP, {CONNECTIONS} connections, SQLite full durability | {:.0} runs/s | GET /v1/runs/{{id}} under load: p50 {:.2} ms, p99 {:.2} ms ({} requests) |",
            runs as f64 / elapsed.as_secs_f64(),
            ms(p(0.50)),
            ms(p(0.99)),
            latencies.len()
        );
        let _ = stop.send(());
        served.await.unwrap().expect("flowd stops");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
