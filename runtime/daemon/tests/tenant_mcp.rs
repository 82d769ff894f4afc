//! MCP servers in flowd belong to the operator: a tenant's workflow uses
//! them by name, only those its account is allowed, and never starts or
//! reaches anything its own file declares. flowd runs as its own process;
//! the servers are real (server-everything, Playwright's on Chromium).

mod common;

use common::{ACME, CONFIG, Flowd, GLOBEX};
use flow_tests::TempDir;
use flow_tests::mcp_servers::{PageServer, marked_processes, mcp_servers_dir};
use reqwest::Method;
use serde_json::{Value, json};

/// A mark unique to this test process and `name`, carried in the
/// environment of every server a test configures or declares.
fn mark(name: &str) -> String {
    format!("{}-tenant-{name}", std::process::id())
}

/// `CONFIG` with `[mcp]` tables and each account's `mcp_servers`.
fn config_with(mcp: &str, acme_servers: &[&str], globex_servers: &[&str]) -> String {
    let list = |servers: &[&str]| {
        servers
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    CONFIG
        .replace(
            "id = \"globex\"\n",
            &format!(
                "id = \"globex\"\nmcp_servers = [{}]\n",
                list(globex_servers)
            ),
        )
        .replace(
            "id = \"acme\"\n",
            &format!("id = \"acme\"\nmcp_servers = [{}]\n", list(acme_servers)),
        )
        + mcp
}

fn everything_server(mark: &str) -> String {
    let js = mcp_servers_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nenv = {{ FLOW_MCP_TEST_MARK = {mark:?} }}\nisolation = \"account\"\n",
        js.to_string_lossy()
    )
}

fn browser_server(mark: &str, extra: &str) -> String {
    let cli = mcp_servers_dir().join("node_modules/@playwright/mcp/cli.js");
    // Not every test of this file starts the browser: one only deploys.
    let chromium = flow_tests::services::program("chromium").unwrap_or_default();
    format!(
        "[mcp.servers.browser]\ncommand = \"node\"\nargs = [{:?}, \"--executable-path\", {chromium:?}, \"--headless\", \"--no-sandbox\", \"--isolated\"]\nenv = {{ FLOW_MCP_TEST_MARK = {mark:?} }}\n{extra}",
        cli.to_string_lossy()
    )
}

/// A workflow whose file declares `evil` as a shell command that leaves a
/// file behind, its process marked with `mark`.
fn evil_source(touched: &std::path::Path, mark: &str) -> String {
    format!(
        "mcp evil {{ command \"sh\" args [\"-c\", \"touch {}; sleep 5\"] env {{ FLOW_MCP_TEST_MARK: {mark:?} }} }}\n\
         workflow evil {{\n  input {{ q: string }}\n  step a = evil.anything {{ q: workflow_input.q }}\n  output {{ ok: true }}\n}}\n",
        touched.display()
    )
}

fn plan_of(source: &str) -> Value {
    let checked = flow_compiler::check_source("evil.flow", source);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    let plan = flow_compiler::lower(&checked).expect("lowered");
    serde_json::from_str(&plan.to_json()).unwrap()
}

/// Regression: any API key could deploy a workflow declaring a shell
/// command, and preflight ran it on flowd's host. Refused at deploy (as a
/// source and as a plan) and at start, and no process is ever spawned.
#[tokio::test]
async fn a_workflow_with_its_own_command_is_refused_and_nothing_runs() {
    let dir = TempDir::new("tenant-mcp-evil");
    let mark = mark("evil");
    let touched = dir.path().join("pwned");
    let source = evil_source(&touched, &mark);
    let flowd = Flowd::start(&dir);

    let (status, body) = flowd.try_deploy(ACME, json!({ "source": source })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "mcp_server_not_allowed", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("`evil`") && detail.contains("[mcp.servers.evil]"),
        "{detail}"
    );
    assert!(
        !detail.contains("touch"),
        "the declaration is not echoed: {detail}"
    );

    let (status, body) = flowd
        .try_deploy(ACME, json!({ "plan": plan_of(&source) }))
        .await;
    assert_eq!(status, 422, "a plan is checked the same way: {body}");
    assert_eq!(body["code"], "mcp_server_not_allowed", "{body}");

    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "evil", "input": { "q": "x" } })),
        )
        .await;
    assert_eq!(status, 404, "nothing was deployed: {body}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        marked_processes(|found| found == mark).is_empty(),
        "a server was spawned"
    );
    assert!(!touched.exists(), "the declared command ran");
}

/// An operator's server works for the account it is allowed to, whatever
/// the file declares under its name; another account may not deploy a
/// workflow that uses it; and a start re-checks, so a server taken away
/// from an account after a deploy is refused at the next start.
#[tokio::test]
async fn an_allowed_server_serves_its_account_only_and_a_start_rechecks() {
    flow_tests::require!(McpServers);
    let dir = TempDir::new("tenant-mcp-allowed");
    let mark = mark("allowed");
    let touched = dir.path().join("declared-ran");
    // The file's declaration of `everything` is a command that leaves a
    // file: flowd must start the operator's server instead.
    let source = format!(
        "mcp everything {{ command \"sh\" args [\"-c\", \"touch {}\"] }}\n\
         workflow sums {{\n  step sum = everything.get-sum {{ a: 2, b: 3 }} retry 1\n  output {{ sum: step.sum }}\n}}\n",
        touched.display()
    );
    let config = config_with(&everything_server(&mark), &["everything"], &[]);
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, &source).await;
    let run = flowd
        .start_run(ACME, json!({ "workflow": "sums", "input": {} }))
        .await;
    let record = flowd.settled(&run, ACME).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(
        record["output"]["sum"], "The sum of 2 and 3 is 5.",
        "{record}"
    );
    assert!(!touched.exists(), "the file's command ran");

    let (status, body) = flowd.try_deploy(GLOBEX, json!({ "source": source })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "mcp_server_not_allowed", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("this account may use no MCP server"),
        "{body}"
    );
    drop(flowd);

    // The operator takes the server away from acme: the deployed workflow
    // no longer starts.
    let config = config_with(&everything_server(&mark), &[], &["everything"]);
    let flowd = Flowd::start_with(&dir, &config);
    let (status, body) = flowd
        .send(
            Method::POST,
            "/v1/runs",
            Some(ACME),
            Some(json!({ "workflow": "sums", "input": {} })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "mcp_server_not_allowed", "{body}");
    drop(flowd);
    assert!(!touched.exists());
}

