//! What flowd's benches share: flowd as a process of its own, the load of
//! runs started over HTTP, and the CPU time of the processes involved.

#![allow(dead_code, reason = "each bench uses a part of it")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The configuration of a flowd on loopback over `store` (a SQLite file or
/// a `postgres://` URL) with the offline provider and one account, `bench`,
/// whose API key is `key`.
pub(crate) fn config(store: &str, key: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nstore = \"{store}\"\nlink_secret = \"0123456789abcdef0123456789abcdef\"\n[[accounts]]\nid = \"bench\"\napi_keys = [\"{key}\"]\n"
    )
}

/// flowd as a process of its own (the release binary beside this bench),
/// stopped with SIGTERM, by `stop` or when dropped: a bench that panics
/// must not leave a daemon behind holding its port and its store.
pub(crate) struct Flowd {
    pub(crate) child: std::process::Child,
    pub(crate) url: String,
}

impl Flowd {
    pub(crate) fn start(dir: &std::path::Path) -> Flowd {
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flowd"))
            .arg("serve")
            .current_dir(dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("flowd starts");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        let address = loop {
            line.clear();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                panic!("flowd exited before listening");
            }
            // The log line `<time>  INFO listening on ADDRESS`.
            if let Some((_, found)) = line.trim().split_once(" listening on ") {
                break found.to_string();
            }
        };
        std::thread::spawn(move || for _ in stderr.lines() {});
        Flowd {
            child,
            url: format!("http://{address}"),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops flowd and waits for it; once it has exited, does nothing (the
    /// pid may by then belong to another process).
    pub(crate) fn stop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Flowd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET url` with `key`, its JSON answer.
pub(crate) async fn get_json(client: &reqwest::Client, url: &str, key: &str) -> serde_json::Value {
    client
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .expect("flowd answers")
        .json()
        .await
        .expect("a JSON answer")
}

/// `POST url` of JSON `body` with `key`.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("flowd answers")
}

pub(crate) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Starts `runs` runs by `POST /v1/runs` of `body` from `connections`
/// concurrent clients, each start sent to the next of `bases` in turn;
/// returns once every start has been answered 202 (stored and started).
pub(crate) async fn start_runs(
    client: &reqwest::Client,
    bases: &[String],
    key: &'static str,
    body: String,
    runs: usize,
    connections: usize,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let (bases, body): (Arc<[String]>, Arc<str>) = (bases.into(), body.into());
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (client, bases, body, next) = (
            client.clone(),
            Arc::clone(&bases),
            Arc::clone(&body),
            Arc::clone(&next),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= runs {
                    break;
                }
                let response = client
                    .post(format!("{}/v1/runs", bases[n % bases.len()]))
                    .bearer_auth(key)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .expect("flowd answers");
                assert_eq!(response.status(), 202);
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a client finishes");
    }
}

/// Returns once no run of the account is left running, asking every 5 ms.
pub(crate) async fn until_none_running(client: &reqwest::Client, base: &str, key: &str) {
    loop {
        let running = get_json(
            client,
            &format!("{base}/v1/runs?status=running&limit=1"),
            key,
        )
        .await;
        if running["runs"].as_array().is_none_or(Vec::is_empty) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
