//! Fixture tests of `flowc test`, run through the binary.
//!
//! Each `.flow` file under `tests/test/` holds named cases, `--- name ---`,
//! as `tests/diff/` does (`tests/common`): the files of a case (`// file:
//! NAME`) are written to a folder of their own and `flowc test .` runs
//! there, with the case's `// args: ...`. For each case the human and the
//! JSON answers, with their exit codes, go into one insta snapshot per
//! fixture file, so that a review sees every answer change.

use std::fmt::Write as _;
use std::path::Path;

mod common;

fn run_fixture(name: &str) {
    run_fixture_in(name, &["json"]);
}

/// Runs the cases of fixture `name` in the human format and in each of
/// `formats`.
fn run_fixture_in(name: &str, formats: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/test")
        .join(format!("{name}.flow"));
    let text = std::fs::read_to_string(&path).expect("the fixture");
    let (shared, cases) = common::cases(&text);
    assert!(!cases.is_empty(), "{name} has no cases");
    let mut snapshot = String::new();
    for (index, case) in cases.iter().enumerate() {
        let dir = common::folder("test", name, index);
        for (file, text) in shared.iter().chain(&case.files) {
            std::fs::write(dir.join(file), text).expect("a case's file");
        }
        let mut args: Vec<&str> = vec!["test", "."];
        args.extend(case.args.iter().map(String::as_str));
        let _ = writeln!(snapshot, "=== {} ===", case.name);
        let _ = writeln!(snapshot, "{}", common::flowc(&dir, &args));
        for format in formats {
            let mut args = args.clone();
            args.extend(["--format", format]);
            let _ = writeln!(
                snapshot,
                "--- {format} ---\n{}\n",
                common::flowc(&dir, &args)
            );
        }
    }
    insta::assert_snapshot!(name, snapshot);
}

#[test]
fn mocks_retries_and_failures() {
    run_fixture("mocks");
}

#[test]
fn approvals_decided_expired_and_left_parked() {
    run_fixture("approvals");
}

#[test]
fn files_that_do_not_check_and_usage() {
    run_fixture("usage");
}

#[test]
fn branch_coverage() {
    run_fixture("coverage");
}

#[test]
fn junit_and_github_reports() {
    run_fixture_in("formats", &["junit", "github"]);
}

/// A test's run parks at most 1,000 times, as the docs say, and a run
/// past that is named for what it is. Regression: the 1,000th park failed
/// the test ("the run parked 1000 times").
#[test]
fn a_tests_run_parks_at_most_a_thousand_times() {
    for (gates, passes) in [(1_000, true), (1_001, false)] {
        let dir = common::folder("test", "parks", gates);
        let items: Vec<String> = (0..gates).map(|i| format!("\"t{i}\"")).collect();
        let source = format!(
            "workflow w {{\n  input {{ xs: list<string> }}\n  for workflow_input.xs as l {{\n    step g = approval {{ approvers: [\"a\"], message: \"{{{{loop_item}}}}\" }}\n  }}\n}}\ntest \"gates\" {{\n  workflow w\n  input {{ xs: [{}] }}\n  decide step.g approve by \"a\"\n  expect status completed\n}}\n",
            items.join(", ")
        );
        std::fs::write(dir.join("gates.flow"), source).expect("the test's file");
        let answer = common::flowc(&dir, &["test", "."]);
        assert_eq!(answer.starts_with("exit 0\n"), passes, "{gates}: {answer}");
        assert_eq!(
            answer.contains("the run parked more than 1000 times"),
            !passes,
            "{gates}: {answer}"
        );
    }
}