/// A browser's tools that reach beyond the page (running code in the
/// server's process, uploading the host's files) are not offered unless the
/// operator lists them.
#[tokio::test]
async fn a_browser_tool_the_operator_does_not_offer_is_refused_at_deploy() {
    let dir = TempDir::new("tenant-mcp-tools");
    let config = config_with(&browser_server(&mark("tools"), ""), &["browser"], &[]);
    let flowd = Flowd::start_with(&dir, &config);
    let source = "mcp browser { command \"npx\" args [\"@playwright/mcp\"] }\n\
         workflow rce {\n  step a = browser.browser_run_code_unsafe { code: \"async () => 1\" }\n  output { ok: true }\n}\n";
    let (status, body) = flowd.try_deploy(ACME, json!({ "source": source })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "mcp_tool_not_allowed", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("browser_run_code_unsafe"),
        "{body}"
    );
}

const VISIT: &str = "mcp browser { command \"npx\" args [\"@playwright/mcp\", \"--headless\", \"--isolated\"] }\n\
     workflow visit {\n  input { url: string }\n  step page = browser.browser_navigate { url: workflow_input.url } retry 1\n  output { page: step.page }\n}\n\
     workflow tabs {\n  step list = browser.browser_tabs { action: \"list\" } retry 1\n  output { tabs: step.list }\n}\n";

/// Under flowd's default policy a browser step reaches neither flowd's
/// loopback nor cloud metadata, and says why without the server's command
/// line; the origin the operator allows is reached.
#[tokio::test]
async fn a_browser_step_reaches_loopback_only_when_the_operator_allows_its_origin() {
    flow_tests::require!(McpServers, Chromium);
    let dir = TempDir::new("tenant-mcp-egress");
    let pages = PageServer::start();
    let mark = mark("egress");
    let config = config_with(&browser_server(&mark, ""), &["browser"], &[]);
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, VISIT).await;
    for (url, why) in [
        (format!("{}/inside", pages.base), "a loopback address"),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "a link-local address",
        ),
    ] {
        let run = flowd
            .start_run(
                ACME,
                json!({ "workflow": "visit", "input": { "url": url } }),
            )
            .await;
        let record = flowd
            .settled_within(&run, ACME, std::time::Duration::from_secs(60))
            .await;
        assert_eq!(record["status"], "failed", "{record}");
        let error = record["error"]["message"].as_str().unwrap_or_default();
        assert!(
            error.contains(why) && error.contains("allowed_origins"),
            "{url}: {record}"
        );
        assert!(
            !error.contains("cli.js") && !error.contains("--no-sandbox"),
            "{error}"
        );
    }
    drop(flowd);

    let allowed = format!("allowed_origins = [{:?}]\n", pages.base);
    let config = config_with(&browser_server(&mark, &allowed), &["browser"], &[]);
    let flowd = Flowd::start_with(&dir, &config);
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "visit", "input": { "url": format!("{}/inside", pages.base) } }),
        )
        .await;
    let record = flowd
        .settled_within(&run, ACME, std::time::Duration::from_secs(60))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    assert!(
        record["output"]["page"]
            .to_string()
            .contains("Page /inside"),
        "{record}"
    );
    // The run's browser was its own: it closes with the run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !marked_processes(|found| found == mark).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the run's browser outlives the run"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(flowd.stop(), Some(0));
}

/// Regression: the pool keyed a server by its transport, so every account
/// shared one Playwright server and its browser, and one account listed
/// another's tabs. Each run now has a browser of its own.
#[tokio::test]
async fn a_run_never_sees_another_runs_browser() {
    flow_tests::require!(McpServers, Chromium);
    let dir = TempDir::new("tenant-mcp-isolation");
    let pages = PageServer::start();
    let mark = mark("isolation");
    let allowed = format!("allowed_origins = [{:?}]\n", pages.base);
    let config = config_with(&browser_server(&mark, &allowed), &["browser"], &["browser"]);
    let flowd = Flowd::start_with(&dir, &config);
    flowd.deploy(ACME, VISIT).await;
    flowd.deploy(GLOBEX, VISIT).await;
    let secret = format!("{}/session-token-4711", pages.base);
    let run = flowd
        .start_run(
            ACME,
            json!({ "workflow": "visit", "input": { "url": secret } }),
        )
        .await;
    let record = flowd
        .settled_within(&run, ACME, std::time::Duration::from_secs(60))
        .await;
    assert_eq!(record["status"], "completed", "{record}");
    for key in [GLOBEX, ACME] {
        let run = flowd
            .start_run(key, json!({ "workflow": "tabs", "input": {} }))
            .await;
        let record = flowd
            .settled_within(&run, key, std::time::Duration::from_secs(60))
            .await;
        assert_eq!(record["status"], "completed", "{record}");
        assert!(
            !record["output"].to_string().contains("session-token-4711"),
            "another run's tab: {record}"
        );
    }
}
