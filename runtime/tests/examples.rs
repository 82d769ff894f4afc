//! The examples, run. Every example runs to completion with the offline
//! provider, parking at each approval and resuming after it is decided. The
//! examples that drive a browser need an MCP client, which this in-memory
//! run has none of: their preflight says so and nothing runs
//! (`tests/tests/flow.rs` and `tests/tests/browser.rs` run them with real
//! servers).
//!
//! And programs nobody wrote: the examples' statements moved, dropped and
//! repeated. Whatever of them checks clean keeps the compiler's promise all
//! the way through: it lowers to a plan that validates, formats to a
//! program that still checks clean, and runs with the offline provider to
//! an end the checker allowed (never a panic, a hang, an answer that does
//! not fit its recipe, or an output without its declared fields).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flow_plan::{ErrorKind, Plan};
use flow_runtime::journal::Outcome;
use flow_runtime::memory::MemoryStore;
use flow_runtime::offline::OfflineProvider;
use flow_runtime::services::Services;
use proptest::prelude::*;

/// The repository's root, which holds examples/.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Reads sources under the root; `examples/spliced.flow`, the program
/// under test, is served from memory, beside the files it may import.
struct Disk<'a> {
    spliced: &'a str,
}

impl flow_compiler::SourceLoader for Disk<'_> {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        if path == "examples/spliced.flow" {
            return Ok(self.spliced.as_bytes().to_vec());
        }
        if path.split('/').any(|part| part == ".." || part.is_empty()) {
            return Err(flow_compiler::LoadFailure::unreadable("outside the root"));
        }
        std::fs::read(root().join(path))
            .map_err(|e| flow_compiler::LoadFailure::unreadable(e.to_string()))
    }
}

/// The `.flow` files under examples/ and examples/recipes/, by their paths
/// from the root, sorted, with their text.
fn example_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    for folder in ["examples/", "examples/recipes/"] {
        for entry in std::fs::read_dir(root().join(folder)).expect("examples/ exists") {
            let name = entry
                .expect("readable")
                .file_name()
                .to_string_lossy()
                .to_string();
            if name.ends_with(".flow") {
                let path = format!("{folder}{name}");
                let text = std::fs::read_to_string(root().join(&path)).expect("readable");
                files.push((path, text));
            }
        }
    }
    files.sort();
    files
}

/// The input beside an example (`x.input.json` for `x.flow`), if it has one.
fn input_of(path: &str) -> Option<serde_json::Value> {
    let bytes = std::fs::read(root().join(path.replace(".flow", ".input.json"))).ok()?;
    Some(serde_json::from_slice(&bytes).expect("the input is JSON"))
}

/// Runs a workflow to its end in a store of its own, approving every
/// approval it parks at. The offline provider answers at once and never
/// fails, so no step waits for a retry's backoff: a run still going after
/// half a minute waits on something that never comes.
async fn run_approving(
    plan: &Plan,
    workflow: &str,
    input: &serde_json::Value,
) -> (Outcome, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let services = Services {
        provider: Arc::new(OfflineProvider::default()),
        effects: store.clone(),
        mcp: None,
        journal: store.clone(),
        steps: None,
        in_flight: None,
    };
    let mut decisions = 0;
    loop {
        let run = flow_runtime::run(plan, workflow, "run-1", input.clone(), services.clone());
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(30), run)
            .await
            .expect("the run ends");
        let Outcome::Parked { pending } = &outcome else {
            return (outcome, store);
        };
        assert!(!pending.is_empty(), "parked without a pending approval");
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
        assert!(decisions < 200, "does not stop parking");
    }
}

/// Holds a completed run's output to the fields its workflow declares.
fn assert_declared_output(plan: &Plan, workflow: &str, output: &serde_json::Value) {
    let declared = &plan
        .workflows
        .iter()
        .find(|w| w.name == workflow)
        .expect("the workflow ran")
        .output;
    for field in declared {
        assert!(
            output.get(&field.name).is_some(),
            "{workflow}: output lacks `{}`: {output}",
            field.name
        );
    }
}

