//! flowd.toml: named cases, each a file (and environment) with the
//! configuration it gives or every problem it has, as a snapshot.

use flow_daemon::config::{Environment, load};

const SECRET: &str = "link_secret = \"0123456789abcdef0123456789abcdef\"\n";

/// Loads `text` as `flowd.toml` with `env`, rendered for a snapshot.
fn render(text: &str, env: &[(&str, &str)]) -> String {
    match load("flowd.toml", text, &env.iter().copied().collect()) {
        Ok(config) => format!("{config:#?}"),
        Err(problems) => problems.iter().map(|p| format!("error: {p}\n")).collect(),
    }
}

#[test]
fn a_minimal_file_takes_the_defaults() {
    insta::assert_snapshot!(render(SECRET, &[]));
}

#[test]
fn a_full_file() {
    let text = format!(
        r#"{SECRET}listen = "0.0.0.0:9000"
store = "postgres://flow@db/flow"
public_url = "https://flow.example.com/"
otlp_endpoint = "http://127.0.0.1:4318"
metrics_token = "scrape-0123456789abcdef"

[smtp]
host = "127.0.0.1"
port = 2525
from = "flow@example.com"

[limits]
redis_url = "redis://127.0.0.1:6379"
llm_concurrency = 20
plan_bytes = 16_777_216
compile_seconds = 10
compile_memory = 1_073_741_824

[mcp]
max_connections = 8
max_connections_per_account = 3
idle_timeout_secs = 30
pass_env = ["PATH"]

[mcp.servers.browser]
command = "npx"
args = ["@playwright/mcp", "--executable-path", "/usr/bin/chromium", "--headless"]
env = {{ DEBUG = "pw:mcp" }}
allowed_origins = ["https://intranet.acme.io", "http://127.0.0.1:*"]

[mcp.servers.tickets]
url = "http://127.0.0.1:8931/mcp?key=hunter2-hunter2"
isolation = "account"
tools = ["create_ticket"]

[provider]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
models = {{ default = "llama3.1" }}

[[accounts]]
id = "acme"
api_keys = ["acme-key-0123456789"]
mail_domains = ["acme.io", "acme-partners.com"]
llm_concurrency = 4
mcp_servers = ["browser", "tickets"]

[accounts.departments]
billing = ["ana@acme.io", "bo@acme.io"]

[accounts.approver_groups]
billing-leads = ["ana@acme.io"]

[[accounts.webhooks]]
name = "crm"
url = "https://hooks.example.com/flow"
secret = "whsec-0123456789abcdef"
events = ["completed", "failed", "cancelled"]

[[accounts]]
id = "globex"
api_keys = ["globex-key-0123456789", "globex-key-abcdefghij"]
"#
    );
    insta::assert_snapshot!(render(&text, &[]));
}

#[test]
fn the_environment_overrides_the_file() {
    let text =
        format!("{SECRET}listen = \"127.0.0.1:1\"\n[smtp]\nhost = \"mail\"\nfrom = \"f@x.io\"\n");
    insta::assert_snapshot!(render(
        &text,
        &[
            ("FLOWD_LISTEN", "127.0.0.1:7000"),
            ("FLOWD_STORE", "/tmp/flowd.db"),
            ("FLOWD_SMTP_PORT", "1025"),
            (
                "FLOWD_LINK_SECRET",
                "a-secret-from-the-environment-0123456789"
            ),
        ]
    ));
}

#[test]
fn every_problem_is_listed_with_its_place() {
    let text = r#"listen = "localhost"
public_url = "flow.example.com"

[smtp]
host = "mail"
from = "nobody"

[provider]
kind = "gemini"
base_url = "localhost:11434"

[[accounts]]
id = "acme"
api_keys = ["short"]

[[accounts]]
id = "acme"
api_keys = []

[[accounts]]
id = "globex"
api_keys = ["short"]

[accounts.departments]
billing = ["ana", "bo@acme.io"]
empty = []

[[accounts.webhooks]]
name = "crm"
url = "ftp://hooks"
secret = "s"
events = ["started"]

[[accounts.webhooks]]
name = "crm"
url = "https://hooks.example.com"
secret = "whsec_c2hvcnQ="

[[webhooks]]
url = "https://hooks.example.com/all"
secret = "whsec-0123456789abcdef"

[limits]
compile_seconds = 0
compile_memory = 1_000_000

[mcp]
max_connections = 0

[mcp.servers.both]
command = "npx"
url = "http://127.0.0.1:1/mcp"

[mcp.servers.neither]
args = ["x"]

[mcp.servers.remote]
url = "localhost:8931"
env = { A = "b" }

[mcp.servers.tools]
command = "node"
allowed_origins = ["intranet.acme.io"]

[mcp.servers.far-browser]
url = "http://10.0.0.5:8931/mcp"
browser = true
blocked_origins = ["http://10.0.0.5/admin"]

[mcp.servers.kept-browser]
command = "npx"
args = ["@playwright/mcp", "--user-data-dir=/var/lib/flowd/profile", "--proxy-bypass", "*"]
env = { PLAYWRIGHT_MCP_CDP_ENDPOINT = "http://127.0.0.1:9222" }

[[accounts]]
id = "initech"
api_keys = ["initech-key-0123456789"]
mcp_servers = ["browser", "tools"]
"#;
    insta::assert_snapshot!(render(text, &[("FLOWD_SMTP_PORT", "many")]));
}

