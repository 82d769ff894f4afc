//! Preflight: what a run needs, checked before its first step, every problem
//! listed and nothing run. A resumed invocation (after an approval, after a
//! crash) has steps behind it that failing now would throw away: it checks
//! again only what cannot have changed (the input, the plan), and resolves
//! the workflow's context again without failing on it.
//!
//! * the input against the workflow's input schema;
//! * the plan's mappings: every recipe, MCP server and slot a step names is
//!   in the plan (its format and hash were checked when it was read:
//!   `Plan::from_json`);
//! * the provider knows every model alias the workflow's recipes use;
//! * every MCP server the workflow can call answers `initialize` and lists
//!   the tools it needs (when the runtime has an MCP client);
//! * the workflow's context is resolved, once, for every recipe of the run:
//!   the documents its `context kb` ids name and those its `department`
//!   owns, ranked by the words of the run's input (the prompts do not exist
//!   yet; the input is what the run is about).

use std::collections::BTreeMap;
use std::time::Duration;

use flow_plan::{Action, Plan, Workflow};
use serde_json::Value;

use crate::services::{BoxFuture, KbDocument, Services};

/// How long the MCP servers get to answer, all of them together.
const MCP_WITHIN: Duration = Duration::from_secs(30);

/// What a run gets from its preflight.
pub(crate) struct Ready {
    /// The workflow's `context kb` documents and its department's, for
    /// every recipe call.
    pub(crate) context: Vec<KbDocument>,
}

pub(crate) async fn preflight(
    plan: &Plan,
    workflow: &Workflow,
    input: &Value,
    services: &Services,
) -> Result<Ready, Vec<String>> {
    let mismatches = crate::schema::validate(&workflow.input_schema, input);
    let mut problems: Vec<String> = mismatches
        .iter()
        .map(|mismatch| format!("input: {mismatch}"))
        .collect();
    if mismatches.omitted > 0 {
        problems.push(format!("input: and {} more mismatches", mismatches.omitted));
    }

    let mut models: Vec<String> = Vec::new();
    // Server index to the tools the workflow calls on it.
    let mut servers: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    workflow.each_step(&mut |step| {
        if step.slot as usize >= workflow.slots.len() {
            problems.push(format!(
                "plan: step `{}` has slot {}, the workflow has {}",
                step.id,
                step.slot,
                workflow.slots.len()
            ));
        }
        match &step.action {
            Action::Recipe { recipe, .. } => match plan.recipes.get(*recipe as usize) {
                Some(recipe) if !models.contains(&recipe.model) => {
                    models.push(recipe.model.clone())
                }
                Some(_) => {}
                None => problems.push(format!(
                    "plan: step `{}` names recipe {recipe}, the plan has {}",
                    step.id,
                    plan.recipes.len()
                )),
            },
            Action::Browser(browser) => {
                let (server, tool) = (&browser.server, &browser.tool);
                if (*server as usize) < plan.mcp_servers.len() {
                    let tools = servers.entry(*server).or_default();
                    if !tools.contains(tool) {
                        tools.push(tool.clone());
                    }
                } else {
                    problems.push(format!(
                        "plan: step `{}` names MCP server {server}, the plan has {}",
                        step.id,
                        plan.mcp_servers.len()
                    ));
                }
            }
            _ => {}
        }
    });

    let resumed = services.journal.resumed();
    if !resumed {
        problems.extend(services.provider.check_models(&models));
    }

    if services.mcp.is_none() && !servers.is_empty() {
        let names: Vec<&str> = servers
            .keys()
            .map(|server| plan.mcp_servers[*server as usize].name.as_str())
            .collect();
        problems.push(format!(
            "the workflow calls MCP servers ({}) but this runtime has no MCP client",
            names.join(", ")
        ));
    }
    if let Some(mcp) = services.mcp.as_ref().filter(|_| !resumed) {
        // Asked together, not one after another.
        let checks = servers.iter().map(|(server, tools)| {
            let check: BoxFuture<'_, Option<String>> = Box::pin(async move {
                let server = &plan.mcp_servers[*server as usize];
                mcp.check(server, tools)
                    .await
                    .err()
                    .map(|why| format!("MCP server `{}`: {why}", server.name))
            });
            check
        });
        let all = crate::bounded::run_bounded(checks, servers.len().max(1), |_| false);
        match tokio::time::timeout(MCP_WITHIN, all).await {
            Ok(failed) => problems.extend(failed.into_iter().flatten()),
            Err(_) => problems.push(format!(
                "MCP servers: no answer from all of them within {MCP_WITHIN:?}"
            )),
        }
    }

    let department = workflow.department.as_deref();
    let context = if workflow.context.is_empty() && department.is_none() {
        Vec::new()
    } else {
        let terms = crate::kb::input_terms(input);
        let what = match department {
            Some(department) => format!(
                "the workflow's context {:?} and department `{department}`'s documents",
                workflow.context
            ),
            None => format!("the workflow's context {:?}", workflow.context),
        };
        // The documents the workflow names first; its department's fill
        // the room left. A department's documents pile up (every run of its
        // workflows may write one) and must not push out what the author
        // asked for by name.
        let resolved = async {
            let most = crate::kb::MOST_DOCUMENTS;
            let named = match workflow.context.is_empty() {
                true => Vec::new(),
                false => {
                    services
                        .effects
                        .kb_context(&workflow.context, None, &terms, most)
                        .await?
                }
            };
            let owned = match department {
                Some(department) if named.len() < most => {
                    services
                        .effects
                        .kb_context(&[], Some(department), &terms, most)
                        .await?
                }
                _ => Vec::new(),
            };
            let mut documents = crate::kb::merged(&named, owned);
            documents.truncate(most);
            Ok::<_, crate::error::StepError>(documents)
        };
        match resolved.await {
            Ok(documents) => documents,
            // A resumed run goes on without the context rather than fail.
            Err(error) if resumed => {
                tracing::warn!(
                    "{what} could not be read; the run goes on without them: {}",
                    error.message
                );
                Vec::new()
            }
            Err(error) => {
                problems.push(format!(
                    "knowledge base: {what} could not be read: {}",
                    error.message
                ));
                Vec::new()
            }
        }
    };

    if problems.is_empty() {
        Ok(Ready { context })
    } else {
        Err(problems)
    }
}
