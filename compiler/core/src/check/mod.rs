//! The checker: loads a file and its imports through a caller-supplied loader,
//! resolves declarations, and checks every workflow.
//!
//! The entry point is [`check`]. It never fails on a user's mistake: every
//! problem becomes a [`Diagnostic`], and checking goes on past it.

mod env;
mod test_blocks;
mod types;
mod workflow;

use std::collections::HashMap;

pub(crate) use env::{BUILTIN_TYPE_NAMES, names_builtin_type};
pub use env::{Env, McpInfo, RecipeInfo};
pub use test_blocks::{STATUSES, TestInfo};
pub use types::{AliasNames, ByName, Fields, ItemName, Named, Ty, Variants};
pub(crate) use types::{Positions, SchemaBytes};
pub use workflow::{Container, LoopInfo, McpTool, StepInfo, StepKind, StepTable, WorkflowInfo};
pub(crate) use workflow::{DEFAULT_ATTEMPTS, DEFAULT_STEP_TIMEOUT_MS};
pub(crate) use workflow::{approval_params, error_ty, handoff_params, kb_write_params, not_run};

use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId, Span};
use crate::lock::ToolLock;
use crate::suggest::did_you_mean;
use crate::syntax::ast::{Item, SourceFile};
use crate::syntax::parse;

/// Reads source files for the checker. `flowc` reads the disk; `flow-lsp`
/// serves open buffers first. The checker itself does no IO.
///
/// A loader decides which files a program may reach: the disk loaders of the
/// drivers (crate `flow-loader`) serve only the regular `.flow` files inside
/// the project's folder, so that an import cannot make the checker read, and
/// print, a file it has no business with.
pub trait SourceLoader {
    /// The bytes of the file at `path`, or why the loader gives none.
    fn load(&self, path: &str) -> Result<Vec<u8>, LoadFailure>;

    /// The bytes of the lock file at `path` (the `flow.lock` beside a root,
    /// named as the loader names sources), or `None` when there is none. A
    /// loader of sources without locks has none.
    fn lock(&self, path: &str) -> Result<Option<Vec<u8>>, LoadFailure> {
        let _ = path;
        Ok(None)
    }

    /// The names of the source files and of the folders (ending in `/`) in
    /// `folder` (`""` for the current one), named as the loader names
    /// sources: an import that fails is answered with the file it most
    /// likely meant. A loader that cannot list gives none.
    fn list(&self, folder: &str) -> Vec<String> {
        let _ = folder;
        Vec::new()
    }
}

/// Why a loader gives no source for a path; each kind is its own code when
/// the path was imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    /// The file cannot be read as a source: it does not exist, is a
    /// directory, is not a regular file, is too large, is not a `.flow`
    /// file (E113).
    Unreadable {
        reason: String,
        /// What the loader accepts instead, when that helps.
        hint: Option<String>,
    },
    /// The path leaves the files the loader serves: the project's folder
    /// (E119). Nothing was read.
    OutsideProject {
        reason: String,
        /// What is allowed, and how to name a wider project.
        hint: String,
    },
}

impl LoadFailure {
    /// An unreadable file, for `reason`, without a hint.
    pub fn unreadable(reason: impl Into<String>) -> LoadFailure {
        LoadFailure::Unreadable {
            reason: reason.into(),
            hint: None,
        }
    }

    /// Why, in a few words, to follow "cannot read PATH: ".
    pub fn reason(&self) -> &str {
        match self {
            LoadFailure::Unreadable { reason, .. } | LoadFailure::OutsideProject { reason, .. } => {
                reason
            }
        }
    }

    pub fn hint(&self) -> Option<&str> {
        match self {
            LoadFailure::Unreadable { hint, .. } => hint.as_deref(),
            LoadFailure::OutsideProject { hint, .. } => Some(hint),
        }
    }

