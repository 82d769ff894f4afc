//! The MCP client of browser steps: a pool of connections to MCP servers.
//!
//! A browser step (`server.tool { args }`) calls a tool of an MCP server that a
//! `.flow` file declares, over stdio (a child process the pool starts) or
//! streamable HTTP. Starting a server costs from a tenth of a second (a small
//! Node.js server) to seconds (Playwright with a browser), so connections are
//! kept and shared by every run of the process, keyed by the server's identity:
//! the command, arguments and environment of a stdio server, the URL of an
//! HTTP one. Two `.flow` files that declare the same server share its
//! connection whatever they call it.
//!
//! The pool holds at most `max_connections` (20) connections. A server not in
//! the pool takes the place of the least recently used connection that no call
//! is using; when every connection is in use, the caller waits for one to be
//! released (the step's timeout bounds the wait). A connection unused for
//! `idle_timeout` (60 s) is closed; the others are pinged every
//! `keepalive_interval`, and one that does not answer is closed, so the next
//! call starts a fresh one instead of failing on a dead one. A connection
//! whose server exited is replaced at its next use.
//!
//! A stdio server runs in a process group of its own, and closing it signals
//! the whole group: `npx` and `sh -c` start the real server as a grandchild,
//! which killing the direct child alone would leave behind. Closing is
//! graceful first (stdin closed, then SIGTERM) and forceful after a grace
//! period (SIGKILL). Dropping the pool kills every group at once, so no server
//! outlives the process that started it; the binaries call `shutdown` before
//! they exit to give the servers their graceful close.
//!
//! The pool counts a connection from the start of its server until its
//! process has been reaped, closing ones included (a semaphore of
//! `max_connections` permits), so that no more than `max_connections` servers
//! are ever running, not merely held.

pub mod egress;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use flow_plan::{ErrorKind, McpServer, McpTransport, cut, shell_quote};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientRequest,
    ErrorCode, Implementation, PingRequest, ProtocolVersion,
};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::egress::{EgressPolicy, EgressProxy};

/// How a pool behaves; `Default` is what `flow run` and flowd use.
#[derive(Debug, Clone)]
pub struct McpPoolConfig {
    /// The most connections (running servers) at once.
    pub max_connections: usize,
    /// A connection unused for this long is closed.
    pub idle_timeout: Duration,
    /// How often an unused connection is pinged.
    pub keepalive_interval: Duration,
    /// How long a ping may take before the connection counts as dead.
    pub ping_timeout: Duration,
    /// How long a server may take to start and answer `initialize` when a
    /// step needs it. Playwright's server takes about a second, `npx`
    /// fetching a package first far longer.
    pub connect_timeout: Duration,
    /// How many tool calls one connection serves at once. An MCP session is
    /// stateful: Playwright's is one browser, and two navigations at once
    /// (a loop with `concurrency 4`) would each report whichever page loaded
    /// last. One at a time makes each call's answer its own.
    pub calls_per_connection: usize,
    /// How long preflight's check of a server (start, `initialize`,
    /// `tools/list`) may take. Below preflight's own bound on all servers
    /// together (30 s), so that a slow server is reported with the phase it
    /// was stuck in.
    pub check_timeout: Duration,
    /// Servers as this deployment reaches them, by name: a plan's server of
    /// that name is started or called this way instead of as its `.flow`
    /// file declares it. A file says what a workflow needs (`npx
    /// @playwright/mcp`); the machine it runs on knows where its browser is
    /// or which shared server to use.
    pub servers: BTreeMap<String, ServerSetup>,
    /// Whether a server that `servers` does not name may be started or
    /// reached as its plan declares it. `flow run` runs its user's own file
    /// (as `make` runs a Makefile); flowd runs tenants' plans and must never
    /// let their text choose a command or an address (`false`).
    pub servers_from_plans: bool,
    /// The most connections one account holds at once (flowd), so that one
    /// tenant's runs cannot take every place of the pool.
    pub max_connections_per_account: usize,
}

/// How a server is started or reached, and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSetup {
    pub transport: McpTransport,
    /// Which calls share one connection (one server process, one browser).
    pub isolation: Isolation,
    /// The variables of this process's environment a stdio server gets
    /// besides its own `env`; `None` passes all of them. A server is often
    /// third-party code fetched by `npx`: it must not see flowd's secrets.
    pub inherited_env: Option<Vec<String>>,
    /// Whether a stdio server starts in a fresh empty directory of its own
    /// (removed when it exits) rather than this process's: Playwright lets a
    /// page's file upload and its screenshots reach its working directory.
    pub private_workdir: bool,
    /// For a browser server (Playwright's): where its browser may connect.
    pub browser: Option<BrowserPolicy>,
}

impl ServerSetup {
    /// A server as a plan declares it, shared by the whole process and
    /// started with this process's environment and working directory.
    pub fn from_plan(transport: McpTransport) -> ServerSetup {
        ServerSetup {
            transport,
            isolation: Isolation::Process,
            inherited_env: None,
            private_workdir: false,
            browser: None,
        }
    }
}

/// Which calls share a connection to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// Every call of the process (`flow run`: one person's runs).
    Process,
    /// The calls of one account's runs.
    Account,
    /// The calls of one run's invocation: a browser's cookies, tabs and
    /// pages never outlive the run that made them, nor reach another run.
    Run,
}

/// Where a browser server's browser may connect (see `egress`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct BrowserPolicy {
    /// The private hosts allowed, and whether all are.
    pub egress: EgressPolicy,
    /// Playwright's `--allowed-origins`: when not empty, the only origins
    /// its browser requests.
    pub allowed_origins: Vec<String>,
    /// Playwright's `--blocked-origins`.
    pub blocked_origins: Vec<String>,
}

impl BrowserPolicy {
    /// Why a call with `arguments` may not go to a browser under this
    /// policy, if it may not: a `url` that opens one of the browser's own
    /// pages (`chrome://version` shows the host's paths, `chrome://settings`
    /// its configuration) or anything else the network policy does not
    /// see. A page only reaches them through these arguments: Chromium
    /// refuses a web page's links and scripts to them. The URL is read as
    /// Playwright reads it, by the WHATWG rules (`chrome:version`, ` CHROME:
    /// //version` and `chr\tome://version` are all `chrome:`); one that
    /// does not parse there is prefixed with `https://` by Playwright.
    pub fn refusal(&self, arguments: &serde_json::Map<String, Value>) -> Option<String> {
        let Some(Value::String(url)) = arguments.get("url") else {
            return None;
        };
        let parsed = reqwest::Url::parse(url).ok()?;
        match parsed.scheme() {
            "http" | "https" => None,
            "about" if parsed.path() == "blank" => None,
            scheme => Some(format!(
                "a browser here opens http and https pages only, not `{scheme}:` ({})",
                cut(url, 100)
            )),
        }
    }
}

/// Whose calls a connection serves: a process's, an account's or a run's
/// (`Isolation`). flowd gives each invocation of a run its scope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct McpScope {
    /// The account; empty for `flow run`.
    pub account: String,
    /// The run; empty when calls are not a run's (`flowc lock`).
    pub run: String,
}

