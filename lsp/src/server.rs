//! The language server: LSP requests and notifications to the compiler's IDE
//! functions (`flow_compiler::ide`), and diagnostics published after edits.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flow_compiler::check::normalize;
use flow_compiler::diagnostic::Severity;
use flow_compiler::ide;
use flow_compiler::{FileId, Span};
use tower_lsp_server::jsonrpc::{Error, Result};
use tower_lsp_server::ls_types::*;
use tower_lsp_server::{Client, LanguageServer};

use crate::convert::{Encoding, Lines};
use crate::documents::{Analysis, Document, Documents, Repaired, check_file, check_with};
use crate::kinds::{completion_kind, document_symbol, symbol_kind, token_type};
use crate::workspace::{path_of, uri_of, walk, workspace_roots};

/// How long edits must pause before the file is checked again: a burst of
/// keystrokes is checked once. `initializationOptions.debounceMs` overrides it.
const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(40);

#[derive(Debug)]
/// Where a positional request points: its document's path and analysis,
/// the client's character encoding, and the byte offset.
struct At {
    root: String,
    analysis: Analysis,
    encoding: Encoding,
    offset: u32,
}

pub struct Backend {
    client: Client,
    state: Arc<Mutex<State>>,
    /// One debounced check at a time. When a check of a large file with a
    /// syntax error (the recovering parser) takes longer than the pause
    /// between keystrokes, checks of successive versions would otherwise run
    /// side by side, taking both blocking threads from the requests; queued
    /// instead, a check whose version was overtaken meanwhile is skipped.
    checks: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug)]
struct State {
    documents: Documents,
    encoding: Encoding,
    debounce: Duration,
    /// Where the language reference is, for diagnostics' `codeDescription`.
    docs: Option<Uri>,
    /// The diagnostics last published for imported files that are not open,
    /// by normal path (see `publish_imports`).
    shown: HashMap<String, Vec<Diagnostic>>,
    /// Whether the client lets the server ask it to watch files.
    watches_files: bool,
}