    /// The code of a diagnostic at an import that failed this way.
    pub fn code(&self) -> Code {
        match self {
            LoadFailure::Unreadable { .. } => Code::UnresolvedImport,
            LoadFailure::OutsideProject { .. } => Code::ImportOutsideProject,
        }
    }
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// One loaded and parsed file.
#[derive(Debug, Clone)]
pub struct LoadedFile {
    pub path: String,
    /// The text as checked; invalid UTF-8 is replaced (and reported).
    pub text: String,
    pub tree: SourceFile,
}

/// The result of checking a root file.
#[derive(Debug)]
pub struct Checked {
    /// The root file first, then its imports in the order they were reached.
    pub files: Vec<LoadedFile>,
    pub diagnostics: Vec<Diagnostic>,
    /// The analysis, present even with errors so that editors can use it.
    pub analysis: Analysis,
    /// Whether a `flow.lock` held the browser steps' tools to its servers'.
    pub lock: LockUse,
}

/// What became of the `flow.lock` beside the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockUse {
    /// There is none: browser steps' tools are unchecked.
    Absent,
    /// Browser steps' tools were checked against it.
    Used,
    /// It could not be used (E120): checked as without one.
    Unusable,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// The checked program when there is no error: what `flowc build` lowers.
    pub fn program(&self) -> Option<Program<'_>> {
        (!self.has_errors()).then_some(Program { checked: self })
    }

    pub fn file(&self, id: FileId) -> &LoadedFile {
        &self.files[id.0 as usize]
    }
}

/// What the checker learnt: the declarations in scope and each workflow's steps.
#[derive(Debug, Default)]
pub struct Analysis {
    pub env: Env,
    /// The root file's workflows.
    pub workflows: Vec<WorkflowInfo>,
    /// The root file's tests, in order.
    pub tests: Vec<TestInfo>,
    /// Each of `workflows`' static budget, when the program has no errors
    /// (`crate::budget`).
    pub budgets: Vec<flow_plan::budget::Budget>,
    /// The imported files' workflows that the root file's tests may run,
    /// checked to be known (their steps and output) for tests and editors.
    pub tested: Vec<WorkflowInfo>,
}

impl Analysis {
    /// The workflow `name` as a test of the root file sees it: the root
    /// file's, or an imported one.
    pub fn test_workflow(&self, name: &str) -> Option<&WorkflowInfo> {
        self.workflows
            .iter()
            .chain(&self.tested)
            .find(|workflow| workflow.name == name)
    }
}

/// A program without errors, ready to lower.
#[derive(Debug, Clone, Copy)]
pub struct Program<'c> {
    pub checked: &'c Checked,
}

/// Why the root file could not be checked at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub path: String,
    pub message: String,
    /// What the loader allows, when it refused the file.
    pub hint: Option<String>,
}

/// Checks the file at `root` and everything it imports, with the
/// `flow.lock` beside `root` when the loader has one: the one way every
/// driver (`flowc check` and `build`, `flow run`, flowd's deploy, the
/// language server) compiles a program, so that they all report the same.
/// A lock that cannot be used is an error (E120), since checking without it
/// would pass what it forbids; the rest is checked as without a lock.
pub fn check(root: &str, loader: &dyn SourceLoader) -> Result<Checked, LoadError> {
    let (tools, unusable) = match read_lock(root, loader) {
        Ok(tools) => (tools, None),
        Err(unusable) => (None, Some(unusable)),
    };
    let mut checked = check_with_tools(root, loader, tools.as_ref())?;
    if let Some(lock) = unusable {
        checked.lock = LockUse::Unusable;
        // The lock is no source: its problem is shown on the name of the
        // root's first MCP server (what a lock is about), or at its start.
        let at = checked
            .analysis
            .env
            .mcp_servers
            .values()
            .filter(|info| info.file == FileId(0))
            .map(|info| info.decl.name.span)
            .min_by_key(|span| span.start)
            .unwrap_or(Span::new(0, 0));
        let mut diagnostic = Diagnostic::new(
            Code::UnusableLock,
            FileId(0),
            at,
            format!("{} cannot be used: {}", lock.path, lock.message),
        );
        if let Some(hint) = lock.hint {
            diagnostic = diagnostic.hint(hint);
        }
        checked.diagnostics.push(diagnostic);
        sort_diagnostics(&mut checked.diagnostics);
    }
    Ok(checked)
}

