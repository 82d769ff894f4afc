//! `flowc init [DIR]`: a starter project that checks, tests and runs at
//! once: a workflow with two recipes and a branch, its input, tests that
//! cover every branch, editor settings, a README and a `.gitignore` for the
//! store `flow run` writes. The files are those of
//! `compiler/flowc/starter/`, built into the binary; a test runs `flowc
//! check`, `flowc test --min-coverage 100` and `flow run` on what it writes.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::Exit;

/// The starter's files, by path in the project.
const FILES: &[(&str, &str)] = &[
    ("hello.flow", include_str!("../../starter/hello.flow")),
    (
        "hello.input.json",
        include_str!("../../starter/hello.input.json"),
    ),
    (
        "hello.test.flow",
        include_str!("../../starter/hello.test.flow"),
    ),
    (
        ".vscode/settings.json",
        include_str!("../../starter/.vscode/settings.json"),
    ),
    (
        ".vscode/extensions.json",
        include_str!("../../starter/.vscode/extensions.json"),
    ),
    ("README.md", include_str!("../../starter/README.md")),
    (".gitignore", include_str!("../../starter/.gitignore")),
];

pub(crate) fn run(dir: &Path) -> Exit {
    // Every file is checked before any is written, so that a refusal
    // leaves the folder as it was.
    let existing: Vec<PathBuf> = FILES
        .iter()
        .map(|(path, _)| dir.join(path))
        .filter(|path| path.symlink_metadata().is_ok())
        .collect();
    if !existing.is_empty() {
        eprintln!(
            "error: flowc init writes no file over another; these exist already: {}\n  = help: run it in an empty folder (`flowc init DIR` makes one), or move them away",
            existing
                .iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Exit::Usage;
    }
    for (path, text) in FILES {
        let target = dir.join(path);
        if let Err(error) = write_new(&target, text) {
            eprintln!("error: cannot write {}: {error}", target.display());
            return Exit::Usage;
        }
    }
    let shown = dir.display().to_string();
    outln!("created a flow project in {shown}:");
    for (path, _) in FILES {
        outln!("  {path}");
    }
    let cd = if dir == Path::new(".") {
        String::new()
    } else {
        format!("cd {} && ", flow_plan::shell_quote(&shown))
    };
    outln!(
        "next: {cd}flowc check . && flowc test --min-coverage 100 && flow run hello.flow --input hello.input.json"
    );
    Exit::Ok
}

/// Writes a file that must not exist yet (`create_new`: a file made since
/// the check above is not overwritten either).
fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(text.as_bytes())
}