impl Backend {
    pub fn new(client: Client) -> Backend {
        Backend {
            client,
            state: Arc::new(Mutex::new(State {
                documents: Documents::default(),
                encoding: Encoding::Utf16,
                debounce: DEFAULT_DEBOUNCE,
                docs: None,
                shown: HashMap::new(),
                watches_files: false,
            })),
            checks: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this crate; the
        // state is still consistent (every update is one assignment).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Checks `path` after the debounce delay, unless a newer edit comes, and
    /// publishes the result unless the document moved on meanwhile; then
    /// re-checks the open documents that import it.
    fn schedule(&self, path: String) {
        let client = self.client.clone();
        let state = self.state.clone();
        let checks = self.checks.clone();
        // The version of this edit, read now rather than when the task
        // first runs: in a burst of edits every task then saw the last
        // version, and each checked and published it again (an audit: 65
        // identical publishes after 67 keystrokes).
        let (version, debounce) = {
            let state = self.lock();
            let Some(doc) = state.documents.open.get(&path) else {
                return;
            };
            (doc.version, state.debounce)
        };
        tokio::spawn(async move {
            if !debounce.is_zero() {
                tokio::time::sleep(debounce).await;
            }
            // The semaphore is never closed.
            let Ok(_turn) = checks.acquire().await else {
                return;
            };
            let mut queue = vec![path.clone()];
            let mut done = HashSet::new();
            while let Some(path) = queue.pop() {
                if !done.insert(path.clone()) {
                    continue;
                }
                let Some(analysis) =
                    analyse(&state, &path, (done.len() == 1).then_some(version)).await
                else {
                    continue;
                };
                let (uri, diagnostics, dependants) = {
                    let state = state.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(doc) = state.documents.open.get(&path) else {
                        continue;
                    };
                    if doc.version != analysis.version {
                        // A newer edit will publish its own result.
                        continue;
                    }
                    let diagnostics = diagnostics(
                        &analysis.checked,
                        FileId(0),
                        (&analysis.text, &analysis.lines),
                        state.encoding,
                        state.docs.as_ref(),
                    );
                    (
                        doc.uri.clone(),
                        diagnostics,
                        state.documents.dependants(&path),
                    )
                };
                client
                    .publish_diagnostics(uri, diagnostics, Some(analysis.version))
                    .await;
                publish_imports(&client, &state, &analysis).await;
                queue.extend(dependants);
            }
        });
    }

    /// The analysis of the document at `uri` at its current version.
    async fn current(&self, uri: &Uri) -> Option<(String, Analysis)> {
        let path = path_of(uri)?;
        let analysis = analyse(&self.state, &path, None).await?;
        Some((path, analysis))
    }

    /// The document a request points into, analysed at its current version,
    /// and the byte offset it points at: what every positional request
    /// starts from.
    async fn at(&self, position: &TextDocumentPositionParams) -> Option<At> {
        let (root, analysis) = self.current(&position.text_document.uri).await?;
        let encoding = self.encoding();
        let offset = analysis
            .lines
            .offset(&analysis.text, position.position, encoding);
        Some(At {
            root,
            analysis,
            encoding,
            offset,
        })
    }

    /// The analysis of a file that may not be open, from the cache or checked now.
    async fn any_file(&self, path: &str) -> Option<Analysis> {
        if self.lock().documents.open.contains_key(path) {
            return analyse(&self.state, path, None).await;
        }
        let overlay = self.lock().documents.overlay();
        let path = path.to_string();
        tokio::task::spawn_blocking(move || {
            let checked = check_file(&overlay, &path)?;
            let text: Arc<str> = checked.files[0].text.clone().into();
            Some(Analysis {
                version: 0,
                lines: Arc::new(Lines::new(&text)),
                text,
                checked: Arc::new(checked),
            })
        })
        .await
        .ok()
        .flatten()
    }

    fn encoding(&self) -> Encoding {
        self.lock().encoding
    }

    /// Every `.flow` file that a workspace-wide query should look at: the
    /// open documents and the files under the workspace folders.
    fn workspace_files(&self) -> Vec<String> {
        let state = self.lock();
        let mut files: Vec<String> = state.documents.open.keys().cloned().collect();
        for root in &state.documents.roots {
            walk(root, &mut files, 0);
        }
        files.sort();
        files.dedup();
        files
    }
}

/// The analysis of open document `path`: the cached one if it is current,
/// else a check now. With `only`, returns nothing unless the document is
/// still at that version (a debounced check that a newer edit overtook).
async fn analyse(state: &Arc<Mutex<State>>, path: &str, only: Option<i32>) -> Option<Analysis> {
    let (text, lines, version, overlay) = {
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        let doc = state.documents.open.get(path)?;
        if only.is_some_and(|v| v != doc.version) {
            return None;
        }
        if only.is_none()
            && let Some(analysis) = state.documents.fresh(path)
        {
            return Some(analysis);
        }
        (
            doc.text.clone(),
            doc.lines.clone(),
            doc.version,
            state.documents.overlay(),
        )
    };
    let root = path.to_string();
    let checked_text = text.clone();
    let checked = tokio::task::spawn_blocking(move || check_with(&overlay, &root, &checked_text))
        .await
        .ok()?;
    let analysis = Analysis {
        version,
        text,
        lines,
        checked: Arc::new(checked),
    };
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    if state
        .documents
        .open
        .get(path)
        .is_some_and(|doc| doc.version == version)
    {
        state.documents.store(path, analysis.clone());
    }
    Some(analysis)
}

/// The diagnostics of file `file` of a check as LSP diagnostics: the same
/// codes, messages and hints as `flowc check`, secondary labels as related
/// information. `text` and `lines` are the file's.
fn diagnostics(
    checked: &flow_compiler::Checked,
    file: FileId,
    (text, lines): (&str, &Lines),
    encoding: Encoding,
    docs: Option<&Uri>,
) -> Vec<Diagnostic> {
    let mut lines_of: HashMap<FileId, Lines> = HashMap::new();
    checked
        .diagnostics
        .iter()
        .filter(|d| d.primary.file == file)
        .map(|d| {
            let range = lines.range(text, d.primary.span, encoding);
            let mut message = d.message.clone();
            // The label, unless the message says it already (`expected
            // `import`, ..., found `zz`` under the label `expected `import`,
            // ...`).
            if !d.primary.message.is_empty() && !d.message.contains(&d.primary.message) {
                message.push_str(&format!(" ({})", d.primary.message));
            }
            for hint in &d.hints {
                message.push_str("\nhelp: ");
                message.push_str(hint);
            }
            let related: Vec<DiagnosticRelatedInformation> = d
                .secondary
                .iter()
                .filter_map(|label| {
                    let file = checked.file(label.file);
                    let lines = lines_of
                        .entry(label.file)
                        .or_insert_with(|| Lines::new(&file.text));
                    Some(DiagnosticRelatedInformation {
                        location: Location::new(
                            uri_of(&file.path)?,
                            lines.range(&file.text, label.span, encoding),
                        ),
                        message: label.message.clone(),
                    })
                })
                .collect();
            let info = d.code.info();
            Diagnostic {
                range,
                severity: Some(match d.severity {
                    Severity::Error => DiagnosticSeverity::ERROR,
                    Severity::Warning => DiagnosticSeverity::WARNING,
                }),
                code: Some(NumberOrString::String(info.code.to_string())),
                code_description: docs.and_then(|docs| {
                    format!("{}#{}", docs.as_str(), info.code.to_ascii_lowercase())
                        .parse()
                        .ok()
                        .map(|href| CodeDescription { href })
                }),
                source: Some("flow".to_string()),
                message,
                related_information: (!related.is_empty()).then_some(related),
                tags: None,
                data: None,
            }
        })
        .collect()
}

/// Publishes the diagnostics of the files `analysis` imported that are not
/// open, under their own URIs: an error in an imported file shows where it
/// is as soon as a file importing it is open, as `flowc check` reports it.
/// An open file publishes its own. Each set is sent only when it changed, so
/// that typing in the importer does not resend its imports' diagnostics.
async fn publish_imports(client: &Client, state: &Arc<Mutex<State>>, analysis: &Analysis) {
    let changed: Vec<(String, Vec<Diagnostic>)> = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        let checked = &analysis.checked;
        let mut changed = Vec::new();
        for (index, file) in checked.files.iter().enumerate().skip(1) {
            let path = normalize(&file.path);
            if state.documents.open.contains_key(&path) {
                continue;
            }
            let lines = Lines::new(&file.text);
            let found = diagnostics(
                checked,
                FileId(index as u32),
                (&file.text, &lines),
                state.encoding,
                state.docs.as_ref(),
            );
            if state.shown.get(&path) != Some(&found) {
                state.shown.insert(path.clone(), found.clone());
                changed.push((path, found));
            }
        }
        changed.extend(unshown(&mut state));
        changed
    };
    for (path, diagnostics) in changed {
        if let Some(uri) = uri_of(&path) {
            client.publish_diagnostics(uri, diagnostics, None).await;
        }
    }
}

/// Forgets the imported files whose diagnostics were published while no
/// open document imports them any more, or that are open now (their own
/// check publishes for them), and gives those to clear: nothing stays
/// underlined for a file nobody looks at through an importer.
fn unshown(state: &mut State) -> Vec<(String, Vec<Diagnostic>)> {
    let documents = &state.documents;
    let gone: Vec<String> = state
        .shown
        .keys()
        .filter(|path| {
            documents.open.contains_key(*path)
                || !documents.imports.iter().any(|(root, imports)| {
                    documents.open.contains_key(root) && imports.contains(path)
                })
        })
        .cloned()
        .collect();
    gone.into_iter()
        .filter_map(|path| {
            state.shown.remove(&path)?;
            // An open file's own check publishes its diagnostics; clearing
            // them here could race with it.
            (!state.documents.open.contains_key(&path)).then_some((path, Vec::new()))
        })
        .collect()
}

/// The most completion items one answer carries. A 5,000-line workflow has
/// hundreds of steps in scope, and their items are most of a completion's
/// cost (JSON the server writes and the editor parses); nobody scrolls them.
const MOST_COMPLETIONS: usize = 100;

/// At most `MOST_COMPLETIONS` of `items`, those whose label has the `typed`
/// characters in order (as editors filter), in the query's order; and
/// whether some were left out, in which case the editor asks again as the
/// user types (`isIncomplete`), and the next answer narrows down.
fn capped(items: Vec<ide::Completion>, typed: &str) -> (Vec<ide::Completion>, bool) {
    if items.len() <= MOST_COMPLETIONS {
        return (items, false);
    }
    let typed: Vec<char> = typed.chars().flat_map(char::to_lowercase).collect();
    let matches = |label: &str| {
        let mut wanted = typed.iter().peekable();
        for c in label.chars().flat_map(char::to_lowercase) {
            if wanted.peek() == Some(&&c) {
                wanted.next();
            }
        }
        wanted.peek().is_none()
    };
    let mut kept: Vec<ide::Completion> = items
        .into_iter()
        .filter(|item| matches(&item.label))
        .collect();
    let cut = kept.len() > MOST_COMPLETIONS;
    kept.truncate(MOST_COMPLETIONS);
    (kept, cut)
}

impl Backend {
    /// The locations of `symbol` in every workspace file that sees it: a
    /// declaration's in the files that import it, a step's in its workflow's
    /// file and in the tests that run the workflow (`.test.flow` files).
    async fn locations(
        &self,
        root: &str,
        analysis: &Analysis,
        symbol: &ide::Symbol,
    ) -> Vec<(String, Span, Arc<flow_compiler::Checked>)> {
        let mut found = Vec::new();
        let mut push = |checked: &Arc<flow_compiler::Checked>, file: FileId, span: Span| {
            found.push((normalize(&checked.file(file).path), span, checked.clone()));
        };
        for (file, span) in ide::references(&analysis.checked, symbol) {
            push(&analysis.checked, file, span);
        }
        for path in self.workspace_files() {
            if path == root {
                continue;
            }
            if let Some(other) = self.any_file(&path).await {
                for (file, span) in ide::references(&other.checked, symbol) {
                    push(&other.checked, file, span);
                }
            }
        }
        let mut seen = HashSet::new();
        found.retain(|(path, span, _)| seen.insert((path.clone(), *span)));
        found
    }
}

/// Places spans of the files of analyses as LSP locations, indexing each
/// file's lines once per request: the references of a step used 16,000
/// times took 38 s when each one searched its analysis's files by path and
/// indexed the lines of the whole file again.
struct Locator {
    encoding: Encoding,
    /// By normal path; nothing for a file that has no URI.
    files: HashMap<String, Option<Indexed>>,
}

/// A file of an analysis, with its URI and line index.
struct Indexed {
    uri: Uri,
    checked: Arc<flow_compiler::Checked>,
    file: usize,
    lines: Lines,
}

impl Locator {
    fn new(encoding: Encoding) -> Locator {
        Locator {
            encoding,
            files: HashMap::new(),
        }
    }