/// The lock beside `root`, parsed, if its folder has one.
fn read_lock(
    root: &str,
    loader: &dyn SourceLoader,
) -> Result<Option<crate::lock::ToolLock>, LoadError> {
    let path = match normalize(root).rsplit_once('/') {
        Some((folder, _)) => format!("{folder}/{}", crate::lock::LOCK_FILE),
        None => crate::lock::LOCK_FILE.to_string(),
    };
    let unusable = |message: String, hint: Option<String>| LoadError {
        path: path.clone(),
        message,
        hint,
    };
    let Some(bytes) = loader.lock(&path).map_err(|failure| {
        unusable(
            failure.reason().to_string(),
            failure.hint().map(str::to_string),
        )
    })?
    else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| unusable("it is not valid UTF-8".to_string(), None))?;
    crate::lock::ToolLock::from_json(&text)
        .map(Some)
        .map_err(|reason| {
            unusable(
                reason,
                Some("run `flowc lock` again to write it afresh".to_string()),
            )
        })
}

/// `check`, with the tools of the MCP servers from `flow.lock` (which the
/// caller read): browser steps' tool names and arguments are checked against
/// them. Without a lock they are not checked.
pub fn check_with_tools(
    root: &str,
    loader: &dyn SourceLoader,
    tools: Option<&ToolLock>,
) -> Result<Checked, LoadError> {
    let bytes = loader.load(root).map_err(|failure| LoadError {
        path: root.to_string(),
        message: failure.reason().to_string(),
        hint: failure.hint().map(str::to_string),
    })?;
    let mut files = Vec::new();
    let mut diagnostics = Vec::new();
    let mut by_path = HashMap::new();
    let root_id = add_file(root, bytes, &mut files, &mut diagnostics);
    by_path.insert(normalize(root), root_id);
    let missing = load_imports(root_id, loader, &mut files, &mut by_path, &mut diagnostics);

    let mut env = env::build(&files, &mut diagnostics);
    // Each server is looked up in the lock once, by its identity, for the
    // checker's browser steps and for the editor's completion of tools.
    if let Some(lock) = tools {
        for info in env.mcp_servers.values_mut() {
            info.locked = lock.server(&info.transport).cloned();
        }
    }
    let mut workflows = Vec::new();
    for decl in files[0].tree.workflows() {
        workflows.push(workflow::check_workflow(
            decl,
            root_id,
            &env,
            tools.is_some(),
            &mut diagnostics,
        ));
    }
    let (tests, tested) = check_tests(&files, &workflows, &env, tools.is_some(), &mut diagnostics);
    if missing {
        forget_what_missing_imports_declare(&mut diagnostics);
    }
    sort_diagnostics(&mut diagnostics);
    Ok(Checked {
        files,
        diagnostics,
        analysis: Analysis {
            env,
            workflows,
            tests,
            budgets: Vec::new(),
            tested,
        },
        lock: match tools {
            Some(_) => LockUse::Used,
            None => LockUse::Absent,
        },
    })
}

