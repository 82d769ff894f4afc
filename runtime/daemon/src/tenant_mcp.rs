//! MCP for tenants: which servers and tools an account's workflows may use,
//! and the client their runs call servers through.
//!
//! Only the operator decides what runs on flowd's host (ARCHITECTURE.md,
//! "Trust model"). A plan names MCP servers; here a name means the
//! operator's `[mcp.servers.NAME]` and nothing else, and only when the
//! account's `mcp_servers` lists it. The plan's own command, arguments,
//! environment or URL are never used (the pool is configured with
//! `servers_from_plans: false`), so a deployed plan cannot choose a process
//! or an address, whatever it declares. A deploy and every start check the
//! plan against the configuration of the moment; each call checks again, for
//! runs that started under an older configuration.
//!
//! A server's failure is shown to the tenant without what only the operator
//! may see (the server's command line or URL, what it wrote to stderr, a
//! transport's words), with a reference that the operator finds in flowd's
//! log beside the whole error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flow_plan::{Action, McpServer, Plan, cut};
use flow_runtime::error::{ErrorKind, StepError};
use flow_runtime::journal::Journal;
use flow_runtime::mcp::{McpError, McpScope};
use flow_runtime::services::{BoxFuture, McpClient};
use serde_json::Value;

use crate::config::{Config, Secret};
use crate::server::Daemon;

/// Why a plan may not run for an account: the first refusals (at most
/// `MAX_REFUSALS`), each with a stable code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// `mcp_server_not_allowed` or `mcp_tool_not_allowed`.
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

/// How many refusals a check lists: a plan from outside may declare
/// thousands of servers, and the answer must stay small.
const MAX_REFUSALS: usize = 20;

/// Every MCP server `plan` declares, and every tool its workflows call, that
/// `account` may not use under `config`.
pub(crate) fn refusals(config: &Config, account: &str, plan: &Plan) -> Vec<Refusal> {
    let allowed = &config.people(account).mcp_servers;
    let offer = if allowed.is_empty() {
        "this account may use no MCP server".to_string()
    } else {
        format!("this account may use: {}", allowed.join(", "))
    };
    let mut refusals = Vec::new();
    // Which workflows call each server, for messages; each tool once.
    let mut users: Vec<Vec<&str>> = vec![Vec::new(); plan.mcp_servers.len()];
    let mut calls: Vec<(u32, String, &str)> = Vec::new();
    for workflow in &plan.workflows {
        workflow.each_step(&mut |step| {
            if let Action::Browser(browser) = &step.action {
                let (server, tool) = (&browser.server, &browser.tool);
                if let Some(users) = users.get_mut(*server as usize)
                    && !users.contains(&workflow.name.as_str())
                {
                    users.push(&workflow.name);
                }
                if !calls.iter().any(|(s, t, _)| s == server && t == tool) {
                    calls.push((*server, tool.clone(), &workflow.name));
                }
            }
        });
    }
    for (index, server) in plan.mcp_servers.iter().enumerate() {
        let configured = config.mcp.servers.contains_key(&server.name);
        if configured && allowed.contains(&server.name) {
            continue;
        }
        let user = match users[index].as_slice() {
            [] => "the plan declares".to_string(),
            [one] => format!("workflow `{one}` uses"),
            many => format!("workflows `{}` use", many.join("`, `")),
        };
        refusals.push(Refusal {
            code: "mcp_server_not_allowed",
            message: cut(
                &format!(
                    "{user} MCP server `{}`, which this account may not use ({offer}); a workflow on flowd uses the servers the operator configures (`[mcp.servers.{}]` in flowd.toml) and allows for the account (`mcp_servers` of its [[accounts]] entry), never a command or URL of its own",
                    server.name, server.name
                ),
                600,
            ),
        });
    }
    for (server, tool, workflow) in calls {
        let Some(name) = plan.mcp_servers.get(server as usize).map(|s| &s.name) else {
            continue;
        };
        let Some(entry) = config.mcp.servers.get(name) else {
            continue;
        };
        if !allowed.contains(name) || entry.allows_tool(&tool) {
            continue;
        }
        refusals.push(Refusal {
            code: "mcp_tool_not_allowed",
            message: cut(
                &format!(
                    "workflow `{workflow}` calls `{tool}` of MCP server `{name}`, which the operator does not offer; the operator lists the tools workflows may call in `tools` of [mcp.servers.{name}]"
                ),
                600,
            ),
        });
    }
    refusals.truncate(MAX_REFUSALS);
    refusals
}

/// The MCP client of one invocation of one run: the account's servers only,
/// on connections scoped to the run (or account, as each server's
/// `isolation` says), closed when the invocation ends.
pub(crate) struct TenantMcp {
    daemon: Arc<Daemon>,
    scope: McpScope,
}

impl TenantMcp {
    pub(crate) fn new(daemon: Arc<Daemon>, account: &str, run: &str) -> Self {
        TenantMcp {
            daemon,
            scope: McpScope {
                account: account.to_string(),
                run: run.to_string(),
            },
        }
    }

