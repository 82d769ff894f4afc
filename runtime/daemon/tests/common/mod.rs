//! What the flowd end-to-end tests share: a `flowd serve` child process and
//! the accounts of its configuration.

#![allow(dead_code, reason = "each test crate uses a part of it")]

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use flow_tests::TempDir;
use serde_json::Value;

/// A `flowd serve` child process on a loopback port, stopped on drop.
pub(crate) struct Flowd {
    pub(crate) child: std::process::Child,
    pub(crate) url: String,
    pub(crate) client: reqwest::Client,
    /// What flowd said on stderr before it listened (warnings).
    pub(crate) startup: String,
}

/// Acme comes last: a test may add tables of its own (`[accounts.departments]`).
pub(crate) const CONFIG: &str = "listen = \"127.0.0.1:0\"
link_secret = \"0123456789abcdef0123456789abcdef\"
[[accounts]]
id = \"globex\"
api_keys = [\"globex-key-0123456789\"]
[[accounts]]
id = \"acme\"
api_keys = [\"acme-key-0123456789\"]
[accounts.approver_groups]
leads = [\"ana@acme.io\"]
";
/// A workflow of two recipe steps, the second reading the first.
pub(crate) const TWO_STEPS: &str = r#"recipe summarize {
  model "default"
  input { text: string }
  output { summary: string }
  prompt "Summarize {{input.text}}"
}
workflow digest {
  input { text: string }
  step first = summarize { text: workflow_input.text }
  step second = summarize { text: step.first.summary }
  output { summary: step.second.summary }
}
"#;

pub(crate) const ACME: &str = "acme-key-0123456789";
pub(crate) const GLOBEX: &str = "globex-key-0123456789";

/// The `[provider]` section of a flowd whose model is the fake one at
/// `url` (`flow_tests::fake_llm`), every recipe's model `default` its
/// `fake`.
pub(crate) fn fake_model(url: &str) -> String {
    format!(
        "[provider]\nkind = \"openai\"\nbase_url = \"{url}\"\nmodels = {{ default = \"fake\" }}\n"
    )
}

/// The fake model of `model_chain`'s recipe: every answer after `delay`.
pub(crate) async fn chain_model(delay: std::time::Duration) -> flow_tests::fake_llm::FakeLlm {
    flow_tests::fake_llm::FakeLlm::start(
        vec![],
        serde_json::json!({ "text": "t", "score": 1 }),
        delay,
    )
    .await
}

/// A workflow `chain` of `steps` model calls, each prompt `TAG step I`
/// (`tag` its input), and the recipe `answer` they call: the fake model's
/// answer for it is `{ "text": ..., "score": ... }`.
pub(crate) fn model_chain(steps: usize) -> String {
    let mut source = String::from(
        "recipe answer { model \"default\" input { q: string } output { text: string, score: int } prompt \"{{input.q}}\" }\nworkflow chain {\n  input { tag: string }\n",
    );
    for i in 0..steps {
        source.push_str(&format!(
            "  step s{i} = answer {{ q: \"{{{{workflow_input.tag}}}} step {i}\" }}\n"
        ));
    }
    source.push_str(&format!(
        "  output {{ last: step.s{}.text }}\n}}\n",
        steps - 1
    ));
    source
}

impl Flowd {
    pub(crate) fn start(dir: &TempDir) -> Flowd {
        Flowd::start_with(dir, CONFIG)
    }

    pub(crate) fn start_with(dir: &TempDir, config: &str) -> Flowd {
        use std::io::{BufRead, BufReader};
        dir.write("flowd.toml", config);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flowd"))
            .arg("serve")
            .current_dir(dir.path())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("flowd starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let mut startup = String::new();
        let address = loop {
            line.clear();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                panic!("flowd exited before listening:\n{startup}");
            }
            // The log line `<time>  INFO listening on ADDRESS`.
            if let Some((_, found)) = line.trim().split_once(" listening on ") {
                break found.to_string();
            }
            startup.push_str(&line);
        };
        // Keep reading stderr so that flowd never blocks on a full pipe.
        std::thread::spawn(move || for _ in stderr.lines() {});
        Flowd {
            child,
            url: format!("http://{address}"),
            client: reqwest::Client::new(),
            startup,
        }
    }

    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.url));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("flowd answers");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// Deploys a `.flow` source to the account of `key`.
    pub(crate) async fn deploy(&self, key: &str, source: &str) {
        let (status, body) = self
            .try_deploy(key, serde_json::json!({ "source": source }))
            .await;
        assert_eq!(status, 201, "{body}");
    }

    /// `POST /v1/workflows` with `body` for the account of `key`: the
    /// status and the answer, for a test of what is refused.
    pub(crate) async fn try_deploy(
        &self,
        key: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        self.send(
            reqwest::Method::POST,
            "/v1/workflows",
            Some(key),
            Some(body),
        )
        .await
    }

    /// `GET /v1/runs/{run_id}/trace` for the account of `key`, which must
    /// answer 200.
    pub(crate) async fn trace(&self, run_id: &str, key: &str) -> serde_json::Value {
        let (status, trace) = self
            .send(
                reqwest::Method::GET,
                &format!("/v1/runs/{run_id}/trace"),
                Some(key),
                None,
            )
            .await;
        assert_eq!(status, 200, "{trace}");
        trace
    }

    /// Waits until `/metrics` has the line `line`; panics after `within`.
    pub(crate) async fn metric_reaches(&self, line: &str, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let metrics = self.metrics().await;
            if metrics.lines().any(|l| l == line) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no `{line}` within {within:?}:\n{metrics}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Approves the gate at `path` of run `run` of the account of `key`, as
    /// ana@acme.io: the status and the answer.
    pub(crate) async fn approve(
        &self,
        key: &str,
        run: &str,
        path: &str,
    ) -> (u16, serde_json::Value) {
        self.send(
            reqwest::Method::POST,
            &format!("/v1/runs/{run}/approvals/{path}"),
            Some(key),
            Some(serde_json::json!({ "approver": "ana@acme.io", "approved": true })),
        )
        .await
    }

    /// Starts a run (`POST /v1/runs` with `body`) for the account of `key`;
    /// its id.
    pub(crate) async fn start_run(&self, key: &str, body: serde_json::Value) -> String {
        let (status, answer) = self
            .send(reqwest::Method::POST, "/v1/runs", Some(key), Some(body))
            .await;
        assert_eq!(status, 202, "{answer}");
        answer["run_id"].as_str().expect("a run id").to_string()
    }

    /// The `/metrics` text (Prometheus scrapes without a key).
    pub(crate) async fn metrics(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.url))
            .send()
            .await;
        response.expect("flowd answers").text().await.unwrap()
    }

    /// Polls run `id` until it is no longer `running`; its record.
    pub(crate) async fn settled(&self, id: &str, key: &str) -> serde_json::Value {
        self.settled_within(id, key, std::time::Duration::from_secs(10))
            .await
    }

    /// Polls run `id` for up to `wait` until it is no longer `running`.
    pub(crate) async fn settled_within(
        &self,
        id: &str,
        key: &str,
        wait: std::time::Duration,
    ) -> serde_json::Value {
        self.poll_run(id, key, wait, "no longer running", |record| {
            record["status"] != "running"
        })
        .await
    }

    /// Polls run `id` until its status is `status`, for up to ten seconds.
    pub(crate) async fn reaches(&self, id: &str, key: &str, status: &str) -> serde_json::Value {
        let wait = std::time::Duration::from_secs(10);
        self.poll_run(id, key, wait, status, |record| record["status"] == status)
            .await
    }

    /// Polls run `id`'s record every 10 ms for up to `wait` until `done`
    /// says so; panics saying it is not `what` after that.
    async fn poll_run(
        &self,
        id: &str,
        key: &str,
        wait: std::time::Duration,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let (status, record) = self
                .send(
                    reqwest::Method::GET,
                    &format!("/v1/runs/{id}"),
                    Some(key),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{record}");
            if done(&record) {
                return record;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "run {id} is not {what}: {record}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM, then the exit code.
    pub(crate) fn stop(mut self) -> Option<i32> {
        flow_tests::signal(self.child.id(), "TERM");
        self.child.wait().expect("flowd exits").code()
    }
}

impl Drop for Flowd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OTLP/HTTP trace receiver on loopback: it decodes each export (the
/// JSON encoding) into its spans and keeps them.
pub(crate) struct OtlpReceiver {
    /// The collector's base URL, as `otlp_endpoint` takes it.
    pub(crate) url: String,
    spans: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl OtlpReceiver {
    pub(crate) async fn start() -> OtlpReceiver {
        use std::sync::{Arc, Mutex};
        let spans: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let kept = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: String| async move {
                let export: serde_json::Value =
                    serde_json::from_str(&body).expect("an export is JSON");
                let mut kept = kept.lock().unwrap();
                for resource in export["resourceSpans"].as_array().expect("resourceSpans") {
                    for scope in resource["scopeSpans"].as_array().expect("scopeSpans") {
                        kept.extend(scope["spans"].as_array().expect("spans").iter().cloned());
                    }
                }
                axum::http::StatusCode::OK
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        OtlpReceiver { url, spans }
    }

    /// Waits up to ten seconds for a span named `name`; every span so far.
    pub(crate) async fn wait_for(&self, name: &str) -> Vec<serde_json::Value> {
        for _ in 0..1_000 {
            let spans = self.spans.lock().unwrap().clone();
            if spans.iter().any(|span| span["name"] == name) {
                return spans;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no span `{name}` arrived");
    }
}

/// The value of attribute `key` of an OTLP span, as text.
pub(crate) fn attribute(span: &serde_json::Value, key: &str) -> String {
    span["attributes"]
        .as_array()
        .and_then(|attributes| attributes.iter().find(|a| a["key"] == key))
        .map(|a| {
            let value = &a["value"];
            value["stringValue"]
                .as_str()
                .or(value["intValue"].as_str())
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// The signing secret of the endpoints `Receiver` stands for.
pub(crate) const SECRET: &str = "whsec-0123456789abcdef";

/// `CONFIG` with one webhook endpoint for each account (named `crm`,
/// signed with `SECRET`, for every event): globex's at `globex`, acme's at
/// `acme`.
pub(crate) fn config_with_endpoints(globex: &str, acme: &str) -> String {
    let endpoint = |url: &str| {
        format!("[[accounts.webhooks]]\nname = \"crm\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n")
    };
    let globex_keys = "api_keys = [\"globex-key-0123456789\"]\n";
    CONFIG.replace(globex_keys, &format!("{globex_keys}{}", endpoint(globex))) + &endpoint(acme)
}

/// A loopback receiver that answers what it is told to, after a delay,
/// and keeps every post with whether its Standard Webhooks signature
/// verified.
pub(crate) struct Receiver {
    pub(crate) url: String,
    pub(crate) answer: Arc<AtomicU16>,
    /// How long it takes to answer, in milliseconds.
    pub(crate) delay_ms: Arc<AtomicU64>,
    posts: Arc<Mutex<Vec<Post>>>,
}

#[derive(Clone, Debug)]
pub(crate) struct Post {
    pub(crate) id: String,
    pub(crate) body: Value,
    /// Whether its `webhook-signature` verified under `SECRET`.
    pub(crate) signed: bool,
    pub(crate) at: Instant,
    pub(crate) answered: u16,
}

impl Receiver {
    pub(crate) async fn start(answer: u16) -> Receiver {
        let answer = Arc::new(AtomicU16::new(answer));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
        let router = {
            let (answer, delay_ms, posts) = (answer.clone(), delay_ms.clone(), posts.clone());
            axum::Router::new().route(
                "/hook",
                axum::routing::post(move |headers: HeaderMap, body: String| async move {
                    let header = |name: &str| headers[name].to_str().unwrap().to_string();
                    let id = header("webhook-id");
                    let timestamp: u64 = header("webhook-timestamp").parse().unwrap();
                    let expected = flow_daemon::webhooks::standard_signature(
                        SECRET,
                        &id,
                        timestamp,
                        body.as_bytes(),
                    );
                    let answered = answer.load(Ordering::SeqCst);
                    posts.lock().unwrap().push(Post {
                        id,
                        body: serde_json::from_str(&body).unwrap(),
                        signed: header("webhook-signature") == expected,
                        at: Instant::now(),
                        answered,
                    });
                    tokio::time::sleep(Duration::from_millis(delay_ms.load(Ordering::SeqCst)))
                        .await;
                    StatusCode::from_u16(answered).unwrap()
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Receiver {
            url,
            answer,
            delay_ms,
            posts,
        }
    }

    pub(crate) fn answer(&self, status: u16) {
        self.answer.store(status, Ordering::SeqCst);
    }

    pub(crate) fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    /// Waits until the posts satisfy `done`; the posts so far.
    pub(crate) async fn until(
        &self,
        within: Duration,
        done: impl Fn(&[Post]) -> bool,
    ) -> Vec<Post> {
        let deadline = Instant::now() + within;
        loop {
            let posts = self.posts();
            if done(&posts) {
                return posts;
            }
            assert!(
                Instant::now() < deadline,
                "not within {within:?}: {posts:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