/// Checks the root file's tests against its workflows and its imports'.
/// An imported file's workflows are checked here only to be known (their
/// steps and output): their problems are that file's own, reported when it
/// is checked, so they are not repeated here.
fn check_tests(
    files: &[LoadedFile],
    root_workflows: &[WorkflowInfo],
    env: &Env,
    locked: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> (Vec<TestInfo>, Vec<WorkflowInfo>) {
    if files[0].tree.tests().next().is_none() {
        return (Vec::new(), Vec::new());
    }
    let mut imported = Vec::new();
    for (index, file) in files.iter().enumerate().skip(1) {
        for decl in file.tree.workflows() {
            let mut theirs = Vec::new();
            let id = FileId(index as u32);
            imported.push(workflow::check_workflow(decl, id, env, locked, &mut theirs));
        }
    }
    let known: Vec<&WorkflowInfo> = root_workflows.iter().chain(&imported).collect();
    let tests: Vec<TestInfo> = files[0]
        .tree
        .tests()
        .map(|decl| test_blocks::check_test(decl, FileId(0), &known, env, diagnostics))
        .collect();
    test_blocks::check_names(&tests, FileId(0), diagnostics);
    (tests, imported)
}

/// Checks one in-memory source that imports nothing from disk; imports are
/// reported as unresolved. For tests, benchmarks and quick tools.
pub fn check_source(path: &str, text: &str) -> Checked {
    struct OneFile<'a>(&'a str, &'a str);
    impl SourceLoader for OneFile<'_> {
        fn load(&self, path: &str) -> Result<Vec<u8>, LoadFailure> {
            if path == self.0 {
                Ok(self.1.as_bytes().to_vec())
            } else {
                Err(LoadFailure::unreadable("not found"))
            }
        }
    }
    check(path, &OneFile(path, text)).expect("the root is always found")
}

/// When an import could not be read and no file it meant was found, the
/// recipes, types, MCP servers and workflows (a test's) it would have
/// declared are unknown: a use
/// of a name that is not close to any declared one is taken to be one of
/// those, not a second mistake. A name with a "did you mean" stays
/// reported, as a likely typo.
fn forget_what_missing_imports_declare(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.retain(|d| {
        !(matches!(
            d.code,
            Code::UnknownRecipe
                | Code::UnknownType
                | Code::UnknownMcpServer
                | Code::UnknownWorkflow
        ) && d.fix.is_none()
            && d.message.starts_with("unknown "))
    });
}

/// In the order of their places, each said once: one mistake met on
/// several paths (a parse error met again for each line of the doc above
/// it) is one diagnostic, its first, whatever the labels and hints of the
/// others, as `flowc` reports it (an audit: the editor showed some three
/// times).
pub(crate) fn sort_diagnostics(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort_by_key(|d| (d.primary.file, d.primary.span.start, d.code));
    let mut seen = std::collections::HashSet::new();
    diagnostics
        .retain(|d| seen.insert((d.primary.file, d.primary.span, d.code, d.message.clone())));
}

/// Adds the file read from `path`; its bytes become its text without a
/// copy (a copy of a large file stayed alive beside the tree it parsed to).
fn add_file(
    path: &str,
    bytes: Vec<u8>,
    files: &mut Vec<LoadedFile>,
    diagnostics: &mut Vec<Diagnostic>,
) -> FileId {
    let id = FileId(files.len() as u32);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => {
            let (error, bytes) = (error.utf8_error(), error.as_bytes());
            // A file that is not UTF-8 is most likely not a flow source at
            // all (a binary, a key, a file the import names by mistake), so
            // none of it is kept: a diagnostic's snippet, a parse error's
            // "found ..." or a CI log must not echo its bytes. The position
            // of the bad byte is told in the message instead.
            let at = error.valid_up_to();
            let prefix = String::from_utf8_lossy(&bytes[..at]);
            // What is kept instead is the shape of the lines before the bad
            // byte, every other character a space (a byte order mark kept,
            // as columns skip it), so that the diagnostic sits at its line
            // and column (an annotation at 1:1 pointed at nothing) and
            // shows nothing of the file. Its line ends are read as every
            // file's are, and the message counts on the same text.
            let blank: String = prefix
                .char_indices()
                .map(|(at, c)| match c {
                    '\n' | '\r' => c,
                    '\u{FEFF}' if at == 0 => c,
                    _ => ' ',
                })
                .chain([' '])
                .collect();
            let blank = crate::syntax::lone_cr_as_lf(&blank).into_owned();
            let bad = blank.len() - 1;
            let (line, column) = crate::diagnostic::line_col(&blank, bad as u32);
            diagnostics.push(
                Diagnostic::new(
                    Code::NotUtf8,
                    id,
                    Span::new(bad, bad + 1),
                    format!(
                        "`{path}` is not valid UTF-8: invalid byte at offset {at} (line {line}, column {column}); the file is not checked"
                    ),
                )
                .label("this byte is not UTF-8")
                .hint("save the file as UTF-8"),
            );
            blank
        }
    };
    let text = if text.len() > u32::MAX as usize / 2 {
        diagnostics.push(Diagnostic::new(
            Code::Syntax,
            id,
            Span::default(),
            "the file is larger than 2 GiB",
        ));
        String::new()
    } else {
        text
    };
    let text = match crate::syntax::lone_cr_as_lf(&text) {
        std::borrow::Cow::Owned(lines) => lines,
        std::borrow::Cow::Borrowed(_) => text,
    };
    let (tree, problems) = parse(&text, id);
    diagnostics.extend(problems);
    files.push(LoadedFile {
        path: path.to_string(),
        text,
        tree,
    });
    id
}

