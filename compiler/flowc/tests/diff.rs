//! Fixture tests of `flowc diff`, run through the binary.
//!
//! Each `.flow` file under `tests/diff/` holds named cases, `--- name ---`,
//! in the style of the compiler's IDE fixtures: `// file: old.flow` and
//! `// file: new.flow` start the two versions (and any other line
//! `// file: NAME` a file beside them); `// args: ...` adds arguments. What
//! comes before the first case is written beside every case's files (a
//! `// file: common.flow` of recipes, which versions import). For each case
//! the human and the JSON answers, with their exit codes, go into one insta
//! snapshot per fixture file, so that a review sees every answer change.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::cases;

/// A fresh folder for one case.
fn folder(fixture: &str, case: usize) -> PathBuf {
    common::folder("diff", fixture, case)
}

/// `flowc diff` in `dir` with `args`: its exit code and output, hashes
/// left out (they change with any change to lowering).
fn flowc(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["diff"];
    all.extend(args);
    without_hashes(&common::flowc(dir, &all))
}

/// `text` with each `sha256:HEX` as `sha256:…`.
fn without_hashes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sha256:") {
        let (before, after) = rest.split_at(at + "sha256:".len());
        out.push_str(before);
        out.push('…');
        rest = after.trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    out
}

fn run_fixture(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/diff")
        .join(format!("{name}.flow"));
    let text = std::fs::read_to_string(&path).expect("the fixture");
    let (shared, cases) = cases(&text);
    assert!(!cases.is_empty(), "{name} has no cases");
    let mut snapshot = String::new();
    for (index, case) in cases.iter().enumerate() {
        let dir = folder(name, index);
        for (file, text) in shared.iter().chain(&case.files) {
            std::fs::write(dir.join(file), text).expect("a case's file");
        }
        let mut args: Vec<&str> = vec!["old.flow", "new.flow"];
        args.extend(case.args.iter().map(String::as_str));
        let _ = writeln!(snapshot, "=== {} ===", case.name);
        let _ = writeln!(snapshot, "{}", flowc(&dir, &args));
        args.extend(["--format", "json"]);
        let _ = writeln!(snapshot, "--- json ---\n{}\n", flowc(&dir, &args));
    }
    insta::assert_snapshot!(name, snapshot);
}

#[test]
fn steps_added_removed_and_changed() {
    run_fixture("steps");
}

#[test]
fn output_and_input_types() {
    run_fixture("types");
}

#[test]
fn gates_in_branches_loops_and_parallels() {
    run_fixture("structure");
}

/// What `flowc diff` answers about its inputs: built plans as versions,
/// and each way a version cannot be compared (exit 2).
#[test]
fn versions_from_plans_and_usage_errors() {
    let dir = folder("cli", 0);
    let old = "recipe r { model \"m\" input { t: string } output { s: string } prompt \"{{input.t}}\" }\n\
               workflow w {\n  input { t: string }\n  step a = r { t: workflow_input.t }\n  step gate = approval { approvers: [\"ana\"], message: \"ok?\" }\n}\n";
    let new = old.replace("step gate", "step b = r { t: step.a.s }\n  step gate");
    std::fs::write(dir.join("old.flow"), old).expect("old");
    std::fs::write(dir.join("new.flow"), &new).expect("new");
    std::fs::write(dir.join("broken.flow"), "workflow w { step a = nope {} }\n").expect("broken");
    let built = Command::new(env!("CARGO_BIN_EXE_flowc"))
        .current_dir(&dir)
        .args(["build", "old.flow", "-o", "old.plan.json"])
        .output()
        .expect("flowc starts");
    assert!(built.status.success(), "{built:?}");
    let plan = std::fs::read_to_string(dir.join("old.plan.json")).expect("the plan");
    std::fs::write(
        dir.join("edited.plan.json"),
        plan.replace("\"gate\"", "\"gates\""),
    )
    .expect("edited");
    let mut snapshot = String::new();
    for args in [
        &["old.plan.json", "new.flow"][..],
        &["old.plan.json", "old.plan.json"],
        &["old.flow", "new.flow", "--workflow", "nope"],
        &["old.flow", "missing.flow"],
        &["old.flow", "broken.flow"],
        &["edited.plan.json", "new.flow"],
        &["old.flow"],
    ] {
        let _ = writeln!(snapshot, "=== flowc diff {} ===", args.join(" "));
        let _ = writeln!(snapshot, "{}\n", flowc(&dir, args));
    }
    insta::assert_snapshot!("cli", snapshot);
}

/// Every code `flowc diff` can answer has a fixture case that answers it.
#[test]
fn every_code_has_a_fixture() {
    let snapshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut all = String::new();
    for entry in std::fs::read_dir(snapshots).expect("the snapshots") {
        let path = entry.expect("an entry").path();
        if path.to_string_lossy().contains("diff__") {
            all.push_str(&std::fs::read_to_string(path).expect("a snapshot"));
        }
    }
    for code in flow_plan::compat::Code::ALL {
        let code = code.as_str();
        assert!(
            all.contains(&format!("error[{code}]")),
            "no fixture answers {code}"
        );
    }
}
