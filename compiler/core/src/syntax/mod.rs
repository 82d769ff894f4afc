//! Syntax: the pest grammar, the syntax tree, and the template parser.

pub mod ast;
pub(crate) mod cursor;
mod fast;
pub(crate) mod lex;
mod parse;
mod template;

pub(crate) use parse::KEYWORDS;

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
