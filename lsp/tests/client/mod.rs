//! A minimal LSP client over the `flow-lsp` binary's stdio, for the
//! end-to-end tests: it frames JSON-RPC messages and keeps notifications.

#![allow(dead_code, unreachable_pub)] // reason: each test binary uses part of the helper

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub struct Client {
    child: Child,
    stdin: ChildStdin,
    incoming: Receiver<Value>,
    next_id: i64,
    /// Notifications received while waiting for responses.
    pub notifications: Vec<Value>,
}

impl Client {
    /// Starts the server and initializes it with `root` as workspace folder.
    pub fn start(root: &Path) -> Client {
        Client::start_with(root, json!({ "debounceMs": 20 }))
    }

    /// Starts the server with these `initializationOptions`.
    pub fn start_with(root: &Path, options: Value) -> Client {
        Client::start_as(root, options, json!({}))
    }

    /// Starts the server as a client that watches files for it (dynamic
    /// registration of `workspace/didChangeWatchedFiles`, as VS Code's).
    pub fn start_watching(root: &Path) -> Client {
        let workspace = json!({ "didChangeWatchedFiles": { "dynamicRegistration": true } });
        Client::start_as(root, json!({ "debounceMs": 20 }), workspace)
    }

    /// Starts the server with these `initializationOptions` and these
    /// `workspace` client capabilities.
    fn start_as(root: &Path, options: Value, workspace: Value) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flow-lsp"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("flow-lsp starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, incoming) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut length = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(value) = line.strip_prefix("Content-Length: ") {
                        length = value.parse::<usize>().ok();
                    }
                }
                let Some(length) = length else { return };
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                let Ok(message) = serde_json::from_slice::<Value>(&body) else {
                    return;
                };
                if sender.send(message).is_err() {
                    return;
                }
            }
        });
        let mut client = Client {
            child,
            stdin,
            incoming,
            next_id: 0,
            notifications: Vec::new(),
        };
        let root_uri = uri(root);
        let answer = client.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": root_uri,
                "workspaceFolders": [{ "uri": root_uri, "name": "test" }],
                "capabilities": {
                    "general": { "positionEncodings": ["utf-16"] },
                    "workspace": workspace
                },
                "initializationOptions": options
            }),
        );
        assert!(
            answer.get("result").is_some(),
            "initialize failed: {answer}"
        );
        client.notify("initialized", json!({}));
        client
    }

    /// The server's process id, to read its memory from /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send(&mut self, message: &Value) {
        let body = message.to_string();
        self.send_raw(format!("Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    }

    /// Sends `bytes` as they are, framing included.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).expect("the server reads");
        self.stdin.flush().expect("the server reads");
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// Sends a request and waits for its response (the whole message).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        self.response(&json!(id))
    }

    /// Waits for the response with this `id` (null for a message whose id
    /// the server could not read).
    pub fn response(&mut self, id: &Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let message = self
                .next(deadline)
                .unwrap_or_else(|| panic!("no response with id {id}"));
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return message;
            }
            self.keep(message);
        }
    }

    fn next(&mut self, deadline: Instant) -> Option<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        // A timeout and a closed server both end the wait.
        self.incoming.recv_timeout(left).ok()
    }

    fn keep(&mut self, message: Value) {
        // Requests from the server (such as registrations) get an empty answer.
        if let (Some(id), Some(_)) = (message.get("id"), message.get("method")) {
            let answer = json!({ "jsonrpc": "2.0", "id": id, "result": null });
            self.send(&answer);
        }
        self.notifications.push(message);
    }

    /// Waits for a `publishDiagnostics` for `uri` that satisfies `accept`.
    pub fn diagnostics_for(&mut self, uri: &str, accept: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = self.notifications.iter().find(|n| {
                n["method"] == "textDocument/publishDiagnostics"
                    && n["params"]["uri"] == uri
                    && accept(&n["params"])
            }) {
                return found["params"].clone();
            }
            let message = self
                .next(deadline)
                .unwrap_or_else(|| panic!("no diagnostics for {uri}: {:?}", self.notifications));
            self.keep(message);
        }
    }

    /// Waits for the server's request `method` (answered empty, as any).
    pub fn server_request(&mut self, method: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = self.notifications.iter().find(|n| n["method"] == method) {
                return found.clone();
            }
            let message = self
                .next(deadline)
                .unwrap_or_else(|| panic!("no {method}: {:?}", self.notifications));
            self.keep(message);
        }
    }

    /// Collects what arrives within `wait`.
    pub fn drain(&mut self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while let Some(message) = self.next(deadline) {
            self.keep(message);
        }
    }

    pub fn open(&mut self, path: &Path, text: &str) -> String {
        let uri = uri(path);
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": "flow", "version": 1, "text": text } }),
        );
        uri
    }

    /// Shuts the server down and makes it exit, with status 0.
    pub fn shutdown(mut self) {
        let answer = self.request("shutdown", Value::Null);
        assert!(answer.get("error").is_none(), "{answer}");
        self.notify("exit", Value::Null);
        let status = self.exited();
        assert!(status.success(), "`exit` after `shutdown`: {status}");
    }

    /// The server's exit status, once it exits, which it must within 10 s.
    pub fn exited(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("flow-lsp did not exit");
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// A fresh directory for one test, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("flow-lsp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TempDir(path)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("writable");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The zero-based line and UTF-16 character of the first `needle` in `text`, plus `shift`.
pub fn position(text: &str, needle: &str, shift: usize) -> Value {
    let at = text.find(needle).expect("the needle is in the text") + shift;
    let line = text[..at].matches('\n').count();
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    json!({ "line": line, "character": text[start..at].encode_utf16().count() })
}