#[test]
fn a_syntax_error_is_placed() {
    insta::assert_snapshot!(render("listen = \"127.0.0.1:80\"\n[smtp\nhost = 1\n", &[]));
}

#[test]
fn an_unknown_key_is_refused_not_ignored() {
    insta::assert_snapshot!(render(&format!("{SECRET}listne = \"127.0.0.1:80\"\n"), &[]));
}

#[test]
fn a_short_link_secret_is_refused() {
    insta::assert_snapshot!(render("link_secret = \"hunter2\"\n", &[]));
}

#[test]
fn a_store_url_prints_without_its_password() {
    let shown = |store: &str| {
        let text = format!("{SECRET}store = \"{store}\"\n");
        let config = load("flowd.toml", &text, &Environment::default()).expect("valid");
        // Printed and logged alike without the password.
        assert_eq!(
            format!("{:?}", config.store),
            format!("{:?}", config.store.to_string())
        );
        config.store.to_string()
    };
    assert_eq!(
        shown("postgres://flow:hunter2@db:5432/flow"),
        "postgres://flow:***@db:5432/flow"
    );
    assert_eq!(shown("postgres://flow@db/flow"), "postgres://flow@db/flow");
    assert_eq!(shown("/tmp/flowd.db"), "/tmp/flowd.db");
}

/// Regression (issue 13): `check-config` stopped at the first unknown key
/// and accepted stores that `serve` then refused. Every unknown key is
/// listed, in every section, and the store is read as `serve` reads it.
#[test]
fn every_unknown_key_and_unusable_store_is_listed() {
    let text = format!(
        r#"{SECRET}lisen = "127.0.0.1:80"
[smtp]
host = "mail"
from = "f@x.io"
prot = 25
[[accounts]]
id = "acme"
api_key = ["acme-key-0123456789"]
[[accounts.users]]
email = "ana@acme.io"
api_keys = ["ana-key-0123456789"]
role = "lead"
"#
    );
    insta::assert_snapshot!(render(&text, &[]));
    for (store, why) in [
        ("mysql://root@db/flow", "no store of flowd's"),
        ("postgres://flow@db:99999/flow", "port"),
        ("postgres://flow@db/flow?schema=x y", "schema `x y`"),
        ("postgres://flow@db/flow?sslmode=verify", "sslmode `verify`"),
        (
            "postgres://flow@db/flow?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "sslrootcert `/nonexistent/ca.pem`",
        ),
        (
            "/nonexistent/flowd.db",
            "the directory `/nonexistent` does not exist",
        ),
        ("/tmp", "is a directory"),
    ] {
        let text = format!("{SECRET}store = \"{store}\"\n");
        let shown = render(&text, &[]);
        assert!(
            shown.starts_with("error: flowd.toml:2:9: store") && shown.contains(why),
            "{store}: {shown}"
        );
    }
}

/// flowd reads the variables `flow run` reads for its model, over the file.
#[test]
fn the_model_variables_of_flow_run_configure_flowd_too() {
    let config = load(
        "flowd.toml",
        SECRET,
        &[
            ("FLOW_LLM_BASE_URL", "http://127.0.0.1:11434/v1"),
            ("FLOW_LLM_API_KEY", "sk-env"),
            ("FLOW_LLM_MODEL", "llama3"),
            ("FLOW_LLM_MODEL_SMART", "llama3:70b"),
            ("FLOW_LLM_CONCURRENCY", "3"),
        ]
        .into_iter()
        .collect(),
    )
    .expect("valid");
    let provider = config.provider.expect("a provider from the environment");
    assert_eq!(
        (provider.kind.as_str(), provider.base_url.as_str()),
        ("openai", "http://127.0.0.1:11434/v1")
    );
    assert_eq!(
        provider.api_key.map(|key| key.0),
        Some("sk-env".to_string())
    );
    assert_eq!(provider.models["default"], "llama3");
    assert_eq!(provider.models["smart"], "llama3:70b");
    assert_eq!(config.limits.llm_concurrency, 3);

    insta::assert_snapshot!(render(
        SECRET,
        &[
            ("FLOW_LLM_PROVIDER", "gemini"),
            ("FLOW_LLM_CONCURRENCY", "0")
        ]
    ));
}

