//! B12: a run's answer time with a destination that takes 5 s.
//!
//! flowd runs as a process of its own on loopback (SQLite store, full
//! durability, the offline provider). Two workflows of one recipe step are
//! deployed, alike but that one delivers its result to a webhook endpoint
//! whose receiver (in this process) answers after 5 s. Runs of the two
//! alternate, one at a time; a run's answer time is from `POST /v1/runs`
//! until `GET /v1/runs/{id}` first says `completed` (polled every
//! millisecond). The destination is delivered after the run completed, so
//! the two distributions should be the same; the receiver's count shows the
//! deliveries did happen meanwhile. `--quick` runs a few.
//!
//! `cargo bench -p flow-daemon --bench destinations [-- --quick]`

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Flowd, get_json, ms, post_json};
use serde_json::json;

const KEY: &str = "bench-key-0123456789";
const DELAY: Duration = Duration::from_secs(5);

fn workflow(name: &str, deliver: &str) -> String {
    format!(
        r#"recipe r {{ model "m" input {{ q: string }} output {{ a: string }} prompt "{{{{input.q}}}}" }}
workflow {name} {{
  input {{ q: string }}
{deliver}
  step one = r {{ q: workflow_input.q }}
  output {{ a: step.one.a }}
}}
"#
    )
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs: usize = if quick { 20 } else { 500 };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    // The slow receiver: takes every post and answers 204 after `DELAY`.
    let delivered = Arc::new(AtomicUsize::new(0));
    let hook = runtime.block_on(async {
        let delivered = Arc::clone(&delivered);
        let router = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || async move {
                tokio::time::sleep(DELAY).await;
                delivered.fetch_add(1, Ordering::SeqCst);
                axum::http::StatusCode::NO_CONTENT
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    });
    let dir = std::env::temp_dir().join(format!("flow-bench-dest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("flowd.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"{}\"\nlink_secret = \"0123456789abcdef0123456789abcdef\"\n\
             [[accounts]]\nid = \"bench\"\napi_keys = [\"{KEY}\"]\n\
             [[accounts.webhooks]]\nname = \"slow\"\nurl = \"{hook}\"\nsecret = \"whsec-0123456789abcdef\"\nevents = []\n",
            dir.join("flowd.db").display()
        ),
    )
    .expect("the bench config is written");
    let mut flowd = Flowd::start(&dir);
    let base = flowd.url.clone();
    let client = reqwest::Client::new();

    let (plain, slow) = runtime.block_on(async {
        for source in [
            workflow("plain", ""),
            workflow("slow", "  deliver on completed to webhook \"slow\""),
        ] {
            let deployed = post_json(
                &client,
                &format!("{base}/v1/workflows"),
                KEY,
                json!({ "source": source }),
            )
            .await;
            assert_eq!(deployed.status(), 201);
        }
        let answer = |workflow: &'static str| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let start = Instant::now();
                let body = json!({ "workflow": workflow, "input": { "q": "x" } });
                let started = post_json(&client, &format!("{base}/v1/runs"), KEY, body).await;
                let started: serde_json::Value = started.json().await.unwrap();
                let id = started["run_id"].as_str().unwrap().to_string();
                loop {
                    let run = get_json(&client, &format!("{base}/v1/runs/{id}"), KEY).await;
                    match run["status"].as_str() {
                        Some("completed") => return start.elapsed(),
                        Some("running") => tokio::time::sleep(Duration::from_millis(1)).await,
                        other => panic!("run {id} ended {other:?}"),
                    }
                }
            }
        };
        let (mut plain, mut slow) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            plain.push(answer("plain").await);
            slow.push(answer("slow").await);
        }
        (plain, slow)
    });
    let stats = |mut times: Vec<Duration>| {
        times.sort();
        let p = |q: f64| ms(times[((times.len() as f64 * q) as usize).min(times.len() - 1)]);
        format!("p50 {:.2} ms, p99 {:.2} ms", p(0.50), p(0.99))
    };
    // Wait for the deliveries still out, to show they happened: the
    // deliverer takes at most 64 events at a time, each batch `DELAY`.
    let deadline = Instant::now() + DELAY * (runs as u32 / 64 + 4);
    while delivered.load(Ordering::SeqCst) < runs && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "| B12 | {runs} runs each, one at a time | no destination: {} | a webhook destination answering in 5 s: {} | {} of {runs} deliveries taken |",
        stats(plain),
        stats(slow),
        delivered.load(Ordering::SeqCst)
    );
    flowd.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
