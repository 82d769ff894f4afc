//! Syntax: the pest grammar, the syntax tree, and the template parser.

pub mod ast;
pub(crate) mod cursor;
mod fast;
mod parse;
mod template;

pub(crate) use parse::KEYWORDS;

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
