//! flowd's configuration: a TOML file, then environment overrides.
//!
//! Loading never stops at the first mistake: every problem in the file is
//! listed with where it is (`flowd.toml:12:3`), so an operator fixes them in
//! one pass. Environment variables (`FLOWD_LISTEN`, `FLOWD_STORE`,
//! `FLOWD_PUBLIC_URL`, `FLOWD_LINK_SECRET`, `FLOWD_SMTP_HOST`,
//! `FLOWD_SMTP_PORT`, `FLOWD_OTLP_ENDPOINT`, `FLOWD_METRICS_TOKEN`,
//! `FLOWD_REDIS_URL`), and those `flow run` reads for its model provider
//! (`FLOW_LLM_PROVIDER`, `FLOW_LLM_BASE_URL`, `FLOW_LLM_API_KEY`,
//! `FLOW_LLM_MODEL*`, `FLOW_LLM_CONCURRENCY`), override the file's values,
//! for containers and secrets kept out of files.

mod load;
mod parse;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use flow_runtime::store::{EventsOf, NotificationKind};
use serde::Deserialize;

pub use load::load;

/// A secret from the configuration: usable, but never printed (a `Debug` of
/// the configuration in a log shows that it is set, not what it is).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} characters>)", self.0.chars().count())
    }
}

/// The daemon's configuration once checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub store: StoreLocation,
    /// Where approvers' links point, without a trailing slash; by default
    /// the address flowd listens on (`Daemon::public_url`).
    pub public_url: Option<String>,
    /// The secret each account's approval-link key is derived from.
    pub link_secret: Secret,
    /// Secrets that signed links before `link_secret` replaced them: links
    /// already sent keep working until they expire.
    pub previous_link_secrets: Vec<Secret>,
    pub smtp: Option<Smtp>,
    pub provider: Option<Provider>,
    pub accounts: Vec<Account>,
    /// OTLP/HTTP endpoint for traces; none exports nothing.
    pub otlp_endpoint: Option<String>,
    /// When set, `/metrics` answers only `Authorization: Bearer TOKEN`: its
    /// labels name every account's workflows.
    pub metrics_token: Option<Secret>,
    pub limits: LimitsSection,
    pub mcp: McpSection,
}

/// `[mcp]`: the pool of MCP connections, and the servers workflows may
/// use. Only the operator decides what runs on flowd's host: a deployed
/// workflow uses a server by a name configured here and allowed for its
/// account (`[[accounts]] mcp_servers`), and its file's own `command`,
/// `args`, `env` or `url` never reach a process or a socket.
#[derive(Debug, Clone, PartialEq)]
pub struct McpSection {
    /// The most MCP servers running (or connected) at once.
    pub max_connections: usize,
    /// The most of them one account's runs hold at once.
    pub max_connections_per_account: usize,
    /// A connection unused for this many seconds is closed.
    pub idle_timeout_secs: u64,
    /// The variables of flowd's environment that servers started here get
    /// (each server's own `env` besides); nothing else of it, since servers
    /// are often third-party code fetched by `npx`, and flowd's environment
    /// holds its secrets.
    pub pass_env: Vec<String>,
    /// `[mcp.servers.NAME]`: the servers workflows may use, by name.
    pub servers: BTreeMap<String, McpServerEntry>,
}

/// `[mcp]` as written, with places for its problems.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpFile {
    #[serde(default = "default_mcp_connections")]
    max_connections: toml::Spanned<usize>,
    max_connections_per_account: Option<toml::Spanned<usize>>,
    #[serde(default = "default_mcp_idle_secs")]
    idle_timeout_secs: toml::Spanned<u64>,
    #[serde(default = "default_pass_env")]
    pass_env: Vec<String>,
    #[serde(default)]
    servers: BTreeMap<String, toml::Spanned<McpServerEntry>>,
}

impl Default for McpSection {
    fn default() -> McpSection {
        let max_connections = default_mcp_connections().into_inner();
        McpSection {
            max_connections,
            max_connections_per_account: default_per_account(max_connections),
            idle_timeout_secs: default_mcp_idle_secs().into_inner(),
            pass_env: default_pass_env(),
            servers: BTreeMap::new(),
        }
    }
}