impl Default for McpPoolConfig {
    fn default() -> McpPoolConfig {
        McpPoolConfig {
            max_connections: 20,
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(15),
            ping_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(60),
            calls_per_connection: 1,
            check_timeout: Duration::from_secs(25),
            servers: BTreeMap::new(),
            servers_from_plans: true,
            max_connections_per_account: 20,
        }
    }
}

/// How long a stdio server has to exit by itself once its stdin is closed,
/// and then once it got SIGTERM, before the next step of closing it.
const EXIT_ON_EOF: Duration = Duration::from_millis(500);
const EXIT_ON_TERM: Duration = Duration::from_millis(1500);
/// How much of a server's stderr is kept for error messages.
const STDERR_LINES: usize = 8;
const STDERR_LINE_CHARS: usize = 300;

/// A tool of an MCP server, as `tools/list` gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the tool's arguments.
    pub input_schema: Value,
}

/// Why talking to an MCP server failed: the server, in words a person
/// recognises from the `.flow` file, and what went wrong.
///
/// What a tenant may read is kept apart from what only the operator may:
/// `server` and `message` never carry a command line, a URL (which may hold
/// a password or a key), nor anything the server wrote to stderr; `how` and
/// `detail` do. `flow run` shows all of it (its user runs their own file);
/// flowd shows tenants `server` and `message` and logs the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct McpError {
    /// The server's name, as its plan gives it.
    pub server: String,
    /// How it is reached: its command line, or its URL.
    pub how: String,
    /// The retry policy's view of the failure.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
    /// What else is known, for the operator: the server's exit status and
    /// the end of its stderr, a transport error's own words. Empty, or
    /// starting with "; ".
    pub detail: String,
}

/// What a caller asks just before its call goes out (`McpPool::call_in`):
/// `Err` with the kind and message the call fails with, unsent.
pub type GoAhead<'a> =
    Pin<Box<dyn std::future::Future<Output = Result<(), (ErrorKind, String)>> + Send + 'a>>;

impl McpError {
    fn new(server: &McpServer, kind: ErrorKind, message: impl Into<String>) -> McpError {
        McpError {
            server: server.name.clone(),
            how: how_reached(server),
            kind,
            message: message.into(),
            detail: String::new(),
        }
    }

    fn with_detail(mut self, detail: impl Into<String>) -> McpError {
        self.detail.push_str(&detail.into());
        self
    }
}

impl fmt::Display for McpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MCP server `{}` ({}): {}{}",
            self.server, self.how, self.message, self.detail
        )
    }
}

impl std::error::Error for McpError {}

/// How a server is reached, for messages: its command line or URL.
fn how_reached(server: &McpServer) -> String {
    describe_transport(&server.transport)
}

/// How a server is started or reached, for people and logs others may read
/// (a CI job's): the command line, each word quoted as a shell would need
/// it, and the names of its environment variables, never their values; or
/// the URL without its user information and with its query's values masked,
/// since tokens travel there.
pub fn describe_transport(transport: &McpTransport) -> String {
    match transport {
        McpTransport::Stdio { command, args, env } => {
            let mut line = shell_quote(command);
            for arg in args {
                line.push(' ');
                line.push_str(&shell_quote(arg));
            }
            if !env.is_empty() {
                let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
                line.push_str(&format!(" (environment: {})", names.join(", ")));
            }
            line
        }
        McpTransport::Http { url } => masked_url(url),
    }
}

/// `url` with its user information (`user:password@`) replaced and its
/// query's values masked: how logs others may read show a URL (flowd's
/// provider URL too).
pub fn masked_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut shown = match base.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://***{}", &rest[at..]),
                None => base.to_string(),
            }
        }
        None => base.to_string(),
    };
    if let Some(query) = query {
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None => pair.to_string(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&masked.join("&"));
    }
    shown
}

/// What makes two uses the same server: the name a file gives it does not;
/// its command line and environment (or URL), how it is set up, and whose
/// calls it serves (`Isolation`) do. The transport is its `identity`, the
/// same that `flow.lock` finds a server by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ServerKey {
    transport: McpTransport,
    browser: Option<BrowserPolicy>,
    inherited_env: Option<Vec<String>>,
    private_workdir: bool,
    /// The account it serves, unless the process shares it.
    account: Option<String>,
    /// The run it serves, when isolated per run.
    run: Option<String>,
}

impl ServerKey {
    fn of(setup: &ServerSetup, scope: &McpScope) -> ServerKey {
        let (account, run) = match setup.isolation {
            Isolation::Process => (None, None),
            Isolation::Account => (Some(scope.account.clone()), None),
            Isolation::Run => (Some(scope.account.clone()), Some(scope.run.clone())),
        };
        ServerKey {
            transport: setup.transport.identity(),
            browser: setup.browser.clone(),
            inherited_env: setup.inherited_env.clone(),
            private_workdir: setup.private_workdir,
            account,
            run,
        }
    }

    fn in_scope(&self, scope: &McpScope) -> bool {
        self.account.as_deref() == Some(scope.account.as_str())
            && self.run.as_deref() == Some(scope.run.as_str())
    }
}

/// A pool of MCP connections shared by the runs of a process; see the module
/// documentation.
pub struct McpPool {
    shared: Arc<Shared>,
    /// Closes idle connections and pings the others; started with the first
    /// use, so that a pool can be made outside an async runtime.
    housekeeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl fmt::Debug for McpPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpPool")
            .field("config", &self.shared.config)
            .field("live_connections", &self.live_connections())
            .finish()
    }
}

struct Shared {
    config: McpPoolConfig,
    state: Mutex<State>,
    /// Woken when a slot is released or removed: a caller waiting for room
    /// looks again.
    room: Notify,
    /// One permit per server that may be running: held from its start until
    /// its process is reaped (or its HTTP session closed).
    running: Arc<Semaphore>,
    /// The HTTP client of every streamable-HTTP server (one connection pool).
    http: reqwest::Client,
}

#[derive(Default)]
struct State {
    slots: HashMap<ServerKey, Slot>,
}

/// A server's place in the pool; it holds at most one connection.
struct Slot {
    entry: Arc<Entry>,
    /// Calls (and pings) using it now; only a slot nobody holds is evicted
    /// or closed for idleness.
    holders: usize,
    /// The last time a call released it, for LRU eviction and idleness.
    last_used: Instant,
    /// The last time it was used or pinged, for keepalive.
    last_checked: Instant,
}

struct Entry {
    /// The connection, once made; the lock is held while one is being made,
    /// so that concurrent first calls start the server once.
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

impl Entry {
    async fn close(&self) {
        let connection = self.connection.lock().await.take();
        if let Some(connection) = connection {
            connection.close().await;
        }
    }
}

impl McpPool {
    pub fn new(config: McpPoolConfig) -> McpPool {
        let max = config.max_connections.max(1);
        McpPool {
            shared: Arc::new(Shared {
                config: McpPoolConfig {
                    max_connections: max,
                    ..config
                },
                state: Mutex::new(State::default()),
                room: Notify::new(),
                running: Arc::new(Semaphore::new(max)),
                http: reqwest::Client::new(),
            }),
            housekeeper: Mutex::new(None),
        }
    }

