//! Syntax: the pest grammar, the syntax tree, and the template parser.

pub mod ast;
pub(crate) mod cursor;
mod fast;
mod parse;
mod template;

pub(crate) use parse::KEYWORDS;

/// What a reference in a workflow may start with (besides `input` in a
/// recipe's prompt): the parser knows them to tell a reference written
/// without `{{ }}`, or a bare name meant as one, from a plain word.
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
];
pub use parse::parse;
