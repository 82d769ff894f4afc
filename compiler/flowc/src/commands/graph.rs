//! `flowc graph`: a Mermaid flowchart of a workflow, on stdout.

use std::path::Path;

use crate::Exit;
use crate::loader::{print_load_error, single_file};

pub(crate) fn run(file: &Path, root: Option<&Path>, workflow: Option<&str>) -> Exit {
    let Some(source) = single_file(file, root) else {
        return Exit::Usage;
    };
    let path = source.path.clone();
    let checked = match flow_compiler::check(&path, &source.loader()) {
        Ok(checked) => checked,
        Err(error) => {
            print_load_error(&error);
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
            out!("{graph}");
            Exit::Ok
        }
        Err(message) => {
            eprintln!("error: {message}");
            Exit::Usage
        }
    }
}
