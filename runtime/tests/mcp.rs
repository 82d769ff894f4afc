//! The MCP pool against real servers from npm: the MCP reference server
//! (`@modelcontextprotocol/server-everything`) over stdio and streamable HTTP,
//! and Playwright's (`@playwright/mcp`) driving Debian's Chromium on a page
//! this test serves on loopback. `tests/setup.sh` (at the repository root)
//! installs them; without them the tests say they were skipped, and under
//! `FLOW_TEST_SERVICES=1` (CI) they fail.
//!
//! Servers started by a test carry `FLOW_MCP_TEST_MARK=<mark>` in their
//! environment (inherited by their children), so that a test counts its own
//! processes in /proc while other tests run beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flow_plan::{McpServer, McpTransport};
use flow_runtime::egress::{AllowedHost, EgressPolicy};
use flow_runtime::error::ErrorKind;
use flow_runtime::journal::{Journal as _, Outcome, StepStatus};
use flow_runtime::mcp::{BrowserPolicy, McpPool, McpPoolConfig, ServerSetup};
use flow_runtime::memory::MemoryStore;
use flow_runtime::offline::OfflineProvider;
use flow_runtime::services::Services;
use flow_tests::mcp_servers::dead;
use serde_json::{Value, json};

fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

fn everything_js() -> String {
    mcp_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .to_string_lossy()
        .into_owned()
}

/// A mark unique to this test process and `name`.
fn mark(name: &str) -> String {
    format!("{}-{name}", std::process::id())
}

fn stdio(name: &str, command: &str, args: &[&str], mark: &str) -> McpServer {
    McpServer {
        name: name.to_string(),
        transport: McpTransport::Stdio {
            command: command.to_string(),
            args: args.iter().map(ToString::to_string).collect(),
            env: vec![("FLOW_MCP_TEST_MARK".to_string(), mark.to_string())],
        },
    }
}

/// server-everything over stdio, one identity per `mark`.
fn everything(mark: &str) -> McpServer {
    stdio("everything", "node", &[&everything_js(), "stdio"], mark)
}

/// The live processes whose environment holds `mark`.
fn marked_processes(mark: &str) -> Vec<u32> {
    flow_tests::mcp_servers::marked_processes(|found| found == mark)
}