    /// Why `tool` of `server` may not be called for this account now, if
    /// it may not: the configuration may have changed since the run began.
    fn refusal(&self, server: &McpServer, tool: Option<&str>) -> Option<String> {
        let allowed = &self.daemon.config.people(&self.scope.account).mcp_servers;
        let entry = self.daemon.config.mcp.servers.get(&server.name);
        match entry {
            Some(entry) if allowed.contains(&server.name) => match tool {
                Some(tool) if !entry.allows_tool(tool) => Some(format!(
                    "MCP server `{}` does not offer `{tool}` to workflows here",
                    server.name
                )),
                _ => None,
            },
            _ => Some(format!(
                "MCP server `{}` is not one this account may use",
                server.name
            )),
        }
    }

    /// What the tenant is told of `error`: its message without anything the
    /// operator configured, and a reference to the whole error, which goes
    /// to flowd's log.
    fn tenant_message(&self, error: &McpError) -> String {
        let message = redact(&error.message, &self.daemon.config);
        if error.kind == ErrorKind::Tool && error.detail.is_empty() {
            // The tool's own answer to this call: nothing to look up.
            return format!("MCP server `{}`: {message}", error.server);
        }
        let reference = next_reference("mcp");
        tracing::warn!(
            run = %self.scope.run,
            reference = %reference,
            "MCP: {error}"
        );
        format!(
            "MCP server `{}`: {message} (reference {reference}: the operator finds the details in flowd's log)",
            error.server
        )
    }
}

impl McpClient for TenantMcp {
    fn call_tool<'a>(
        &'a self,
        server: &'a McpServer,
        tool: &'a str,
        args: &'a Value,
        _path: &'a str,
        journal: Option<&'a dyn Journal>,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            if let Some(refusal) = self.refusal(server, Some(tool)) {
                return Err(StepError::new(ErrorKind::Unsupported, refusal));
            }
            // Asked once the call has its turn on the connection.
            let go_ahead = journal.map(|journal| -> flow_runtime::mcp::GoAhead<'_> {
                Box::pin(async move {
                    self.daemon.unless_stopping(&self.scope.account).await;
                    flow_runtime::mcp::go_ahead(journal).await
                })
            });
            self.daemon
                .mcp
                .call_in(&self.scope, server, tool, args, go_ahead)
                .await
                .map_err(|error| StepError::new(error.kind, self.tenant_message(&error)))
        })
    }

    fn check<'a>(
        &'a self,
        server: &'a McpServer,
        tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let refused: Vec<String> = std::iter::once(None)
                .chain(tools.iter().map(|tool| Some(tool.as_str())))
                .filter_map(|tool| self.refusal(server, tool))
                .collect();
            if let Some(first) = refused.into_iter().next() {
                return Err(first);
            }
            let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
            let within = flow_runtime::mcp::McpPoolConfig::default().check_timeout;
            self.daemon
                .mcp
                .check_in(&self.scope, server, &tools, within)
                .await
                .map_err(|error| {
                    let message = self.tenant_message(&error);
                    // Preflight names the server itself.
                    let prefix = format!("MCP server `{}`: ", error.server);
                    message
                        .strip_prefix(&prefix)
                        .map_or(message.clone(), str::to_string)
                })
        })
    }
}

impl Drop for TenantMcp {
    /// The invocation has ended: its run's own connections close, and with
    /// them its browser's pages, cookies and storage.
    fn drop(&mut self) {
        self.daemon.mcp.close_scope(&self.scope);
    }
}

/// `text` without the values the operator configured for MCP servers that
/// could be secrets: URLs, their passwords and query values, `env` values.
/// The messages shown to tenants are built without them already; this is
/// the second line, for words a server or a library put together.
fn redact(text: &str, config: &Config) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    for entry in config.mcp.servers.values() {
        if let Some(Secret(url)) = &entry.url {
            secrets.push(url);
            if let Some((_, rest)) = url.split_once("://")
                && let Some((userinfo, _)) = rest.split_once('@')
            {
                secrets.push(userinfo);
                if let Some((_, password)) = userinfo.split_once(':') {
                    secrets.push(password);
                }
            }
            if let Some((_, query)) = url.split_once('?') {
                secrets.push(query);
                secrets.extend(
                    query
                        .split('&')
                        .filter_map(|pair| pair.split_once('='))
                        .map(|(_, v)| v),
                );
            }
        }
        secrets.extend(entry.env.values().map(|Secret(value)| value.as_str()));
    }
    // Longest first, so that a URL goes whole before its parts.
    secrets.retain(|secret| secret.len() >= 4);
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut text = text.to_string();
    for secret in secrets {
        if text.contains(secret) {
            text = text.replace(secret, "<redacted>");
        }
    }
    text
}

/// A reference for the log, `KIND-...`: unique in this process, and naming
/// no run.
pub(crate) fn next_reference(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{kind}-{:x}-{}",
        flow_runtime::time::now_ms(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