/// Regression (an audit): `FLOW_LLM_API_KEY=` was a key, empty: it hid
/// `OPENAI_API_KEY`, sent `Authorization: Bearer` with nothing after it,
/// and a 401 blamed the key. An empty variable is no key.
#[test]
fn an_empty_key_variable_is_no_key() {
    let provider = |vars: &[(&str, &str)]| {
        let mut vars: Vec<(&str, &str)> = vars.to_vec();
        vars.push(("FLOW_LLM_BASE_URL", "http://127.0.0.1:11434/v1"));
        load("flowd.toml", SECRET, &vars.into_iter().collect())
            .expect("valid")
            .provider
            .expect("a provider from the environment")
    };
    let key = provider(&[("FLOW_LLM_API_KEY", ""), ("OPENAI_API_KEY", "sk-vendor")]).api_key;
    assert_eq!(key.map(|key| key.0), Some("sk-vendor".to_string()));
    assert!(provider(&[("FLOW_LLM_API_KEY", "")]).api_key.is_none());
}

/// Regression: a key ending in a line break (a secret read from a file)
/// passed `check-config`, and every run of the flowd then panicked a
/// worker and stayed `running`. It is a problem placed where the key was
/// given, the key itself not shown.
#[test]
fn an_api_key_a_header_cannot_carry_is_refused() {
    let in_file = format!(
        "{SECRET}[provider]\nkind = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\napi_key = \"sk-ant-secret\\n\"\n"
    );
    insta::assert_snapshot!(
        "an_api_key_a_header_cannot_carry_is_refused_in_the_file",
        render(&in_file, &[])
    );
    insta::assert_snapshot!(
        "an_api_key_a_header_cannot_carry_is_refused_from_the_environment",
        render(
            SECRET,
            &[
                ("FLOW_LLM_BASE_URL", "http://127.0.0.1:11434/v1"),
                ("OPENAI_API_KEY", "sk-secret\r\n"),
            ]
        )
    );
}

/// A browser server's Playwright configuration file is held to what its
/// arguments are: none of its settings may undo the browser policy, and
/// it is named from `/` (the server starts in an empty directory).
#[test]
fn a_browser_servers_playwright_config_file_keeps_the_policy() {
    let dir = std::env::temp_dir().join(format!("flowd-config-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let undoing = dir.join("undoing.json");
    std::fs::write(
        &undoing,
        r#"{ "browser": { "isolated": false, "userDataDir": "/var/lib/profile",
             "launchOptions": { "headless": true, "proxy": { "server": "direct://" } } },
             "sharedBrowserContext": false, "extension": true }"#,
    )
    .unwrap();
    let keeping = dir.join("keeping.json");
    std::fs::write(
        &keeping,
        r#"{ "browser": { "isolated": true, "launchOptions": { "headless": true } } }"#,
    )
    .unwrap();
    let server = |name: &str, config: &str| {
        format!(
            "[mcp.servers.{name}]\ncommand = \"npx\"\nargs = [\"@playwright/mcp\", \"--headless\", {config}]\n"
        )
    };
    let text = format!(
        "{SECRET}{}{}{}{}",
        server(
            "undoing",
            &format!("\"--config\", {:?}", undoing.display().to_string())
        ),
        server("keeping", &format!("\"--config={}\"", keeping.display())),
        server("relative", "\"--config\", \"pw.json\""),
        server(
            "missing",
            &format!(
                "\"--config\", {:?}",
                dir.join("none.json").display().to_string()
            )
        ),
    );
    let rendered = render(&text, &[]);
    let said = |what: &str| rendered.lines().filter(|line| line.contains(what)).count();
    assert_eq!(said("[mcp.servers.undoing]"), 4, "{rendered}");
    for setting in [
        "`browser.isolated`",
        "`browser.userDataDir`",
        "`browser.launchOptions.proxy`",
        "`extension`",
    ] {
        assert_eq!(said(setting), 1, "{setting}: {rendered}");
    }
    assert_eq!(said("[mcp.servers.keeping]"), 0, "{rendered}");
    assert_eq!(said("is named by a relative path"), 1, "{rendered}");
    assert_eq!(said("none.json cannot be read"), 1, "{rendered}");
    let _ = std::fs::remove_dir_all(&dir);
}