    /// `server` as this deployment reaches it (`McpPoolConfig::servers`),
    /// and how it is set up; an error for a server the configuration does
    /// not name when plans may not bring their own.
    fn resolve(&self, server: &McpServer) -> Result<(McpServer, ServerSetup), McpError> {
        let config = &self.shared.config;
        match config.servers.get(&server.name) {
            Some(setup) => Ok((
                McpServer {
                    name: server.name.clone(),
                    transport: setup.transport.clone(),
                },
                setup.clone(),
            )),
            None if config.servers_from_plans => Ok((
                server.clone(),
                ServerSetup::from_plan(server.transport.clone()),
            )),
            None => Err(McpError {
                server: server.name.clone(),
                // How the plan declares it is not how anything is reached here.
                how: "not configured".to_string(),
                kind: ErrorKind::Unsupported,
                message: format!(
                    "no MCP server `{}` is configured here, and servers that files declare are not started here (flowd starts its operator's `[mcp.servers.{}]` only; `flow run --no-mcp-from-file` none)",
                    server.name, server.name
                ),
                detail: String::new(),
            }),
        }
    }

    /// Whether a server that the configuration does not name is started or
    /// reached as its plan declares it (`McpPoolConfig::servers_from_plans`).
    pub fn servers_from_plans(&self) -> bool {
        self.shared.config.servers_from_plans
    }

    /// Servers running (or being closed) for this pool now.
    pub fn live_connections(&self) -> usize {
        self.shared.config.max_connections - self.shared.running.available_permits()
    }

    /// How long a preflight `check` waits for a server (`McpPoolConfig`).
    pub fn check_timeout(&self) -> Duration {
        self.shared.config.check_timeout
    }

    /// Calls `tool` of `server` with `args` (a JSON object, or null for no
    /// arguments). The output is the tool's structured content when it gives
    /// one, else its text content (the text blocks joined by newlines), else
    /// its content blocks as JSON.
    pub async fn call(
        &self,
        server: &McpServer,
        tool: &str,
        args: &Value,
    ) -> Result<Value, McpError> {
        self.call_in(&McpScope::default(), server, tool, args, None)
            .await
    }

    /// `call` on behalf of `scope`: on a connection of its own when the
    /// server is isolated per account or per run. `go_ahead`, when given,
    /// is asked once the call has its connection and its turn, just before
    /// it goes out: the wait for a slot can outlast the caller's right to
    /// call (a run's hold, passed to another process meanwhile), and its
    /// refusal fails the call unsent.
    pub async fn call_in(
        &self,
        scope: &McpScope,
        server: &McpServer,
        tool: &str,
        args: &Value,
        go_ahead: Option<GoAhead<'_>>,
    ) -> Result<Value, McpError> {
        let (server, setup) = self.resolve(server)?;
        let server = &server;
        let arguments = match args {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            other => {
                return Err(McpError::new(
                    server,
                    ErrorKind::Expression,
                    format!("the arguments of `{tool}` must be a record, not {other}"),
                ));
            }
        };
        if let (Some(policy), Some(arguments)) = (&setup.browser, &arguments)
            && let Some(refusal) = policy.refusal(arguments)
        {
            return Err(McpError::new(server, ErrorKind::Tool, refusal));
        }
        let began = Instant::now();
        let lease = self.lease(&setup, scope).await;
        let deadline = Instant::now() + self.shared.config.connect_timeout;
        let connection = lease.connection(server, &setup, began, deadline).await?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        // Waiting for its turn happens under the lease: the slot is in use.
        let Ok(_turn) = connection.calls.acquire().await else {
            return Err(McpError::new(
                server,
                ErrorKind::Connection,
                "the connection was closed",
            ));
        };
        if let Some(go_ahead) = go_ahead {
            go_ahead
                .await
                .map_err(|(kind, message)| McpError::new(server, kind, message))?;
        }
        // Refusals before this call are another call's.
        connection.take_refusals();
        match connection.peer.call_tool(params).await {
            Ok(result) => tool_output(result).map_err(|(kind, message)| {
                let mut message = format!("`{tool}` failed: {message}");
                let refused = connection.take_refusals();
                if !refused.is_empty() {
                    let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
                    message.push_str(&format!(
                        "; the browser may not connect to {}: its network policy allows private addresses only where the operator allows their origin (`allowed_origins`)",
                        refused.join(", ")
                    ));
                }
                McpError::new(server, kind, message)
            }),
            Err(error) => {
                let (kind, message, detail, broken) = service_error(&error);
                let mut error =
                    McpError::new(server, kind, format!("`{tool}`: {message}")).with_detail(detail);
                if broken {
                    error = error.with_detail(connection.ending().await);
                    lease.discard(&connection).await;
                }
                Err(error)
            }
        }
    }

    /// The rmcp peer of `server`'s pooled connection, started if needed: for
    /// MCP requests the pool does not wrap, and for the benchmark that sets
    /// a direct call beside a pooled one. Requests on it bypass the pool's
    /// turns (`calls_per_connection`) and do not count as uses for idleness.
    pub async fn peer(&self, server: &McpServer) -> Result<Peer<RoleClient>, McpError> {
        let (server, setup) = self.resolve(server)?;
        let scope = McpScope::default();
        let began = Instant::now();
        let lease = self.lease(&setup, &scope).await;
        let deadline = Instant::now() + self.shared.config.connect_timeout;
        Ok(lease
            .connection(&server, &setup, began, deadline)
            .await?
            .peer
            .clone())
    }

    /// The tools `server` lists, connecting to it first if needed; fails
    /// within `within`, saying which phase ran out of time.
    pub async fn tools(
        &self,
        server: &McpServer,
        within: Duration,
    ) -> Result<Vec<McpTool>, McpError> {
        self.tools_in(&McpScope::default(), server, within).await
    }

    /// `tools` on behalf of `scope` (see `call_in`).
    pub async fn tools_in(
        &self,
        scope: &McpScope,
        server: &McpServer,
        within: Duration,
    ) -> Result<Vec<McpTool>, McpError> {
        let (server, setup) = self.resolve(server)?;
        let server = &server;
        let began = Instant::now();
        let deadline = began + within;
        let Ok(lease) = tokio::time::timeout_at(deadline, self.lease(&setup, scope)).await else {
            return Err(McpError::new(
                server,
                ErrorKind::Timeout,
                format!(
                    "all {} connections of the MCP pool stayed in use for {within:?}",
                    self.shared.config.max_connections
                ),
            ));
        };
        let connection = lease.connection(server, &setup, began, deadline).await?;
        match tokio::time::timeout_at(deadline, connection.peer.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools
                .into_iter()
                .map(|tool| McpTool {
                    name: tool.name.to_string(),
                    description: tool.description.map(|d| d.to_string()),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                })
                .collect()),
            Ok(Err(error)) => {
                let (kind, message, detail, broken) = service_error(&error);
                let mut error = McpError::new(server, kind, format!("`tools/list`: {message}"))
                    .with_detail(detail);
                if broken {
                    error = error.with_detail(connection.ending().await);
                    lease.discard(&connection).await;
                }
                Err(error)
            }
            Err(_) => Err(McpError::new(
                server,
                ErrorKind::Timeout,
                format!("answered `initialize` but did not list its tools within {within:?}"),
            )),
        }
    }