/// Loads the imports of `root` and theirs, depth first: each file's imports
/// in order, each imported file's own before the next. The walk keeps its
/// own stack, not the thread's: a chain of a thousand files, each importing
/// the next, overflowed the thread's stack as recursion. Whether an import
/// could not be read, with no file it meant found in its place.
fn load_imports(
    root: FileId,
    loader: &dyn SourceLoader,
    files: &mut Vec<LoadedFile>,
    by_path: &mut HashMap<String, FileId>,
    diagnostics: &mut Vec<Diagnostic>,
) -> bool {
    let mut missing = false;
    // The import chain from the root to the file being read (to find
    // cycles and to explain failures), each with the imports it has left.
    let mut chain: Vec<(FileId, std::vec::IntoIter<ImportAt>)> =
        vec![(root, imports_of(&files[root.0 as usize]))];
    while let Some((file, left)) = chain.last_mut() {
        let file = *file;
        let Some(ImportAt {
            relative,
            span,
            statement,
        }) = left.next()
        else {
            chain.pop();
            continue;
        };
        let ids = || chain.iter().map(|(id, _)| *id).collect::<Vec<FileId>>();
        let importer = files[file.0 as usize].path.clone();
        let path = resolve_import(&importer, &relative);
        let key = normalize(&path);
        if let Some(&existing) = by_path.get(&key) {
            let ids = ids();
            if let Some(position) = ids.iter().position(|id| *id == existing) {
                diagnostics.push(cycle_diagnostic(files, &ids[position..]));
            }
            continue;
        }
        let loaded = match loader.load(&path) {
            Ok(bytes) => Some((path, key, bytes)),
            Err(failure) => {
                let via: Vec<String> = ids()
                    .iter()
                    .map(|id| files[id.0 as usize].path.clone())
                    .collect();
                let code = failure.code();
                let mut diagnostic = Diagnostic::new(
                    code,
                    file,
                    span,
                    format!("cannot import `{path}`: {}", failure.reason()),
                )
                .label("imported here");
                if let Some(hint) = failure.hint() {
                    diagnostic = diagnostic.hint(hint);
                }
                diagnostic =
                    diagnostic.hint(format!("import chain: {} -> {path}", via.join(" -> ")));
                // Not a file of the chain: it would import itself.
                let meant = (code == Code::UnresolvedImport)
                    .then(|| meant_import(loader, &importer, &relative))
                    .flatten()
                    .filter(|meant| {
                        let key = normalize(&resolve_import(&importer, meant));
                        !via.iter().any(|path| normalize(path) == key)
                    });
                missing |= meant.is_none()
                    && matches!(code, Code::UnresolvedImport | Code::ImportOutsideProject);
                // An import the parser read as meant from a slip (`from
                // "x.flow" import y`, a path without quotes) is said once,
                // by its syntax error (an audit: said twice, the guess first).
                let slipped = diagnostics.iter().any(|d| {
                    d.code == Code::Syntax
                        && d.primary.file == file
                        && d.primary.span.start < statement.end
                        && statement.start < d.primary.span.end
                });
                if let Some(meant) = &meant {
                    diagnostic.hints.insert(
                        0,
                        format!("did you mean `{meant}`? it is checked as if it were imported"),
                    );
                    diagnostic = diagnostic.fix(format!("\"{meant}\""));
                } else if code == Code::UnresolvedImport {
                    diagnostic = diagnostic
                        .hint("import paths are relative to the importing file")
                        .hint("names that only it could declare are not reported as unknown");
                }
                if !slipped {
                    diagnostics.push(diagnostic);
                }
                // The file that was meant stands in for the one named, so
                // that what it declares is known and the rest is checked.
                meant.and_then(|meant| {
                    let path = resolve_import(&importer, &meant);
                    let key = normalize(&path);
                    if by_path.contains_key(&key) {
                        return None;
                    }
                    let bytes = loader.load(&path).ok()?;
                    Some((path, key, bytes))
                })
            }
        };
        if let Some((path, key, bytes)) = loaded {
            let id = add_file(&path, bytes, files, diagnostics);
            by_path.insert(key, id);
            chain.push((id, imports_of(&files[id.0 as usize])));
        }
    }
    missing
}