    /// The location of `span` in the file at normal path `path` of
    /// `checked`. The first analysis that places a span in a path gives its
    /// text: within one request every analysis read the same buffers, since
    /// messages are handled one at a time.
    fn location(
        &mut self,
        path: &str,
        span: Span,
        checked: &Arc<flow_compiler::Checked>,
    ) -> Option<Location> {
        if !self.files.contains_key(path) {
            let indexed = checked
                .files
                .iter()
                .position(|file| normalize(&file.path) == path)
                .and_then(|file| {
                    Some(Indexed {
                        uri: uri_of(path)?,
                        lines: Lines::new(&checked.files[file].text),
                        checked: checked.clone(),
                        file,
                    })
                });
            self.files.insert(path.to_string(), indexed);
        }
        let indexed = self.files.get(path)?.as_ref()?;
        let text = &indexed.checked.files[indexed.file].text;
        Some(Location::new(
            indexed.uri.clone(),
            indexed.lines.range(text, span, self.encoding),
        ))
    }
}

impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        let utf8 = params
            .capabilities
            .general
            .as_ref()
            .and_then(|general| general.position_encodings.as_ref())
            .is_some_and(|encodings| encodings.contains(&PositionEncodingKind::UTF8));
        {
            let mut state = self.lock();
            state.encoding = if utf8 {
                Encoding::Utf8
            } else {
                Encoding::Utf16
            };
            if let Some(ms) = params
                .initialization_options
                .as_ref()
                .and_then(|options| options.get("debounceMs"))
                .and_then(serde_json::Value::as_u64)
            {
                state.debounce = Duration::from_millis(ms);
            }
            state.documents.roots = workspace_roots(&params);
            state.watches_files = params
                .capabilities
                .workspace
                .as_ref()
                .and_then(|workspace| workspace.did_change_watched_files.as_ref())
                .and_then(|watched| watched.dynamic_registration)
                .unwrap_or(false);
            state.docs = state
                .documents
                .roots
                .iter()
                .map(|root| root.join("docs/language.md"))
                .find(|docs| docs.is_file())
                .and_then(Uri::from_file_path);
        }
        Ok(InitializeResult {
            server_info: Some(ServerInfo {
                name: "flow-lsp".to_string(),
                version: Some(env!("CARGO_PKG_VERSION").to_string()),
            }),
            capabilities: crate::capabilities::capabilities(utf8),
            offset_encoding: None,
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        if !self.lock().watches_files {
            return;
        }
        // Asked in a task of its own: the answer comes as a message, and a
        // client slow to give it must not hold the ones after it.
        let client = self.client.clone();
        tokio::spawn(async move {
            let watch = DidChangeWatchedFilesRegistrationOptions {
                // A project's lock decides E120, W304 and the browser
                // tools' checks as its sources do (regression, an audit:
                // `flowc lock` left the editor's diagnostics stale).
                watchers: ["**/*.flow", "**/flow.lock"]
                    .into_iter()
                    .map(|glob| FileSystemWatcher {
                        glob_pattern: GlobPattern::String(glob.to_string()),
                        kind: None,
                    })
                    .collect(),
            };
            let registration = Registration {
                id: "flow-files".to_string(),
                method: "workspace/didChangeWatchedFiles".to_string(),
                register_options: serde_json::to_value(watch).ok(),
            };
            let _ = client.register_capability(vec![registration]).await;
        });
    }

    async fn shutdown(&self) -> Result<()> {
        Ok(())
    }

    /// A `.flow` file or a `flow.lock` made, changed or deleted on disk (by
    /// git, another editor, `flowc fmt`, `flowc lock`): what an open
    /// document imports may be among
    /// them, an import that could not be read before among the rest, so
    /// every open document is checked again.
    async fn did_change_watched_files(&self, _: DidChangeWatchedFilesParams) {
        let open: Vec<String> = {
            let mut state = self.lock();
            state.documents.repaired = None;
            state.documents.analyses.clear();
            state.documents.open.keys().cloned().collect()
        };
        for path in open {
            self.schedule(path);
        }
    }

    async fn did_open(&self, params: DidOpenTextDocumentParams) {
        let Some(path) = path_of(&params.text_document.uri) else {
            return;
        };
        let text: Arc<str> = params.text_document.text.into();
        let unread = {
            let mut state = self.lock();
            // The new buffer replaces the disk for whatever imports it.
            state.documents.repaired = None;
            state.documents.open.insert(
                path.clone(),
                Document {
                    uri: params.text_document.uri,
                    lines: Arc::new(Lines::new(&text)),
                    text,
                    version: params.text_document.version,
                },
            );
            // A buffer opened where an import could not be read (a file
            // made in the editor, not saved yet) mends that import
            // (regression, an audit: the importer kept its E113).
            let unread = state.documents.with_unread_imports();
            for importer in &unread {
                state.documents.analyses.remove(importer);
            }
            unread
        };
        self.schedule(path.clone());
        for importer in unread.into_iter().filter(|importer| *importer != path) {
            self.schedule(importer);
        }
    }

    async fn did_change(&self, params: DidChangeTextDocumentParams) {
        let Some(path) = path_of(&params.text_document.uri) else {
            return;
        };
        {
            let mut state = self.lock();
            let encoding = state.encoding;
            state.documents.change(
                &path,
                params.text_document.version,
                params.content_changes,
                encoding,
            );
            // What imports this file must be checked again, now or when asked.
            for dependant in state.documents.dependants(&path) {
                state.documents.analyses.remove(&dependant);
            }
        }
        self.schedule(path);
    }

    async fn did_save(&self, params: DidSaveTextDocumentParams) {
        // Files that import this one and are not open read it from disk.
        if let Some(path) = path_of(&params.text_document.uri) {
            let dependants = {
                let mut state = self.lock();
                state.documents.repaired = None;
                let dependants = state.documents.dependants(&path);
                for dependant in &dependants {
                    state.documents.analyses.remove(dependant);
                }
                dependants
            };
            for dependant in dependants {
                self.schedule(dependant);
            }
        }
    }

    async fn did_close(&self, params: DidCloseTextDocumentParams) {
        let Some(path) = path_of(&params.text_document.uri) else {
            return;
        };
        let (dependants, cleared) = {
            let mut state = self.lock();
            state.documents.repaired = None;
            state.documents.open.remove(&path);
            state.documents.analyses.remove(&path);
            state.documents.imports.remove(&path);
            let cleared = unshown(&mut state);
            (state.documents.dependants(&path), cleared)
        };
        self.client
            .publish_diagnostics(params.text_document.uri, Vec::new(), None)
            .await;
        for (path, diagnostics) in cleared {
            if let Some(uri) = uri_of(&path) {
                self.client
                    .publish_diagnostics(uri, diagnostics, None)
                    .await;
            }
        }
        // Its importers now read the saved file instead of the buffer.
        for dependant in dependants {
            self.schedule(dependant);
        }
    }

    async fn completion(&self, params: CompletionParams) -> Result<Option<CompletionResponse>> {
        let position = params.text_document_position;
        let Some(path) = path_of(&position.text_document.uri) else {
            return Ok(None);
        };
        let encoding = self.encoding();
        let (text, lines, fresh, overlay) = {
            let state = self.lock();
            let Some(doc) = state.documents.open.get(&path) else {
                return Ok(None);
            };
            (
                doc.text.clone(),
                doc.lines.clone(),
                state.documents.fresh(&path),
                state.documents.overlay(),
            )
        };
        let offset = lines.offset(&text, position.position, encoding);
        // In a reference or string being typed, the text certainly has a
        // syntax error and the answer comes from a copy repaired at the
        // cursor, so the text itself is not checked first: with a syntax
        // error that takes the recovering parser, slow on a large file, and
        // the debounced check does it for the diagnostics anyway.
        let analysis = match fresh {
            Some(analysis) => Some(analysis),
            None if ide::half_typed(&text, offset) => None,
            None => match self.current(&position.text_document.uri).await {
                Some((_, analysis)) => Some(analysis),
                None => return Ok(None),
            },
        };
        let state = self.state.clone();
        let found = tokio::task::spawn_blocking({
            let text = text.clone();
            move || {
                let mut recheck = |repaired: &str| {
                    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(kept) = lock().documents.kept_repair(&path, repaired) {
                        return kept;
                    }
                    let checked = Arc::new(check_with(&overlay, &path, repaired));
                    lock().documents.repaired = Some(Repaired {
                        path: path.clone(),
                        text: repaired.into(),
                        checked: checked.clone(),
                    });
                    checked
                };
                match analysis {
                    Some(analysis) => ide::completions(&analysis.checked, offset, &mut recheck),
                    None => ide::completions_in_broken(&text, offset, &mut recheck),
                }
            }
        })
        .await
        .map_err(|_| Error::internal_error())?;
        let range = lines.range(&text, found.replace, encoding);
        let typed = text
            .get(found.replace.start as usize..(offset as usize).max(found.replace.start as usize))
            .unwrap_or_default();
        let (kept, is_incomplete) = capped(found.items, typed);
        let items = kept
            .into_iter()
            .enumerate()
            .map(|(index, item)| CompletionItem {
                kind: Some(completion_kind(item.kind)),
                detail: Some(item.detail),
                sort_text: Some(format!("{index:05}")),
                text_edit: Some(CompletionTextEdit::Edit(TextEdit::new(
                    range,
                    item.insert.unwrap_or_else(|| item.label.clone()),
                ))),
                label: item.label,
                ..CompletionItem::default()
            })
            .collect();
        Ok(Some(CompletionResponse::List(CompletionList {
            is_incomplete,
            items,
        })))
    }

    async fn hover(&self, params: HoverParams) -> Result<Option<Hover>> {
        let position = params.text_document_position_params;
        let Some(At {
            analysis,
            encoding,
            offset,
            ..
        }) = self.at(&position).await
        else {
            return Ok(None);
        };
        Ok(
            ide::hover(&analysis.checked, FileId(0), offset).map(|hover| Hover {
                contents: HoverContents::Markup(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: hover.markdown,
                }),
                range: Some(analysis.lines.range(&analysis.text, hover.span, encoding)),
            }),
        )
    }