    /// The preflight check of a server: it starts, answers `initialize` and
    /// lists its tools within `within`, and has every tool of `tools`.
    pub async fn check(
        &self,
        server: &McpServer,
        tools: &[&str],
        within: Duration,
    ) -> Result<(), McpError> {
        self.check_in(&McpScope::default(), server, tools, within)
            .await
    }

    /// `check` on behalf of `scope` (see `call_in`).
    pub async fn check_in(
        &self,
        scope: &McpScope,
        server: &McpServer,
        tools: &[&str],
        within: Duration,
    ) -> Result<(), McpError> {
        let listed = self.tools_in(scope, server, within).await?;
        let missing: Vec<String> = tools
            .iter()
            .filter(|wanted| !listed.iter().any(|tool| tool.name == **wanted))
            .map(|name| format!("`{name}`"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut names: Vec<&str> = listed.iter().map(|tool| tool.name.as_str()).collect();
        names.sort_unstable();
        Err(McpError::new(
            server,
            ErrorKind::Tool,
            format!(
                "has no tool {} (its tools: {})",
                missing.join(", "),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ))
    }

    /// Closes every connection gracefully (stdin closed, SIGTERM, then
    /// SIGKILL after the grace periods) and waits for the servers to exit.
    /// The pool stays usable: a later call starts its server again.
    pub async fn shutdown(&self) {
        if let Some(housekeeper) = self.lock_housekeeper().take() {
            housekeeper.abort();
        }
        let entries: Vec<Arc<Entry>> = {
            let mut state = self.shared.lock_state();
            state.slots.drain().map(|(_, slot)| slot.entry).collect()
        };
        self.shared.room.notify_waiters();
        let mut closing = tokio::task::JoinSet::new();
        for entry in entries {
            closing.spawn(async move { entry.close().await });
        }
        while closing.join_next().await.is_some() {}
    }

    fn lock_housekeeper(&self) -> std::sync::MutexGuard<'_, Option<tokio::task::JoinHandle<()>>> {
        self.housekeeper.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `server`: its own, or a new one in the place of the
    /// least recently used free slot, or, when all are in use, the first
    /// that frees up.
    async fn lease(&self, setup: &ServerSetup, scope: &McpScope) -> Lease {
        {
            let mut housekeeper = self.lock_housekeeper();
            if housekeeper.is_none() {
                let tick = self
                    .shared
                    .config
                    .idle_timeout
                    .min(self.shared.config.keepalive_interval)
                    .div_f64(4.0)
                    .clamp(Duration::from_millis(10), Duration::from_secs(5));
                *housekeeper = Some(tokio::spawn(housekeep(Arc::downgrade(&self.shared), tick)));
            }
        }
        let key = ServerKey::of(setup, scope);
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            let taken = {
                let mut state = self.shared.lock_state();
                self.take_slot(&mut state, &key, room.as_mut())
            };
            match taken {
                Some((entry, evicted)) => {
                    if let Some(evicted) = evicted {
                        // Its server keeps its permit until it has exited, so
                        // the new connection may wait for that (`connection`).
                        tokio::spawn(async move { evicted.close().await });
                    }
                    return Lease::new(&self.shared, key, entry, true);
                }
                // Every slot is in use: wait for a release.
                None => room.await,
            }
        }
    }

    /// The slot of `key`, held: the existing one, or a new one (with the
    /// entry it evicted to make room). `None` when every slot is in use;
    /// `room` is then enabled before the lock is let go, so that no release
    /// is missed.
    fn take_slot(
        &self,
        state: &mut State,
        key: &ServerKey,
        room: Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) -> Option<(Arc<Entry>, Option<Arc<Entry>>)> {
        if let Some(slot) = state.slots.get_mut(key) {
            slot.holders += 1;
            return Some((Arc::clone(&slot.entry), None));
        }
        let config = &self.shared.config;
        // An account at its share makes room among its own connections; a
        // full pool, among everyone's.
        let account_full = key.account.as_ref().is_some_and(|account| {
            state
                .slots
                .keys()
                .filter(|other| other.account.as_ref() == Some(account))
                .count()
                >= config.max_connections_per_account.max(1)
        });
        let evicted = if !account_full && state.slots.len() < config.max_connections {
            None
        } else {
            let victim = state
                .slots
                .iter()
                .filter(|(_, slot)| slot.holders == 0)
                .filter(|(other, _)| !account_full || other.account == key.account)
                .min_by_key(|(_, slot)| slot.last_used)
                .map(|(key, _)| key.clone());
            let Some(victim) = victim else {
                room.enable();
                return None;
            };
            state.slots.remove(&victim).map(|slot| slot.entry)
        };
        let entry = Arc::new(Entry {
            connection: tokio::sync::Mutex::new(None),
        });
        let now = Instant::now();
        state.slots.insert(
            key.clone(),
            Slot {
                entry: Arc::clone(&entry),
                holders: 1,
                last_used: now,
                last_checked: now,
            },
        );
        Some((entry, evicted))
    }

    /// Closes the connections that serve `scope`'s run alone (`Isolation::Run`):
    /// its invocation has ended, and its browser's pages, cookies and
    /// storage go with it. Connections shared by the account or the
    /// process stay.
    pub fn close_scope(&self, scope: &McpScope) {
        let entries: Vec<Arc<Entry>> = {
            let mut state = self.shared.lock_state();
            let keys: Vec<ServerKey> = state
                .slots
                .keys()
                .filter(|key| key.in_scope(scope))
                .cloned()
                .collect();
            keys.iter()
                .filter_map(|key| state.slots.remove(key))
                .map(|slot| slot.entry)
                .collect()
        };
        if entries.is_empty() {
            return;
        }
        self.shared.room.notify_waiters();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                for entry in entries {
                    runtime.spawn(async move { entry.close().await });
                }
            }
            // No runtime to close them gracefully: at once.
            Err(_) => {
                for entry in entries {
                    if let Ok(mut connection) = entry.connection.try_lock()
                        && let Some(connection) = connection.take()
                    {
                        connection.kill_now();
                    }
                }
            }
        }
    }
}

