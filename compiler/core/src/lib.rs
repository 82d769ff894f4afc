//! The `.flow` compiler core.
//!
//! Pure: no function here reads a file, a clock or the environment. Drivers
//! (`flowc`, `flow-lsp`, the runtime's CLIs) load sources and hand them in, so
//! that the command line and the editor report exactly the same diagnostics.

// pest's generated parser names `alloc` directly when pest is built without
// `std` (see the workspace Cargo.toml for why it is).
extern crate alloc;

pub mod check;
pub mod codes;
pub mod diagnostic;
pub mod format;
pub mod graph;
pub mod ide;
pub mod lock;
pub mod lower;
pub mod suggest;
pub mod syntax;
pub mod test_case;

pub use check::{
    Checked, LoadError, LoadFailure, SourceLoader, check, check_source, check_with_tools,
};
pub use diagnostic::{Diagnostic, FileId, Label, Severity, Span};
pub use lower::lower;