    async fn goto_definition(
        &self,
        params: GotoDefinitionParams,
    ) -> Result<Option<GotoDefinitionResponse>> {
        let position = params.text_document_position_params;
        let Some(At {
            analysis,
            encoding,
            offset,
            ..
        }) = self.at(&position).await
        else {
            return Ok(None);
        };
        let Some((file, span)) = ide::definition(&analysis.checked, FileId(0), offset) else {
            return Ok(None);
        };
        let path = normalize(&analysis.checked.file(file).path);
        Ok(Locator::new(encoding)
            .location(&path, span, &analysis.checked)
            .map(GotoDefinitionResponse::Scalar))
    }

    async fn references(&self, params: ReferenceParams) -> Result<Option<Vec<Location>>> {
        let position = params.text_document_position;
        let Some(At {
            root,
            analysis,
            encoding,
            offset,
        }) = self.at(&position).await
        else {
            return Ok(None);
        };
        let Some((symbol, _)) = ide::symbol_at(&analysis.checked, FileId(0), offset) else {
            return Ok(None);
        };
        let mut locator = Locator::new(encoding);
        let mut locations: Vec<Location> = Vec::new();
        for (path, span, checked) in self.locations(&root, &analysis, &symbol).await {
            if let Some(location) = locator.location(&path, span, &checked) {
                locations.push(location);
            }
        }
        if !params.context.include_declaration
            && let Some((file, span)) = ide::definition(&analysis.checked, FileId(0), offset)
            && let Some(declaration) = locator.location(
                &normalize(&analysis.checked.file(file).path),
                span,
                &analysis.checked,
            )
        {
            locations.retain(|location| *location != declaration);
        }
        Ok(Some(locations))
    }