/// Half the pool: one account's runs can never hold all of it.
fn default_per_account(max_connections: usize) -> usize {
    (max_connections / 2).max(1)
}

/// What a server needs to find programs and its caches, and no secret.
fn default_pass_env() -> Vec<String> {
    ["PATH", "HOME", "LANG", "TZ", "TMPDIR"]
        .map(String::from)
        .to_vec()
}

/// The tools of Playwright's MCP server that a browser server offers when
/// the operator lists none: reading and operating pages. Left out: running
/// code in the server's process (`browser_run_code_unsafe`: its own
/// documentation calls it RCE-equivalent), uploading the host's files,
/// rewriting the browser's network (routes, offline mode), and reading the
/// server's configuration. A tool a newer Playwright adds is not offered
/// until the operator lists it.
pub const BROWSER_TOOLS: &[&str] = &[
    "browser_click",
    "browser_close",
    "browser_console_messages",
    "browser_drag",
    "browser_drop",
    "browser_emulate_media",
    "browser_evaluate",
    "browser_fill_form",
    "browser_find",
    "browser_handle_dialog",
    "browser_hover",
    "browser_navigate",
    "browser_navigate_back",
    "browser_network_request",
    "browser_network_requests",
    "browser_press_key",
    "browser_resize",
    "browser_select_option",
    "browser_snapshot",
    "browser_tabs",
    "browser_take_screenshot",
    "browser_type",
    "browser_wait_for",
];

/// Playwright's settings that flowd refuses on a browser server, each with
/// what it would undo of what flowd does (`flow_runtime::mcp::BrowserPolicy`):
/// keep each run's or account's browser apart, behind the egress proxy and
/// away from the host's files.
pub const BROWSER_POLICY_SETTINGS: &[(&str, &str)] = &[
    (
        "--user-data-dir",
        "keep one profile on disk, its cookies and storage, for every run and account",
    ),
    (
        "--cdp-endpoint",
        "drive a browser flowd did not start, shared by every run and account and outside the network policy",
    ),
    (
        "--extension",
        "drive a browser flowd did not start, shared by every run and account and outside the network policy",
    ),
    (
        "--shared-browser-context",
        "share one browser context, its cookies and pages, between the server's connections",
    ),
    (
        "--proxy-server",
        "take the browser from behind flowd's egress proxy",
    ),
    (
        "--proxy-bypass",
        "let the browser reach hosts past flowd's egress proxy",
    ),
    (
        "--allow-unrestricted-file-access",
        "let pages and tools read the host's files",
    ),
];

/// The settings of a Playwright configuration file (`--config`) that
/// flowd refuses on a browser server, as JSON pointers, each with the
/// argument of `BROWSER_POLICY_SETTINGS` it stands for; `browser.isolated`
/// too, when false (flowd's `--isolated` wins over it, but a file that says
/// so meant a profile on disk).
pub const BROWSER_POLICY_FILE_SETTINGS: &[(&str, &str)] = &[
    ("/browser/userDataDir", "--user-data-dir"),
    ("/browser/isolated", "--user-data-dir"),
    ("/browser/cdpEndpoint", "--cdp-endpoint"),
    ("/browser/remoteEndpoint", "--cdp-endpoint"),
    ("/extension", "--extension"),
    ("/sharedBrowserContext", "--shared-browser-context"),
    ("/browser/launchOptions/proxy", "--proxy-server"),
    ("/browser/contextOptions/proxy", "--proxy-server"),
    (
        "/allowUnrestrictedFileAccess",
        "--allow-unrestricted-file-access",
    ),
];

fn default_mcp_connections() -> toml::Spanned<usize> {
    toml::Spanned::new(
        0..0,
        flow_runtime::mcp::McpPoolConfig::default().max_connections,
    )
}

fn default_mcp_idle_secs() -> toml::Spanned<u64> {
    toml::Spanned::new(
        0..0,
        flow_runtime::mcp::McpPoolConfig::default()
            .idle_timeout
            .as_secs(),
    )
}