async fn wait_until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_stdio_echoes_gives_structured_content_and_lists_its_tools() {
    flow_tests::require!(McpServers);
    let mark = mark("stdio");
    let server = everything(&mark);
    let pool = McpPool::new(McpPoolConfig::default());

    let echoed = pool
        .call(&server, "echo", &json!({ "message": "hello" }))
        .await
        .expect("echo answers");
    assert_eq!(echoed, json!("Echo: hello"));

    let weather = pool
        .call(
            &server,
            "get-structured-content",
            &json!({ "location": "Chicago" }),
        )
        .await
        .expect("get-structured-content answers");
    assert_eq!(weather["temperature"], json!(36), "{weather}");
    assert_eq!(weather["conditions"], json!("Light rain / drizzle"));

    let tools = pool
        .tools(&server, Duration::from_secs(10))
        .await
        .expect("it lists its tools");
    let echo = tools
        .iter()
        .find(|t| t.name == "echo")
        .expect("echo listed");
    assert_eq!(echo.input_schema["required"], json!(["message"]));
    pool.check(&server, &["echo", "get-sum"], Duration::from_secs(10))
        .await
        .expect("it has both tools");
    let missing = pool
        .check(
            &server,
            &["echo", "browser_navigate"],
            Duration::from_secs(10),
        )
        .await
        .expect_err("it has no browser_navigate");
    assert!(
        missing
            .to_string()
            .contains("has no tool `browser_navigate`")
            && missing.to_string().contains("echo"),
        "{missing}"
    );

    // Three calls and two listings, one server.
    assert_eq!(pool.live_connections(), 1);
    assert_eq!(marked_processes(&mark).len(), 1);
    pool.shutdown().await;
    assert_eq!(pool.live_connections(), 0);
    assert!(marked_processes(&mark).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_error_fails_the_step_with_the_tools_message_without_a_retry() {
    flow_tests::require!(McpServers);
    let mark = mark("tool-error");
    let server = everything(&mark);
    let pool = Arc::new(McpPool::new(McpPoolConfig::default()));

    // The tool validates its arguments and answers with `isError`.
    let invalid = pool
        .call(&server, "get-sum", &json!({ "a": 1 }))
        .await
        .expect_err("b is missing");
    assert_eq!(invalid.kind, ErrorKind::Tool, "{invalid}");
    assert!(
        invalid.message.contains("get-sum") && invalid.message.contains('b'),
        "{invalid}"
    );
    let unknown = pool
        .call(&server, "no-such-tool", &json!({}))
        .await
        .expect_err("no such tool");
    assert_eq!(unknown.kind, ErrorKind::Tool, "{unknown}");
    assert!(unknown.message.contains("no-such-tool"), "{unknown}");

    // In a run: the step fails with that message after one attempt, though
    // it may retry three times.
    let source = format!(
        "mcp everything {{ command \"node\" args [{:?}, \"stdio\"] env {{ FLOW_MCP_TEST_MARK: {mark:?} }} }}\n\
         workflow echoes {{\n  step said = everything.echo {{ text: \"hello\" }} retry 3\n}}\n",
        everything_js()
    );
    let plan = compile(&source);
    let (outcome, store) = run_on_pool(&pool, &plan, "echoes", json!({})).await;
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("the run fails: {outcome:?}");
    };
    assert_eq!(error.kind, ErrorKind::Tool);
    assert!(
        error.message.contains("`echo` failed") && error.message.contains("message"),
        "{}",
        error.message
    );
    assert_eq!(step.as_deref(), Some("said"));
    let record = store.lookup("said").expect("the step is journaled");
    assert_eq!(record.attempts.len(), 1, "{:?}", record.attempts);
    assert_eq!(record.input, json!({ "text": "hello" }));
    pool.shutdown().await;
}

/// Regression (issue 21): a browser step waited for its turn on a busy
/// connection, and its call went out even if the run had passed to another
/// process meanwhile. The go-ahead is asked once the turn comes, just
/// before the call, and its refusal fails the call unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_asks_its_go_ahead_after_the_wait_for_its_turn() {
    flow_tests::require!(McpServers);
    let mark = mark("go-ahead");
    let server = everything(&mark);
    let pool = Arc::new(McpPool::new(McpPoolConfig {
        calls_per_connection: 1,
        ..McpPoolConfig::default()
    }));
    pool.call(&server, "echo", &json!({ "message": "warm" }))
        .await
        .expect("the server answers");
    let busy = {
        let (pool, server) = (Arc::clone(&pool), server.clone());
        tokio::spawn(async move {
            pool.call(
                &server,
                "trigger-long-running-operation",
                &json!({ "duration": 1, "steps": 1 }),
            )
            .await
            .expect("the long call answers");
            Instant::now()
        })
    };
    // The long call has the connection's one turn by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let go_ahead: flow_runtime::mcp::GoAhead<'_> = {
        let asked = Arc::clone(&asked);
        Box::pin(async move {
            *asked.lock().unwrap() = Some(Instant::now());
            Err((
                ErrorKind::Server,
                "the run is no longer this process's".to_string(),
            ))
        })
    };
    let refused = pool
        .call_in(
            &flow_runtime::mcp::McpScope::default(),
            &server,
            "echo",
            &json!({ "message": "late" }),
            Some(go_ahead),
        )
        .await
        .expect_err("the go-ahead refuses");
    assert!(
        refused.message.contains("no longer this process's"),
        "{refused}"
    );
    let long_done = busy.await.unwrap();
    let asked = asked.lock().unwrap().expect("the go-ahead was asked");
    assert!(
        asked >= long_done - Duration::from_millis(50),
        "asked before the turn came"
    );
    pool.shutdown().await;
}

/// A tool named with hyphens is written as it is named, and a deployment's
/// `McpPoolConfig::servers` replaces the file's declaration of a server: the
/// file's command does not exist here, the configured one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_server_replaces_the_files_declaration() {
    flow_tests::require!(McpServers);
    let mark = mark("configured");
    let source = "mcp everything { command \"no-such-command-here\" args [\"--x\"] }\n\
         workflow sums {\n  step sum = everything.get-sum { a: 2, b: 3 } retry 1\n  output { sum: step.sum }\n}\n";
    let plan = compile(source);
    let configured = everything(&mark);
    let pool = Arc::new(McpPool::new(McpPoolConfig {
        servers: [(
            "everything".to_string(),
            ServerSetup::from_plan(configured.transport.clone()),
        )]
        .into(),
        ..McpPoolConfig::default()
    }));
    let (outcome, _) = run_on_pool(&pool, &plan, "sums", json!({})).await;
    let Outcome::Completed { output } = outcome else {
        panic!("the run completes on the configured server: {outcome:?}");
    };
    assert_eq!(output["sum"], json!("The sum of 2 and 3 is 5."), "{output}");
    assert!(
        !marked_processes(&mark).is_empty(),
        "the configured command is the one running"
    );
    pool.shutdown().await;
}

/// Runs `workflow` of `plan` as `run-1` on a fresh memory store, its
/// browser steps on `pool`; the outcome and the store (for its journal).
async fn run_on_pool(
    pool: &Arc<McpPool>,
    plan: &flow_plan::Plan,
    workflow: &str,
    input: Value,
) -> (Outcome, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let services = Services {
        provider: Arc::new(OfflineProvider::default()),
        effects: store.clone(),
        mcp: Some(Arc::new(flow_runtime::mcp::PoolClient(pool.clone()))),
        journal: store.clone(),
        steps: None,
        in_flight: None,
    };
    let outcome = flow_runtime::run(plan, workflow, "run-1", input, services).await;
    (outcome, store)
}

