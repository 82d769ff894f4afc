//! Syntax: the pest grammar, the syntax tree, and the template parser.

pub mod ast;
pub(crate) mod cursor;
mod fast;
pub(crate) mod lex;
mod parse;
mod template;

pub(crate) use parse::{KEYWORDS, MAX_DEPTH};

/// The roots of a reference path outside a recipe's prompt: the parser
/// tells a reference from text by them (`{{path}}` outside a string), the
/// checker resolves them.
pub(crate) const ROOTS: &[&str] = &[
    "workflow_input",
    "step",
    "loop_item",
    "loop_index",
    "loop",
    "error",
];

/// The words that start a workflow setting (before its first statement), as
/// the grammar's `workflow_setting`; the direct parser and completion use it.
pub(crate) const WORKFLOW_SETTINGS: &[&str] = &[
    "input",
    "timeout",
    "context",
    "department",
    "durability",
    "on_error",
    "deliver",
];
pub use parse::parse;

/// `text` with each lone `\r` (a line end of classic Mac files) turned into
/// `\n`, and `\r\n` left alone. Lines end at `\n` in both parsers, the
/// comments' lexers and the line index; an editor ends them at a lone `\r`
/// too, and a `//` comment there otherwise ran to the end of the file. The
/// change is byte for byte, so every span is also one of the text as the
/// file holds it.
pub fn lone_cr_as_lf(text: &str) -> std::borrow::Cow<'_, str> {
    let bytes = text.as_bytes();
    let lone = |at: usize| bytes[at] == b'\r' && bytes.get(at + 1) != Some(&b'\n');
    if !(0..bytes.len()).any(lone) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\r') {
        out.push_str(&rest[..at]);
        out.push(if rest[at + 1..].starts_with('\n') {
            '\r'
        } else {
            '\n'
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// `items` in an allocation of exactly their number. A list grown by pushes
/// keeps spare room (four slots for one item), and the tree keeps its lists
/// for the whole check and lowering: a 10,000-step file's record literals,
/// paths and templates held about 5 MB of it. `shrink_to_fit` would not do,
/// as an allocator may leave a block that shrinks by half where it is.
pub(crate) fn exact<T>(items: Vec<T>) -> Vec<T> {
    if items.capacity() == items.len() {
        return items;
    }
    let mut exact = Vec::with_capacity(items.len());
    exact.extend(items);
    exact
}

/// `ty` followed by `?` marks, the first ending at `first` and the last at
/// `last`, for both parsers: one mark makes it optional; more nest once
/// more, so that the checker can point at the extra ones (`string??`),
/// which add nothing. Never deeper than two, so that a thousand marks do
/// not make a tree a thousand levels deep.
pub(crate) fn optional_marks(
    ty: ast::TypeExpr,
    start: usize,
    first: usize,
    last: usize,
) -> ast::TypeExpr {
    use crate::diagnostic::Span;
    use ast::{TypeExpr, TypeExprKind};
    let mut ty = TypeExpr {
        kind: TypeExprKind::Optional(Box::new(ty)),
        span: Span::new(start, first),
    };
    if last > first {
        ty = TypeExpr {
            kind: TypeExprKind::Optional(Box::new(ty)),
            span: Span::new(start, last),
        };
    }
    ty
}
