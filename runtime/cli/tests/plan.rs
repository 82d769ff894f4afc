//! `flow run PLAN.json` holds a plan file to what `flowc build` writes.

use flow_tests::{TempDir, run_in};

fn flow(dir: &TempDir, args: &[&str]) -> flow_tests::Run {
    run_in(
        std::path::Path::new(env!("CARGO_BIN_EXE_flow")),
        dir.path(),
        args,
    )
}

/// A plan whose hash is right but whose numbers and indices the compiler
/// never writes is refused with its problems listed and exit code 2, and no
/// store is created for it.
#[test]
fn an_invalid_plan_file_is_refused_with_its_problems_and_exit_code_2() {
    let dir = TempDir::new("flow-cli-invalid-plan");
    let checked = flow_compiler::check_source(
        "w.flow",
        "recipe echo {\n  model \"default\"\n  input { text: string }\n  output { text: string }\n  prompt \"{{input.text}}\"\n}\nworkflow w {\n  input { text: string }\n  step a = echo { text: workflow_input.text }\n  output { text: step.a.text }\n}\n",
    );
    let mut plan = flow_compiler::lower(&checked).expect("the source lowers");
    let flow_plan::Node::Step(step) = &mut plan.workflows[0].body[0] else {
        panic!("the first node is a step");
    };
    step.retry.attempts = 1_000_000;
    step.retry.backoff_min_ms = 0;
    if let flow_plan::Action::Recipe { recipe, .. } = &mut step.action {
        *recipe = 7;
    }
    std::fs::write(dir.path().join("bad.json"), plan.seal().to_json()).unwrap();
    std::fs::write(dir.path().join("in.json"), r#"{ "text": "hi" }"#).unwrap();

    let output = flow(&dir, &["run", "bad.json", "--input", "in.json"]);
    let stderr = &output.stderr;
    assert_eq!(output.code, 2, "{stderr}");
    assert!(
        stderr.contains("error: bad.json: the plan is not one flowc could have built (3 problems)")
            && stderr.contains(
                "/workflows/0/body/0/action/recipe: recipe 7 is past the end of the plan's 1 recipes"
            )
            && stderr.contains(
                "/workflows/0/body/0/retry/attempts: 1000000 attempts; a retry makes from 1 to 100"
            )
            && stderr.contains("/workflows/0/body/0/retry/backoff_min_ms: a backoff of 0 ms"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("flow.db").exists(),
        "nothing was stored for the refused plan"
    );
}

/// A source past a limit of plans (a step id of 300 bytes) is refused by
/// `flow run` with E212 where the step is, and the last line names
/// `flowc check`, which reports it too. Nothing is stored.
#[test]
fn a_source_past_a_plan_limit_is_refused_where_it_is() {
    let dir = TempDir::new("flow-cli-plan-limit");
    let long = "s".repeat(300);
    std::fs::write(
        dir.path().join("long.flow"),
        format!(
            "recipe echo {{\n  model \"default\"\n  input {{ text: string }}\n  output {{ text: string }}\n  prompt \"{{{{input.text}}}}\"\n}}\nworkflow w {{\n  input {{ text: string }}\n  step {long} = echo {{ text: workflow_input.text }}\n}}\n"
        ),
    )
    .unwrap();
    let output = flow(
        &dir,
        &["run", "long.flow", "--input", r#"{ "text": "hi" }"#],
    );
    let stderr = &output.stderr;
    assert_eq!(output.code, 1, "{stderr}");
    assert!(
        stderr.contains("long.flow:9:8: error E212: a step id of 300 bytes"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("error: long.flow does not check; see `flowc check long.flow`\n"),
        "{stderr}"
    );
    assert!(!dir.path().join("flow.db").exists(), "nothing was stored");
}

/// Regression: `--input null` (or `42`, `"text"`) was read as a file name
/// ("cannot read null"); JSON that is not an object is JSON, and the run
/// says what its input must be, as for an object of the wrong shape.
#[test]
fn an_input_of_json_that_is_not_an_object_is_read_as_json() {
    let dir = TempDir::new("flow-cli-input-null");
    std::fs::write(
        dir.path().join("w.flow"),
        "workflow w {\n  input { text: string }\n  output { text: workflow_input.text }\n}\n",
    )
    .unwrap();
    let output = flow(&dir, &["run", "w.flow", "--input", "null"]);
    let stdout = &output.stdout;
    let stderr = &output.stderr;
    assert_eq!(output.code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("input: expected an object, found null"),
        "{stdout}{stderr}"
    );
}