/// One `[mcp.servers.NAME]`: a command flowd starts, or a URL.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerEntry {
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Often tokens: printed as `Secret(<n characters>)`.
    #[serde(default)]
    pub env: BTreeMap<String, Secret>,
    /// May carry a password or a key: shown to nobody but the operator.
    pub url: Option<Secret>,
    /// Which runs share a connection: `run` (each run its own server,
    /// the default: a browser's pages and cookies never reach another run)
    /// or `account` (the runs of one account).
    #[serde(default)]
    pub isolation: IsolationSetting,
    /// Whether it is Playwright's MCP server, whose browser flowd puts
    /// behind its network policy. By default, when its command line names
    /// `@playwright/mcp`.
    pub browser: Option<bool>,
    /// The origins a browser may request (Playwright's `--allowed-origins`);
    /// the private hosts among them are exempt from the network policy.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The origins a browser may not request (`--blocked-origins`).
    #[serde(default)]
    pub blocked_origins: Vec<String>,
    /// Lets a browser reach loopback, link-local and private addresses.
    #[serde(default)]
    pub allow_private_network: bool,
    /// The tools workflows may call; all of a server's by default, but a
    /// browser's `BROWSER_TOOLS`.
    pub tools: Option<Vec<String>>,
}

/// `isolation` of an `[mcp.servers.NAME]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationSetting {
    #[default]
    Run,
    Account,
}

impl McpServerEntry {
    /// Whether this is a browser server (see `browser`).
    pub fn is_browser(&self) -> bool {
        self.browser.unwrap_or_else(|| {
            let names_playwright =
                |word: &str| word.contains("@playwright/mcp") || word.contains("playwright-mcp");
            self.command.as_deref().is_some_and(names_playwright)
                || self.args.iter().any(|arg| names_playwright(arg))
        })
    }

    /// The operator's arguments and `env` that would undo what flowd does to
    /// a browser server (`flow_runtime::mcp::BrowserPolicy`), each as
    /// written (`--user-data-dir`, `PLAYWRIGHT_MCP_USER_DATA_DIR` in `env`) with
    /// what it would undo.
    pub fn undoing_browser_policy(&self) -> Vec<(String, &'static str)> {
        let mut found = Vec::new();
        for (flag, undoes) in BROWSER_POLICY_SETTINGS {
            let in_args = self.args.iter().any(|arg| {
                arg.strip_prefix(flag)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
            });
            if in_args {
                found.push((format!("`{flag}`"), *undoes));
            }
            // Playwright reads each setting from a variable of its name too.
            let variable = format!(
                "PLAYWRIGHT_MCP_{}",
                flag.trim_start_matches('-')
                    .replace('-', "_")
                    .to_uppercase()
            );
            if self.env.contains_key(&variable) {
                found.push((format!("`{variable}` in `env`"), *undoes));
            }
        }
        found
    }

    /// The Playwright configuration file this server is started with, as
    /// written (`--config PATH`, `--config=PATH` or `PLAYWRIGHT_MCP_CONFIG`
    /// in `env`).
    pub fn playwright_config(&self) -> Option<&str> {
        let mut args = self.args.iter();
        while let Some(arg) = args.next() {
            if arg == "--config" {
                return args.next().map(String::as_str);
            }
            if let Some(path) = arg.strip_prefix("--config=") {
                return Some(path);
            }
        }
        self.env
            .get("PLAYWRIGHT_MCP_CONFIG")
            .map(|Secret(path)| path.as_str())
    }

    /// What a Playwright configuration file's `text` sets that would undo
    /// what flowd does to a browser server: each setting as written there
    /// (`browser.userDataDir`) with what it would undo.
    pub fn undoing_in_config_file(text: &str) -> Result<Vec<(String, &'static str)>, String> {
        let config: serde_json::Value =
            serde_json::from_str(text).map_err(|error| format!("is not JSON: {error}"))?;
        Ok(BROWSER_POLICY_FILE_SETTINGS
            .iter()
            .filter(|(pointer, _)| match config.pointer(pointer) {
                None | Some(serde_json::Value::Null) => false,
                Some(serde_json::Value::Bool(isolated)) if *pointer == "/browser/isolated" => {
                    !isolated
                }
                Some(serde_json::Value::Bool(on)) => *on,
                Some(_) => true,
            })
            .map(|(pointer, flag)| {
                let undoes = BROWSER_POLICY_SETTINGS
                    .iter()
                    .find(|(setting, _)| setting == flag)
                    .map_or("", |(_, undoes)| *undoes);
                (format!("`{}`", pointer[1..].replace('/', ".")), undoes)
            })
            .collect())
    }

