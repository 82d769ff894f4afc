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
///
/// Each client is one keep-alive connection per flowd driven by hyper's
/// client connection, its headers built once: the generator shares the
/// machine's cores with flowd, and reqwest (a pool, a URL parsed and a
/// header map built per request) took 0.21 – 0.23 of a core in B9 where
/// this takes 0.14 – 0.17 (docs/benchmarks.md, B9).
pub(crate) async fn start_runs(
    bases: &[String],
    key: &'static str,
    body: String,
    runs: usize,
    connections: usize,
) {
    use axum::http::{HeaderValue, header};
    let next = Arc::new(AtomicUsize::new(0));
    let bases: Arc<[String]> = bases.into();
    let body = axum::body::Bytes::from(body);
    let bearer = HeaderValue::try_from(format!("Bearer {key}")).expect("a header value");
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (bases, body, bearer, next) = (
            Arc::clone(&bases),
            body.clone(),
            bearer.clone(),
            Arc::clone(&next),
        );
        workers.push(tokio::spawn(async move {
            let mut flowds = Vec::new();
            for base in bases.iter() {
                flowds.push(Connection::open(base).await);
            }
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= runs {
                    break;
                }
                let flowd = &mut flowds[n % bases.len()];
                let request = axum::http::Request::post("/v1/runs")
                    .header(header::HOST, flowd.host.clone())
                    .header(header::AUTHORIZATION, bearer.clone())
                    .header(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )
                    .body(axum::body::Body::from(body.clone()))
                    .expect("a request");
                flowd
                    .sender
                    .ready()
                    .await
                    .expect("the connection stays open");
                let response = flowd
                    .sender
                    .send_request(request)
                    .await
                    .expect("flowd answers");
                assert_eq!(response.status(), 202);
                // Read to its end, so that the connection takes the next.
                axum::body::to_bytes(axum::body::Body::new(response.into_body()), usize::MAX)
                    .await
                    .expect("the answer's body");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a client finishes");
    }
}

/// A load generator's keep-alive HTTP/1.1 connection to one flowd.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<axum::body::Body>,
    host: axum::http::HeaderValue,
}

impl Connection {
    /// Connects to `base` (`http://HOST:PORT`); the connection is driven by
    /// a task of its own until either side drops it.
    async fn open(base: &str) -> Connection {
        let address = base.strip_prefix("http://").expect("an http:// base");
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("flowd accepts");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("an HTTP/1.1 connection");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Connection {
            sender,
            host: axum::http::HeaderValue::try_from(address).expect("a host header"),
        }
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