    async fn prepare_rename(
        &self,
        params: TextDocumentPositionParams,
    ) -> Result<Option<PrepareRenameResponse>> {
        let Some(At {
            analysis,
            encoding,
            offset,
            ..
        }) = self.at(&params).await
        else {
            return Ok(None);
        };
        Ok(match ide::symbol_at(&analysis.checked, FileId(0), offset) {
            Some((ide::Symbol::Import { .. }, _)) | None => None,
            Some((_, span)) => Some(PrepareRenameResponse::Range(analysis.lines.range(
                &analysis.text,
                span,
                encoding,
            ))),
        })
    }

    async fn rename(&self, params: RenameParams) -> Result<Option<WorkspaceEdit>> {
        let position = params.text_document_position;
        let Some(At {
            root,
            analysis,
            encoding,
            offset,
        }) = self.at(&position).await
        else {
            return Ok(None);
        };
        let (symbol, _) = ide::rename(&analysis.checked, FileId(0), offset, &params.new_name)
            .map_err(|error| Error::invalid_params(error.to_string()))?;
        let found = self.locations(&root, &analysis, &symbol).await;
        let mut locator = Locator::new(encoding);
        let mut asked = HashSet::new();
        let mut changes: HashMap<Uri, Vec<TextEdit>> = HashMap::new();
        for (path, span, checked) in found {
            // The name must be free in every file the rename reaches: asked
            // once of each analysis that reaches a file.
            if asked.insert(Arc::as_ptr(&checked)) {
                ide::check_new_name(&checked, &symbol, &params.new_name)
                    .map_err(|error| Error::invalid_params(format!("{error} in {path}")))?;
            }
            if let Some(location) = locator.location(&path, span, &checked) {
                changes
                    .entry(location.uri)
                    .or_default()
                    .push(TextEdit::new(location.range, params.new_name.clone()));
            }
        }
        Ok(Some(WorkspaceEdit {
            changes: Some(changes),
            ..WorkspaceEdit::default()
        }))
    }