    /// Whether workflows may call `tool` of this server.
    pub fn allows_tool(&self, tool: &str) -> bool {
        match &self.tools {
            Some(tools) => tools.iter().any(|t| t == tool),
            None => !self.is_browser() || BROWSER_TOOLS.contains(&tool),
        }
    }
}

impl McpSection {
    /// The pool's configuration: the runtime's defaults with this section's
    /// values (its servers checked by `load`).
    pub fn pool_config(&self) -> flow_runtime::mcp::McpPoolConfig {
        use flow_plan::McpTransport;
        use flow_runtime::egress::{AllowedHost, EgressPolicy};
        use flow_runtime::mcp::{BrowserPolicy, Isolation, ServerSetup};
        let servers = self
            .servers
            .iter()
            .map(|(name, entry)| {
                let transport = match (&entry.command, &entry.url) {
                    (Some(command), _) => McpTransport::Stdio {
                        command: command.clone(),
                        args: entry.args.clone(),
                        env: entry
                            .env
                            .iter()
                            .map(|(name, Secret(value))| (name.clone(), value.clone()))
                            .collect(),
                    },
                    (None, url) => McpTransport::Http {
                        url: url.clone().map(|Secret(url)| url).unwrap_or_default(),
                    },
                };
                let browser = entry.is_browser().then(|| BrowserPolicy {
                    egress: EgressPolicy {
                        allowed: entry
                            .allowed_origins
                            .iter()
                            .filter_map(|origin| AllowedHost::of_origin(origin))
                            .collect(),
                        allow_private: entry.allow_private_network,
                    },
                    allowed_origins: entry.allowed_origins.clone(),
                    blocked_origins: entry.blocked_origins.clone(),
                });
                let setup = ServerSetup {
                    transport,
                    isolation: match entry.isolation {
                        IsolationSetting::Run => Isolation::Run,
                        IsolationSetting::Account => Isolation::Account,
                    },
                    inherited_env: Some(self.pass_env.clone()),
                    private_workdir: true,
                    browser,
                };
                (name.clone(), setup)
            })
            .collect();
        flow_runtime::mcp::McpPoolConfig {
            max_connections: self.max_connections,
            max_connections_per_account: self.max_connections_per_account,
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_secs),
            servers,
            servers_from_plans: false,
            ..flow_runtime::mcp::McpPoolConfig::default()
        }
    }
}

/// `[limits]`: what one account may hold at once, so that no tenant slows
/// the others down: LLM calls in flight (shared through Redis by every
/// flowd), and in each flowd its steps executing and runs in flight, and
/// its deployed versions. An account's own values (`[[accounts]]`)
/// replace these.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// A Redis shared by every flowd of a deployment (`redis://host:6379`);
    /// without one, each flowd limits its own calls.
    pub redis_url: Option<String>,
    /// Every key flowd writes in that Redis starts with it.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// The limit of an account that sets none.
    #[serde(default = "default_llm_concurrency")]
    pub llm_concurrency: usize,
    #[serde(default = "default_steps_in_flight")]
    pub steps_in_flight: usize,
    #[serde(default = "default_runs_in_flight")]
    pub runs_in_flight: usize,
    #[serde(default = "default_deployments")]
    pub deployments: usize,
    /// Bytes the account's data may take in the store (plans deployed,
    /// runs with their inputs, outcomes and journals, KB documents,
    /// notifications); past it, deploys and run starts answer 429.
    #[serde(default = "default_stored_bytes")]
    pub stored_bytes: u64,
    /// Ended runs (with their journals) are deleted this many days after
    /// they ended; kept for ever without it.
    pub retention_days: Option<u32>,
    /// How long a run's event is offered again to a webhook endpoint that
    /// does not take it, counted from the event.
    #[serde(default = "default_webhook_retry_secs")]
    pub webhook_retry_secs: u64,
    /// The most bytes of a deployed plan's JSON, for every account. A
    /// source names a type wherever it is used, and the plan writes it
    /// out at each of those places: a 2 MB source can stand for a plan of
    /// the format's 256 MiB, which takes gigabytes to build and to parse
    /// at each run start.
    #[serde(default = "default_plan_bytes")]
    pub plan_bytes: u64,
    /// The most CPU seconds a deploy's compile takes, in its process of
    /// its own (`compile_worker`); it is stopped at twice as many seconds
    /// of wall-clock time, plus one.
    #[serde(default = "default_compile_seconds")]
    pub compile_seconds: u64,
    /// The most bytes of memory a deploy's compile takes (its heap and
    /// other writable mappings: `RLIMIT_DATA`).
    #[serde(default = "default_compile_memory")]
    pub compile_memory: u64,
}