/// An import as a file writes it: its path as written, where the path is,
/// and where the whole statement is.
struct ImportAt {
    relative: String,
    span: Span,
    statement: Span,
}

/// The imports a file writes, in order: each path as written, and where.
fn imports_of(file: &LoadedFile) -> std::vec::IntoIter<ImportAt> {
    let imports: Vec<ImportAt> = file
        .tree
        .items
        .iter()
        .filter_map(|item| match item {
            Item::Import(import) => Some(ImportAt {
                relative: import.path.display_text(),
                span: import.path.span,
                statement: import.span,
            }),
            _ => None,
        })
        .collect();
    imports.into_iter()
}

/// The import path that a failed import `relative` most likely meant, as
/// it would be written in `importer`: each part of the path is matched
/// against what the loader lists in the folder reached so far, and a part
/// that is not there is replaced by the closest name that is.
fn meant_import(loader: &dyn SourceLoader, importer: &str, relative: &str) -> Option<String> {
    let mut folder = match importer.rfind('/') {
        Some(slash) => importer[..slash].to_string(),
        None => String::new(),
    };
    let parts: Vec<&str> = relative.split('/').collect();
    let mut meant: Vec<String> = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        let is_file = index + 1 == parts.len();
        let found = if matches!(*part, "" | "." | "..") {
            part.to_string()
        } else {
            let wanted = if is_file {
                part.to_string()
            } else {
                format!("{part}/")
            };
            let entries = loader.list(&folder);
            if entries.contains(&wanted) {
                wanted
            } else if is_file && entries.contains(&format!("{part}/")) {
                // A folder of that name: not a slip of another file's.
                return None;
            } else {
                let kind = entries
                    .iter()
                    .filter(|entry| entry.ends_with('/') != is_file)
                    .map(String::as_str);
                did_you_mean(&wanted, kind)?.to_string()
            }
        };
        let found = found.trim_end_matches('/').to_string();
        folder = match folder.as_str() {
            "" => found.clone(),
            _ => format!("{folder}/{found}"),
        };
        meant.push(found);
    }
    let meant = meant.join("/");
    (meant != relative).then_some(meant)
}