    async fn document_symbol(
        &self,
        params: DocumentSymbolParams,
    ) -> Result<Option<DocumentSymbolResponse>> {
        let Some((_, analysis)) = self.current(&params.text_document.uri).await else {
            return Ok(None);
        };
        let encoding = self.encoding();
        let symbols = ide::document_symbols(&analysis.checked, FileId(0))
            .iter()
            .map(|symbol| document_symbol(symbol, &analysis, encoding))
            .collect();
        Ok(Some(DocumentSymbolResponse::Nested(symbols)))
    }

    async fn semantic_tokens_full(
        &self,
        params: SemanticTokensParams,
    ) -> Result<Option<SemanticTokensResult>> {
        let Some((_, analysis)) = self.current(&params.text_document.uri).await else {
            return Ok(None);
        };
        let encoding = self.encoding();
        let mut data = Vec::new();
        let mut last = Position::new(0, 0);
        let text = &analysis.text;
        for token in ide::semantic_tokens(&analysis.checked, FileId(0)) {
            let (token_type, modifiers) = token_type(token.kind);
            let modifiers = modifiers | u32::from(token.definition);
            // A token is on one line for the protocol (clients need not
            // support more): a `"""` string or a block comment is sent as
            // one token per line it spans.
            let mut start = token.span.start as usize;
            let end = token.span.end as usize;
            while start < end {
                let line_end = text[start..end]
                    .find(['\r', '\n'])
                    .map_or(end, |i| start + i);
                let range = analysis
                    .lines
                    .range(text, Span::new(start, line_end), encoding);
                start = line_end + 1;
                if range.end.character == range.start.character {
                    continue;
                }
                let delta_line = range.start.line - last.line;
                let delta_start = if delta_line == 0 {
                    range.start.character - last.character
                } else {
                    range.start.character
                };
                data.push(SemanticToken {
                    delta_line,
                    delta_start,
                    length: range.end.character - range.start.character,
                    token_type,
                    token_modifiers_bitset: modifiers,
                });
                last = range.start;
            }
        }
        Ok(Some(SemanticTokensResult::Tokens(SemanticTokens {
            result_id: None,
            data,
        })))
    }