#[tokio::test]
async fn every_example_completes_after_its_approvals() {
    let files = example_files();
    // A test file (`flowc test`) declares no workflow to run, a recipe file
    // none either.
    let examples = files.iter().filter(|(path, _)| {
        !path.ends_with(".test.flow") && !path.starts_with("examples/recipes/")
    });
    for (path, _) in examples {
        let input = input_of(path).expect("an input beside each example");
        let checked = flow_compiler::check(path, &Disk { spliced: "" }).expect("readable");
        let plan = flow_compiler::lower(&checked).expect("the example checks clean");
        let workflow = plan.workflows[0].name.clone();
        if !plan.mcp_servers.is_empty() {
            let (outcome, store) = run_approving(&plan, &workflow, &input).await;
            let Outcome::Failed {
                error, step: None, ..
            } = &outcome
            else {
                panic!("{path}: {outcome:?}");
            };
            assert!(
                error.message.contains("has no MCP client"),
                "{path}: {}",
                error.message
            );
            assert!(store.records().is_empty(), "{path}: a step ran");
            continue;
        }
        let (outcome, store) = run_approving(&plan, &workflow, &input).await;
        match outcome {
            Outcome::Completed { output } => assert_declared_output(&plan, &workflow, &output),
            other => panic!("{path}: {other:?}"),
        }
        // Completed steps ran once: every path is journaled once, and a
        // replay took the recorded outputs.
        assert!(!store.records().is_empty(), "{path}: nothing was journaled");
    }
}

/// How far a line opens (positive) or closes brackets, strings and comments
/// aside as far as a line-based estimate goes.
fn depth_change(line: &str) -> i32 {
    let code = line.split("//").next().unwrap_or("");
    code.chars()
        .map(|c| match c {
            '{' | '[' | '(' => 1,
            '}' | ']' | ')' => -1,
            _ => 0,
        })
        .sum()
}

/// The lines from `start` that make `count` whole statements: a line that
/// closes what it opens, or a line that opens a block through the line
/// that closes it. Stops before a line that closes a block it did not open.
fn statements(lines: &[String], start: usize, count: usize) -> std::ops::Range<usize> {
    let mut end = start;
    for _ in 0..count {
        let mut depth = 0;
        let mut at = end;
        while at < lines.len() {
            depth += depth_change(&lines[at]);
            if depth < 0 {
                return start..end;
            }
            at += 1;
            if depth == 0 {
                break;
            }
        }
        if depth != 0 {
            return start..end;
        }
        end = at;
    }
    start..end
}

#[derive(Debug, Clone)]
enum Edit {
    /// Statements of any example or recipe, put in at a place.
    Insert { at: f64, from: f64, count: usize },
    /// Statements of the program, left out.
    Drop { at: f64, count: usize },
    /// Statements of the program, written again elsewhere in it.
    Repeat { at: f64, to: f64, count: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0f64..1.0, 0.0f64..1.0, 1usize..4).prop_map(|(at, from, count)| Edit::Insert {
            at,
            from,
            count
        }),
        (0.0f64..1.0, 1usize..4).prop_map(|(at, count)| Edit::Drop { at, count }),
        (0.0f64..1.0, 0.0f64..1.0, 1usize..4).prop_map(|(at, to, count)| Edit::Repeat {
            at,
            to,
            count
        }),
    ]
}

fn line_at(lines: &[String], fraction: f64) -> usize {
    ((lines.len() as f64) * fraction) as usize
}

fn splice(base: &str, pool: &[String], edits: &[Edit]) -> String {
    let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
    for edit in edits {
        match *edit {
            Edit::Insert { at, from, count } => {
                let taken = statements(pool, line_at(pool, from), count);
                let at = line_at(&lines, at);
                lines.splice(at..at, pool[taken].iter().cloned());
            }
            Edit::Drop { at, count } => {
                let dropped = statements(&lines, line_at(&lines, at), count);
                lines.drain(dropped);
            }
            Edit::Repeat { at, to, count } => {
                let block = statements(&lines, line_at(&lines, at), count);
                let block: Vec<String> = lines[block].to_vec();
                let to = line_at(&lines, to);
                lines.splice(to..to, block);
            }
        }
    }
    lines.join("\n")
}

