//! Diagnostics: what the compiler reports, independent of how it is shown.
//!
//! A diagnostic has a stable code (see `codes.rs`), a primary label, secondary
//! labels (possibly in other files), and hints. Renderers live outside the core:
//! `flowc` renders with miette and as JSON or GitHub annotations, `flow-lsp` as
//! LSP diagnostics.

use serde::Serialize;

use crate::codes::Code;

/// A byte range in one source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, PartialOrd, Ord)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        // Offsets fit in 32 bits: the drivers' loaders read at most 8 MiB of
        // a source (`flow_loader::MAX_SOURCE_BYTES`), flowd's deploys less.
        Span {
            start: start as u32,
            end: end as u32,
        }
    }

    pub fn len(self) -> u32 {
        self.end - self.start
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    pub fn shifted(self, by: u32) -> Span {
        Span {
            start: self.start + by,
            end: self.end + by,
        }
    }

    pub fn contains(self, offset: u32) -> bool {
        self.start <= offset && offset <= self.end
    }

    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// Which loaded file a span belongs to: an index into `Checked::files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FileId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Label {
    pub file: FileId,
    pub span: Span,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub hints: Vec<String>,
    /// The text that should replace the primary span: the "did you mean"
    /// candidate when the span is exactly the misspelt name. Editors offer it as
    /// a quick fix; it is not part of the JSON that `flowc` prints, whose hints
    /// already say it in words.
    #[serde(skip)]
    pub fix: Option<String>,
    /// Changes that carry out what a hint says when that is more than
    /// replacing the primary span (an `idempotency` key added after a step,
    /// missing inputs filled in): the checker knows the types and scope
    /// there, so editors offer them as they are, without deriving them again.
    #[serde(skip)]
    pub fixes: Vec<Fix>,
}

/// A mechanical change to the file of a diagnostic: edits applied together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    /// What the change does, as an editor titles it.
    pub title: String,
    /// Non-overlapping edits in the diagnostic's file, in source order.
    pub edits: Vec<Edit>,
}

/// Text to put in place of a span (an empty span inserts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Span,
    pub text: String,
}

impl Edit {
    pub fn insert(at: u32, text: impl Into<String>) -> Edit {
        Edit {
            span: Span { start: at, end: at },
            text: text.into(),
        }
    }
}

/// The most characters of a diagnostic's message, of each label's and of
/// each hint's. Each says what is wrong in a sentence; one that quoted a
/// literal of a megabyte, repeated at each of its uses, took gigabytes.
pub const MOST_TEXT_CHARS: usize = 2_000;

/// `text`, cut to [`MOST_TEXT_CHARS`] with `…`.
fn bounded(text: String) -> String {
    if text.len() <= MOST_TEXT_CHARS {
        text
    } else {
        flow_plan::cut(&text, MOST_TEXT_CHARS)
    }
}

impl Diagnostic {
    /// A diagnostic with the severity its code declares.
    pub fn new(code: Code, file: FileId, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: code.info().severity,
            message: bounded(message.into()),
            primary: Label {
                file,
                span,
                message: String::new(),
            },
            secondary: Vec::new(),
            hints: Vec::new(),
            fix: None,
            fixes: Vec::new(),
        }
    }

    pub fn label(mut self, message: impl Into<String>) -> Diagnostic {
        self.primary.message = bounded(message.into());
        self
    }

    pub fn secondary(mut self, file: FileId, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label {
            file,
            span,
            message: bounded(message.into()),
        });
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hints.push(bounded(hint.into()));
        self
    }

    /// Proposes `replacement` for the primary span (see [`Diagnostic::fix`]).
    pub fn fix(mut self, replacement: impl Into<String>) -> Diagnostic {
        self.fix = Some(replacement.into());
        self
    }

    /// Offers `edits` as a fix titled `title` (see [`Diagnostic::fixes`]).
    pub fn fix_with(mut self, title: impl Into<String>, edits: Vec<Edit>) -> Diagnostic {
        self.fixes.push(Fix {
            title: title.into(),
            edits,
        });
        self
    }

    pub fn file(&self) -> FileId {
        self.primary.file
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Line starts of a text, for many offset lookups in one file without
/// rescanning it each time.
#[derive(Debug, Clone)]
pub struct LineIndex {
    starts: Vec<u32>,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i as u32 + 1));
        LineIndex { starts }
    }

    /// 1-based line and column (in chars) of `offset` in `text`, the text this
    /// index was built from.
    pub fn line_col(&self, text: &str, offset: u32) -> (usize, usize) {
        let offset = offset.min(text.len() as u32);
        let line = self.starts.partition_point(|start| *start <= offset) - 1;
        let start = after_bom(text, self.starts[line] as usize);
        let end = floor_char_boundary(text, offset as usize).max(start);
        (line + 1, text[start..end].chars().count() + 1)
    }

    /// The offset of a 1-based line and column (in chars) in `text`, the
    /// text this index was built from: the inverse of [`Self::line_col`].
    /// `None` past the end of the line or the text.
    pub fn offset(&self, text: &str, line: usize, column: usize) -> Option<u32> {
        let start = after_bom(text, *self.starts.get(line.checked_sub(1)?)? as usize);
        let rest = &text[start..];
        let line_text = &rest[..rest.find('\n').unwrap_or(rest.len())];
        let within = match column.checked_sub(1)? {
            0 => 0,
            chars => {
                let (at, c) = line_text.char_indices().nth(chars - 1)?;
                at + c.len_utf8()
            }
        };
        Some((start + within) as u32)
    }
}

/// Where a byte offset is in human terms: 1-based line and column (in chars).
pub fn line_col(source: &str, offset: u32) -> (usize, usize) {
    let offset = (offset as usize).min(source.len());
    let before = &source[..floor_char_boundary(source, offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = after_bom(before, before.rfind('\n').map_or(0, |i| i + 1));
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Where the first line's columns start: after a byte-order mark, which no
/// editor shows as a column (`\u{FEFF}workflw` was reported at 1:2).
fn after_bom(text: &str, line_start: usize) -> usize {
    if line_start == 0 && text.starts_with('\u{FEFF}') {
        '\u{FEFF}'.len_utf8()
    } else {
        line_start
    }
}

fn floor_char_boundary(source: &str, mut offset: usize) -> usize {
    while !source.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a file's byte-order mark counted as a column of its
    /// first line, so an error there was reported one column to the right.
    #[test]
    fn a_byte_order_mark_is_no_column() {
        let text = "\u{FEFF}workflw w {}\nnext";
        let index = LineIndex::new(text);
        for (offset, at) in [(0, (1, 1)), (3, (1, 1)), (10, (1, 8)), (16, (2, 1))] {
            assert_eq!(line_col(text, offset), at, "{offset}");
            assert_eq!(index.line_col(text, offset), at, "{offset}");
        }
        assert_eq!(index.offset(text, 1, 1), Some(3));
        assert_eq!(index.offset(text, 1, 8), Some(10));
    }
}