    async fn formatting(&self, params: DocumentFormattingParams) -> Result<Option<Vec<TextEdit>>> {
        let Some((_, analysis)) = self.current(&params.text_document.uri).await else {
            return Ok(None);
        };
        let encoding = self.encoding();
        // A file that cannot be tokenised (an unterminated string) is left as is.
        let Ok(formatted) = flow_compiler::format::format_source(&analysis.text) else {
            return Ok(None);
        };
        if *formatted == *analysis.text {
            return Ok(Some(Vec::new()));
        }
        let whole =
            analysis
                .lines
                .range(&analysis.text, Span::new(0, analysis.text.len()), encoding);
        Ok(Some(vec![TextEdit::new(whole, formatted)]))
    }

    async fn inlay_hint(&self, params: InlayHintParams) -> Result<Option<Vec<InlayHint>>> {
        let Some((_, analysis)) = self.current(&params.text_document.uri).await else {
            return Ok(None);
        };
        let encoding = self.encoding();
        let range = analysis.lines.span(&analysis.text, params.range, encoding);
        let hints = ide::inlay_hints(&analysis.checked, range)
            .into_iter()
            .map(|hint| InlayHint {
                position: analysis
                    .lines
                    .position(&analysis.text, hint.offset, encoding),
                label: InlayHintLabel::String(hint.label),
                kind: Some(InlayHintKind::TYPE),
                text_edits: None,
                tooltip: None,
                padding_left: None,
                padding_right: None,
                data: None,
            })
            .collect();
        Ok(Some(hints))
    }

    async fn signature_help(&self, params: SignatureHelpParams) -> Result<Option<SignatureHelp>> {
        let position = params.text_document_position_params;
        let Some(At {
            analysis, offset, ..
        }) = self.at(&position).await
        else {
            return Ok(None);
        };
        let Some(found) = ide::signature_help(&analysis.checked, offset) else {
            return Ok(None);
        };
        // Each input by its text, which needs no offsets in UTF-16.
        let parameters = found
            .parameters
            .iter()
            .map(|(start, end)| ParameterInformation {
                label: ParameterLabel::Simple(
                    found.label[*start as usize..*end as usize].to_string(),
                ),
                documentation: None,
            })
            .collect();
        let active = found.active.map(|index| index as u32);
        Ok(Some(SignatureHelp {
            signatures: vec![SignatureInformation {
                label: found.label,
                documentation: None,
                parameters: Some(parameters),
                active_parameter: active,
            }],
            active_signature: Some(0),
            active_parameter: active,
        }))
    }