/// The examples as the splicer takes them, read once for every case.
struct Corpus {
    /// `example_files()`.
    files: Vec<(String, String)>,
    /// Every line of them all, in order: what insertions take from.
    lines: Vec<String>,
    /// The indices of the files that run in this in-memory test: an input
    /// beside them and no MCP server declared (there is no MCP client here).
    runnable: Vec<usize>,
}

fn corpus() -> &'static Corpus {
    static CORPUS: std::sync::OnceLock<Corpus> = std::sync::OnceLock::new();
    CORPUS.get_or_init(|| {
        let files = example_files();
        let lines = files
            .iter()
            .flat_map(|(_, text)| text.lines().map(str::to_owned))
            .collect();
        let runnable = (0..files.len())
            .filter(|&at| {
                let (path, text) = &files[at];
                input_of(path).is_some() && !text.lines().any(|line| line.starts_with("mcp "))
            })
            .collect();
        Corpus {
            files,
            lines,
            runnable,
        }
    })
}

/// Checks a spliced program as `examples/spliced.flow`; if it checks clean,
/// holds it to the compiler's promise, running its workflows with the input
/// of the example it was spliced from.
fn check_and_run(base: &str, text: &str) {
    let checked =
        flow_compiler::check("examples/spliced.flow", &Disk { spliced: text }).expect("loads");
    if checked.has_errors() {
        return;
    }
    let plan = flow_compiler::lower(&checked).expect("no errors, so it lowers");
    if let Err(problems) = plan.validate() {
        panic!("the compiler wrote a plan that does not validate: {problems}");
    }
    let formatted = flow_compiler::format::format_source(text).expect("it parsed");
    let reformatted = flow_compiler::check(
        "examples/spliced.flow",
        &Disk {
            spliced: &formatted,
        },
    )
    .expect("loads");
    assert!(
        !reformatted.has_errors(),
        "formatted, it no longer checks:\n{formatted}"
    );
    let Some(input) = input_of(base) else {
        return;
    };
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    });
    for workflow in &plan.workflows {
        let (outcome, _) = runtime.block_on(run_approving(&plan, &workflow.name, &input));
        match outcome {
            Outcome::Completed { output } => assert_declared_output(&plan, &workflow.name, &output),
            // What a checked program may still meet at run time: an input
            // that does not fit (a spliced program's input is its base's),
            // a browser with no MCP client here, an expression on a `json`
            // value or past a list's end.
            Outcome::Failed { error, .. } => assert!(
                matches!(
                    error.kind,
                    ErrorKind::Preflight | ErrorKind::Unsupported | ErrorKind::Expression
                ),
                "failed with {:?}: {}",
                error.kind,
                error.message
            ),
            Outcome::Parked { .. } => unreachable!("approved until it stopped parking"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn spliced_examples_keep_the_checkers_promise(
        // Three cases in four start from an example that runs here, so
        // that most clean programs run: test files, recipe files and the
        // examples that call MCP servers are checked only.
        from_a_runnable_example in prop::bool::weighted(0.75),
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let corpus = corpus();
        let (base, text) = if from_a_runnable_example {
            &corpus.files[*which.get(&corpus.runnable)]
        } else {
            which.get(&corpus.files)
        };
        check_and_run(base, &splice(text, &corpus.lines, &edits));
    }
}

/// The splicer's own unit: statements are whole lines, blocks and all.
#[test]
fn a_statement_is_a_line_or_a_whole_block() {
    let lines: Vec<String> = ["a {", "  b", "}", "c", "}"].map(str::to_owned).to_vec();
    assert_eq!(statements(&lines, 0, 1), 0..3);
    assert_eq!(statements(&lines, 0, 2), 0..4);
    assert_eq!(
        statements(&lines, 3, 2),
        3..4,
        "stops before the outer closing brace"
    );
    assert_eq!(statements(&lines, 4, 1), 4..4);
}
