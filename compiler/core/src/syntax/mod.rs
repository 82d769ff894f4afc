//! Syntax: the pest grammar, the syntax tree, and the template parser.

pub mod ast;
mod fast;
mod parse;
mod template;

pub(crate) use parse::KEYWORDS;
pub use parse::parse;