    async fn symbol(
        &self,
        params: WorkspaceSymbolParams,
    ) -> Result<Option<WorkspaceSymbolResponse>> {
        let encoding = self.encoding();
        let files = self.workspace_files();
        let buffers = self.lock().documents.overlay().buffers;
        // Each file parsed, none checked: what a file declares is in its
        // syntax tree, and checking every file of a large workspace (its
        // imports with it) for each query kept the server busy for tens of
        // seconds, every other request behind it. Each file's own symbols,
        // so that a declaration imported by many files is listed once.
        let found = tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            for path in files {
                let text: Arc<str> = match buffers.get(&path) {
                    Some(text) => Arc::clone(text),
                    None => match std::fs::read(&path).map(String::from_utf8) {
                        Ok(Ok(text)) => text.into(),
                        _ => continue,
                    },
                };
                let Some(uri) = uri_of(&path) else {
                    continue;
                };
                let source = flow_compiler::syntax::lone_cr_as_lf(&text);
                let (tree, _) = flow_compiler::syntax::parse(&source, FileId(0));
                let lines = Lines::new(&text);
                for symbol in ide::matching_symbols(&tree, &params.query) {
                    #[allow(deprecated)] // reason: `deprecated` must still be written
                    found.push(SymbolInformation {
                        name: symbol.name,
                        kind: symbol_kind(symbol.kind),
                        tags: None,
                        deprecated: None,
                        location: Location::new(
                            uri.clone(),
                            lines.range(&text, symbol.span, encoding),
                        ),
                        container_name: symbol.container,
                    });
                }
            }
            found
        })
        .await
        .unwrap_or_default();
        Ok(Some(WorkspaceSymbolResponse::Flat(found)))
    }

    async fn code_action(&self, params: CodeActionParams) -> Result<Option<CodeActionResponse>> {
        let Some((_, analysis)) = self.current(&params.text_document.uri).await else {
            return Ok(None);
        };
        let encoding = self.encoding();
        let range = analysis.lines.span(&analysis.text, params.range, encoding);
        let uri = params.text_document.uri;
        let actions = ide::quick_fixes(&analysis.checked, FileId(0), range)
            .into_iter()
            .map(|fix| {
                let edits = fix
                    .edits
                    .into_iter()
                    .map(|edit| {
                        TextEdit::new(
                            analysis.lines.range(&analysis.text, edit.span, encoding),
                            edit.text,
                        )
                    })
                    .collect();
                CodeActionOrCommand::CodeAction(CodeAction {
                    title: fix.title,
                    kind: Some(CodeActionKind::QUICKFIX),
                    is_preferred: Some(fix.preferred),
                    edit: Some(WorkspaceEdit {
                        changes: Some(HashMap::from([(uri.clone(), edits)])),
                        ..WorkspaceEdit::default()
                    }),
                    ..CodeAction::default()
                })
            })
            .collect();
        Ok(Some(actions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flow_compiler::ide::CompletionKind;

    fn item(label: &str) -> ide::Completion {
        ide::Completion {
            label: label.to_string(),
            kind: CompletionKind::Step,
            detail: String::new(),
            insert: None,
        }
    }

    /// References are placed in linear time: a file's lines are indexed
    /// once per request, however many spans are placed in it.
    #[test]
    fn a_request_indexes_each_files_lines_once() {
        let text = "workflow w {\n  step a = handoff \"x\" { message: \"m\" }\n}\n";
        let checked = Arc::new(flow_compiler::check_source("/tmp/w.flow", text));
        let mut locator = Locator::new(Encoding::Utf16);
        let first = locator.location("/tmp/w.flow", Span::new(0, 8), &checked);
        let second = locator.location("/tmp/w.flow", Span::new(20, 21), &checked);
        assert_eq!(locator.files.len(), 1);
        let range = |location: Option<Location>| location.map(|location| location.range);
        assert_eq!(
            range(first),
            Some(Range::new(Position::new(0, 0), Position::new(0, 8)))
        );
        assert_eq!(
            range(second),
            Some(Range::new(Position::new(1, 7), Position::new(1, 8)))
        );
        assert_eq!(
            locator.location("/tmp/other.flow", Span::new(0, 1), &checked),
            None,
            "a file the analysis does not hold"
        );
    }

    #[test]
    fn a_long_list_is_cut_and_narrowed_by_what_is_typed() {
        let few: Vec<_> = (0..10).map(|i| item(&format!("s{i}"))).collect();
        assert_eq!(
            capped(few.clone(), "zz"),
            (few, false),
            "short lists stay whole"
        );

        let many: Vec<_> = (0..700).map(|i| item(&format!("s{i}"))).collect();
        let (kept, cut) = capped(many.clone(), "");
        assert!(cut);
        assert_eq!(kept.len(), MOST_COMPLETIONS);
        assert_eq!(kept[0].label, "s0", "in the query's order");

        let (kept, cut) = capped(many, "S69");
        assert!(!cut, "few enough match");
        // The typed characters in order, not necessarily together.
        let labels: Vec<&str> = kept.iter().map(|i| i.label.as_str()).collect();
        assert_eq!(
            labels[..7],
            ["s69", "s169", "s269", "s369", "s469", "s569", "s609"]
        );
        assert_eq!(labels.len(), 25, "{labels:?}");
    }
}
