//! The MCP servers of the tests, and the examples with their browser steps
//! pointed at this machine: Playwright's MCP server installed by
//! `tests/setup.sh` in `runtime/tests/mcp` (on Debian's Chromium), and pages served on
//! loopback by `PageServer`.
//!
//! The examples declare `mcp browser { command "npx" args ["-y", "@playwright/mcp",
//! ...] }` and take URLs of the outside world in their inputs. A test must
//! reach nothing beyond loopback, and must not depend on `npx` fetching a
//! package, so `local_examples` copies `examples/` with the declaration
//! rewritten to the project-local install and every URL of an input moved to
//! the page server, keeping its path.
//!
//! Servers a test starts carry `FLOW_MCP_TEST_MARK=<mark>` in their
//! environment (their children inherit it), so that a test finds its own
//! processes in /proc (`marked_processes`) while other tests run beside it.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::root;

/// The folder of the MCP servers' npm project.
pub fn mcp_servers_dir() -> PathBuf {
    root().join("runtime/tests/mcp")
}

/// The environment variable that marks a test's servers.
pub const MARK: &str = "FLOW_MCP_TEST_MARK";

/// One scan of /proc: the live processes whose mark `matches`. A process
/// whose environment cannot be read any more (it is exiting) does not count.
pub fn marked_processes(matches: impl Fn(&str) -> bool) -> Vec<u32> {
    let key = format!("{MARK}=");
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let found = environ
            .split(|b| *b == 0)
            .find_map(|variable| variable.strip_prefix(key.as_bytes()));
        let Some(found) = found else {
            continue;
        };
        if matches(&String::from_utf8_lossy(found)) && !dead(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `pid` has exited: gone, or a zombie whose every thread has
/// exited too. (A multi-threaded leader shows as a zombie while its other
/// threads are still tearing down; its parent cannot reap it before they are
/// done, and its pipes stay open until then.)
pub fn dead(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    })
}

/// The examples' own declaration of their browser server, as `flowc fmt`
/// writes it (a block's members on lines of their own).
pub const EXAMPLES_BROWSER: &str = r#"mcp browser {
  command "npx"
  args ["-y", "@playwright/mcp", "--headless", "--isolated"]
}"#;

/// The same server, installed in the project and driving Debian's Chromium
/// (`--no-sandbox`: tests run as root), its processes marked with `mark`.
pub fn local_browser(mark: &str) -> String {
    let chromium = crate::services::chromium();
    let cli = mcp_servers_dir().join("node_modules/@playwright/mcp/cli.js");
    format!(
        r#"mcp browser {{ command "node" args [{:?}, "--executable-path", {chromium:?}, "--headless", "--no-sandbox", "--isolated"] env {{ {MARK}: {mark:?} }} }}"#,
        cli.to_string_lossy()
    )
}

/// Copies `examples/` into `dir/examples`, the browser server made local
/// (its processes marked with the copy's path) and every URL in the inputs
/// moved to `base` (keeping its path); returns the copy's folder.
pub fn local_examples(dir: &Path, base: &str) -> PathBuf {
    let from = root().join("examples");
    let to = dir.join("examples");
    copy_dir(&from, &to);
    let browser = local_browser(&to.to_string_lossy());
    for entry in std::fs::read_dir(&to).expect("the copy exists").flatten() {
        let path = entry.path();
        let name = path.to_string_lossy().to_string();
        if name.ends_with(".flow") {
            let source = std::fs::read_to_string(&path).expect("readable");
            if source.contains("mcp browser") {
                assert!(
                    source.contains(EXAMPLES_BROWSER),
                    "{name} declares its browser otherwise than this harness expects"
                );
                std::fs::write(&path, source.replace(EXAMPLES_BROWSER, &browser))
                    .expect("writable");
            }
        } else if name.ends_with(".input.json") {
            let mut input: Value =
                serde_json::from_slice(&std::fs::read(&path).expect("readable")).expect("JSON");
            move_urls(&mut input, base);
            std::fs::write(&path, input.to_string()).expect("writable");
        }
    }
    to
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder for the copy");
    for entry in std::fs::read_dir(from).expect("readable").flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copied");
        }
    }
}

/// Replaces the scheme and host of every `http(s)://` string with `base`.
fn move_urls(value: &mut Value, base: &str) {
    match value {
        Value::String(text) => {
            for scheme in ["https://", "http://"] {
                if let Some(rest) = text.strip_prefix(scheme) {
                    let path = rest.find('/').map_or("/", |at| &rest[at..]);
                    *text = format!("{base}{path}");
                    return;
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| move_urls(item, base)),
        Value::Object(fields) => fields.values_mut().for_each(|field| move_urls(field, base)),
        _ => {}
    }
}

/// Pages on loopback: each path gets a page titled `Page <path>` with a
/// heading that says the path, so a test can tell which page a step saw.
#[derive(Debug)]
pub struct PageServer {
    pub base: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PageServer {
    pub fn start() -> PageServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        listener.set_nonblocking(true).expect("non-blocking");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            std::thread::spawn(move || answer(stream));
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    }
                }
            })
        };
        PageServer {
            base,
            stop,
            thread: Some(thread),
        }
    }
}

fn answer(mut stream: std::net::TcpStream) {
    let _ = stream.set_nonblocking(false);
    let mut request = [0u8; 4096];
    let read = stream.read(&mut request).unwrap_or(0);
    let request = String::from_utf8_lossy(&request[..read]);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let path: String = path
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "/-_.?=&".contains(*c))
        .collect();
    let body = format!(
        "<!doctype html><html><head><title>Page {path}</title></head>\
         <body><h1>You are at {path}</h1></body></html>"
    );
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