impl Drop for McpPool {
    /// Kills every server's process group at once. A graceful close needs the
    /// async runtime, which may be gone by now: `shutdown` is that.
    fn drop(&mut self) {
        if let Some(housekeeper) = self.lock_housekeeper().take() {
            housekeeper.abort();
        }
        let entries: Vec<Arc<Entry>> = {
            let mut state = self.shared.lock_state();
            state.slots.drain().map(|(_, slot)| slot.entry).collect()
        };
        for entry in entries {
            // A connection being made holds the lock; its process is killed
            // when the connect future is dropped with the runtime.
            if let Ok(mut connection) = entry.connection.try_lock()
                && let Some(connection) = connection.take()
            {
                connection.kill_now();
            }
        }
    }
}

impl Shared {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A slot held by a call (or a ping); released on drop, also when the call's
/// future is dropped at a step's timeout.
struct Lease {
    shared: Arc<Shared>,
    key: ServerKey,
    entry: Arc<Entry>,
    /// Whether releasing it counts as a use (a ping does not: an unused
    /// connection must still go idle).
    touch: bool,
}

impl Lease {
    fn new(shared: &Arc<Shared>, key: ServerKey, entry: Arc<Entry>, touch: bool) -> Lease {
        Lease {
            shared: Arc::clone(shared),
            key,
            entry,
            touch,
        }
    }

    /// The slot's connection: the one it has if its server still runs, else
    /// a new one, made by the first caller while the others wait for it.
    async fn connection(
        &self,
        server: &McpServer,
        setup: &ServerSetup,
        began: Instant,
        deadline: Instant,
    ) -> Result<Arc<Connection>, McpError> {
        let mut slot = match tokio::time::timeout_at(deadline, self.entry.connection.lock()).await {
            Ok(slot) => slot,
            Err(_) => {
                return Err(McpError::new(
                    server,
                    ErrorKind::Timeout,
                    "did not answer `initialize` in time (another call is still starting it)",
                ));
            }
        };
        if let Some(connection) = slot.as_ref() {
            if connection.is_alive() {
                return Ok(Arc::clone(connection));
            }
            // Its server exited or the connection broke: replace it.
            if let Some(dead) = slot.take() {
                tokio::spawn(async move { dead.close().await });
            }
        }
        let Ok(permit) =
            tokio::time::timeout_at(deadline, Arc::clone(&self.shared.running).acquire_owned())
                .await
        else {
            return Err(McpError::new(
                server,
                ErrorKind::Timeout,
                "the servers the pool closed to make room did not exit in time",
            ));
        };
        let Ok(permit) = permit else {
            return Err(McpError::new(
                server,
                ErrorKind::Unsupported,
                "the MCP pool is closed",
            ));
        };
        let connection =
            Arc::new(Connection::open(&self.shared, server, setup, permit, began, deadline).await?);
        *slot = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// Takes a broken connection out of the slot (unless another call
    /// replaced it already) and closes it.
    async fn discard(&self, broken: &Arc<Connection>) {
        let mut slot = self.entry.connection.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, broken))
        {
            slot.take();
        }
        drop(slot);
        let broken = Arc::clone(broken);
        tokio::spawn(async move { broken.close().await });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut state = self.shared.lock_state();
        if let Some(slot) = state.slots.get_mut(&self.key)
            && Arc::ptr_eq(&slot.entry, &self.entry)
        {
            slot.holders = slot.holders.saturating_sub(1);
            if self.touch {
                let now = Instant::now();
                slot.last_used = now;
                slot.last_checked = now;
            }
        }
        drop(state);
        self.shared.room.notify_waiters();
    }
}

/// Every `tick`: closes the connections unused for `idle_timeout`, pings
/// those unchecked for `keepalive_interval`. Ends with the pool.
async fn housekeep(shared: Weak<Shared>, tick: Duration) {
    loop {
        tokio::time::sleep(tick).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (idle, due) = {
            let mut state = shared.lock_state();
            let idle_keys: Vec<ServerKey> = state
                .slots
                .iter()
                .filter(|(_, slot)| {
                    slot.holders == 0 && now - slot.last_used >= shared.config.idle_timeout
                })
                .map(|(key, _)| key.clone())
                .collect();
            let idle: Vec<Arc<Entry>> = idle_keys
                .iter()
                .filter_map(|key| state.slots.remove(key))
                .map(|slot| slot.entry)
                .collect();
            let mut due = Vec::new();
            for (key, slot) in &mut state.slots {
                if slot.holders == 0 && now - slot.last_checked >= shared.config.keepalive_interval
                {
                    slot.holders += 1;
                    slot.last_checked = now;
                    due.push(Lease::new(
                        &shared,
                        key.clone(),
                        Arc::clone(&slot.entry),
                        false,
                    ));
                }
            }
            (idle, due)
        };
        if !idle.is_empty() {
            shared.room.notify_waiters();
        }
        for entry in idle {
            tokio::spawn(async move { entry.close().await });
        }
        for lease in due {
            let ping_timeout = shared.config.ping_timeout;
            tokio::spawn(async move {
                let connection = lease.entry.connection.lock().await.clone();
                let Some(connection) = connection else {
                    return;
                };
                let ping = connection
                    .peer
                    .send_request(ClientRequest::PingRequest(PingRequest::default()));
                let answered = matches!(tokio::time::timeout(ping_timeout, ping).await, Ok(Ok(_)));
                if !answered || !connection.is_alive() {
                    lease.discard(&connection).await;
                }
            });
        }
    }
}

/// One connection to one server.
struct Connection {
    peer: Peer<RoleClient>,
    /// The rmcp service driving the connection; taken when it is closed.
    service: Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    /// The server's process, for a stdio server.
    process: Option<ServerProcess>,
    /// The proxy in front of a browser server's browser.
    proxy: Option<EgressProxy>,
    /// This connection's place among the servers running; given back once
    /// its server has exited.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Turns for tool calls (`calls_per_connection`).
    calls: Semaphore,
}

