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

struct Case {
    name: String,
    args: Vec<String>,
    files: Vec<(String, String)>,
}

/// The shared files and the cases of a fixture file.
fn cases(text: &str) -> (Vec<(String, String)>, Vec<Case>) {
    let mut shared: Vec<(String, String)> = Vec::new();
    let mut cases: Vec<Case> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line
            .strip_prefix("--- ")
            .and_then(|l| l.strip_suffix(" ---"))
        {
            cases.push(Case {
                name: name.to_string(),
                args: Vec::new(),
                files: Vec::new(),
            });
            continue;
        }
        let files = match cases.last_mut() {
            Some(case) => {
                if let Some(args) = line.strip_prefix("// args: ") {
                    case.args = args.split_whitespace().map(str::to_string).collect();
                    continue;
                }
                &mut case.files
            }
            None => &mut shared,
        };
        if let Some(path) = line.strip_prefix("// file: ") {
            files.push((path.trim().to_string(), String::new()));
            continue;
        }
        if let Some((_, text)) = files.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    (shared, cases)
}

/// A fresh folder for one case, under the target directory.
fn folder(fixture: &str, case: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("diff")
        .join(format!("{fixture}-{case}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the case");
    dir
}

/// `flowc diff` in `dir` with `args`: its exit code and output, hashes
/// left out (they change with any change to lowering).
fn flowc(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_flowc"))
        .current_dir(dir)
        .arg("diff")
        .args(args)
        .output()
        .expect("flowc starts");
    let mut out = format!("exit {}\n", output.status.code().unwrap_or(-1));
    out.push_str(&String::from_utf8_lossy(&output.stdout));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.is_empty() {
        out.push_str("stderr:\n");
        out.push_str(&stderr);
    }
    out.lines()
        .map(|line| match line.find("\"sha256:") {
            Some(at) => format!("{}\"sha256:…\",", &line[..at]),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
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
