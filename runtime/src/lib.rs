//! The flow runtime: executes plans.
//!
//! The runtime knows the plan format (`flow-plan`) and nothing else of the
//! compiler. A run is the deterministic replay of a plan over a journal: every
//! step execution is recorded under its execution path (`lookups/billing/invoices`,
//! `scans[3]/page`), and executing a path that the journal already holds takes
//! the recorded outcome instead of running the step again. Resuming after an
//! approval and recovering after a crash are both that replay.
//!
//! The interpreter and the vocabulary it speaks live in `flow-engine`, which
//! links no store; they are re-exported here under the paths the rest of the
//! runtime, flowd and the CLI use (`flow_runtime::interp`, `::journal`, ...).

pub use flow_engine::{
    approval, destination, error, eval, interp, journal, kb, memory, offline, schema, scope,
    services, stall, sync, test_from, time,
};

pub mod allocator;
pub mod anthropic;
pub mod fenced_body;
pub mod limit;
pub mod llm;
pub mod log;
pub mod mcp;
pub use flow_mcp::egress;
pub mod openai;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod runner;
pub mod sqlite;
pub mod store;
pub mod tls;
pub mod versions;

pub use interp::run;
pub use journal::Outcome;
pub use services::Services;