impl Connection {
    async fn open(
        shared: &Shared,
        server: &McpServer,
        setup: &ServerSetup,
        permit: OwnedSemaphorePermit,
        began: Instant,
        deadline: Instant,
    ) -> Result<Connection, McpError> {
        let client = client_info();
        // What a timeout says: the whole time the caller gave, and how much
        // of it went to waiting for room in the pool, not the moments the
        // server had after that wait.
        let too_slow = |started: Instant| {
            let mut message = format!("did not answer `initialize` within {:?}", deadline - began);
            let waited = started.saturating_duration_since(began);
            if waited >= Duration::from_millis(100) {
                message.push_str(&format!(
                    " ({waited:?} of it waiting for a place in the MCP pool)"
                ));
            }
            message
        };
        match &server.transport {
            McpTransport::Stdio { command, args, env } => {
                let proxy = match &setup.browser {
                    Some(policy) => Some(EgressProxy::start(policy.egress.clone()).await.map_err(
                        |error| {
                            McpError::new(
                                server,
                                ErrorKind::Connection,
                                "the browser's network proxy could not start",
                            )
                            .with_detail(format!("; {error}"))
                        },
                    )?),
                    None => None,
                };
                let mut args = args.clone();
                if let (Some(policy), Some(proxy)) = (&setup.browser, &proxy) {
                    args.extend(browser_arguments(policy, proxy));
                }
                let process = ServerProcess::spawn(server, setup, command, &args, env)?;
                let transport = process.transport();
                let started = Instant::now();
                let service = match tokio::time::timeout_at(deadline, client.serve(transport)).await
                {
                    Ok(Ok(service)) => service,
                    Ok(Err(error)) => {
                        let (message, detail) = initialize_error(&error);
                        let detail = format!("{detail}{}", process.ending().await);
                        process.stop().await;
                        return Err(McpError::new(server, ErrorKind::Connection, message)
                            .with_detail(detail));
                    }
                    Err(_) => {
                        let detail = process.ending().await;
                        process.stop().await;
                        return Err(McpError::new(server, ErrorKind::Timeout, too_slow(started))
                            .with_detail(detail));
                    }
                };
                Ok(Connection {
                    peer: service.peer().clone(),
                    service: Mutex::new(Some(service)),
                    process: Some(process),
                    proxy,
                    permit: Mutex::new(Some(permit)),
                    calls: Semaphore::new(shared.config.calls_per_connection.max(1)),
                })
            }
            McpTransport::Http { url } => {
                let transport = StreamableHttpClientTransport::with_client(
                    shared.http.clone(),
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()),
                );
                let started = Instant::now();
                let service = match tokio::time::timeout_at(deadline, client.serve(transport)).await
                {
                    Ok(Ok(service)) => service,
                    Ok(Err(error)) => {
                        let (message, detail) = initialize_error(&error);
                        return Err(McpError::new(server, ErrorKind::Connection, message)
                            .with_detail(detail));
                    }
                    Err(_) => {
                        return Err(McpError::new(server, ErrorKind::Timeout, too_slow(started)));
                    }
                };
                Ok(Connection {
                    peer: service.peer().clone(),
                    service: Mutex::new(Some(service)),
                    process: None,
                    proxy: None,
                    permit: Mutex::new(Some(permit)),
                    calls: Semaphore::new(shared.config.calls_per_connection.max(1)),
                })
            }
        }
    }

    /// The connections the browser's proxy refused since the last call.
    fn take_refusals(&self) -> Vec<crate::egress::Refusal> {
        self.proxy
            .as_ref()
            .map(EgressProxy::take_refusals)
            .unwrap_or_default()
    }

    fn is_alive(&self) -> bool {
        !self.peer.is_transport_closed()
            && self.process.as_ref().is_none_or(ServerProcess::is_running)
    }

    /// How the server ended, for an error message: its exit status and the
    /// last lines of its stderr (empty for an HTTP server).
    async fn ending(&self) -> String {
        match &self.process {
            Some(process) => process.ending().await,
            None => String::new(),
        }
    }

    /// Closes the session, then the server's process group, and gives the
    /// permit back once the server has exited.
    async fn close(&self) {
        let service = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut service) = service {
            // Closing the transport closes a stdio server's stdin, which is
            // the MCP way to ask it to exit.
            let _ = service.close_with_timeout(EXIT_ON_EOF).await;
        }
        if let Some(process) = &self.process {
            process.stop().await;
        }
        self.permit.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Kills the server's process group now, without waiting: for `Drop`.
    fn kill_now(&self) {
        if let Some(service) = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            service.cancellation_token().cancel();
        }
        if let Some(process) = &self.process {
            process.kill_group(rustix::process::Signal::KILL);
        }
    }
}

