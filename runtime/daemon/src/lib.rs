//! flowd: the runtime as a service. The library holds what the binary and the
//! end-to-end tests share; `main.rs` only parses the command line.

mod api;
pub mod compile_worker;
pub mod config;
mod connections;
mod counts;
mod deploy_count;
mod destinations;
mod freed_off_worker;
mod inspector;
pub mod links;
mod mailer;
pub mod metrics;
mod migrate;
mod pages;
mod plan_cache;
mod run_graph;
pub mod server;
mod sources;
mod storage;
mod tenant_mcp;
mod tenant_provider;
mod trace_step;
mod traces;
pub mod webhooks;
