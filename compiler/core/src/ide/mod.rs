//! Editor queries on a checked program: completion, hover, go to definition,
//! find references, rename, document and workspace symbols, semantic tokens,
//! quick fixes, inlay hints and signature help.
//!
//! Every query is a plain function of a [`Checked`](crate::Checked) and a byte
//! offset into one of its files, so that it is tested here, without any editor
//! protocol; `flow-lsp` only converts positions and types. Queries never panic
//! on a document in any state: they answer from whatever the parser recovered
//! (of a workflow with a `{` left open, what comes before the line it is
//! blamed on), and completion re-checks a repaired copy of the text when the
//! cursor sits in a half-typed construct (see [`completion`]).

pub mod completion;
mod fields;
pub mod fixes;
pub mod hints;
pub mod hover;
pub mod navigation;
mod scope;
pub mod signature;
pub mod symbols;
pub mod tokens;
mod visit;

pub use completion::{
    Completion, CompletionKind, Completions, completions, completions_in_broken, half_typed,
};
pub use fixes::{QuickFix, apply, quick_fixes};
pub use hints::{InlayHint, inlay_hints};
pub use hover::{Hover, hover};
pub use navigation::{
    RenameError, Symbol, check_new_name, definition, references, rename, symbol_at,
};
pub use signature::{Signature, signature_help};
pub use symbols::{
    DocumentSymbol, FoundSymbol, SymbolKind, document_symbols, matching_symbols, outline,
};
pub use tokens::{SemanticToken, TokenKind, semantic_tokens};