/// Who this client is, in `initialize`. The 2026 protocol has no
/// `initialize`; the servers of today speak the versions before it.
fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("flow", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// What failed in `initialize`, and the words of the server or transport
/// for the operator (`McpError::detail`).
fn initialize_error(error: &ClientInitializeError) -> (String, String) {
    match error {
        ClientInitializeError::ConnectionClosed(_) => (
            "closed the connection before answering `initialize`".to_string(),
            String::new(),
        ),
        ClientInitializeError::JsonRpcError(data) => (
            "refused `initialize`".to_string(),
            format!(": {}", cut(&data.message, 300)),
        ),
        ClientInitializeError::ExpectedInitResponse(message) => (
            "answered `initialize` with a malformed message".to_string(),
            format!(
                ": {}",
                message
                    .as_ref()
                    .and_then(|m| serde_json::to_string(m).ok())
                    .map_or_else(|| "nothing".to_string(), |m| cut(&m, 200))
            ),
        ),
        ClientInitializeError::ExpectedInitResult(result) => (
            "answered `initialize` with something that is not its result".to_string(),
            format!(
                ": {}",
                result
                    .as_ref()
                    .and_then(|r| serde_json::to_string(r).ok())
                    .map_or_else(|| "nothing".to_string(), |r| cut(&r, 200))
            ),
        ),
        // Transport errors name the URL, which may carry credentials. Their
        // own words name rmcp's types (`Transport [rmcp::transport::worker::
        // WorkerTransport<...>] error`): the innermost cause says what
        // happened (a refused connection, a name that does not resolve).
        other => {
            let mut cause: &dyn std::error::Error = other;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            // rmcp writes the cause into its own words, after the type.
            let words = cause.to_string();
            let words = match words.split_once("] error: ") {
                Some((_, after)) if words.contains("Transport [") => after.to_string(),
                _ => words,
            };
            (
                "failed in `initialize`".to_string(),
                format!(": {}", cut(&words, 300)),
            )
        }
    }
}

/// The arguments that put Playwright's MCP server under a browser policy:
/// its browser behind the egress proxy, its profile in memory (without
/// `--isolated` Playwright keeps one on disk, under `$HOME/.cache`, after
/// the server ends), and the operator's origin lists.
fn browser_arguments(policy: &BrowserPolicy, proxy: &EgressProxy) -> Vec<String> {
    let mut arguments = vec![
        "--proxy-server".to_string(),
        proxy.url(),
        "--isolated".to_string(),
    ];
    if !policy.allowed_origins.is_empty() {
        arguments.push("--allowed-origins".to_string());
        arguments.push(policy.allowed_origins.join(";"));
    }
    if !policy.blocked_origins.is_empty() {
        arguments.push("--blocked-origins".to_string());
        arguments.push(policy.blocked_origins.join(";"));
    }
    arguments
}

/// The retry policy's kind of a request's failure, its message, the words
/// of the transport for the operator (`McpError::detail`), and whether the
/// connection is broken (and must be replaced).
fn service_error(error: &ServiceError) -> (ErrorKind, String, String, bool) {
    match error {
        ServiceError::McpError(data) => {
            let kind = match data.code {
                ErrorCode::INTERNAL_ERROR => ErrorKind::Server,
                // The TypeScript SDK's request timeout and closed connection.
                ErrorCode(-32001) => ErrorKind::Timeout,
                ErrorCode(-32000) => ErrorKind::Connection,
                _ => ErrorKind::Tool,
            };
            // The server's answer to this request: the caller's business.
            (kind, data.message.to_string(), String::new(), false)
        }
        ServiceError::TransportSend(error) => (
            ErrorKind::Connection,
            "the connection failed".to_string(),
            format!(": {error}"),
            true,
        ),
        ServiceError::TransportClosed => (
            ErrorKind::Connection,
            "the server closed the connection".to_string(),
            String::new(),
            true,
        ),
        ServiceError::Cancelled { reason } => (
            ErrorKind::Connection,
            "the connection was cancelled".to_string(),
            format!(": {}", reason.as_deref().unwrap_or("no reason given")),
            true,
        ),
        ServiceError::Timeout { timeout } => (
            ErrorKind::Timeout,
            format!("no answer within {timeout:?}"),
            String::new(),
            false,
        ),
        ServiceError::UnexpectedResponse => (
            ErrorKind::Server,
            "the server answered with a message of another kind".to_string(),
            String::new(),
            false,
        ),
        other => (
            ErrorKind::Server,
            "the request failed".to_string(),
            format!(": {other}"),
            false,
        ),
    }
}

/// Words in a tool's error message that say the failure is passing, with
/// the kind that retries it. Everything else a tool reports is its answer to
/// this call and is not retried. Matched in lower case.
const TRANSIENT_TOOL_ERRORS: &[(&str, ErrorKind)] = &[
    ("timed out", ErrorKind::Timeout),
    ("timeout", ErrorKind::Timeout),
    ("etimedout", ErrorKind::Timeout),
    ("econnreset", ErrorKind::Connection),
    ("connection reset", ErrorKind::Connection),
    ("err_connection_reset", ErrorKind::Connection),
    ("econnrefused", ErrorKind::Connection),
    ("connection refused", ErrorKind::Connection),
    ("err_connection_refused", ErrorKind::Connection),
    ("err_network_changed", ErrorKind::Connection),
    ("temporarily unavailable", ErrorKind::Server),
];

/// A tool result as a step's output, or its error's kind and message.
fn tool_output(result: CallToolResult) -> Result<Value, (ErrorKind, String)> {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| block.as_text())
        .map(|text| text.text.as_str())
        .collect();
    if result.is_error == Some(true) {
        let message = if texts.is_empty() {
            "the tool reported an error without a message".to_string()
        } else {
            texts.join("\n")
        };
        let lower = message.to_lowercase();
        let kind = TRANSIENT_TOOL_ERRORS
            .iter()
            .find(|(marker, _)| lower.contains(marker))
            .map_or(ErrorKind::Tool, |(_, kind)| *kind);
        return Err((kind, message));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    if !texts.is_empty() {
        return Ok(Value::String(texts.join("\n")));
    }
    serde_json::to_value(&result.content).map_err(|e| (ErrorKind::Server, e.to_string()))
}

/// A stdio server's process: the leader of a process group of its own.
struct ServerProcess {
    child: tokio::sync::Mutex<tokio::process::Child>,
    /// The process group's id (the leader's pid); always above 1, since
    /// signalling group 1 or 0 would reach far more than the server.
    group: rustix::process::Pid,
    /// Set once the leader has been reaped and its group signalled a last
    /// time: from then on the group id may be reused, so it is not signalled
    /// again.
    ended: AtomicBool,
    exit: Mutex<Option<ExitStatus>>,
    /// Its pipes until `transport` takes them.
    pipes: Mutex<Option<(WatchedStdout, tokio::process::ChildStdin)>>,
    /// The last lines it wrote to stderr.
    stderr: Arc<Mutex<std::collections::VecDeque<String>>>,
    /// The last line of its stdout that was not a JSON-RPC message.
    foreign: Arc<Mutex<Option<String>>>,
    /// Its working directory when it has one of its own; removed with it.
    _workdir: Option<PrivateDir>,
}

/// A directory only this process's user can enter, removed on drop.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn create() -> std::io::Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "flow-mcp-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // `create`, not `create_all`: a path that exists already is not ours.
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(PrivateDir(path))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl ServerProcess {
    fn spawn(
        server: &McpServer,
        setup: &ServerSetup,
        command: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<ServerProcess, McpError> {
        let mut command_line = tokio::process::Command::new(command);
        if let Some(inherited) = &setup.inherited_env {
            command_line.env_clear();
            for name in inherited {
                if let Some(value) = std::env::var_os(name) {
                    command_line.env(name, value);
                }
            }
        }
        let workdir = if setup.private_workdir {
            let dir = PrivateDir::create().map_err(|error| {
                McpError::new(
                    server,
                    ErrorKind::Connection,
                    "the server's working directory could not be made",
                )
                .with_detail(format!("; {error}"))
            })?;
            command_line.current_dir(&dir.0);
            Some(dir)
        } else {
            None
        };
        let mut child = command_line
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own: closing the server signals its children too.
            .process_group(0)
            // The last resort for the leader, should everything else be skipped.
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                let kind = match error.kind() {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                        ErrorKind::Unsupported
                    }
                    _ => ErrorKind::Connection,
                };
                McpError::new(server, kind, "the server could not be started")
                    .with_detail(format!("; cannot start `{command}`: {error}"))
            })?;
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|pid| *pid > 1)
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| {
                McpError::new(server, ErrorKind::Connection, "the server exited at once")
            })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(McpError::new(
                server,
                ErrorKind::Connection,
                "the server's pipes could not be opened",
            ));
        };
        let stderr_tail = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        tokio::spawn(keep_tail(stderr, Arc::clone(&stderr_tail)));
        let foreign = Arc::new(Mutex::new(None));
        Ok(ServerProcess {
            child: tokio::sync::Mutex::new(child),
            group,
            ended: AtomicBool::new(false),
            exit: Mutex::new(None),
            pipes: Mutex::new(Some((
                WatchedStdout {
                    inner: stdout,
                    watch: LineWatch {
                        line: Vec::new(),
                        foreign: Arc::clone(&foreign),
                    },
                },
                stdin,
            ))),
            stderr: stderr_tail,
            foreign,
            _workdir: workdir,
        })
    }

    /// The server's stdout and stdin, for rmcp's line transport.
    fn transport(&self) -> (WatchedStdout, tokio::process::ChildStdin) {
        self.pipes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("the transport is taken once, right after the spawn")
    }

    fn kill_group(&self, signal: rustix::process::Signal) {
        if !self.ended.load(Ordering::SeqCst) {
            // ESRCH (the group is gone) is what a clean exit leaves.
            let _ = rustix::process::kill_process_group(self.group, signal);
        }
    }

    /// Whether the leader still runs; reaps it (and kills what is left of
    /// its group) once it has exited.
    fn is_running(&self) -> bool {
        let Ok(mut child) = self.child.try_lock() else {
            // Being stopped.
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.reaped(status);
                false
            }
            Err(_) => false,
        }
    }

    /// Records the leader's exit and kills the rest of its group: its id is
    /// still reserved while any member lives, so this reaches only them.
    fn reaped(&self, status: ExitStatus) {
        if !self.ended.load(Ordering::SeqCst) {
            let _ = rustix::process::kill_process_group(self.group, rustix::process::Signal::KILL);
            self.ended.store(true, Ordering::SeqCst);
        }
        *self.exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    /// Asks the group to exit (SIGTERM), then makes it (SIGKILL), and reaps
    /// the leader. The caller has closed stdin before, if it could.
    async fn stop(&self) {
        let mut child = self.child.lock().await;
        if self.ended.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(Ok(status)) = tokio::time::timeout(EXIT_ON_EOF, child.wait()).await {
            self.reaped(status);
            return;
        }
        self.kill_group(rustix::process::Signal::TERM);
        if let Ok(Ok(status)) = tokio::time::timeout(EXIT_ON_TERM, child.wait()).await {
            self.reaped(status);
            return;
        }
        self.kill_group(rustix::process::Signal::KILL);
        if let Ok(status) = child.wait().await {
            self.reaped(status);
        }
    }

    /// How the server ended, for an error message: its exit status (waited
    /// for briefly), the last stdout line that was not JSON-RPC, and the
    /// last lines of its stderr.
    async fn ending(&self) -> String {
        let mut text = String::new();
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            let running = self.is_running();
            if !running || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(status) = *self.exit.lock().unwrap_or_else(|p| p.into_inner()) {
            text.push_str(&format!("; it exited ({status})"));
        }
        if let Some(line) = self
            .foreign
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            text.push_str(&format!(
                "; it wrote a line that is not a JSON-RPC message to stdout: {line:?}"
            ));
        }
        let stderr = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if !stderr.is_empty() {
            let lines: Vec<&str> = stderr.iter().map(String::as_str).collect();
            text.push_str(&format!("; its stderr ends with: {}", lines.join(" | ")));
        }
        text
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_group(rustix::process::Signal::KILL);
    }
}

