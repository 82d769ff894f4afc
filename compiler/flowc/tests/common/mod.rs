//! What the fixture tests of flowc's commands share: a fixture file holds
//! named cases, `--- name ---`; `// file: NAME` starts a file of the case
//! (before the first case, a file written beside every case's); `// args:
//! ...` adds arguments to the command.

use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
    pub(crate) files: Vec<(String, String)>,
}

/// The shared files and the cases of a fixture file.
pub(crate) fn cases(text: &str) -> (Vec<(String, String)>, Vec<Case>) {
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

/// A fresh folder for one case of a `command`'s fixture, under the target
/// directory.
pub(crate) fn folder(command: &str, fixture: &str, case: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(command)
        .join(format!("{fixture}-{case}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the case");
    dir
}

/// `flowc ARGS` in `dir`: its exit code, stdout, and stderr if any.
pub(crate) fn flowc(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_flowc"))
        .current_dir(dir)
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
    out
}