/// The diagnostic for the import cycle through `cycle` (each file imports the
/// next, the last imports the first). It is always told from the file whose
/// path sorts first, at its import of the next file, so that checking the
/// cycle from any of its files reports it once, identically.
fn cycle_diagnostic(files: &[LoadedFile], cycle: &[FileId]) -> Diagnostic {
    let path = |id: FileId| files[id.0 as usize].path.as_str();
    let start = (0..cycle.len())
        .min_by_key(|i| path(cycle[*i]))
        .expect("a cycle has a file");
    let from = cycle[start];
    let to = cycle[(start + 1) % cycle.len()];
    let span = files[from.0 as usize]
        .tree
        .items
        .iter()
        .find_map(|item| match item {
            Item::Import(import)
                if normalize(&resolve_import(path(from), &import.path.display_text()))
                    == normalize(path(to)) =>
            {
                Some(import.path.span)
            }
            _ => None,
        })
        .unwrap_or_default();
    let mut names: Vec<&str> = (0..cycle.len())
        .map(|i| path(cycle[(start + i) % cycle.len()]))
        .collect();
    names.push(path(from));
    Diagnostic::new(
        Code::ImportCycle,
        from,
        span,
        format!("import cycle: {}", names.join(" -> ")),
    )
    .label("this import starts the cycle")
    .hint("move what the files share into a file that each of them imports")
}

/// The path of an import written in the file at `importer`.
pub fn resolve_import(importer: &str, relative: &str) -> String {
    if relative.starts_with('/') {
        return relative.to_string();
    }
    match importer.rfind('/') {
        Some(slash) => format!("{}/{}", &importer[..slash], relative),
        None => relative.to_string(),
    }
}

/// A lexical normal form of a path (`a/./b/../c` is `a/c`), so that one file
/// reached by two spellings is loaded once, and shown once.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for (index, part) in path.split('/').enumerate() {
        match part {
            // A leading empty part is the root of an absolute path.
            "" if index == 0 => parts.push(""),
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != ".." && !p.is_empty()) => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// flowc checks files on several threads and flow-lsp hands results
    /// between tasks, so a check result must cross threads.
    #[test]
    fn checked_programs_cross_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Checked>();
    }

    #[test]
    fn imports_resolve_relative_to_the_importer() {
        assert_eq!(
            resolve_import("examples/a.flow", "recipes/b.flow"),
            "examples/recipes/b.flow"
        );
        assert_eq!(resolve_import("a.flow", "b.flow"), "b.flow");
        assert_eq!(resolve_import("x/a.flow", "/abs/b.flow"), "/abs/b.flow");
    }

    /// A file saved with classic Mac line ends (a lone `\r`): its `//`
    /// comment ended at the first one, not at the end of the file, and its
    /// errors are on their lines.
    #[test]
    fn a_lone_carriage_return_ends_a_line() {
        let text = "// a comment\rworkflow w {\r  step a = nowhere {}\r}\r";
        let checked = crate::check_source("mac.flow", text);
        let lines: Vec<(usize, String)> = checked
            .diagnostics
            .iter()
            .map(|d| {
                let at = crate::diagnostic::line_col(&checked.files[0].text, d.primary.span.start);
                (at.0, d.message.clone())
            })
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].0, 3, "{lines:?}");
        assert!(lines[0].1.contains("nowhere"), "{lines:?}");
    }

    /// A string left open on the last line of a file that does not end
    /// that line was reported as the `{` before it left open, with a fix
    /// inserting ` }` inside the string.
    #[test]
    fn a_string_the_end_of_the_file_cuts_is_named() {
        for text in [
            "workflow t {\n  step h = handoff \"x\" { message: \"hello",
            "workflow t {\n  step h = handoff \"x\" { message: \"hello {{workflow_input",
        ] {
            let checked = crate::check_source("eof.flow", text);
            let first = &checked.diagnostics[0];
            assert_eq!(first.message, "this string is not closed", "{text}");
            assert_eq!(first.primary.span.start, 47, "{text}");
        }
    }

    #[test]
    fn normal_forms() {
        assert_eq!(normalize("a/./b/../c.flow"), "a/c.flow");
        assert_eq!(normalize("./a.flow"), "a.flow");
        assert_eq!(normalize("../x/../y.flow"), "../y.flow");
        assert_eq!(normalize("/abs/./b.flow"), "/abs/b.flow");
    }
}