/// Reads a server's stderr to its end, keeping the last lines. Reading it
/// also keeps a chatty server from blocking on a full pipe.
async fn keep_tail(
    stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<std::collections::VecDeque<String>>>,
) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                if text.is_empty() {
                    continue;
                }
                let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == STDERR_LINES {
                    tail.pop_front();
                }
                tail.push_back(cut(text, STDERR_LINE_CHARS));
            }
        }
    }
}

/// A server's stdout as rmcp reads it, watched for lines that are not
/// JSON-RPC messages. rmcp skips such lines silently, and a server that
/// prints only those would otherwise look like one that hangs.
struct WatchedStdout {
    inner: tokio::process::ChildStdout,
    watch: LineWatch,
}

/// Notes the last line of a stream that does not start like a JSON message.
struct LineWatch {
    /// The start of the current line (enough to judge and show it).
    line: Vec<u8>,
    foreign: Arc<Mutex<Option<String>>>,
}

/// How much of a line is kept to judge and show it.
const WATCHED_PREFIX: usize = 160;

impl LineWatch {
    fn watch(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match bytes.iter().position(|b| *b == b'\n') {
                Some(end) => {
                    self.keep(&bytes[..end]);
                    self.line_ended();
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.keep(bytes);
                    return;
                }
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = WATCHED_PREFIX.saturating_sub(self.line.len());
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn line_ended(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim();
        if !text.is_empty() && !text.starts_with('{') && !text.starts_with('[') {
            *self.foreign.lock().unwrap_or_else(|p| p.into_inner()) = Some(cut(text, 120));
        }
        self.line.clear();
    }
}

impl AsyncRead for WatchedStdout {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            this.watch.watch(&buf.filled()[before..]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_error_is_not_retried_unless_it_says_it_is_passing() {
        let error = |text: &str| CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)]);
        assert_eq!(
            tool_output(error("Unknown city")).unwrap_err(),
            (ErrorKind::Tool, "Unknown city".to_string())
        );
        assert_eq!(
            tool_output(error("page.goto: Timeout 5000ms exceeded"))
                .unwrap_err()
                .0,
            ErrorKind::Timeout
        );
        assert_eq!(
            tool_output(error("net::ERR_CONNECTION_REFUSED at http://127.0.0.1:9"))
                .unwrap_err()
                .0,
            ErrorKind::Connection
        );
    }

    #[test]
    fn the_output_is_structured_content_else_the_texts_joined() {
        let mut result = CallToolResult::success(vec![
            rmcp::model::ContentBlock::text("one"),
            rmcp::model::ContentBlock::text("two"),
        ]);
        assert_eq!(
            tool_output(result.clone()).unwrap(),
            Value::String("one\ntwo".into())
        );
        result.structured_content = Some(serde_json::json!({ "temperature": 33 }));
        assert_eq!(
            tool_output(result).unwrap(),
            serde_json::json!({ "temperature": 33 })
        );
    }

    #[test]
    fn the_identity_of_a_server_ignores_its_name_and_the_order_of_its_env() {
        let server = |name: &str, env: &[(&str, &str)]| McpServer {
            name: name.to_string(),
            transport: McpTransport::Stdio {
                command: "node".into(),
                args: vec!["server.js".into()],
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        };
        let key = |server: McpServer, isolation: Isolation, account: &str, run: &str| {
            let setup = ServerSetup {
                isolation,
                ..ServerSetup::from_plan(server.transport)
            };
            let scope = McpScope {
                account: account.to_string(),
                run: run.to_string(),
            };
            ServerKey::of(&setup, &scope)
        };
        let process = Isolation::Process;
        assert_eq!(
            key(server("a", &[("X", "1"), ("Y", "2")]), process, "", ""),
            key(server("b", &[("Y", "2"), ("X", "1")]), process, "", "")
        );
        assert_ne!(
            key(server("a", &[("X", "1")]), process, "", ""),
            key(server("a", &[("X", "2")]), process, "", "")
        );
        // Shared by a process, whatever the scope; never across accounts
        // when isolated per account; never across runs when per run.
        assert_eq!(
            key(server("a", &[]), process, "acme", "r1"),
            key(server("a", &[]), process, "other", "r2")
        );
        let account = Isolation::Account;
        assert_eq!(
            key(server("a", &[]), account, "acme", "r1"),
            key(server("a", &[]), account, "acme", "r2")
        );
        assert_ne!(
            key(server("a", &[]), account, "acme", "r1"),
            key(server("a", &[]), account, "other", "r1")
        );
        let run = Isolation::Run;
        assert_ne!(
            key(server("a", &[]), run, "acme", "r1"),
            key(server("a", &[]), run, "acme", "r2")
        );
        assert_ne!(
            key(server("a", &[]), run, "acme", "r1"),
            key(server("a", &[]), run, "other", "r1")
        );
    }

    #[test]
    fn stdout_lines_that_are_not_json_rpc_are_noted() {
        let foreign = Arc::new(Mutex::new(None));
        let mut watch = LineWatch {
            line: Vec::new(),
            foreign: Arc::clone(&foreign),
        };
        watch.watch(b"{\"jsonrpc\":\"2.0\"}\nServer rea");
        assert_eq!(*foreign.lock().unwrap(), None);
        watch.watch(b"dy on stdio\n{\"id\":1}\n");
        assert_eq!(
            foreign.lock().unwrap().as_deref(),
            Some("Server ready on stdio")
        );
    }
}