impl LimitsSection {
    /// What a deploy's compile is held to.
    pub(crate) fn compile_limits(&self) -> crate::compile_worker::CompileLimits {
        crate::compile_worker::CompileLimits {
            cpu_seconds: self.compile_seconds,
            memory_bytes: self.compile_memory,
            plan_bytes: self.plan_bytes,
        }
    }
}

/// 30 s: a source of 2 MB (a deploy's most) checks and lowers in a tenth of
/// a second, the costliest shapes known in under one (docs/benchmarks.md).
fn default_compile_seconds() -> u64 {
    30
}

/// 2 GiB: the largest sources take tens of megabytes, and a plan of
/// `plan_bytes` a few times that while it is built and written.
fn default_compile_memory() -> u64 {
    2 << 30
}

/// The least `compile_memory` a worker starts in: the writable memory of
/// flowd's executable and its allocator's first pages.
pub(crate) const LEAST_COMPILE_MEMORY: u64 = 64 << 20;

/// 64 MiB: twice the plan of a 2 MB source that repeats no type (a
/// workflow of 17,000 steps lowers to 32 MB), a quarter of the plan
/// format's bound.
fn default_plan_bytes() -> u64 {
    64 * 1024 * 1024
}

fn default_webhook_retry_secs() -> u64 {
    24 * 60 * 60
}

impl Default for LimitsSection {
    fn default() -> LimitsSection {
        LimitsSection {
            redis_url: None,
            redis_prefix: default_redis_prefix(),
            llm_concurrency: default_llm_concurrency(),
            steps_in_flight: default_steps_in_flight(),
            runs_in_flight: default_runs_in_flight(),
            deployments: default_deployments(),
            stored_bytes: default_stored_bytes(),
            retention_days: None,
            webhook_retry_secs: default_webhook_retry_secs(),
            plan_bytes: default_plan_bytes(),
            compile_seconds: default_compile_seconds(),
            compile_memory: default_compile_memory(),
        }
    }
}

/// An account's quotas in one flowd (see `LimitsSection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Steps executing at once, over all its runs (`Services::steps`).
    pub steps_in_flight: usize,
    /// Runs being driven at once; a start beyond answers 429.
    pub runs_in_flight: usize,
    /// Deployed versions kept, over all its workflows.
    pub deployments: usize,
    /// Bytes its data may take in the store.
    pub stored_bytes: u64,
}

/// 10 GB: far from an ordinary account's use, well before one account
/// fills a disk that every account shares.
fn default_stored_bytes() -> u64 {
    10_000_000_000
}

/// Enough for a loop to keep a model or a browser busy, and few enough
/// that the journal's commits are not one account's.
fn default_steps_in_flight() -> usize {
    16
}

fn default_runs_in_flight() -> usize {
    1_000
}

fn default_deployments() -> usize {
    1_000
}

fn default_redis_prefix() -> String {
    "flow".to_string()
}

fn default_llm_concurrency() -> usize {
    flow_runtime::limit::DEFAULT_LIMIT
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smtp {
    pub host: String,
    #[serde(default = "default_smtp_port")]
    pub port: u16,
    /// The sender of every email flowd sends.
    pub from: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// How the connection is secured.
    #[serde(default)]
    pub tls: SmtpTls,
}

/// `tls` of `[smtp]`: credentials and links never travel in clear text unless
/// the operator says so (a relay on loopback, a test's sink).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// STARTTLS, required (port 587, or 25).
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Implicit,
    /// Plain text.
    None,
}

fn default_smtp_port() -> u16 {
    25
}

