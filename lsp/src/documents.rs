//! Open documents, their latest analyses, and the loader that serves open
//! buffers before the disk, so that an import sees unsaved edits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flow_compiler::check::normalize;
use flow_compiler::{Checked, LoadFailure};
use flow_loader::Project;

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
    /// The workspace folders (or the root URI), each a project: imports may
    /// not lead outside the one that holds the importing file.
    pub roots: Vec<PathBuf>,
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

    /// The loader's view: every open buffer's text by normal path, and the
    /// workspace folders that bound what a file may import.
    pub fn overlay(&self) -> Overlay {
        Overlay {
            buffers: self
                .open
                .iter()
                .map(|(path, doc)| (path.clone(), doc.text.clone()))
                .collect(),
            roots: self.roots.clone(),
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

    /// The open documents whose last analysis could not read an import
    /// (E113): a file opened or made since may be it, and a failed import
    /// is in no document's imports to find them by.
    pub fn with_unread_imports(&self) -> Vec<String> {
        let mut found: Vec<String> = self
            .analyses
            .iter()
            .filter(|(path, analysis)| {
                self.open.contains_key(path.as_str())
                    && analysis
                        .checked
                        .diagnostics
                        .iter()
                        .any(|d| d.code == flow_compiler::codes::Code::UnresolvedImport)
            })
            .map(|(path, _)| path.clone())
            .collect();
        found.sort();
        found
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

/// Open buffers first, then the disk, within the project of the file being
/// checked.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    pub buffers: HashMap<String, Arc<str>>,
    /// The workspace folders, each a project: a file's imports are confined
    /// to the folder that holds it (the innermost), or to the file's own
    /// folder when none does.
    pub roots: Vec<PathBuf>,
}

/// How to name a wider project, in an editor.
const WIDEN: &str = "the project is the editor's workspace folder, or the file's own folder outside any; open a wider folder as the workspace to import from it";

impl Overlay {
    /// The project whose files `file` may import.
    fn project_of(&self, file: &str) -> Option<Project> {
        let path = Path::new(file);
        let folder = self
            .roots
            .iter()
            .filter(|root| path.starts_with(root))
            .max_by_key(|root| root.components().count())
            .cloned()
            .or_else(|| path.parent().map(Path::to_path_buf))?;
        Project::new(&folder, WIDEN).ok()
    }

    /// The loader for checking `root`.
    pub fn loader(&self, root: &str) -> OverlayLoader<'_> {
        OverlayLoader {
            overlay: self,
            root: normalize(root),
            project: self.project_of(root),
        }
    }
}

/// An [`Overlay`] as the checker's loader for one root file.
#[derive(Debug)]
pub struct OverlayLoader<'o> {
    overlay: &'o Overlay,
    root: String,
    /// `None` when the file's folder cannot be opened (an unsaved buffer in
    /// a folder since removed): then only the root's own buffer is served.
    project: Option<Project>,
}

impl flow_compiler::SourceLoader for OverlayLoader<'_> {
    fn load(&self, path: &str) -> Result<Vec<u8>, LoadFailure> {
        let normal = normalize(path);
        let Some(project) = &self.project else {
            return match self.overlay.buffers.get(&normal) {
                Some(text) if normal == self.root => Ok(text.as_bytes().to_vec()),
                _ => Err(LoadFailure::unreadable("the file's folder cannot be read")),
            };
        };
        // The project's bounds hold for open buffers too: the editor's
        // buffers are not read from disk, but an import must mean the same
        // in the editor as in `flowc check`.
        if !project.contains(path) {
            return Err(project.outside());
        }
        if let Some(text) = self.overlay.buffers.get(&normal) {
            return Ok(text.as_bytes().to_vec());
        }
        project.read(path, false)
    }

    fn lock(&self, path: &str) -> Result<Option<Vec<u8>>, LoadFailure> {
        match &self.project {
            Some(project) => project.read_other(Path::new(path)),
            None => Ok(None),
        }
    }

    /// What the disk holds in `folder`, as `flowc` lists it, plus the open
    /// buffers there that were never saved: an import that fails is answered
    /// with the file it most likely meant, in the editor as on the command
    /// line, and a file just created in the editor counts.
    fn list(&self, folder: &str) -> Vec<String> {
        let Some(project) = &self.project else {
            return Vec::new();
        };
        let mut names = project.list(folder);
        if project.contains(if folder.is_empty() { "." } else { folder }) {
            let folder = normalize(folder);
            for path in self.overlay.buffers.keys() {
                let Some((parent, name)) = path.rsplit_once('/') else {
                    continue;
                };
                if parent == folder && name.ends_with(".flow") && !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
            }
            names.sort();
        }
        names
    }
}

/// Checks `root` with `text` in place of its buffer, as `flowc check` does
/// (the `flow.lock` beside it included, or E120 when it cannot be used).
pub fn check_with(overlay: &Overlay, root: &str, text: &str) -> Checked {
    let mut overlay = overlay.clone();
    overlay.buffers.insert(normalize(root), Arc::from(text));
    // The root is in the overlay, so loading it cannot fail.
    flow_compiler::check(root, &overlay.loader(root))
        .unwrap_or_else(|_| flow_compiler::check_source(root, text))
}

/// Checks `root`, a file that is not open, as it is on disk.
pub fn check_file(overlay: &Overlay, root: &str) -> Option<Checked> {
    flow_compiler::check(root, &overlay.loader(root)).ok()
}
