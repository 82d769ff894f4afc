//! What flowd's benches share: flowd as a process of its own.

#![allow(dead_code, reason = "each bench uses a part of it")]

use std::time::Duration;

/// flowd as a process of its own (the release binary beside this bench),
/// stopped with SIGTERM.
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

    pub(crate) fn stop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
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
