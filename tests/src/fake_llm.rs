//! A scripted OpenAI-compatible chat completions server on loopback, for the
//! provider tests and the crash-recovery test. Each request takes the next
//! reply of the script; past the script it answers with `default_answer`.
//! It records every request's last user message (the step's prompt) and when
//! the request began to arrive, so that a test can count how often each step
//! was called, and when. Requests to
//! `/v1/messages` get Anthropic's reply shape (the content as a forced tool
//! call's input), all others OpenAI's chat completion shape.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Status, extra headers, and the assistant's message content (for 200)
    /// or the error message.
    Answer(u16, Vec<(&'static str, &'static str)>, String),
    /// Closes the connection without answering.
    Reset,
    /// Waits this long, then answers 200 with the default answer.
    Stall(Duration),
    /// Answers 200 with this whole body, in no provider's shape but its
    /// own (a refusal, a reply cut at the output limit).
    Body(Value),
    /// Answers 200 and sends its body without end, a megabyte at a time,
    /// until the client goes away.
    Endless,
    /// Answers this status and headers, then closes the connection a few
    /// bytes into a body it said would be longer.
    CutBody(u16, Vec<(&'static str, &'static str)>),
    /// Answers 200 and a few bytes of a longer body, then sends nothing
    /// more for this long before it closes the connection.
    StallBody(Duration),
}

/// A 200 answer whose content is `content`.
pub fn ok(content: Value) -> Reply {
    Reply::Answer(200, vec![], content.to_string())
}

pub struct FakeLlm {
    /// The base URL, up to `/v1`.
    pub url: String,
    calls: Arc<Mutex<Vec<Call>>>,
    concurrency: Arc<Concurrency>,
}

/// One request: its prompt, and the wall-clock time (ms since the epoch) its
/// first bytes arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub prompt: String,
    pub at_ms: u64,
}

/// Requests being answered now, and the most there were at once.
#[derive(Default)]
struct Concurrency {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl FakeLlm {
    /// Starts the server on a loopback port, on the current tokio runtime.
    /// `delay` is added before every answer.
    pub async fn start(script: Vec<Reply>, default_answer: Value, delay: Duration) -> FakeLlm {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!("http://{}/v1", listener.local_addr().expect("an address"));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let recorded = Arc::clone(&calls);
        let concurrency = Arc::new(Concurrency::default());
        let counted = Arc::clone(&concurrency);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (script, recorded, default_answer, counted) = (
                    Arc::clone(&script),
                    Arc::clone(&recorded),
                    default_answer.clone(),
                    Arc::clone(&counted),
                );
                tokio::spawn(serve(
                    socket,
                    script,
                    recorded,
                    default_answer,
                    delay,
                    counted,
                ));
            }
        });
        FakeLlm {
            url,
            calls,
            concurrency,
        }
    }

    /// The most requests that were being answered at once.
    pub fn most_at_once(&self) -> usize {
        self.concurrency
            .most
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The variables that point `flow` at this model, with a key and a
    /// model name.
    pub fn flow_env(&self) -> [(&'static str, &str); 3] {
        [
            ("FLOW_LLM_BASE_URL", self.url.as_str()),
            ("FLOW_LLM_API_KEY", "test-key"),
            ("FLOW_LLM_MODEL", "fake-model"),
        ]
    }

    /// How many requests were answered or cut off.
    pub fn requests(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Returns once `n` requests have come (the runs that send them are
    /// under way); panics after 30 s.
    pub async fn until_requests(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.requests() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "the model got {} requests in 30 s, not {n}: the runs did not get going",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The prompt of every request, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.calls().into_iter().map(|call| call.prompt).collect()
    }

    /// Every request, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn serve(
    mut socket: tokio::net::TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    recorded: Arc<Mutex<Vec<Call>>>,
    default_answer: Value,
    delay: Duration,
    concurrency: Arc<Concurrency>,
) {
    // Read the headers, then the body by Content-Length.
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut began_ms = None;
    let body_start = loop {
        let Ok(n) = socket.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        began_ms.get_or_insert_with(now_ms);
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..body_start]).to_ascii_lowercase();
    let anthropic = head.starts_with("post /v1/messages");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < body_start + length {
        let Ok(n) = socket.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let request: Value = serde_json::from_slice(&buffer[body_start..]).unwrap_or(Value::Null);
    let prompt = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    recorded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Call {
            prompt,
            at_ms: began_ms.unwrap_or_else(now_ms),
        });
    // As Anthropic's API does: a message with no content is refused, but
    // for a last one of the assistant's (which the model continues).
    if anthropic && let Some(messages) = request["messages"].as_array() {
        let empty = messages.iter().enumerate().find(|(i, m)| {
            m["content"].as_str().is_some_and(str::is_empty)
                && !(i + 1 == messages.len() && m["role"] == "assistant")
        });
        if let Some((i, _)) = empty {
            let body = json!({ "type": "error", "error": { "type": "invalid_request_error", "message": format!("messages.{i}: all messages must have non-empty content except for the optional final assistant message") } }).to_string();
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            return;
        }
    }
    let reply = script
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop_front()
        .unwrap_or_else(|| ok(default_answer.clone()));
    {
        use std::sync::atomic::Ordering::SeqCst;
        let now = concurrency.now.fetch_add(1, SeqCst) + 1;
        concurrency.most.fetch_max(now, SeqCst);
        tokio::time::sleep(delay).await;
        concurrency.now.fetch_sub(1, SeqCst);
    }
    let (status, headers, content) = match reply {
        Reply::Reset => return,
        Reply::Body(body) => {
            let body = body.to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            return;
        }
        Reply::Endless => {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let megabyte = vec![b' '; 1 << 20];
            while socket.write_all(&megabyte).await.is_ok() {}
            return;
        }
        Reply::CutBody(status, headers) => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: 1000\r\nconnection: close\r\n"
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n{\"error\": {");
            let _ = socket.write_all(head.as_bytes()).await;
            return;
        }
        Reply::StallBody(wait) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\nconnection: close\r\n\r\n{\"choices\": [";
            if socket.write_all(head.as_bytes()).await.is_ok() {
                tokio::time::sleep(wait).await;
            }
            return;
        }
        Reply::Stall(wait) => {
            tokio::time::sleep(wait).await;
            (200, vec![], default_answer.to_string())
        }
        Reply::Answer(status, headers, content) => (status, headers, content),
    };
    let body = if status == 200 && anthropic {
        match serde_json::from_str::<Value>(&content) {
            Ok(input) => json!({ "content": [{ "type": "tool_use", "id": "t1", "name": "answer", "input": input }] }),
            Err(_) => json!({ "content": [{ "type": "text", "text": content }] }),
        }
        .to_string()
    } else if status == 200 {
        json!({ "choices": [{ "message": { "role": "assistant", "content": content } }] })
            .to_string()
    } else {
        json!({ "error": { "message": content } }).to_string()
    };
    let mut response = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    response.push_str("\r\n");
    response.push_str(&body);
    let _ = socket.write_all(response.as_bytes()).await;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
