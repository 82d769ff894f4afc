//! Editor queries on a checked program: completion, hover, go to definition,
//! find references, rename, document symbols, semantic tokens and quick fixes.
//!
//! Every query is a plain function of a [`Checked`](crate::Checked) and a byte
//! offset into one of its files, so that it is tested here, without any editor
//! protocol; `flow-lsp` only converts positions and types. Queries never panic
//! on a document in any state: they answer from whatever the parser recovered
//! (of a workflow with a `{` left open, what comes before the line it is
//! blamed on), and completion re-checks a repaired copy of the text when the
//! cursor sits in a half-typed construct (see [`completion`]).

pub mod completion;
pub mod fixes;
pub mod hover;
pub mod navigation;
mod scope;
pub mod symbols;
pub mod tokens;
mod visit;

pub use completion::{
    Completion, CompletionKind, Completions, completions, completions_in_broken, half_typed,
};
pub use fixes::{QuickFix, apply, quick_fixes};
pub use hover::{Hover, hover};
pub use navigation::{
    RenameError, Symbol, check_new_name, definition, references, rename, symbol_at,
};
pub use symbols::{DocumentSymbol, SymbolKind, document_symbols};
pub use tokens::{SemanticToken, TokenKind, semantic_tokens};
