//! Browser steps' MCP client: the pool of `flow-mcp`, as the interpreter's
//! `McpClient`. The pool is a crate of its own so that `flowc lock` asks
//! servers for their tools exactly as a run reaches them, without linking
//! the runtime's stores.

pub use flow_mcp::*;
use flow_plan::McpServer;
use serde_json::Value;

use crate::error::StepError;
use crate::services::{BoxFuture, McpClient};

impl From<McpError> for StepError {
    fn from(error: McpError) -> StepError {
        StepError::new(error.kind, error.to_string())
    }
}

impl McpClient for McpPool {
    fn call_tool<'a>(
        &'a self,
        server: &'a McpServer,
        tool: &'a str,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move { Ok(self.call(server, tool, args).await?) })
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
            McpPool::check(self, server, &tools, self.check_timeout())
                .await
                .map_err(|error| format!("({}) {}{}", error.how, error.message, error.detail))
        })
    }
}
