//! Open documents, their latest analyses, and the loader that serves open
//! buffers before the disk, so that an import sees unsaved edits.

use std::collections::HashMap;
use std::sync::Arc;

use flow_compiler::Checked;
use flow_compiler::check::normalize;

use crate::convert::{Encoding, Lines};
use tower_lsp_server::ls_types::{TextDocumentContentChangeEvent, Uri};

#[derive(Debug)]
pub struct Document {
    pub uri: Uri,
    pub text: Arc<str>,
    pub lines: Arc<Lines>,
    pub version: i32,
}

/// An analysis of one document at one version.
#[derive(Debug, Clone)]
pub struct Analysis {
    pub version: i32,
    pub text: Arc<str>,
    pub lines: Arc<Lines>,
    pub checked: Arc<Checked>,
}

/// The analysis of a copy of a document repaired for completion (see
/// `flow_compiler::ide::completions_in_broken`).
#[derive(Debug, Clone)]
pub struct Repaired {
    /// The document's normal path.
    pub path: String,
    pub text: Arc<str>,
    pub checked: Arc<Checked>,
}

#[derive(Debug, Default)]
pub struct Documents {
    /// By normal path.
    pub open: HashMap<String, Document>,
    pub analyses: HashMap<String, Analysis>,
    /// What each open document imported when it was last checked (normal
    /// paths), kept when an analysis is invalidated, to find dependants.
    pub imports: HashMap<String, Vec<String>>,
    /// The last repaired copy checked for completion, in whichever document
    /// (one, since the author types in one place; an analysis of a large
    /// file takes megabytes). It outlives its document's edits on purpose:
    /// the copy leaves out the path being typed, so the keystrokes within
    /// one path repair to the same text and are answered from one check. It
    /// is dropped when another document changes, is opened, closed or saved,
    /// since an import may have changed; files changed on disk only (an
    /// import not open, `flow.lock`) are read again at the next path typed.
    pub repaired: Option<Repaired>,
}

impl Documents {
    /// Applies edits in order; a change without a range replaces the text.
    pub fn change(
        &mut self,
        path: &str,
        version: i32,
        changes: Vec<TextDocumentContentChangeEvent>,
        encoding: Encoding,
    ) {
        let Some(doc) = self.open.get_mut(path) else {
            return;
        };
        if self.repaired.as_ref().is_some_and(|kept| kept.path != path) {
            self.repaired = None;
        }
        let mut text = doc.text.to_string();
        let mut lines = Lines::new(&text);
        for change in changes {
            match change.range {
                Some(range) => {
                    let span = lines.span(&text, range, encoding);
                    text.replace_range(span.start as usize..span.end as usize, &change.text);
                }
                None => text = change.text,
            }
            lines = Lines::new(&text);
        }
        doc.text = text.into();
        doc.lines = Arc::new(lines);
        doc.version = version;
    }

    /// The loader's view: every open buffer's text by normal path.
    pub fn overlay(&self) -> Overlay {
        Overlay {
            buffers: self
                .open
                .iter()
                .map(|(path, doc)| (path.clone(), doc.text.clone()))
                .collect(),
        }
    }

    /// The analysis of open document `path` if it is of its current text.
    pub fn fresh(&self, path: &str) -> Option<Analysis> {
        let doc = self.open.get(path)?;
        self.analyses
            .get(path)
            .filter(|analysis| {
                analysis.version == doc.version && Arc::ptr_eq(&analysis.text, &doc.text)
            })
            .cloned()
    }

    /// The kept analysis of `text`, a repaired copy of document `path`, if
    /// the last copy checked was that text.
    pub fn kept_repair(&self, path: &str, text: &str) -> Option<Arc<Checked>> {
        self.repaired
            .as_ref()
            .filter(|kept| kept.path == path && *kept.text == *text)
            .map(|kept| kept.checked.clone())
    }

    /// Keeps `analysis` as the current one of `path`.
    pub fn store(&mut self, path: &str, analysis: Analysis) {
        let imports = analysis
            .checked
            .files
            .iter()
            .skip(1)
            .map(|file| normalize(&file.path))
            .collect();
        self.imports.insert(path.to_string(), imports);
        self.analyses.insert(path.to_string(), analysis);
    }

    /// The open documents whose last analysis loaded `path` as an import,
    /// directly or not.
    pub fn dependants(&self, path: &str) -> Vec<String> {
        let mut found: Vec<String> = self
            .imports
            .iter()
            .filter(|(root, imports)| {
                root.as_str() != path
                    && self.open.contains_key(root.as_str())
                    && imports.iter().any(|import| import == path)
            })
            .map(|(root, _)| root.clone())
            .collect();
        found.sort();
        found
    }
}

/// Open buffers first, then the disk.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    pub buffers: HashMap<String, Arc<str>>,
}

impl flow_compiler::SourceLoader for Overlay {
    fn load(&self, path: &str) -> Result<Vec<u8>, flow_compiler::LoadFailure> {
        if let Some(text) = self.buffers.get(&normalize(path)) {
            return Ok(text.as_bytes().to_vec());
        }
        if std::path::Path::new(path).is_dir() {
            return Err(flow_compiler::LoadFailure::unreadable("it is a directory"));
        }
        std::fs::read(path).map_err(|error| {
            flow_compiler::LoadFailure::unreadable(match error.kind() {
                std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                _ => error.to_string(),
            })
        })
    }
}

/// Checks `root` with `text` in place of its buffer, with the `flow.lock`
/// beside it when there is one: the editor reports the MCP tool problems
/// that `flowc check` does.
pub fn check_with(overlay: &Overlay, root: &str, text: &str) -> Checked {
    let mut overlay = overlay.clone();
    overlay.buffers.insert(normalize(root), Arc::from(text));
    let lock = tool_lock(root);
    // The root is in the overlay, so loading it cannot fail.
    flow_compiler::check_with_tools(root, &overlay, lock.as_ref())
        .unwrap_or_else(|_| flow_compiler::check_source(root, text))
}

/// The `flow.lock` in the folder of `file`, if it exists and reads; a lock
/// that does not parse is as none (`flowc check` reports it).
fn tool_lock(file: &str) -> Option<flow_compiler::lock::ToolLock> {
    let folder = std::path::Path::new(file).parent()?;
    let text = std::fs::read_to_string(folder.join("flow.lock")).ok()?;
    flow_compiler::lock::ToolLock::from_json(&text).ok()
}
