//! The model provider as a tenant sees it. A failed call keeps its kind,
//! and with it its retries and `Retry-After`, but not the provider's words:
//! they name the operator's endpoint and can quote its organisation or a
//! part of its key (OpenAI's "Incorrect API key provided: sk-...").
//! Those go to flowd's log under a reference that the tenant is given, as
//! for MCP servers (`tenant_mcp`).

use std::sync::Arc;

use flow_runtime::error::{ErrorKind, StepError};
use flow_runtime::services::{BoxFuture, Provider, RecipeCall};
use serde_json::Value;

/// flowd's provider, with its failures told to tenants without the
/// operator's details.
pub(crate) struct TenantProvider {
    pub(crate) inner: Arc<dyn Provider>,
    pub(crate) daemon: Arc<crate::server::Daemon>,
    pub(crate) account: String,
}

impl Provider for TenantProvider {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            // After the account's permit (`LimitedProvider`), before the call.
            self.daemon.unless_stopping(&self.account).await;
            self.inner
                .complete(call)
                .await
                .map_err(|error| tenant_error(error, call.call_id))
        })
    }

    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        self.inner.check_models(aliases)
    }
}

/// `error` as the tenant is told it. An answer that does not fit its
/// recipe is the model's reply about the tenant's own data, and is kept
/// (its repair request needs it).
fn tenant_error(mut error: StepError, call_id: &str) -> StepError {
    if error.kind == ErrorKind::InvalidOutput || error.repairable.is_some() {
        return error;
    }
    let reference = crate::tenant_mcp::next_reference("llm");
    tracing::warn!(
        reference = %reference,
        call = %call_id,
        "model provider: {}",
        error.message
    );
    error.message = format!(
        "the model provider failed ({}) (reference {reference}: the operator finds the details in flowd's log)",
        error.kind.name()
    );
    error
}