/// The model provider; without one, recipes answer with the offline provider.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    /// `openai` (any OpenAI-compatible API) or `anthropic`.
    pub kind: String,
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// Model aliases used by recipes (`model "default"`) to the provider's names.
    #[serde(default)]
    pub models: HashMap<String, String>,
}

/// An account: its runs and workflows are visible only to its API keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    pub id: String,
    /// The account's keys, for services: they act for any of its people.
    pub api_keys: Vec<Secret>,
    /// Its people with keys of their own.
    pub users: Vec<User>,
    /// Department name to member emails (handoff recipients). An account's
    /// workflows reach its own departments only.
    pub departments: BTreeMap<String, Vec<String>>,
    /// Approver group name to member emails: an approval naming the group
    /// may be decided by any member.
    pub approver_groups: BTreeMap<String, Vec<String>>,
    /// The domains flowd may email an approver named by address in: by
    /// default those of the account's own people. An approval's approvers
    /// are an expression (they can come from a run's input), and flowd must
    /// not mail a link to anyone a caller names.
    pub mail_domains: Option<Vec<String>>,
    /// LLM calls in flight at most for this account (`[limits]`'s otherwise).
    pub llm_concurrency: Option<usize>,
    /// The `[mcp.servers.NAME]` its workflows may use; none by default.
    pub mcp_servers: Vec<String>,
    /// Where its runs' events are posted.
    pub webhooks: Vec<Webhook>,
    /// Its own quotas, where `[limits]`'s do not fit it.
    pub steps_in_flight: Option<usize>,
    pub runs_in_flight: Option<usize>,
    pub deployments: Option<usize>,
    pub stored_bytes: Option<u64>,
}

/// A person of an account with API keys of their own (`[[accounts.users]]`):
/// a request with one of them acts as that person, so that a decision made
/// through the API is theirs and nobody else's. The account's own `api_keys`
/// stay for services, which name the person they act for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub email: String,
    pub api_keys: Vec<Secret>,
}

/// An account's webhook endpoint (`[[accounts.webhooks]]`): its runs'
/// events, and nobody else's, are posted there.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// How the account's workflows and this configuration name it.
    pub name: String,
    pub url: String,
    /// The HMAC-SHA256 key of the signatures: the bytes of the string, or,
    /// for a Standard Webhooks secret (`whsec_` and base64), the bytes it
    /// encodes, as that convention's verifier libraries take it.
    pub secret: Secret,
    /// Which run events are posted: `completed`, `failed`, `parked`,
    /// `cancelled`; all by default.
    #[serde(default = "all_events")]
    pub events: Vec<String>,
}

const EVENTS: [&str; 4] = ["completed", "failed", "parked", "cancelled"];

fn all_events() -> Vec<String> {
    EVENTS.iter().map(ToString::to_string).collect()
}

/// An `[[accounts]]` entry as written: its people keep their places, for
/// problems.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccountFile {
    id: String,
    #[serde(default)]
    api_keys: Vec<Secret>,
    #[serde(default)]
    users: Vec<toml::Spanned<User>>,
    #[serde(default)]
    departments: BTreeMap<String, toml::Spanned<Vec<String>>>,
    #[serde(default)]
    approver_groups: BTreeMap<String, toml::Spanned<Vec<String>>>,
    mail_domains: Option<Vec<String>>,
    llm_concurrency: Option<toml::Spanned<usize>>,
    mcp_servers: Option<toml::Spanned<Vec<String>>>,
    steps_in_flight: Option<toml::Spanned<usize>>,
    runs_in_flight: Option<toml::Spanned<usize>>,
    deployments: Option<toml::Spanned<usize>>,
    stored_bytes: Option<toml::Spanned<u64>>,
    #[serde(default)]
    webhooks: Vec<toml::Spanned<Webhook>>,
}

/// The file as written, before checks and overrides.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<toml::Spanned<String>>,
    store: Option<toml::Spanned<String>>,
    public_url: Option<toml::Spanned<String>>,
    link_secret: Option<toml::Spanned<String>>,
    #[serde(default)]
    previous_link_secrets: Vec<toml::Spanned<String>>,
    smtp: Option<Smtp>,
    provider: Option<toml::Spanned<Provider>>,
    #[serde(default)]
    accounts: Vec<toml::Spanned<AccountFile>>,
    #[serde(default)]
    webhooks: Vec<toml::Spanned<toml::Value>>,
    otlp_endpoint: Option<toml::Spanned<String>>,
    metrics_token: Option<toml::Spanned<String>>,
    limits: Option<toml::Spanned<LimitsSection>>,
    mcp: Option<McpFile>,
}

