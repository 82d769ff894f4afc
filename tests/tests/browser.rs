//! The examples' browser steps, run for real by `flow run`: Playwright's MCP
//! server (project-local, on Debian's Chromium) visits pages this test serves
//! on loopback, and each step's journaled output is the page it was sent to.

use flow_tests::mcp_servers::{PageServer, local_examples, marked_processes};
use flow_tests::{Run, TempDir, flow_path, run_in};
use serde_json::Value;

fn flow(dir: &TempDir, args: &[&str]) -> Run {
    run_in(&flow_path(), dir.path(), args)
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.all()))
}

/// Runs `examples/<name>` from the local copy, approving every gate as its
/// first approver; returns the run's trace.
fn run_example(dir: &TempDir, examples: &std::path::Path, name: &str) -> Vec<Value> {
    let source = examples.join(format!("{name}.flow"));
    let input = examples.join(format!("{name}.input.json"));
    let mut run = flow(
        dir,
        &[
            "run",
            source.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--json",
        ],
    );
    let run_id = json(&run)["run_id"].as_str().expect("a run id").to_string();
    let mut decisions = 0;
    while run.code == 3 {
        let pending = json(&run)["pending_approvals"].clone();
        let approval = &pending[0];
        run = flow(
            dir,
            &[
                "approve",
                &run_id,
                approval["path"].as_str().unwrap(),
                "--as",
                approval["approvers"][0].as_str().unwrap(),
                "--json",
            ],
        );
        decisions += 1;
        assert!(decisions < 20, "{name} keeps parking");
    }
    assert_eq!(run.code, 0, "{name}: {}", run.all());
    let show = flow(dir, &["show", &run_id, "--json"]);
    assert_eq!(show.code, 0, "{}", show.all());
    json(&show).as_array().expect("records").clone()
}

fn record<'a>(trace: &'a [Value], path: &str) -> &'a Value {
    trace
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("no step record at {path}: {trace:?}"))
}

#[test]
fn the_examples_browser_steps_visit_their_pages() {
    flow_tests::require!(McpServers, Chromium);
    let pages = PageServer::start();
    let dir = TempDir::new("browser-examples");
    let examples = local_examples(dir.path(), &pages.base);

    // incident_response: the dashboard of the alert, once.
    let trace = run_example(&dir, &examples, "incident_response");
    let dashboard = record(&trace, "dashboard");
    assert_eq!(dashboard["status"], "completed", "{dashboard}");
    assert_eq!(dashboard["attempts"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        dashboard["input"]["url"],
        format!("{}/d/checkout-api/overview?from=now-1h", pages.base)
    );
    let page = dashboard["output"].as_str().expect("the page as text");
    assert!(
        page.contains("Page /d/checkout-api/overview?from=now-1h"),
        "{page}"
    );

    // lead_enrichment: one visit per contact, four at a time, on one
    // browser; each iteration journals the page of its own contact.
    let trace = run_example(&dir, &examples, "lead_enrichment");
    let input: Value = serde_json::from_slice(
        &std::fs::read(examples.join("lead_enrichment.input.json")).expect("readable"),
    )
    .expect("JSON");
    let contacts = input["contacts"].as_array().expect("contacts");
    assert_eq!(contacts.len(), 5);
    for (i, contact) in contacts.iter().enumerate() {
        let visit = record(&trace, &format!("contacts[{i}]/visit"));
        assert_eq!(visit["status"], "completed", "{visit}");
        let website = contact["website"].as_str().unwrap();
        let path = website.strip_prefix(&pages.base).expect("a loopback URL");
        let page = visit["output"].as_str().expect("the page as text");
        assert!(
            page.contains(&format!("Page {path}")),
            "contact {i}: {page}"
        );
    }

    // Every `flow` process has exited, and left no server or browser behind.
    let mark = examples.to_string_lossy().to_string();
    assert_eq!(marked_processes(|found| found == mark), Vec::<u32>::new());
}
