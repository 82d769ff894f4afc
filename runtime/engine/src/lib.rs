//! The flow engine: the interpreter of plans and the in-memory journal.
//!
//! A run is the deterministic replay of a plan over a journal: every step
//! execution is recorded under its execution path (`lookups/billing/invoices`,
//! `scans[3]/page`), and executing a path that the journal already holds takes
//! the recorded outcome instead of running the step again. Resuming after an
//! approval and recovering after a crash are both that replay.
//!
//! This crate holds what a run needs and nothing durable: the interpreter,
//! the traits of the services it calls (`services`), the journal's
//! vocabulary, and `memory::MemoryStore`. `flow-runtime` adds the stores
//! and providers and re-exports these modules under the same paths;
//! `flowc test` links this crate alone, so the compiler's driver carries no
//! database or HTTP client.

pub mod approval;
mod bounded;
pub mod destination;
pub mod error;
pub mod eval;
pub mod interp;
pub mod journal;
pub mod kb;
pub mod memory;
pub mod offline;
mod preflight;
pub mod schema;
pub mod scope;
pub mod services;
pub mod stall;
pub mod sync;
pub mod test_from;
pub mod time;

pub use interp::run;
pub use journal::Outcome;
pub use services::Services;
