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

/// Regression (41515f8): `flow approve` on a run whose stored plan no
/// longer loaded printed the parse error alone: no run, no plan, no way
/// on. It names the run, its workflow and plan, and the mend, which works:
/// running the source again stores the plan anew.
#[test]
fn a_run_whose_stored_plan_does_not_load_is_named_with_the_mend() {
    let dir = TempDir::new("flow-cli-damaged-plan");
    dir.write(
        "w.flow",
        "workflow w {\n  step gate = approval { approvers: [\"ana@x.io\"], message: \"ok?\" }\n}\n",
    );
    let parked = flow(&dir, &["run", "w.flow", "--json"]);
    assert_eq!(parked.code, 3, "{}", parked.all());
    let record: serde_json::Value = serde_json::from_str(&parked.stdout).expect("a record");
    let run = record["run_id"].as_str().expect("the run's id");
    let db = rusqlite::Connection::open(dir.path().join("flow.db")).expect("the store");
    let hash: String = db
        .query_row("SELECT plan_hash FROM runs WHERE id = ?1", [run], |row| {
            row.get(0)
        })
        .expect("the run's plan");
    db.execute(
        "UPDATE plans SET json = '{ damaged' WHERE hash = ?1",
        [&hash],
    )
    .expect("the plan damaged");
    drop(db);

    let approve = ["approve", run, "gate", "--as", "ana@x.io"];
    let refused = flow(&dir, &approve);
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused.stderr.contains(&format!(
            "run {run} (w): its plan {hash} does not load from the store"
        )) && refused
            .stderr
            .contains("running the workflow's source again (`flow run FILE`) stores it anew"),
        "{}",
        refused.stderr
    );

    assert_eq!(flow(&dir, &["run", "w.flow"]).code, 3, "the source again");
    let approved = flow(&dir, &approve);
    assert_eq!(approved.code, 0, "{}", approved.all());
}
