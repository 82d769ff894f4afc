//! The plans of the examples, as insta snapshots: any change to lowering or to
//! the plan format shows up in review as a diff of these files.

use std::path::{Path, PathBuf};

use flow_compiler::SourceLoader;

/// Reads files relative to the workspace root, so that plans record the same
/// `source` path on every machine.
struct Workspace(PathBuf);

impl SourceLoader for Workspace {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        std::fs::read(self.0.join(path))
            .map_err(|e| flow_compiler::LoadFailure::unreadable(e.to_string()))
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn examples() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(workspace_root().join("examples"))
        .expect("examples/ exists")
        .map(|e| {
            e.expect("readable entry")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        // A test file declares no workflow of its own: it has no plan.
        .filter(|name| name.ends_with(".flow") && !name.ends_with(".test.flow"))
        .collect();
    names.sort();
    names
}

/// The compiler's output is what `Plan::validate` accepts: flowd validates
/// every plan it is given, compiled from a source or not.
#[test]
fn every_example_lowers_to_a_verified_and_valid_plan() {
    let loader = Workspace(workspace_root());
    let names = examples();
    assert!(names.len() >= 4, "the examples are missing: {names:?}");
    for name in names {
        let path = format!("examples/{name}");
        let checked = flow_compiler::check(&path, &loader).expect("the example is readable");
        let errors: Vec<_> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .collect();
        assert!(errors.is_empty(), "{path} has errors: {errors:#?}");
        let plan = flow_compiler::lower(&checked).expect("a program without errors lowers");
        let json = plan.to_json();
        // What the runtime will do with the file: read it back and verify it.
        assert_eq!(flow_plan::Plan::from_json(&json).as_ref(), Ok(&plan));
        if let Err(problems) = plan.validate() {
            panic!("{path}: {problems}");
        }
        insta::with_settings!({ snapshot_path => "plans", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(name.trim_end_matches(".flow").to_string(), json);
        });
    }
}

/// Regression: a warning is not an error, so a program whose only
/// diagnostics are warnings lowers to a plan that `Plan::validate` accepts
/// (flowd and `flow run` refuse any other). The validator once held a
/// step's timeout to its workflow's, which the checker only warns of
/// (W301), and which a step at the default timeout of 60 s in a workflow
/// of `timeout 30s` has without any warning: `flowc build` wrote plans
/// that `flow run` then refused. Found by the spliced-examples property
/// (runtime/tests/examples.rs).
#[test]
fn a_program_with_only_warnings_lowers_to_a_valid_plan() {
    const RECIPE: &str = r#"recipe answer {
  model "default"
  input { q: string }
  output { text: string, score: int }
  prompt "Answer {{input.q}}"
}
"#;
    let cases = [
        (
            "W301 a step's timeout past its workflow's",
            "workflow w {\n  input { q: string }\n  timeout 45m\n  step a = answer { q: workflow_input.q } timeout 75m\n}",
            Some("W301"),
        ),
        (
            "a step at the default timeout, past its workflow's",
            "workflow w {\n  input { q: string }\n  timeout 30s\n  step a = answer { q: workflow_input.q } retry 1\n}",
            None,
        ),
        (
            "durations of a year, the longest there are",
            "workflow w {\n  input { q: string }\n  timeout 365d\n  step a = answer { q: workflow_input.q } retry 3 backoff 1s..365d timeout 365d\n}",
            None,
        ),
        (
            "W302 a side effect retried without a key",
            "workflow w {\n  input { q: string }\n  step k = kb_write \"notes\" { title: \"t\", content: workflow_input.q }\n}",
            Some("W302"),
        ),
        (
            "W501 a workflow that can outlast its timeout",
            "workflow w {\n  input { q: string }\n  timeout 2m\n  step a = answer { q: workflow_input.q }\n}",
            Some("W501"),
        ),
        (
            "W502 a loop without a bound under a timeout",
            "workflow w {\n  input { qs: list<string> }\n  timeout 30m\n  for workflow_input.qs as each {\n    step a = answer { q: loop_item } retry 1 timeout 10s\n  }\n}",
            Some("W502"),
        ),
        (
            "W503 more model calls at once than an account runs",
            "workflow w {\n  input { qs: list<string> }\n  for workflow_input.qs as each concurrency 50 {\n    step a = answer { q: loop_item }\n  }\n}",
            Some("W503"),
        ),
    ];
    for (name, workflow, warning) in cases {
        let source = format!("{RECIPE}\n{workflow}\n");
        let checked = flow_compiler::check_source("w.flow", &source);
        let codes: Vec<&str> = checked
            .diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .collect();
        assert!(!checked.has_errors(), "{name}: {:#?}", checked.diagnostics);
        if let Some(warning) = warning {
            assert!(
                codes.contains(&warning),
                "{name}: expected {warning}, got {codes:?}"
            );
        }
        let plan = flow_compiler::lower(&checked).expect("a program without errors lowers");
        if let Err(problems) = plan.validate() {
            panic!("{name}: the plan does not validate: {problems}");
        }
    }
}

/// Regression: a program past a limit of the plan format that no check of
/// its own names (a 300-byte step id) checked clean and `flowc build` wrote
/// a plan that `flow run` and flowd refused; then `flowc build` reported it
/// (E212) but `flowc check` and the editor still did not. Every way a
/// source reaches a limit is now an error where it is checked, at the
/// place `flowc build` gives, and no plan comes out of it.
#[test]
fn a_program_past_a_plan_limit_is_an_error_where_it_is_checked() {
    let long_variant = format!("\"{}\"", "v".repeat(2_000));
    struct One(String);
    impl SourceLoader for One {
        fn load(&self, _: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
            Ok(self.0.clone().into_bytes())
        }
    }
    const RECIPE: &str = "recipe answer {\n  model \"default\"\n  input { q: string }\n  output { text: string, raw: json }\n  prompt \"Answer {{input.q}}\"\n}\n";
    let long = "s".repeat(300);
    let step = |body: &str| format!("workflow w {{\n  input {{ q: string }}\n{body}\n}}");
    let asks = |id: &str, q: &str| format!("  step {id} = answer {{ q: {q} }}");
    let huge_text = format!("\"{}\"", "x".repeat(flow_plan::limits::MAX_TEXT_BYTES + 1));
    let many_parts = format!("\"{}\"", "{{workflow_input.q}}".repeat(10_001));
    let deep_path = format!("step.first.raw{}", ".f".repeat(300));
    let recipients = (0..101)
        .map(|i| format!("\"r{i}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // (what, the source after RECIPE, the text the error points at)
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "a step id of 300 bytes",
            step(&asks(&long, "workflow_input.q")),
            &long,
        ),
        (
            "a workflow name of 300 bytes",
            format!(
                "workflow {long} {{\n  input {{ q: string }}\n{}\n}}",
                asks("a", "workflow_input.q")
            ),
            &long,
        ),
        (
            "an input field of 300 bytes",
            format!(
                "workflow w {{\n  input {{ {long}: string }}\n{}\n}}",
                asks("a", &format!("workflow_input.{long}"))
            ),
            "w",
        ),
        (
            "a step id of 300 bytes in a loop in a parallel branch",
            step(&format!(
                "  parallel p {{\n    branch b {{\n      for [1, 2] as each {{\n{}\n      }}\n    }}\n  }}",
                asks(&long, "workflow_input.q")
            )),
            &long,
        ),
        (
            "a branch name of 300 bytes",
            step(&format!(
                "  parallel p {{\n    branch {long} {{\n{}\n    }}\n  }}",
                asks("a", "workflow_input.q")
            )),
            "p",
        ),
        (
            "a step id of 300 bytes in the workflow's fallback",
            format!(
                "workflow w {{\n  input {{ q: string }}\n  on_error fallback {{\n{}\n  }}\n{}\n}}",
                asks(&long, "workflow_input.q"),
                asks("a", "workflow_input.q")
            ),
            &long,
        ),
        (
            "a string of over 1 MiB",
            step(&asks("big", &huge_text)),
            "big",
        ),
        (
            "a template of 10,001 parts",
            step(&asks("parts", &many_parts)),
            "parts",
        ),
        (
            "a path of 300 segments in a condition",
            step(&format!(
                "{}\n  if {deep_path} == 1 {{\n{}\n  }}",
                asks("first", "workflow_input.q"),
                asks("then", "workflow_input.q")
            )),
            "if",
        ),
        (
            "an email destination of 101 recipients",
            format!(
                "workflow w {{\n  input {{ q: string }}\n  deliver on completed to email [{recipients}] subject \"s\" body \"b\"\n{}\n}}",
                asks("a", "workflow_input.q")
            ),
            "w",
        ),
        (
            "a department of 300 bytes",
            format!(
                "workflow w {{\n  input {{ q: string }}\n  department \"{long}\"\n{}\n}}",
                asks("a", "workflow_input.q")
            ),
            "w",
        ),
        (
            "an MCP server's argument of 5,000 bytes",
            format!(
                "mcp tools {{ command \"npx\" args [\"{}\"] }}\n{}",
                "a".repeat(5_000),
                step(&asks("a", "workflow_input.q"))
            ),
            "tools",
        ),
        (
            "a recipe name of 300 bytes",
            format!(
                "recipe {long} {{\n  model \"default\"\n  input {{ q: string }}\n  output {{ text: string }}\n  prompt \"{{{{input.q}}}}\"\n}}\n{}",
                step(&format!("  step a = {long} {{ q: workflow_input.q }}"))
            ),
            &long,
        ),
        (
            "a fallback's string, a step's string and a step id, in that order",
            format!(
                "workflow w {{\n  input {{ q: string }}\n  on_error fallback {{\n{}\n  }}\n{}\n{}\n}}",
                asks("f", &huge_text),
                asks("first", &huge_text),
                asks(&long, "workflow_input.q")
            ),
            "first",
        ),
        (
            "a variant of 2,000 bytes in a recipe's output",
            format!(
                "recipe pick {{\n  model \"default\"\n  input {{ q: string }}\n  output {{ kind: {long_variant} | \"b\" }}\n  prompt \"{{{{input.q}}}}\"\n}}\n{}",
                step("  step a = pick { q: workflow_input.q }")
            ),
            // The checker's own bound, at the variant.
            &long_variant,
        ),
    ];
    // A record of 30,000 fields, whose schema is 1,140,074 bytes: written out
    // for each recipe or workflow that names it, 236 of them are past the
    // plan's 256 MiB. Measured before the plan is written (it took 24 GB).
    let big = format!(
        "type Big = {{ {} }}\n",
        (0..30_000)
            .map(|i| format!("f_{i:05}: string"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cases = cases.into_iter().chain([
        (
            "240 recipes each answering a type of 30,000 fields",
            format!(
                "{big}{}{}",
                (0..240)
                    .map(|i| format!("recipe big_{i:03} {{\n  model \"default\"\n  input {{ q: string }}\n  output {{ x: Big }}\n  prompt \"{{{{input.q}}}}\"\n}}\n"))
                    .collect::<String>(),
                step(&asks("a", "workflow_input.q"))
            ),
            "big_235",
        ),
        (
            "240 workflows each given a type of 30,000 fields",
            format!(
                "{big}{}",
                (0..240)
                    .map(|i| format!("workflow w{i:03} {{\n  input {{ x: Big }}\n{}\n}}\n", asks("a", "workflow_input.x.f_00000")))
                    .collect::<String>()
            ),
            "w235",
        ),
    ]);
    for (name, program, at) in cases {
        let source = format!("{RECIPE}{program}\n");
        let (built, plan) =
            flow_compiler::check_and_lower("w.flow", &One(source.clone())).expect("it loads");
        let checked = flow_compiler::check_source("w.flow", &source);
        // The same diagnostic, in the same words and hints, either way.
        assert_eq!(checked.diagnostics, built.diagnostics, "{name}");
        for (driver, checked) in [("check", &checked), ("check and lower", &built)] {
            let errors: Vec<_> = checked
                .diagnostics
                .iter()
                .filter(|d| d.is_error())
                .collect();
            assert_eq!(errors.len(), 1, "{name} ({driver}): {errors:#?}");
            assert_eq!(errors[0].code.as_str(), "E212", "{name} ({driver})");
            let span = errors[0].primary.span;
            assert_eq!(
                &source[span.start as usize..span.end as usize],
                at,
                "{name} ({driver}): where"
            );
        }
        assert!(plan.is_none(), "{name}: a plan came out");
    }
}

#[test]
fn a_program_with_errors_does_not_lower() {
    let checked = flow_compiler::check_source("x.flow", "workflow w { step a = nope {} }");
    assert!(checked.has_errors());
    assert!(flow_compiler::lower(&checked).is_none());
}

/// `flowc diff` on the examples (`flow_plan::compat`): a version compared
/// with itself lets every run move, and comparing any workflow with any
/// other (renamed to match) answers without panicking, every problem at a
/// place of the old version.
#[test]
fn every_example_can_move_to_itself_and_any_comparison_answers() {
    let loader = Workspace(workspace_root());
    let plans: Vec<flow_plan::Plan> = examples()
        .iter()
        .map(|name| {
            let checked = flow_compiler::check(&format!("examples/{name}"), &loader)
                .expect("the example is readable");
            flow_compiler::lower(&checked).expect("the example lowers")
        })
        .collect();
    for plan in &plans {
        for workflow in &plan.workflows {
            let report = flow_plan::compat::compare(plan, plan, &workflow.name)
                .expect("the workflow is in the plan")
                .report();
            assert!(report.compatible, "{}: {report:#?}", workflow.name);
            assert!(!report.places.is_empty());
        }
    }
    for old in &plans {
        for workflow in &old.workflows {
            for other in &plans {
                for theirs in 0..other.workflows.len() {
                    let mut new = other.clone();
                    new.workflows[theirs].name = workflow.name.clone();
                    let comparison = flow_plan::compat::compare(old, &new, &workflow.name)
                        .expect("the workflow is in the plan");
                    let report = comparison.report();
                    let places: Vec<&str> = report.places.iter().map(|p| p.path.as_str()).collect();
                    for finding in &report.findings {
                        assert!(finding.places.iter().all(|p| places.contains(&p.as_str())));
                    }
                    for place in &report.places {
                        let concrete = place.path.replace("[*]", "[7]");
                        let problems = comparison
                            .at(&concrete)
                            .expect("a place of the old version");
                        assert_eq!(problems.is_empty(), place.compatible, "{}", place.path);
                    }
                }
            }
        }
    }
}
