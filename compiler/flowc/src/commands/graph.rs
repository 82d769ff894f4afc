//! `flowc graph`: a Mermaid flowchart of a workflow, on stdout.

use std::path::Path;

use crate::Exit;
use crate::loader::{DiskLoader, normalize_arg};

pub(crate) fn run(file: &Path, workflow: Option<&str>) -> Exit {
    let Some(path) = normalize_arg(file) else {
        return Exit::Usage;
    };
    let checked = match flow_compiler::check(&path, &DiskLoader) {
        Ok(checked) => checked,
        Err(error) => {
            eprintln!("error: cannot read {}: {}", error.path, error.message);
            return Exit::Usage;
        }
    };
    // The graph is drawn from the syntax tree, so a workflow being written can
    // be pictured before it checks; say so rather than fail.
    let errors = checked.diagnostics.iter().filter(|d| d.is_error()).count();
    if errors > 0 {
        eprintln!(
            "warning: {path} has {errors} error{}; run `flowc check {path}` (the graph shows what parses)",
            if errors == 1 { "" } else { "s" }
        );
    }
    match flow_compiler::graph::mermaid(&checked, workflow) {
        Ok(graph) => {
            print!("{graph}");
            Exit::Ok
        }
        Err(message) => {
            eprintln!("error: {message}");
            Exit::Usage
        }
    }
}
