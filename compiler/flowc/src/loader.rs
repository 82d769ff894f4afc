//! Reading sources from disk: the `SourceLoader` that `flowc` hands to the
//! compiler core, and the expansion of command-line paths into `.flow` files.
//!
//! The core does no IO, so everything that touches the file system for the
//! compiler lives here.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use flow_compiler::check::normalize;

/// Loads sources straight from the file system.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DiskLoader;

impl flow_compiler::SourceLoader for DiskLoader {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        // A directory opens fine on some platforms and only fails on read, with
        // a cryptic message; say what is wrong instead.
        if Path::new(path).is_dir() {
            return Err(flow_compiler::LoadFailure::unreadable("it is a directory"));
        }
        std::fs::read(path)
            .map_err(|error| flow_compiler::LoadFailure::unreadable(io_reason(&error)))
    }
}

/// Writes through a temporary file in the same directory and renames it, so
/// that a runtime watching the path never reads half a plan.
///
/// Only a regular file (or a new one) is replaced that way: renaming over a
/// device such as `/dev/null`, a pipe or a symbolic link would replace the
/// special file itself, so those are written in place.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|meta| !meta.is_file()) {
        return std::fs::write(path, bytes);
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let written = std::fs::File::create(&temporary).and_then(|mut out| {
        out.write_all(bytes)?;
        out.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(error) => {
            // Leave no stray temporary behind; the first error is the one to report.
            let _ = std::fs::remove_file(&temporary);
            Err(error)
        }
    }
}

/// A short, human reason for an IO error, without the `(os error N)` suffix
/// that `io::Error`'s `Display` appends.
pub(crate) fn io_reason(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => "no such file or directory".to_string(),
        io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        io::ErrorKind::IsADirectory => "it is a directory".to_string(),
        _ => {
            let text = error.to_string();
            match text.find(" (os error") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
    }
}

/// A single-file argument as the checker should see it, in lexical normal
/// form; prints the error and returns `None` when the path is not UTF-8.
pub(crate) fn normalize_arg(path: &Path) -> Option<String> {
    match path.to_str() {
        Some(text) => Some(normalize(text)),
        None => {
            eprintln!(
                "error: cannot read {}: the path is not valid UTF-8",
                path.display()
            );
            None
        }
    }
}

/// A command-line path that could not be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathProblem {
    pub(crate) path: String,
    pub(crate) reason: String,
}

impl std::fmt::Display for PathProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot read {}: {}", self.path, self.reason)
    }
}

/// Expands command-line paths into the files to process.
///
/// A file is taken as given, whatever its extension, because the user named it;
/// paths are put in lexical normal form (`./a.flow` is `a.flow`), because the
/// checker names files in messages as they were handed to it.
/// A directory contributes every `*.flow` file below it, sorted, so that output
/// is stable across runs and machines. Hidden entries (`.git`, `.cache`, ...)
/// are skipped when walking, and symbolic links to directories are not
/// followed, so that a walk always ends. A file reached twice is kept once.
pub(crate) fn expand_paths(paths: &[PathBuf]) -> (Vec<String>, Vec<PathProblem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for path in paths {
        let shown = path.display().to_string();
        match std::fs::metadata(path) {
            Err(error) => problems.push(PathProblem {
                path: shown,
                reason: io_reason(&error),
            }),
            Ok(meta) if meta.is_dir() => {
                let mut found = Vec::new();
                walk(path, &mut found, &mut problems);
                found.sort();
                files.extend(found);
            }
            Ok(_) => match path.to_str() {
                Some(text) => files.push(normalize(text)),
                None => problems.push(PathProblem {
                    path: shown,
                    reason: "the path is not valid UTF-8".to_string(),
                }),
            },
        }
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|file| seen.insert(file.clone()));
    (files, problems)
}

fn walk(dir: &Path, found: &mut Vec<String>, problems: &mut Vec<PathProblem>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            problems.push(PathProblem {
                path: dir.display().to_string(),
                reason: io_reason(&error),
            });
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                problems.push(PathProblem {
                    path: dir.display().to_string(),
                    reason: io_reason(&error),
                });
                continue;
            }
        };
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(&path, found, problems);
        } else if path.extension().is_some_and(|ext| ext == "flow")
            && (kind.is_file() || path.is_file())
        {
            match path.to_str() {
                Some(text) => found.push(normalize(text)),
                None => problems.push(PathProblem {
                    path: path.display().to_string(),
                    reason: "the path is not valid UTF-8".to_string(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_suffix_is_dropped() {
        let error = io::Error::from_raw_os_error(21);
        assert!(!io_reason(&error).contains("os error"));
    }
}
