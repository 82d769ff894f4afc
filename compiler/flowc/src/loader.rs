//! Reading sources from disk: the projects whose files `flowc` hands to the
//! compiler core (through `flow-loader`, shared with `flow` and `flow-lsp`),
//! and the expansion of command-line paths into `.flow` files.
//!
//! The core does no IO, so everything that touches the file system for the
//! compiler lives here and in `flow-loader`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flow_compiler::check::normalize;
pub(crate) use flow_loader::io_reason;
use flow_loader::{Project, ProjectLoader};

/// How to name a wider project, the end of the hint of an import refused
/// for leaving the project.
const WIDEN: &str = "to import from a wider folder, name it with `--root DIR`";

/// A file to process, with the project its imports are confined to.
#[derive(Debug, Clone)]
pub(crate) struct RootFile {
    /// In lexical normal form, as the checker names it.
    pub(crate) path: String,
    pub(crate) project: Arc<Project>,
    /// Named on the command line, rather than found by walking a folder: it
    /// may have any extension, since the user chose it.
    pub(crate) named: bool,
}

impl RootFile {
    /// The loader that reads this file and its imports.
    pub(crate) fn loader(&self) -> ProjectLoader<'_> {
        self.project
            .loader(self.named.then_some(self.path.as_str()))
    }
}

/// The project of the paths on a command line: `--root DIR` when given.
fn given_root(root: Option<&Path>) -> Result<Option<Arc<Project>>, PathProblem> {
    root.map(|root| {
        Project::new(root, WIDEN)
            .map(Arc::new)
            .map_err(|error| PathProblem {
                path: format!("the project folder {}", error.root),
                reason: error.reason,
            })
    })
    .transpose()
}

/// The one file of `build` and `graph`, with its project (`--root`, or its
/// folder); prints the problem and returns `None` when there is one.
pub(crate) fn single_file(file: &Path, root: Option<&Path>) -> Option<RootFile> {
    let path = normalize_arg(file)?;
    let project = match given_root(root) {
        Ok(Some(project)) => Ok(project),
        Ok(None) => Project::of_file(file, WIDEN)
            .map(Arc::new)
            .map_err(|error| PathProblem {
                path: path.clone(),
                reason: error.reason,
            }),
        Err(problem) => Err(problem),
    };
    match project {
        Ok(project) => Some(RootFile {
            path,
            project,
            named: true,
        }),
        Err(problem) => {
            eprintln!("error: {problem}");
            None
        }
    }
}

/// Prints why a root file could not be checked at all.
pub(crate) fn print_load_error(error: &flow_compiler::LoadError) {
    eprintln!("error: cannot read {}: {}", error.path, error.message);
    if let Some(hint) = &error.hint {
        eprintln!("  help: {hint}");
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

/// A single-file argument as the checker should see it, in lexical normal
/// form; prints the error and returns `None` when the path is not UTF-8.
fn normalize_arg(path: &Path) -> Option<String> {
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

/// Expands command-line paths into the files to process, each with its
/// project: `root` when given, else the folder named (for the files found
/// in it) or the file's own folder.
///
/// A file is taken as given, whatever its extension, because the user named it;
/// paths are put in lexical normal form (`./a.flow` is `a.flow`), because the
/// checker names files in messages as they were handed to it.
/// A directory contributes every `*.flow` file below it, sorted, so that output
/// is stable across runs and machines. Hidden entries (`.git`, `.cache`, ...)
/// are skipped when walking, and symbolic links to directories are not
/// followed, so that a walk always ends; a link to a file is kept, and its
/// project's loader refuses it if it leads out of the project. A file reached
/// twice is kept once. Third come the folders named that hold no `*.flow`
/// file: a command on them does nothing, which it says (`no_sources`).
pub(crate) fn expand_paths(
    paths: &[PathBuf],
    root: Option<&Path>,
) -> (Vec<RootFile>, Vec<PathProblem>, Vec<String>) {
    let mut files: Vec<RootFile> = Vec::new();
    let mut problems = Vec::new();
    let mut without_sources = Vec::new();
    let given = match given_root(root) {
        Ok(given) => given,
        Err(problem) => return (files, vec![problem], without_sources),
    };
    for path in paths {
        let shown = path.display().to_string();
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(error) => {
                problems.push(PathProblem {
                    path: shown,
                    reason: io_reason(&error),
                });
                continue;
            }
        };
        let project = match &given {
            Some(project) => Ok(Arc::clone(project)),
            None if meta.is_dir() => Project::new(path, WIDEN).map(Arc::new),
            None => Project::of_file(path, WIDEN).map(Arc::new),
        };
        let project = match project {
            Ok(project) => project,
            Err(error) => {
                problems.push(PathProblem {
                    path: shown,
                    reason: error.reason,
                });
                continue;
            }
        };
        if meta.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found, &mut problems);
            if found.is_empty() {
                without_sources.push(shown);
            }
            found.sort();
            files.extend(found.into_iter().map(|path| RootFile {
                path,
                project: Arc::clone(&project),
                named: false,
            }));
        } else {
            match path.to_str() {
                Some(text) => files.push(RootFile {
                    path: normalize(text),
                    project,
                    named: true,
                }),
                None => problems.push(PathProblem {
                    path: shown,
                    reason: "the path is not valid UTF-8".to_string(),
                }),
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|file| seen.insert(file.path.clone()));
    (files, problems, without_sources)
}

/// What a command says of a folder it was named that holds no `.flow`
/// file: it succeeds, having nothing to do, but a CI step pointed at the
/// wrong folder must not pass in silence.
pub(crate) fn no_sources(folder: &str) -> String {
    format!("no .flow files in `{folder}`")
}

/// Says `no_sources` of each folder on stderr.
pub(crate) fn warn_of_no_sources(folders: &[String]) {
    for folder in folders {
        eprintln!("warning: {}", no_sources(folder));
    }
}

/// Why a `.flow` entry of a folder that is not a regular file is not
/// checked.
fn not_a_source(path: &Path, kind: std::fs::FileType) -> String {
    if kind.is_symlink() {
        match std::fs::metadata(path) {
            Err(_) => "a symbolic link to a file that does not exist".to_string(),
            Ok(target) if target.is_dir() => {
                "a symbolic link to a folder, not to a file".to_string()
            }
            Ok(_) => "a symbolic link to something that is not a regular file".to_string(),
        }
    } else {
        "not a regular file (a pipe, a socket or a device)".to_string()
    }
}

pub(crate) fn walk(dir: &Path, found: &mut Vec<String>, problems: &mut Vec<PathProblem>) {
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
        } else if path.extension().is_some_and(|ext| ext == "flow") {
            if !(kind.is_file() || path.is_file()) {
                // Said, not skipped: a link to a file that is gone left a
                // folder's check passing without the file (an audit).
                problems.push(PathProblem {
                    path: normalize(&path.to_string_lossy()),
                    reason: not_a_source(&path, kind),
                });
                continue;
            }
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