/// A `.flow` source lowered to a plan.
fn compile(source: &str) -> flow_plan::Plan {
    struct One(String);
    impl flow_compiler::SourceLoader for One {
        fn load(&self, _: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
            Ok(self.0.clone().into_bytes())
        }
    }
    let checked = flow_compiler::check("test.flow", &One(source.to_string())).expect("readable");
    flow_compiler::lower(&checked).unwrap_or_else(|| panic!("checks clean: {:?}", checked))
}

/// A spare loopback port: bound, read, let go.
fn spare_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a loopback port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http() {
    flow_tests::require!(McpServers);
    let port = spare_port();
    let mut server_process = tokio::process::Command::new("node")
        .args([&everything_js(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    wait_until(Duration::from_secs(20), "the HTTP server listens", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    let server = McpServer {
        name: "everything_http".to_string(),
        transport: McpTransport::Http {
            url: format!("http://127.0.0.1:{port}/mcp"),
        },
    };
    let pool = McpPool::new(McpPoolConfig::default());
    assert_eq!(
        pool.call(&server, "echo", &json!({ "message": "over http" }))
            .await
            .expect("echo answers"),
        json!("Echo: over http")
    );
    let weather = pool
        .call(
            &server,
            "get-structured-content",
            &json!({ "location": "New York" }),
        )
        .await
        .expect("get-structured-content answers");
    assert_eq!(weather["humidity"], json!(82), "{weather}");
    let invalid = pool
        .call(&server, "get-sum", &json!({ "a": "one", "b": 2 }))
        .await
        .expect_err("a is not a number");
    assert_eq!(invalid.kind, ErrorKind::Tool, "{invalid}");
    assert_eq!(pool.live_connections(), 1);
    pool.shutdown().await;
    assert_eq!(pool.live_connections(), 0);
    server_process.kill().await.expect("the HTTP server stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_servers_worth_of_demand_never_run_more_than_twenty() {
    flow_tests::require!(McpServers);
    let pool = Arc::new(McpPool::new(McpPoolConfig::default()));
    let marks: Vec<String> = (0..50).map(|i| mark(&format!("fifty-{i}"))).collect();
    let prefix = mark("fifty-");
    let done = Arc::new(AtomicBool::new(false));
    let most_in_pool = Arc::new(AtomicUsize::new(0));
    let most_running = Arc::new(AtomicUsize::new(0));
    // Samples the pool's count and the processes actually running.
    let sampler = {
        let (pool, done) = (Arc::clone(&pool), Arc::clone(&done));
        let (most_in_pool, most_running) = (Arc::clone(&most_in_pool), Arc::clone(&most_running));
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                most_in_pool.fetch_max(pool.live_connections(), Ordering::SeqCst);
                let running = marked_processes_with_prefix(&prefix);
                most_running.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut calls = tokio::task::JoinSet::new();
    for (i, mark) in marks.iter().enumerate() {
        let (pool, server) = (Arc::clone(&pool), everything(mark));
        calls.spawn(async move {
            pool.call(
                &server,
                "echo",
                &json!({ "message": format!("server {i}") }),
            )
            .await
            .map(|echoed| (i, echoed))
        });
    }
    let mut answered = 0;
    while let Some(joined) = calls.join_next().await {
        let (i, echoed) = joined.expect("the task ends").expect("every call succeeds");
        assert_eq!(echoed, json!(format!("Echo: server {i}")));
        answered += 1;
    }
    done.store(true, Ordering::SeqCst);
    sampler.await.expect("the sampler ends");
    assert_eq!(answered, 50);
    let (in_pool, running) = (
        most_in_pool.load(Ordering::SeqCst),
        most_running.load(Ordering::SeqCst),
    );
    assert!(in_pool <= 20, "the pool counted {in_pool} connections");
    assert!(running <= 20, "{running} servers ran at once");
    assert_eq!(in_pool, 20, "the demand filled the pool");
    pool.shutdown().await;
    assert_eq!(marked_processes_with_prefix(&mark("fifty-")), 0);
}

/// How many live processes carry a mark that starts with `prefix`.
fn marked_processes_with_prefix(prefix: &str) -> usize {
    flow_tests::mcp_servers::marked_processes(|found| found.starts_with(prefix)).len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_recently_used_connection_makes_room() {
    flow_tests::require!(McpServers);
    let pool = McpPool::new(McpPoolConfig {
        max_connections: 3,
        ..McpPoolConfig::default()
    });
    let marks: Vec<String> = (0..4).map(|i| mark(&format!("lru-{i}"))).collect();
    let echo = |i: usize| {
        let server = everything(&marks[i]);
        let pool = &pool;
        async move {
            pool.call(&server, "echo", &json!({ "message": "x" }))
                .await
                .expect("echo answers");
        }
    };
    echo(0).await;
    echo(1).await;
    echo(2).await;
    // 0 is used again, so 1 is now the least recently used.
    echo(0).await;
    echo(3).await;
    wait_until(Duration::from_secs(5), "server 1 exits", || {
        marked_processes(&marks[1]).is_empty()
    })
    .await;
    for kept in [0, 2, 3] {
        assert_eq!(
            marked_processes(&marks[kept]).len(),
            1,
            "server {kept} runs"
        );
    }
    assert_eq!(pool.live_connections(), 3);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_and_its_server_exits() {
    flow_tests::require!(McpServers);
    let mark = mark("idle");
    let pool = McpPool::new(McpPoolConfig {
        idle_timeout: Duration::from_millis(400),
        keepalive_interval: Duration::from_millis(100),
        ..McpPoolConfig::default()
    });
    let server = everything(&mark);
    pool.call(&server, "echo", &json!({ "message": "x" }))
        .await
        .expect("echo answers");
    assert_eq!(marked_processes(&mark).len(), 1);
    wait_until(Duration::from_secs(5), "the idle server exits", || {
        marked_processes(&mark).is_empty() && pool.live_connections() == 0
    })
    .await;
    // The next call starts it again.
    pool.call(&server, "echo", &json!({ "message": "again" }))
        .await
        .expect("echo answers after the idle close");
    assert_eq!(marked_processes(&mark).len(), 1);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_replaced_on_next_use() {
    flow_tests::require!(McpServers);
    let mark = mark("killed");
    let pool = McpPool::new(McpPoolConfig::default());
    let server = everything(&mark);
    pool.call(&server, "echo", &json!({ "message": "x" }))
        .await
        .expect("echo answers");
    let first = marked_processes(&mark);
    assert_eq!(first.len(), 1);
    flow_tests::signal(first[0], "KILL");
    wait_until(Duration::from_secs(5), "the killed server is gone", || {
        dead(first[0])
    })
    .await;
    // The next call finds the crash and starts a new server, or, when it
    // comes before the pool can tell (the kernel shows the process dead a
    // moment before its parent can reap it), fails with a kind the step
    // retries, and the call after it does.
    if let Err(error) = pool
        .call(&server, "echo", &json!({ "message": "after the crash" }))
        .await
    {
        assert_eq!(error.kind, ErrorKind::Connection, "{error}");
        assert!(error.kind.retryable());
        assert_eq!(
            pool.call(&server, "echo", &json!({ "message": "again" }))
                .await
                .expect("a new server answers"),
            json!("Echo: again")
        );
    }
    let second = marked_processes(&mark);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);

    // A call racing the crash either finds it already (and starts a new
    // server) or fails with a kind the step retries; the next call works.
    flow_tests::signal(second[0], "KILL");
    if let Err(error) = pool
        .call(&server, "echo", &json!({ "message": "racing" }))
        .await
    {
        assert_eq!(error.kind, ErrorKind::Connection, "{error}");
        assert!(error.kind.retryable());
    }
    wait_until(Duration::from_secs(5), "the second server is gone", || {
        dead(second[0])
    })
    .await;
    pool.call(&server, "echo", &json!({ "message": "third" }))
        .await
        .expect("a third server answers");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_pings_is_replaced() {
    flow_tests::require!(McpServers);
    let mark = mark("frozen");
    let pool = McpPool::new(McpPoolConfig {
        keepalive_interval: Duration::from_millis(100),
        ping_timeout: Duration::from_millis(300),
        ..McpPoolConfig::default()
    });
    let server = everything(&mark);
    pool.call(&server, "echo", &json!({ "message": "x" }))
        .await
        .expect("echo answers");
    let frozen = marked_processes(&mark);
    assert_eq!(frozen.len(), 1);
    // Stopped, it answers nothing; SIGKILL still reaches it.
    flow_tests::signal(frozen[0], "STOP");
    wait_until(
        Duration::from_secs(10),
        "the frozen server is killed",
        || dead(frozen[0]),
    )
    .await;
    pool.call(&server, "echo", &json!({ "message": "y" }))
        .await
        .expect("a new server answers");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_outlives_a_dropped_pool_not_even_a_grandchild() {
    flow_tests::require!(McpServers);
    let mark = mark("dropped");
    let pool = McpPool::new(McpPoolConfig::default());
    // `sh` stays the group's leader and runs node as its child, as npx does.
    let wrapped = stdio(
        "wrapped",
        "sh",
        &["-c", &format!("node {} stdio; exit 0", everything_js())],
        &mark,
    );
    let direct = everything(&mark);
    for server in [&wrapped, &direct] {
        pool.call(server, "echo", &json!({ "message": "x" }))
            .await
            .expect("echo answers");
    }
    assert_eq!(marked_processes(&mark).len(), 3, "sh, its node, and node");
    drop(pool);
    wait_until(Duration::from_secs(5), "every server is gone", || {
        marked_processes(&mark).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_fail_to_start_fail_the_check_in_bounded_time_saying_why() {
    flow_tests::require!(McpServers);
    let mark = mark("bad");
    let pool = McpPool::new(McpPoolConfig::default());
    let within = Duration::from_secs(2);
    let cases = [
        (
            stdio("missing", "/nonexistent/flow-mcp-server", &[], &mark),
            ErrorKind::Unsupported,
            vec!["`missing`", "cannot start `/nonexistent/flow-mcp-server`"],
        ),
        (
            stdio(
                "crashes",
                "sh",
                &["-c", "echo 'cannot load config' >&2; exit 3"],
                &mark,
            ),
            ErrorKind::Connection,
            vec!["`crashes`", "exit status: 3", "cannot load config"],
        ),
        (
            stdio("hangs", "sleep", &["30"], &mark),
            ErrorKind::Timeout,
            vec!["`hangs`", "did not answer `initialize`"],
        ),
        (
            stdio(
                "chatty",
                "sh",
                &["-c", "echo 'Listening on stdio...'; sleep 30"],
                &mark,
            ),
            ErrorKind::Timeout,
            vec![
                "`chatty`",
                "did not answer `initialize`",
                "not a JSON-RPC message",
                "Listening on stdio...",
            ],
        ),
        (
            stdio(
                "malformed",
                "sh",
                &[
                    "-c",
                    "read request; echo '{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":42}'; sleep 30",
                ],
                &mark,
            ),
            ErrorKind::Connection,
            vec![
                "`malformed`",
                "answered `initialize` with something that is not its result",
                "42",
            ],
        ),
    ];
    for (server, kind, phrases) in cases {
        let started = Instant::now();
        let error = pool
            .check(&server, &["echo"], within)
            .await
            .expect_err("the check fails");
        let took = started.elapsed();
        assert!(
            took < within + Duration::from_secs(3),
            "{}: took {took:?}",
            server.name
        );
        assert_eq!(error.kind, kind, "{error}");
        for phrase in phrases {
            assert!(
                error.to_string().contains(phrase),
                "{phrase:?} not in: {error}"
            );
        }
    }
    wait_until(Duration::from_secs(5), "no failed server is left", || {
        marked_processes(&mark).is_empty()
    })
    .await;
    assert_eq!(pool.live_connections(), 0);
}

/// A page with a button that changes a heading, served on loopback: every
/// request gets it, its title naming the path asked for.
async fn serve_page() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("bound");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let mut request = vec![0u8; 4096];
                let read = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..read]);
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                let body = format!(
                    "<!doctype html><html><head><title>Page {path}</title></head><body>\
                     <h1 id=\"status\">Waiting for a click</h1>\
                     <button onclick=\"document.getElementById('status').textContent='Clicked at {path}'\">Press me</button>\
                     </body></html>"
                );
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (format!("http://{address}"), task)
}

/// Playwright's server on Debian's Chromium, headless, as design.md says.
fn playwright(mark: &str, output_dir: &Path) -> McpServer {
    let chromium = flow_tests::services::chromium();
    stdio(
        "browser",
        "node",
        &[
            &mcp_dir()
                .join("node_modules/@playwright/mcp/cli.js")
                .to_string_lossy(),
            "--executable-path",
            &chromium,
            "--headless",
            "--no-sandbox",
            "--isolated",
            "--output-dir",
            &output_dir.to_string_lossy(),
        ],
        mark,
    )
}

/// The `ref` Playwright's snapshot gives the element described by `line_part`.
fn snapshot_ref(snapshot: &str, line_part: &str) -> String {
    let line = snapshot
        .lines()
        .find(|line| line.contains(line_part))
        .unwrap_or_else(|| panic!("{line_part:?} not in the snapshot:\n{snapshot}"));
    let start = line.find("[ref=").expect("the element has a ref") + "[ref=".len();
    let end = start + line[start..].find(']').expect("the ref ends");
    line[start..end].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn playwright_navigates_snapshots_reads_and_clicks_on_a_loopback_page() {
    flow_tests::require!(McpServers, Chromium);
    let mark = mark("playwright");
    let output = tempdir("playwright");
    let (base, page_server) = serve_page().await;
    let pool = McpPool::new(McpPoolConfig::default());
    let browser = playwright(&mark, &output);
    let text = |value: Value| {
        value
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string())
    };

    let navigated = text(
        pool.call(
            &browser,
            "browser_navigate",
            &json!({ "url": format!("{base}/start") }),
        )
        .await
        .expect("navigate answers"),
    );
    assert!(navigated.contains("Page /start"), "{navigated}");

    let snapshot = text(
        pool.call(&browser, "browser_snapshot", &json!({}))
            .await
            .expect("snapshot answers"),
    );
    assert!(snapshot.contains("Waiting for a click"), "{snapshot}");
    let button = snapshot_ref(&snapshot, "button \"Press me\"");

    pool.call(
        &browser,
        "browser_click",
        &json!({ "element": "Press me button", "target": button }),
    )
    .await
    .expect("click answers");

    let heading = text(
        pool.call(
            &browser,
            "browser_evaluate",
            &json!({ "function": "() => document.getElementById('status').textContent" }),
        )
        .await
        .expect("evaluate answers"),
    );
    assert!(heading.contains("Clicked at /start"), "{heading}");

    // A tool error: Playwright says why, and the pool keeps the browser.
    let refused = pool
        .call(
            &browser,
            "browser_click",
            &json!({ "element": "nothing", "target": "e999" }),
        )
        .await
        .expect_err("no such element");
    assert_eq!(refused.kind, ErrorKind::Tool, "{refused}");
    assert!(refused.message.contains("e999"), "{refused}");
    assert_eq!(pool.live_connections(), 1);

    pool.shutdown().await;
    // Chromium's processes are children of Playwright's: all of them are gone.
    assert!(marked_processes(&mark).is_empty());
    page_server.abort();
    let _ = std::fs::remove_dir_all(&output);
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flow-mcp-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_step_journals_its_input_and_the_pages_output() {
    flow_tests::require!(McpServers, Chromium);
    let mark = mark("browser-step");
    let output = tempdir("browser-step");
    let (base, page_server) = serve_page().await;
    let pool = Arc::new(McpPool::new(McpPoolConfig::default()));
    let browser = playwright(&mark, &output);
    let McpTransport::Stdio { command, args, env } = &browser.transport else {
        unreachable!("playwright is a stdio server");
    };
    let source = format!(
        "mcp browser {{ command {command:?} args {args:?} env {{ FLOW_MCP_TEST_MARK: {:?} }} }}\n\
         workflow visit {{\n  input {{ url: string }}\n  step page = browser.browser_navigate {{ url: workflow_input.url }}\n  output {{ page: step.page }}\n}}\n",
        env[0].1
    );
    let plan = compile(&source);
    let url = format!("{base}/journaled");
    let (outcome, store) = run_on_pool(&pool, &plan, "visit", json!({ "url": url })).await;
    let Outcome::Completed { output: result } = outcome else {
        panic!("the run completes: {outcome:?}");
    };
    assert!(
        result["page"]
            .as_str()
            .unwrap_or("")
            .contains("Page /journaled"),
        "{result}"
    );
    let record = store.lookup("page").expect("journaled");
    assert_eq!(record.status, StepStatus::Completed);
    assert_eq!(record.input, json!({ "url": url }));
    assert_eq!(record.output.as_deref(), Some(&result["page"]));
    pool.shutdown().await;
    page_server.abort();
    let _ = std::fs::remove_dir_all(&output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_names_each_server_that_does_not_answer_and_runs_nothing() {
    flow_tests::require!(McpServers);
    let mark = mark("preflight");
    let pool = Arc::new(McpPool::new(McpPoolConfig {
        check_timeout: Duration::from_secs(2),
        ..McpPoolConfig::default()
    }));
    let source = format!(
        "mcp everything {{ command \"node\" args [{:?}, \"stdio\"] env {{ FLOW_MCP_TEST_MARK: {mark:?} }} }}\n\
         mcp hangs {{ command \"sleep\" args [\"30\"] env {{ FLOW_MCP_TEST_MARK: {mark:?} }} }}\n\
         mcp crashes {{ command \"sh\" args [\"-c\", \"echo 'no config' >&2; exit 3\"] env {{ FLOW_MCP_TEST_MARK: {mark:?} }} }}\n\
         workflow w {{\n  step said = everything.echo {{ message: \"x\" }} retry 1\n  step missing = everything.nonexistent {{}} retry 1\n  \
         step stuck = hangs.anything {{}} retry 1\n  step broken = crashes.anything {{}} retry 1\n}}\n",
        everything_js()
    );
    let plan = compile(&source);
    let started = Instant::now();
    let (outcome, store) = run_on_pool(&pool, &plan, "w", json!({})).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let Outcome::Failed {
        error, step: None, ..
    } = outcome
    else {
        panic!("preflight fails the run: {outcome:?}");
    };
    assert_eq!(error.kind, ErrorKind::Preflight);
    for phrase in [
        "MCP server `everything`",
        "has no tool `nonexistent`",
        "MCP server `hangs`",
        "did not answer `initialize`",
        "MCP server `crashes`",
        "exit status: 3",
        "no config",
    ] {
        assert!(
            error.message.contains(phrase),
            "{phrase:?} not in: {}",
            error.message
        );
    }
    assert!(store.lookup("said").is_none(), "no step ran");
    pool.shutdown().await;
    assert!(marked_processes(&mark).is_empty());
}

/// A browser server under a policy (flowd's default for a browser) reaches
/// no loopback or link-local address, by address or by name, and says why;
/// the origin the operator allows it does reach. Guards tenants' browser
/// steps against reaching flowd's host, its network and cloud metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_under_a_policy_reaches_private_addresses_only_where_allowed() {
    flow_tests::require!(McpServers, Chromium);
    let mark = mark("egress");
    let output = tempdir("egress");
    let (base, page_server) = serve_page().await;
    let browser = playwright(&mark, &output);

    let strict = browser_pool(&browser, BrowserPolicy::default());
    let port = base.rsplit(':').next().unwrap();
    for (url, why) in [
        (format!("{base}/secret"), "a loopback address"),
        (
            format!("http://localhost:{port}/secret"),
            "a loopback address",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "a link-local address",
        ),
    ] {
        let refused = strict
            .call(&browser, "browser_navigate", &json!({ "url": url }))
            .await
            .expect_err("a private address is refused");
        assert_eq!(refused.kind, ErrorKind::Tool, "{refused}");
        assert!(
            refused.message.contains(why) && refused.message.contains("allowed_origins"),
            "{url}: {refused}"
        );
    }
    strict.shutdown().await;

    let allowing = browser_pool(
        &browser,
        BrowserPolicy {
            egress: EgressPolicy {
                allowed: vec![AllowedHost::of_origin(&base).unwrap()],
                allow_private: false,
            },
            allowed_origins: vec![base.clone()],
            blocked_origins: Vec::new(),
        },
    );
    let page = allowing
        .call(
            &browser,
            "browser_navigate",
            &json!({ "url": format!("{base}/allowed") }),
        )
        .await
        .expect("the allowed origin is reached");
    assert!(format!("{page}").contains("Page /allowed"), "{page}");
    allowing.shutdown().await;
    page_server.abort();
    let _ = std::fs::remove_dir_all(&output);
}

/// A browser under a policy opens web pages only: none of Chromium's own
/// (`chrome://version` names the host's executable and profile, and
/// Chromium reads `chrome:version`, `about:version` and a URL with a tab
/// in its scheme as the same page), whichever tool is given the URL. And
/// it keeps no profile on disk, though the operator's arguments lack
/// `--isolated`. Guards the host's paths and one run's cookies from the
/// tenants whose runs come after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_under_a_policy_opens_web_pages_only_and_keeps_no_profile() {
    flow_tests::require!(McpServers, Chromium);
    let mark = mark("own-pages");
    let output = tempdir("own-pages-output");
    let home = tempdir("own-pages-home");
    let mut browser = playwright(&mark, &output);
    let McpTransport::Stdio { args, env, .. } = &mut browser.transport else {
        unreachable!("Playwright's server is started")
    };
    args.retain(|arg| arg != "--isolated");
    env.push(("HOME".to_string(), home.to_string_lossy().into_owned()));
    let pool = browser_pool(&browser, BrowserPolicy::default());
    for (tool, arguments) in [
        ("browser_navigate", json!({ "url": "chrome://version" })),
        ("browser_navigate", json!({ "url": "chrome:version" })),
        ("browser_navigate", json!({ "url": " CHROME://version" })),
        ("browser_navigate", json!({ "url": "chr\tome://version" })),
        ("browser_navigate", json!({ "url": "about:version" })),
        (
            "browser_navigate",
            json!({ "url": "view-source:https://example.com/" }),
        ),
        ("browser_navigate", json!({ "url": "file:///etc/passwd" })),
        (
            "browser_tabs",
            json!({ "action": "new", "url": "chrome://settings" }),
        ),
    ] {
        let refused = pool
            .call(&browser, tool, &arguments)
            .await
            .expect_err("a page of the browser's own is refused");
        assert_eq!(refused.kind, ErrorKind::Tool, "{arguments}: {refused}");
        assert!(
            refused.message.contains("opens http and https pages only"),
            "{arguments}: {refused}"
        );
    }
    // A blank page is no page of Chromium's, and opening one starts the
    // browser, which would make its profile now if it were kept on disk.
    let blank = pool
        .call(
            &browser,
            "browser_navigate",
            &json!({ "url": "about:blank" }),
        )
        .await
        .expect("a blank page opens");
    assert!(format!("{blank}").contains("about:blank"), "{blank}");
    pool.shutdown().await;
    // Chromium keeps its crash reports' settings in `$HOME/.config`; a
    // profile (cookies, local storage) is a `Default` folder.
    let profiles: Vec<_> = walk(&home)
        .into_iter()
        .filter(|path| path.ends_with("Default"))
        .collect();
    assert!(profiles.is_empty(), "the browser kept {profiles:?}");
    let _ = std::fs::remove_dir_all(&output);
    let _ = std::fs::remove_dir_all(&home);
}

/// A pool that starts `browser` alone, as flowd starts an operator's
/// browser server: under `policy`, in a directory of its own.
fn browser_pool(browser: &McpServer, policy: BrowserPolicy) -> McpPool {
    McpPool::new(McpPoolConfig {
        servers: [(
            "browser".to_string(),
            ServerSetup {
                browser: Some(policy),
                private_workdir: true,
                ..ServerSetup::from_plan(browser.transport.clone())
            },
        )]
        .into(),
        servers_from_plans: false,
        ..McpPoolConfig::default()
    })
}

/// Every file and folder under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

/// A server set up as flowd sets up the operator's servers sees none of the
/// process's environment but what it is given, and starts in an empty
/// directory of its own that is gone once it exits. Guards flowd's secrets
/// (`FLOWD_LINK_SECRET`, the provider's key) from third-party servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_gets_only_the_environment_it_is_given_and_a_private_directory() {
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "cargo gives test processes CARGO_MANIFEST_DIR; the test needs a variable to miss"
    );
    let seen = tempdir("environment");
    let script = format!(
        "env > {0}/env; pwd > {0}/pwd; ls -A > {0}/ls; sleep 30",
        seen.display()
    );
    let server = stdio("peek", "sh", &["-c", &script], &mark("environment"));
    let pool = McpPool::new(McpPoolConfig {
        servers: [(
            "peek".to_string(),
            ServerSetup {
                inherited_env: Some(vec!["PATH".to_string()]),
                private_workdir: true,
                ..ServerSetup::from_plan(server.transport.clone())
            },
        )]
        .into(),
        servers_from_plans: false,
        ..McpPoolConfig::default()
    });
    // Not an MCP server: it never answers, but it has looked by then.
    let error = pool
        .tools(&server, Duration::from_secs(2))
        .await
        .expect_err("it never answers");
    assert_eq!(error.kind, ErrorKind::Timeout, "{error}");
    let env = std::fs::read_to_string(seen.join("env")).expect("the server wrote its env");
    assert!(env.contains("PATH="), "{env}");
    assert!(env.contains("FLOW_MCP_TEST_MARK="), "its own env: {env}");
    assert!(!env.contains("CARGO_MANIFEST_DIR"), "{env}");
    let workdir = std::fs::read_to_string(seen.join("pwd")).unwrap();
    let workdir = Path::new(workdir.trim());
    assert_ne!(workdir, std::env::current_dir().unwrap());
    assert_eq!(std::fs::read_to_string(seen.join("ls")).unwrap(), "");
    pool.shutdown().await;
    assert!(!workdir.exists(), "{} is removed", workdir.display());
    let _ = std::fs::remove_dir_all(&seen);
}

/// A pool that takes servers from its configuration only refuses any other
/// name, whatever command the plan declares, and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_servers_from_plans_starts_nothing_a_plan_declares() {
    let seen = tempdir("from-plans");
    let touched = seen.join("touched");
    let server = stdio(
        "evil",
        "sh",
        &["-c", &format!("touch {}", touched.display())],
        &mark("from-plans"),
    );
    let pool = McpPool::new(McpPoolConfig {
        servers_from_plans: false,
        ..McpPoolConfig::default()
    });
    let error = pool
        .call(&server, "anything", &json!({}))
        .await
        .expect_err("not configured");
    assert_eq!(error.kind, ErrorKind::Unsupported, "{error}");
    assert!(error.message.contains("[mcp.servers.evil]"), "{error}");
    assert!(!error.to_string().contains("touch"), "{error}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!touched.exists(), "the plan's command ran");
    assert_eq!(pool.live_connections(), 0);
    let _ = std::fs::remove_dir_all(&seen);
}

/// Regression: a preflight that waited 25 s for a place in the pool said
/// its server "did not answer `initialize` within 1.263615ms". A timeout
/// says the whole time it was given, and how much went to waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_waiting_for_the_pool_says_the_whole_time_given() {
    let mark = mark("whole-time");
    let first = stdio("first", "sleep", &["30"], &mark);
    let second = stdio("second", "sleep", &["31"], &mark);
    let pool = Arc::new(McpPool::new(McpPoolConfig {
        max_connections: 1,
        ..McpPoolConfig::default()
    }));
    // The first holds the pool's only place while it fails to start.
    let holder = {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move { pool.tools(&first, Duration::from_secs(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let error = pool
        .tools(&second, Duration::from_secs(4))
        .await
        .expect_err("sleep is no MCP server");
    assert_eq!(error.kind, ErrorKind::Timeout, "{error}");
    assert!(
        error.message.contains("within 4s") && error.message.contains("waiting for a place"),
        "{error}"
    );
    assert!(holder.await.unwrap().is_err());
    pool.shutdown().await;
    wait_until(Duration::from_secs(5), "the servers exit", || {
        marked_processes(&mark).is_empty()
    })
    .await;
}
