//! The flow runtime: executes plans.
//!
//! The runtime knows the plan format (`flow-plan`) and nothing else of the
//! compiler. A run is the deterministic replay of a plan over a journal: every
//! step execution is recorded under its execution path (`lookups/billing/invoices`,
//! `scans[3]/page`), and executing a path that the journal already holds takes
//! the recorded outcome instead of running the step again. Resuming after an
//! approval and recovering after a crash are both that replay.

pub mod anthropic;
pub mod approval;
pub(crate) mod bounded;
pub mod error;
pub mod eval;
pub mod interp;
pub mod journal;
pub mod kb;
pub mod limit;
pub mod llm;
pub mod log;
pub mod mcp;
pub use flow_mcp::egress;
pub mod memory;
pub mod offline;
pub mod openai;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod preflight;
pub mod runner;
pub mod schema;
pub mod scope;
pub mod services;
pub mod sqlite;
pub mod store;
pub mod time;
pub mod tls;
pub mod versions;

pub use interp::run;
pub use journal::Outcome;
pub use services::Services;
