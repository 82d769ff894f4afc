//! `flowc check`: check files and directories, in parallel, and report.

use std::io::Write;
use std::path::{Path, PathBuf};

use flow_compiler::{Checked, LoadError};

use crate::loader::RootFile;
use crate::render::{self, Human};
use crate::report::Reports;
use crate::{Exit, Format};

pub(crate) fn run(
    paths: &[PathBuf],
    root: Option<&Path>,
    format: Format,
    deny_warnings: bool,
) -> Exit {
    let (roots, mut reports, without_sources) = roots_and_reports(paths, root);
    let files: Vec<String> = roots.iter().map(|file| file.path.clone()).collect();
    let mut unchecked_tools: Vec<String> = Vec::new();
    for (path, result) in files.iter().zip(check_all(&roots)) {
        if let Ok(checked) = &result
            && checked.lock == flow_compiler::check::LockUse::Absent
            && has_browser_steps(checked)
        {
            unchecked_tools.push(path.clone());
        }
        match result {
            Ok(checked) => reports.add(&checked),
            Err(error) => {
                crate::loader::print_load_error(&error);
                reports.unreadable.push((path.clone(), error.message));
            }
        }
    }
    reports.sort();
    // Before the report, whose summary line stays the last: one note for
    // the run, naming the folders (a lock is per folder), not each file.
    if !unchecked_tools.is_empty() {
        let mut folders: Vec<String> = unchecked_tools
            .iter()
            .map(|path| match Path::new(path).parent() {
                Some(folder) if !folder.as_os_str().is_empty() => folder.display().to_string(),
                _ => ".".to_string(),
            })
            .collect();
        folders.sort();
        folders.dedup();
        let files = match unchecked_tools.len() {
            1 => "1 file".to_string(),
            n => format!("{n} files"),
        };
        eprintln!(
            "note: no {} in {} ({files} with browser steps): their tools and arguments are unchecked (`flowc lock` records the MCP servers' tools)",
            flow_compiler::lock::LOCK_FILE,
            folders
                .iter()
                .map(|folder| format!("`{folder}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // When nothing could be read, the IO errors above say all there is.
    if !files.is_empty() || format == Format::Json {
        print(&reports, format, Stream::Stdout);
    }
    // A folder without sources checks clean, but a CI step pointed at the
    // wrong folder must not pass in silence: a warning, in the format's
    // own way, which `--deny-warnings` makes a failure.
    match format {
        Format::Github => {
            for folder in &without_sources {
                let warning = crate::loader::no_sources(folder);
                outln!("::warning::{}", render::escape_data(&warning));
            }
        }
        Format::Human | Format::Json => crate::loader::warn_of_no_sources(&without_sources),
    }

    if !reports.unreadable.is_empty() {
        Exit::Usage
    } else if reports.errors() > 0
        || (deny_warnings && (reports.warnings() > 0 || !without_sources.is_empty()))
    {
        Exit::Problems
    } else {
        Exit::Ok
    }
}

/// The files under `paths`, and the reports of a command that checks them,
/// begun with the paths that cannot be read (each also said on stderr); then
/// the folders named that hold no `.flow` file.
pub(crate) fn roots_and_reports(
    paths: &[PathBuf],
    root: Option<&Path>,
) -> (Vec<RootFile>, Reports, Vec<String>) {
    let (roots, problems, without_sources) = crate::loader::expand_paths(paths, root);
    for problem in &problems {
        eprintln!("error: {problem}");
    }
    let mut reports = Reports::default();
    reports.unreadable = problems
        .iter()
        .map(|problem| (problem.path.clone(), problem.reason.clone()))
        .collect();
    (roots, reports, without_sources)
}

/// Where the machine formats go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    /// When stdout carries something else, such as `flowc build -o -`'s plan.
    Stderr,
}

/// Prints the diagnostics in `format`: human text goes to stderr, because it
/// is commentary; the machine formats go to `machine`, to be piped.
pub(crate) fn print(reports: &Reports, format: Format, machine: Stream) {
    let emit = |text: &str| match machine {
        Stream::Stdout => out!("{text}"),
        Stream::Stderr => eprint!("{text}"),
    };
    match format {
        Format::Human => {
            let human = Human::for_stderr();
            let mut err = std::io::stderr().lock();
            for report in &reports.reports {
                // A closed stderr leaves nothing useful to do with the error.
                let _ = writeln!(err, "{}", human.render(reports, report));
            }
            let _ = writeln!(err, "{}", render::summary(reports));
        }
        Format::Json => emit(&format!("{}\n", render::json(reports))),
        Format::Github => {
            emit(&render::github(reports));
            eprintln!("{}", render::summary(reports));
        }
    }
}

/// Whether a checked file's workflows call MCP tools.
fn has_browser_steps(checked: &Checked) -> bool {
    checked.analysis.workflows.iter().any(|workflow| {
        workflow
            .steps
            .iter()
            .any(|step| matches!(step.kind, flow_compiler::check::StepKind::Browser(_)))
    })
}

/// Checks each root, with the `flow.lock` beside it when there is one, on
/// a thread per core; the results in the order of `roots`.
pub(crate) fn check_all(roots: &[RootFile]) -> Vec<Result<Checked, LoadError>> {
    // The checker never panics on input (a property test holds it to
    // that), so a panic here is a compiler bug: `map` surfaces it as one.
    crate::parallel::map(roots, |root| {
        flow_compiler::check(&root.path, &root.loader())
    })
}

/// How often `--watch` looks at the files' modification times. Polling
/// needs no dependency and no OS-specific watcher, and a project's `.flow`
/// files are few: reading their metadata 3 times a second costs nothing.
const POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// `flowc check --watch`: checks, then checks again each time a `.flow`
/// file or `flow.lock` under the watched folders is written, made or
/// removed, until interrupted. Each check's output follows a separator
/// naming what changed (and clears a terminal first).
pub(crate) fn watch(
    paths: &[PathBuf],
    root: Option<&Path>,
    format: Format,
    deny_warnings: bool,
) -> Exit {
    let folders = watched_folders(paths, root);
    let mut seen = stamps(&folders);
    run(paths, root, format, deny_warnings);
    loop {
        std::thread::sleep(POLL);
        let now = stamps(&folders);
        if now == seen {
            continue;
        }
        let changed: Vec<String> = now
            .iter()
            .filter(|(path, stamp)| seen.get(*path) != Some(*stamp))
            .map(|(path, _)| path.display().to_string())
            .chain(
                seen.keys()
                    .filter(|path| !now.contains_key(*path))
                    .map(|path| format!("{} (removed)", path.display())),
            )
            .collect();
        seen = now;
        let mut err = std::io::stderr().lock();
        if std::io::IsTerminal::is_terminal(&err) {
            // Clear the screen and go home, so each check reads from the top.
            let _ = write!(err, "\x1b[2J\x1b[H");
        }
        let _ = writeln!(
            err,
            "── flowc check --watch: {} changed; checking again ──",
            changed.join(", ")
        );
        drop(err);
        run(paths, root, format, deny_warnings);
    }
}

/// The folders whose files `--watch` looks at: each folder named, and the
/// project (`--root`, else the file's folder) of each file named.
fn watched_folders(paths: &[PathBuf], root: Option<&Path>) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = paths
        .iter()
        .map(|path| match root {
            Some(root) => root.to_path_buf(),
            None if path.is_dir() => path.clone(),
            None => match path.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
                _ => PathBuf::from("."),
            },
        })
        .collect();
    folders.sort();
    folders.dedup();
    folders
}

/// Each `.flow` file and `flow.lock` under `folders` (hidden entries
/// skipped, as `flowc check` skips them) with its modification time and
/// length: a write that keeps the time within the clock's resolution
/// usually changes the length.
fn stamps(
    folders: &[PathBuf],
) -> std::collections::BTreeMap<PathBuf, (Option<std::time::SystemTime>, u64)> {
    let mut files = Vec::new();
    for folder in folders {
        crate::loader::walk(folder, &mut files, &mut Vec::new());
    }
    let mut paths: Vec<PathBuf> = files.into_iter().map(PathBuf::from).collect();
    let locks: Vec<PathBuf> = paths
        .iter()
        .filter_map(|path| path.parent())
        .chain(folders.iter().map(PathBuf::as_path))
        .map(|folder| folder.join(flow_compiler::lock::LOCK_FILE))
        .collect();
    paths.extend(locks);
    paths
        .into_iter()
        .filter_map(|path| {
            let meta = std::fs::metadata(&path).ok()?;
            Some((path, (meta.modified().ok(), meta.len())))
        })
        .collect()
}
