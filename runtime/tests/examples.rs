//! Every example runs to completion with the offline provider, parking at
//! each approval and resuming after it is decided. The examples that drive a
//! browser need an MCP client, which this in-memory run has none of: their
//! preflight says so and nothing runs (`tests/tests/flow.rs` and
//! `tests/tests/browser.rs` run them with real servers).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flow_runtime::journal::Outcome;
use flow_runtime::memory::MemoryStore;
use flow_runtime::offline::OfflineProvider;
use flow_runtime::services::Services;

struct Disk(PathBuf);

impl flow_compiler::SourceLoader for Disk {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        std::fs::read(self.0.join(path))
            .map_err(|e| flow_compiler::LoadFailure::unreadable(e.to_string()))
    }
}

fn examples() -> (PathBuf, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples"))
        .expect("examples/ exists")
        .map(|e| {
            e.expect("readable")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        // A test file (`flowc test`) declares no workflow to run.
        .filter(|n| n.ends_with(".flow") && !n.ends_with(".test.flow"))
        .collect();
    names.sort();
    (root, names)
}

#[tokio::test]
async fn every_example_completes_after_its_approvals() {
    let (root, names) = examples();
    for name in names {
        let path = format!("examples/{name}");
        let checked = flow_compiler::check(&path, &Disk(root.clone())).expect("readable");
        let plan = flow_compiler::lower(&checked).expect("the example checks clean");
        let input: serde_json::Value = serde_json::from_slice(
            &std::fs::read(root.join(path.replace(".flow", ".input.json")))
                .expect("an input beside it"),
        )
        .expect("the input is JSON");
        let store = Arc::new(MemoryStore::default());
        let services = Services {
            provider: Arc::new(OfflineProvider::default()),
            effects: store.clone(),
            mcp: None,
            journal: store.clone(),
            steps: None,
        };
        let workflow = plan.workflows[0].name.clone();
        if !plan.mcp_servers.is_empty() {
            let outcome =
                flow_runtime::run(&plan, &workflow, "run-1", input.clone(), services.clone()).await;
            let Outcome::Failed { error, step: None } = &outcome else {
                panic!("{name}: {outcome:?}");
            };
            assert!(
                error.message.contains("has no MCP client"),
                "{name}: {}",
                error.message
            );
            assert!(store.records().is_empty(), "{name}: a step ran");
            continue;
        }
        let mut decisions = 0;
        let outcome = loop {
            let outcome =
                flow_runtime::run(&plan, &workflow, "run-1", input.clone(), services.clone()).await;
            let Outcome::Parked { pending } = &outcome else {
                break outcome;
            };
            assert!(
                !pending.is_empty(),
                "{name}: parked without a pending approval"
            );
            for approval in pending {
                let approver = approval.approvers.first().cloned().unwrap_or_default();
                store
                    .decide(
                        &approval.path,
                        &approver,
                        true,
                        None,
                        "2026-11-29T00:00:00Z",
                    )
                    .expect("a pending approval can be decided once");
                decisions += 1;
            }
            assert!(decisions < 100, "{name}: does not stop parking");
        };
        match outcome {
            Outcome::Completed { output } => {
                let fields: Vec<&str> = plan.workflows[0]
                    .output
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect();
                for field in fields {
                    assert!(
                        output.get(field).is_some(),
                        "{name}: output lacks `{field}`: {output}"
                    );
                }
            }
            other => panic!("{name}: {other:?}"),
        }
        // Completed steps ran once: every path is journaled once, and a
        // replay took the recorded outputs.
        assert!(!store.records().is_empty(), "{name}: nothing was journaled");
    }
}
