//! Diagnostics gathered from several checked roots, owned and deduplicated.
//!
//! Each root is checked on its own, so a file imported by several roots is
//! loaded, and its diagnostics reported, once per root. This module maps every
//! root's file ids onto one table of distinct files and keeps each diagnostic
//! once, whichever roots reported it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flow_compiler::codes::Code;
use flow_compiler::diagnostic::LineIndex;
use flow_compiler::{Checked, Severity, Span};

/// One distinct source file.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) path: String,
    pub(crate) text: Arc<str>,
    /// Where its lines start, so that each position is found without
    /// scanning the file from its start (thousands of reports in one file).
    pub(crate) lines: Arc<LineIndex>,
}

/// A label resolved to an index into `Reports::sources`.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    pub(crate) file: usize,
    pub(crate) span: Span,
    pub(crate) message: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) code: Code,
    pub(crate) severity: Severity,
    pub(crate) message: String,
    pub(crate) primary: Located,
    pub(crate) secondary: Vec<Located>,
    pub(crate) hints: Vec<String>,
}

/// A position in human terms, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

/// Every distinct file and diagnostic of a run.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    pub(crate) sources: Vec<Source>,
    pub(crate) reports: Vec<Report>,
    /// Paths that could not be read, with the reason; they make the exit code 2
    /// and appear in the JSON output, so that a script sees why.
    pub(crate) unreadable: Vec<(String, String)>,
    by_key: HashMap<String, usize>,
    seen: HashSet<(usize, Span, Code, String)>,
}

impl Reports {
    /// Adds the files and diagnostics of one checked root.
    pub(crate) fn add(&mut self, checked: &Checked) {
        let ids: Vec<usize> = checked
            .files
            .iter()
            .map(|file| self.source(&file.path, &file.text))
            .collect();
        for diagnostic in &checked.diagnostics {
            let file = ids[diagnostic.primary.file.0 as usize];
            let key = (
                file,
                diagnostic.primary.span,
                diagnostic.code,
                diagnostic.message.clone(),
            );
            if !self.seen.insert(key) {
                continue;
            }
            let locate = |label: &flow_compiler::Label| Located {
                file: ids[label.file.0 as usize],
                span: label.span,
                message: label.message.clone(),
            };
            self.reports.push(Report {
                code: diagnostic.code,
                severity: diagnostic.severity,
                message: diagnostic.message.clone(),
                primary: locate(&diagnostic.primary),
                secondary: diagnostic.secondary.iter().map(locate).collect(),
                hints: diagnostic.hints.clone(),
            });
        }
    }

    /// Orders the diagnostics by file, then position, then code, so that the
    /// output does not depend on which worker finished first.
    pub(crate) fn sort(&mut self) {
        let sources = &self.sources;
        self.reports.sort_by(|a, b| {
            (&sources[a.primary.file].path, a.primary.span.start, a.code).cmp(&(
                &sources[b.primary.file].path,
                b.primary.span.start,
                b.code,
            ))
        });
    }

    pub(crate) fn errors(&self) -> usize {
        self.reports
            .iter()
            .filter(|r| r.severity == Severity::Error)
            .count()
    }

    pub(crate) fn warnings(&self) -> usize {
        self.reports
            .iter()
            .filter(|r| r.severity == Severity::Warning)
            .count()
    }

    pub(crate) fn path(&self, file: usize) -> &str {
        &self.sources[file].path
    }

    /// The 1-based line and column of a byte offset in a file.
    pub(crate) fn position(&self, file: usize, offset: u32) -> Position {
        let source = &self.sources[file];
        let (line, column) = source.lines.line_col(&source.text, offset);
        Position { line, column }
    }

    /// The 1-based start and end positions of a span, the end exclusive.
    pub(crate) fn range(&self, file: usize, span: Span) -> (Position, Position) {
        let (start, end) = clamp_span(&self.sources[file].text, span);
        (
            self.position(file, start as u32),
            self.position(file, end as u32),
        )
    }

    /// The index of the file at `path`, registering it on first sight. Two
    /// spellings of one path (`a/b/../c.flow`, `a/c.flow`) are one file.
    fn source(&mut self, path: &str, text: &str) -> usize {
        let shown = flow_compiler::check::normalize(path);
        // Canonical paths also merge symbolic links; a file that vanished
        // since it was read keeps its lexical key.
        let key = std::fs::canonicalize(&shown)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| shown.clone());
        if let Some(&index) = self.by_key.get(&key) {
            return index;
        }
        let index = self.sources.len();
        let text = printable(text);
        self.sources.push(Source {
            // Shown, not opened: a control character in a file's name is
            // escaped as in the text.
            path: flow_plan::inert(&shown).into_owned(),
            lines: Arc::new(LineIndex::new(&text)),
            text: Arc::from(text),
        });
        self.by_key.insert(key, index);
        index
    }
}

/// `text` as it may be printed in a snippet: a control character other than
/// a tab or a line break (a terminal's escape sequence, a bell, a NUL) is
/// shown as `?`, or `¿` for one of two bytes, so that each byte offset and
/// column stays where it was, and a file cannot clear the screen or retitle
/// the window of whoever checks it.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let shown = |c: char| !c.is_control() || matches!(c, '\t' | '\n' | '\r');
    if text.chars().all(shown) {
        return text.into();
    }
    text.chars()
        .map(|c| match c {
            c if shown(c) => c,
            c if c.len_utf8() == 1 => '?',
            // The C1 controls, U+0080 to U+009F, take two bytes, as `¿` does.
            _ => '¿',
        })
        .collect::<String>()
        .into()
}

/// A span clamped to the text and widened to character boundaries, so that
/// slicing never panics: a span computed on the raw bytes of a file that was
/// not UTF-8 may fall inside a replacement character of the decoded text.
pub(crate) fn clamp_span(text: &str, span: Span) -> (usize, usize) {
    let mut start = (span.start as usize).min(text.len());
    let mut end = (span.end as usize).clamp(start, text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    while !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize() {
        assert_eq!(flow_compiler::check::normalize("a/b/../c.flow"), "a/c.flow");
        assert_eq!(flow_compiler::check::normalize("./a.flow"), "a.flow");
        assert_eq!(flow_compiler::check::normalize("/x/./y.flow"), "/x/y.flow");
    }

    /// Regression: a file's escape sequences (clear the screen, retitle
    /// the window) and bells were printed raw in its snippets.
    #[test]
    fn control_characters_print_inert_where_they_were() {
        let text = "a \u{1b}]0;pwned\u{7} \u{9b}2J\tb\r\n";
        let shown = printable(text);
        assert_eq!(shown, "a ?]0;pwned? ¿2J\tb\r\n");
        assert_eq!(shown.len(), text.len(), "every byte offset stays");
        assert!(matches!(
            printable("plain\ttext\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn spans_clamp_to_char_boundaries() {
        let text = "a\u{fffd}b";
        assert_eq!(clamp_span(text, Span::new(1, 2)), (1, 4));
        assert_eq!(clamp_span(text, Span::new(9, 12)), (5, 5));
    }
}