/// A mistake in the configuration, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `flowd.toml:3:10`, or the environment variable that was wrong.
    pub place: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_STORE: &str = "flowd.db";

/// The environment variables flowd reads: the process's, or a test's.
#[derive(Debug, Clone, Default)]
pub struct Environment(BTreeMap<String, String>);

impl Environment {
    /// The process's variables that are Unicode (flowd reads no other).
    pub fn of_process() -> Environment {
        Environment(
            std::env::vars_os()
                .filter_map(|(name, value)| {
                    Some((name.into_string().ok()?, value.into_string().ok()?))
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, String)> + 'a {
        self.0
            .range(prefix.to_string()..)
            .take_while(move |(name, _)| name.starts_with(prefix))
            .map(|(name, value)| (name.as_str(), value.clone()))
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Environment {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Environment {
        Environment(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// Where the store is: a SQLite file path, or a PostgreSQL URL
/// (`postgres://` or `postgresql://`) that several flowds may share, with an
/// optional `schema=NAME` parameter naming the schema its tables go to
/// (`flow_runtime::postgres`). It prints (`Display` and `Debug` alike) with a
/// URL's password replaced by `***`, so that a log of the configuration or
/// an error never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreLocation(pub String);

impl StoreLocation {
    /// Whether it is a PostgreSQL database, which other flowds may share.
    pub fn is_shared(&self) -> bool {
        self.0.starts_with("postgres://") || self.0.starts_with("postgresql://")
    }

    /// What `flowd serve` would refuse when it opens the store, found without
    /// opening it: a URL of another database, a PostgreSQL URL its driver
    /// cannot read (a port past 65535, an unknown parameter, a bad `schema`),
    /// a SQLite file in a directory that does not exist.
    fn check(&self) -> Result<(), String> {
        if self.is_shared() {
            return flow_runtime::postgres::check_location(&self.0)
                .map_err(|error| format!("store {self}: {error}"));
        }
        if let Some((scheme, _)) = self.0.split_once("://") {
            return Err(format!(
                "store `{self}`: `{scheme}://` is no store of flowd's; give a SQLite file path or a postgres:// URL"
            ));
        }
        let path = std::path::Path::new(&self.0);
        if path.is_dir() {
            return Err(format!(
                "store `{self}` is a directory; give the path of a SQLite file (in it: `{}`)",
                path.join(DEFAULT_STORE).display()
            ));
        }
        match path.parent() {
            Some(directory) if !directory.as_os_str().is_empty() && !directory.is_dir() => {
                Err(format!(
                    "store `{self}`: the directory `{}` does not exist",
                    directory.display()
                ))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whole = &self.0;
        let masked = whole.split_once("://").and_then(|(scheme, rest)| {
            let (userinfo, host) = rest.rsplit_once('@')?;
            let (user, _password) = userinfo.split_once(':')?;
            Some(format!("{scheme}://{user}:***@{host}"))
        });
        f.write_str(masked.as_deref().unwrap_or(whole))
    }
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl Config {
    /// The quotas of account `id`: its own, else `[limits]`'s.
    pub fn quotas(&self, id: &str) -> Quotas {
        let account = self.people(id);
        Quotas {
            steps_in_flight: account
                .steps_in_flight
                .unwrap_or(self.limits.steps_in_flight),
            runs_in_flight: account.runs_in_flight.unwrap_or(self.limits.runs_in_flight),
            deployments: account.deployments.unwrap_or(self.limits.deployments),
            stored_bytes: account.stored_bytes.unwrap_or(self.limits.stored_bytes),
        }
    }

    /// The model calls account `id` has in flight at once: its own
    /// `llm_concurrency`, else `[limits]`'s.
    pub fn llm_concurrency(&self, id: &str) -> usize {
        self.people(id)
            .llm_concurrency
            .unwrap_or(self.limits.llm_concurrency)
    }

    /// Whether `id` is one of this flowd's accounts: a run of another (a
    /// killed `flow run`'s, in a SQLite file flowd shares) is not its to
    /// resume.
    pub fn serves(&self, id: &str) -> bool {
        self.accounts.iter().any(|account| account.id == id)
    }

    /// The account `id`'s people: its departments and approver groups (none
    /// for an id that is no account's).
    pub fn people(&self, id: &str) -> &Account {
        static NOBODY: std::sync::OnceLock<Account> = std::sync::OnceLock::new();
        self.accounts
            .iter()
            .find(|account| account.id == id)
            .unwrap_or_else(|| {
                NOBODY.get_or_init(|| Account {
                    id: String::new(),
                    api_keys: Vec::new(),
                    users: Vec::new(),
                    departments: BTreeMap::new(),
                    approver_groups: BTreeMap::new(),
                    mail_domains: Some(Vec::new()),
                    llm_concurrency: None,
                    mcp_servers: Vec::new(),
                    steps_in_flight: None,
                    runs_in_flight: None,
                    deployments: None,
                    stored_bytes: None,
                    webhooks: Vec::new(),
                })
            })
    }
}

impl Account {
    /// Which of this account's runs the outbox keeps events of: every
    /// run's for an account with webhook endpoints, else only those of
    /// runs that deliver somewhere (`deliver`).
    pub fn events_of(&self) -> EventsOf {
        match self.webhooks.is_empty() {
            true => EventsOf::Deliveries,
            false => EventsOf::EveryRun,
        }
    }

    /// The approver groups `email` belongs to.
    pub fn groups_of(&self, email: &str) -> Vec<String> {
        member_of(&self.approver_groups, email)
    }

    /// Every audience whose notifications `email` reads: the address
    /// itself, its approver groups and its departments.
    pub fn audiences_of(&self, email: &str) -> Vec<String> {
        let mut audiences = vec![email.to_string()];
        audiences.extend(self.groups_of(email));
        audiences.extend(member_of(&self.departments, email));
        audiences.sort();
        audiences.dedup();
        audiences
    }

    /// The addresses a notification of `kind` for `audience` goes to: a
    /// handoff's department members; an approval's approver group's
    /// members, or the approver named, if flowd may mail that address.
    pub fn recipients(&self, kind: NotificationKind, audience: &str) -> Vec<String> {
        let table = match kind {
            NotificationKind::Handoff => &self.departments,
            NotificationKind::Approval => &self.approver_groups,
        };
        match table.get(audience) {
            Some(members) => members.clone(),
            None if kind == NotificationKind::Approval && self.may_mail(audience) => {
                vec![audience.to_string()]
            }
            None => Vec::new(),
        }
    }

    /// The addresses an email destination's recipient `name` stands for:
    /// an approver group's or a department's members, or the address
    /// itself if flowd may mail it; none when the account has no such.
    pub fn destination_recipients(&self, name: &str) -> Vec<String> {
        match self
            .approver_groups
            .get(name)
            .or(self.departments.get(name))
        {
            Some(members) => members.clone(),
            None if self.may_mail(name) => vec![name.to_string()],
            None => Vec::new(),
        }
    }

    /// Whether flowd may email `address` for this account: one of its people,
    /// or an address in one of its mail domains.
    pub fn may_mail(&self, address: &str) -> bool {
        if !is_email(address) {
            return false;
        }
        let domain = |email: &str| email.rsplit_once('@').map(|(_, d)| d.to_ascii_lowercase());
        let people = || {
            self.departments
                .values()
                .chain(self.approver_groups.values())
                .flatten()
                .chain(self.users.iter().map(|user| &user.email))
        };
        match &self.mail_domains {
            Some(domains) => domains
                .iter()
                .any(|d| Some(d.to_ascii_lowercase()) == domain(address)),
            None => people().any(|p| p == address || domain(p) == domain(address)),
        }
    }
}

fn member_of(table: &BTreeMap<String, Vec<String>>, email: &str) -> Vec<String> {
    table
        .iter()
        .filter(|(_, members)| members.iter().any(|m| m.eq_ignore_ascii_case(email)))
        .map(|(name, _)| name.clone())
        .collect()
}

fn is_email(text: &str) -> bool {
    text.split_once('@')
        .is_some_and(|(user, domain)| !user.is_empty() && domain.contains('.'))
}
