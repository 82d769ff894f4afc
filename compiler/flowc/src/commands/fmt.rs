//! `flowc fmt`: format files in place, or list the files that would change.

use std::path::{Path, PathBuf};

use flow_compiler::diagnostic::line_col;
use flow_compiler::format::format_source;

use crate::Exit;
use crate::loader::{RootFile, expand_paths, io_reason, write_atomically};

pub(crate) fn run(paths: &[PathBuf], root: Option<&Path>, check: bool) -> Exit {
    let (files, problems, without_sources) = expand_paths(paths, root);
    crate::loader::warn_of_no_sources(&without_sources);
    let mut exit = Exit::Ok;
    for problem in &problems {
        eprintln!("error: {problem}");
        exit = Exit::Usage;
    }
    let mut changed = 0;
    for file in &files {
        let path = &file.path;
        match format_file(file, check) {
            Ok(false) => {}
            Ok(true) => {
                changed += 1;
                if check {
                    // Only the names on stdout, like `gofmt -l`, for scripts.
                    outln!("{path}");
                    exit = exit.max(Exit::Problems);
                }
            }
            Err((code, message)) => {
                eprintln!("error: {message}");
                exit = exit.max(code);
            }
        }
    }
    if !files.is_empty() {
        let verb = if check {
            "would be reformatted"
        } else {
            "reformatted"
        };
        eprintln!(
            "{changed} of {} file{} {verb}",
            files.len(),
            if files.len() == 1 { "" } else { "s" }
        );
    }
    exit
}

/// Formats one file; `Ok(true)` when its formatting changes (and, unless
/// `check`, was written). A file that cannot be read or written is an IO
/// error; one that is not UTF-8 or cannot be tokenised is a problem with the
/// file, reported at its line and column.
///
/// The file is read as the checker reads it, through its project, so that a
/// symbolic link out of the folder being formatted is neither read nor
/// written through.
fn format_file(file: &RootFile, check: bool) -> Result<bool, (Exit, String)> {
    let path = file.path.as_str();
    let bytes = file.project.read(path, file.named).map_err(|failure| {
        (
            Exit::Usage,
            match failure.hint() {
                Some(hint) => format!("cannot read {path}: {failure}\n  help: {hint}"),
                None => format!("cannot read {path}: {failure}"),
            },
        )
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let offset = e.valid_up_to();
        (
            Exit::Problems,
            format!("{path}: not valid UTF-8: invalid byte at offset {offset}; not formatted"),
        )
    })?;
    let formatted = format_source(text).map_err(|e| {
        let (line, column) = line_col(text, e.offset as u32);
        (
            Exit::Problems,
            format!("{path}:{line}:{column}: cannot format: {}", e.message),
        )
    })?;
    if formatted == text {
        return Ok(false);
    }
    if !check {
        write_atomically(path.as_ref(), formatted.as_bytes()).map_err(|e| {
            (
                Exit::Usage,
                format!("cannot write {path}: {}", io_reason(&e)),
            )
        })?;
    }
    Ok(true)
}
