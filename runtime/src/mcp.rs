//! Browser steps' MCP client: the pool of `flow-mcp`, as the interpreter's
//! `McpClient`. The pool is a crate of its own so that `flowc lock` asks
//! servers for their tools exactly as a run reaches them, without linking
//! the runtime's stores.

use std::sync::Arc;

pub use flow_mcp::*;
use flow_plan::McpServer;
use serde_json::Value;

use crate::error::StepError;
use crate::journal::Journal;
use crate::services::{BoxFuture, McpClient};

/// A pool as the `McpClient` of runs. The pool and the trait live in two
/// crates that do not know each other (`flow-mcp`, `flow-engine`), so the
/// runtime, which links both, joins them in this wrapper.
#[derive(Debug, Clone)]
pub struct PoolClient(pub Arc<McpPool>);

impl McpClient for PoolClient {
    fn call_tool<'a>(
        &'a self,
        server: &'a McpServer,
        tool: &'a str,
        args: &'a Value,
        _path: &'a str,
        journal: Option<&'a dyn Journal>,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            self.0
                .call_in(
                    &McpScope::default(),
                    server,
                    tool,
                    args,
                    journal.map(go_ahead),
                )
                .await
                .map_err(|error| StepError::new(error.kind, error.to_string()))
        })
    }

    /// Preflight: the server answers and has `tools`. The caller names the
    /// server; the message says how it is reached and what went wrong.
    fn check<'a>(
        &'a self,
        server: &'a McpServer,
        tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
            McpPool::check(&self.0, server, &tools, self.0.check_timeout())
                .await
                .map_err(|error| format!("({}) {}{}", error.how, error.message, error.detail))
        })
    }
}

/// The go-ahead of a run's tool call: its journal's `admit`, asked once
/// the call has its turn.
pub fn go_ahead(journal: &dyn Journal) -> GoAhead<'_> {
    Box::pin(async move {
        journal
            .admit()
            .await
            .map_err(|error| (error.kind, error.message))
    })
}
