//! The interpreter: runs a workflow of a plan as a replay over its journal.
//!
//! Every step execution is recorded under its execution path. Before running a
//! step, the interpreter looks its path up in the journal: a completed step
//! gives its recorded output and is not run again, a decided approval gives its
//! decision, a pending one parks the run again. So resuming after an approval
//! and recovering after a crash are the same operation: run the plan again.
//!
//! Concurrency (parallel branches, loop iterations with `concurrency N`) is
//! cooperative, within the run's task: the work is waiting on providers, and
//! one task per run keeps a run's state free of locks held across awaits.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use flow_plan::{Action, Node, OnError, OnExpire, OnReject, Plan, Step, StepKind, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::eval::{Env, EvalError};
use crate::scope::Scope;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What kind of failure a step attempt had; it decides whether to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// 429: retried, honouring `Retry-After` within the backoff cap.
    RateLimited,
    /// 5xx: retried.
    Server,
    /// The attempt ran past the step's timeout: retried.
    Timeout,
    /// The connection failed or was reset: retried.
    Connection,
    /// Any other 4xx: not retried.
    Client,
    /// The output does not fit the recipe's schema, after the repair attempt.
    InvalidOutput,
    /// An expression could not be evaluated (a `json` value of another shape).
    Expression,
    /// The step needs something this runtime does not have (an MCP client,
    /// an MCP server's command).
    Unsupported,
    /// An MCP tool answered with an error (`isError`, or a JSON-RPC error
    /// about the request such as an unknown tool): not retried, since the
    /// same call would get the same answer. Errors that say they are
    /// transient (a timeout, a reset connection) get those kinds instead.
    Tool,
    /// An approval was rejected with `on_reject: "fail"`.
    Rejected,
    /// An approval expired with `on_expire: "fail"`.
    Expired,
    /// What the run needs is missing or wrong (its input, a model alias, an
    /// MCP server, its knowledge base): nothing ran.
    Preflight,
}

impl ErrorKind {
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Server | ErrorKind::Timeout | ErrorKind::Connection
        )
    }

    fn name(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Server => "server",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Client => "client",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::Expression => "expression",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Tool => "tool",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Expired => "expired",
            ErrorKind::Preflight => "preflight",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepError {
    pub kind: ErrorKind,
    pub message: String,
    /// A provider's `Retry-After`, honoured within the backoff cap.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

impl StepError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> StepError {
        StepError {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<EvalError> for StepError {
    fn from(error: EvalError) -> StepError {
        StepError::new(ErrorKind::Expression, error.0)
    }
}

/// One call of a recipe, as a provider receives it. It borrows from the plan
/// and the step's arguments: a call is made per step, and copying a schema
/// for each would cost more than the engine's own work.
#[derive(Debug, Clone)]
pub struct RecipeCall<'a> {
    pub recipe: &'a str,
    /// The model alias; the provider's configuration resolves it.
    pub model: &'a str,
    pub prompt: String,
    pub input: &'a Value,
    pub output_schema: &'a Value,
    /// Stable identity of this attempt (run id, path, attempt index), for
    /// deterministic providers and idempotent requests.
    pub call_id: String,
}

/// A model provider (OpenAI-compatible, Anthropic, the offline fabricator).
pub trait Provider: Send + Sync {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>>;

    /// What is wrong with calling these model aliases (preflight): nothing,
    /// for a provider that takes any (the offline one; one whose aliases
    /// pass through as model names).
    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        let _ = aliases;
        Vec::new()
    }
}

/// A call to an MCP server's tool.
pub trait McpClient: Send + Sync {
    fn call_tool<'a>(
        &'a self,
        server: &'a flow_plan::McpServer,
        tool: &'a str,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Value, StepError>>;

    /// Whether `server` answers `initialize` and lists every one of `tools`
    /// (preflight); what went wrong otherwise.
    fn check<'a>(
        &'a self,
        server: &'a flow_plan::McpServer,
        tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The effects of KB writes and handoffs, kept by the store.
pub trait Effects: Send + Sync {
    /// Creates or updates a document; the same idempotency key returns the
    /// first write's result instead of writing again.
    fn kb_write<'a>(&'a self, write: &'a KbWrite) -> BoxFuture<'a, Result<Value, StepError>>;
    /// Records an in-app notification for a department; never blocks the run.
    fn handoff<'a>(&'a self, handoff: &'a Handoff) -> BoxFuture<'a, Result<(), StepError>>;
    /// At most `limit` of the run's account's documents that `ids` name (a
    /// collection, or one document as `collection/title`) or that
    /// `department` owns, those that match `terms` best first
    /// (`crate::kb::search_terms`), then the others by collection and title.
    fn kb_context<'a>(
        &'a self,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KbDocument>, StepError>>;
}

/// A knowledge-base document as a recipe's context gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KbDocument {
    pub collection: String,
    pub title: String,
    pub version: i64,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbWrite {
    pub collection: String,
    pub title: String,
    pub content: String,
    pub metadata: Option<Value>,
    pub key: Option<String>,
    /// The department of the workflow that writes: the document becomes
    /// its. A write from a workflow without one keeps the document's owner.
    /// Absent from the arguments journaled before departments existed.
    #[serde(default)]
    pub department: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    pub run_id: String,
    pub department: String,
    pub message: String,
    pub subject: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Completed,
    Failed,
    /// An approval waiting for a decision.
    Pending,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub index: u32,
    pub error: Option<String>,
    /// The wait before the next attempt.
    pub delay_ms: Option<u64>,
}

/// One step execution: the journal's unit and the trace tree's node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRecord {
    pub path: String,
    pub step_id: String,
    pub kind: StepKind,
    pub status: StepStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<StepError>,
    pub attempts: Vec<Attempt>,
    pub started_ms: u64,
    pub ended_ms: u64,
}

/// Where step records go, and where a replay finds them.
pub trait Journal: Send + Sync {
    fn lookup(&self, path: &str) -> Option<StepRecord>;
    /// Whether the run has recorded any step: a resumed invocation, not a
    /// first one.
    fn resumed(&self) -> bool;
    /// Durable before the future resolves, in the stores that promise it.
    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>>;
    /// Whether this invocation may still act for the run: asked before each
    /// attempt of a step goes out. A store whose processes hold runs by
    /// leases answers an error once the lease passed to another process, so
    /// that a process paused past its lease does not repeat the new owner's
    /// work (see `postgres.rs`).
    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// An approval the run is parked at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingApproval {
    pub path: String,
    pub step_id: String,
    pub approvers: Vec<String>,
    pub message: String,
    pub expires_ms: Option<u64>,
    pub on_reject: OnReject,
    pub on_expire: OnExpire,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Completed {
        output: Value,
    },
    Parked {
        pending: Vec<PendingApproval>,
    },
    Failed {
        error: StepError,
        step: Option<String>,
    },
}

/// The services a run uses.
#[derive(Clone)]
pub struct Services {
    pub provider: Arc<dyn Provider>,
    pub effects: Arc<dyn Effects>,
    pub mcp: Option<Arc<dyn McpClient>>,
    pub journal: Arc<dyn Journal>,
    /// Places for steps executing at once, shared by the runs of one
    /// account (flowd): a step holds one from its first attempt until its
    /// record is journaled, so that one account's loop at `concurrency
    /// 1000` runs at most this many steps at a time and cannot fill the
    /// journal's commits and the runtime's threads for everyone else.
    pub steps: Option<Arc<tokio::sync::Semaphore>>,
}

/// A loop iteration or parallel branch once it has run: its scope and how it ended.
type Settled<'a> = BoxFuture<'a, (Arc<Scope>, Result<(), Interrupt>)>;

/// Why a block stopped early.
enum Interrupt {
    Parked,
    Failed { error: StepError, step: String },
}

/// Where a node runs: its scope, its enclosing loops, the error in scope, and
/// the execution path of its parent.
#[derive(Clone)]
struct Ctx {
    scope: Arc<Scope>,
    loops: Arc<Vec<(Arc<Value>, usize)>>,
    error: Option<Arc<Value>>,
    prefix: String,
}

struct Interpreter<'p> {
    plan: &'p Plan,
    workflow: &'p Workflow,
    run_id: String,
    input: Value,
    services: Services,
    pending: Mutex<Vec<PendingApproval>>,
    /// The workflow's `context kb` documents and its department's,
    /// resolved at preflight.
    context: Vec<KbDocument>,
}

/// Runs (or resumes) the workflow `workflow` of `plan` with `input`.
pub async fn run(
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    services: Services,
) -> Outcome {
    run_within(plan, workflow, run_id, input, services, Duration::ZERO).await
}

/// Runs (or resumes) a run that has already been active for `spent`. The
/// workflow's timeout counts active time only: time parked at an approval is
/// not in `spent`. When the budget runs out, everything in flight (other
/// parallel branches and iterations included) is cancelled and the run fails;
/// the cancelled steps have no record, so a later replay would run them again.
pub async fn run_within(
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    services: Services,
    spent: Duration,
) -> Outcome {
    let Some(workflow) = plan.workflow(workflow) else {
        return Outcome::Failed {
            error: StepError::new(
                ErrorKind::Unsupported,
                format!("the plan has no workflow `{workflow}`"),
            ),
            step: None,
        };
    };
    let ready = match crate::preflight::preflight(plan, workflow, &input, &services).await {
        Ok(ready) => ready,
        Err(problems) => {
            return Outcome::Failed {
                error: StepError::new(
                    ErrorKind::Preflight,
                    format!("the run cannot start: {}", problems.join("; ")),
                ),
                step: None,
            };
        }
    };
    let interpreter = Interpreter {
        plan,
        workflow,
        run_id: run_id.to_string(),
        input,
        services,
        pending: Mutex::new(Vec::new()),
        context: ready.context,
    };
    let budget = Duration::from_millis(workflow.timeout_ms).saturating_sub(spent);
    // `timeout` polls once before it checks the clock; a run with no time
    // left must not start at all.
    let outcome = if budget.is_zero() {
        None
    } else {
        tokio::time::timeout(budget, interpreter.workflow())
            .await
            .ok()
    };
    match outcome {
        Some(outcome) => outcome,
        None => {
            let error = StepError::new(
                ErrorKind::Timeout,
                format!(
                    "the workflow ran past its timeout of {} ms of active time",
                    workflow.timeout_ms
                ),
            );
            // The work in flight is gone; the workflow's handler still runs,
            // seeing the top-level steps that completed (from the journal).
            if let OnError::Fallback(handler) = &workflow.on_error {
                let scope = Arc::new(Scope::root(workflow.slots.len()));
                for (slot, info) in workflow.slots.iter().enumerate() {
                    if let Some(StepRecord {
                        status: StepStatus::Completed,
                        output: Some(output),
                        ..
                    }) = interpreter.services.journal.lookup(&info.id)
                    {
                        scope.set(slot as u32, output);
                    }
                }
                let ctx = Ctx {
                    scope,
                    loops: Arc::new(Vec::new()),
                    error: Some(Arc::new(error_value(&error, ""))),
                    prefix: "on_error/".to_string(),
                };
                let _ = interpreter.block(handler, ctx).await;
            }
            Outcome::Failed { error, step: None }
        }
    }
}

pub(crate) use crate::time::now_ms;

impl<'p> Interpreter<'p> {
    async fn workflow(&self) -> Outcome {
        let root = Ctx {
            scope: Arc::new(Scope::root(self.workflow.slots.len())),
            loops: Arc::new(Vec::new()),
            error: None,
            prefix: String::new(),
        };
        match self.block(&self.workflow.body, root.clone()).await {
            Ok(()) => {}
            Err(Interrupt::Parked) => {
                let pending =
                    std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
                return Outcome::Parked { pending };
            }
            Err(Interrupt::Failed { error, step }) => {
                // `on_error continue` on the workflow: a failure ends the run
                // without running the rest, and without output, not as failed.
                if let OnError::Continue = &self.workflow.on_error {
                    return Outcome::Completed {
                        output: Value::Null,
                    };
                }
                if let OnError::Fallback(handler) = &self.workflow.on_error {
                    let ctx = Ctx {
                        error: Some(Arc::new(error_value(&error, &step))),
                        prefix: "on_error/".to_string(),
                        ..root
                    };
                    // The handler's own failure or park does not hide the
                    // failure that ran it.
                    let _ = self.block(handler, ctx).await;
                }
                return Outcome::Failed {
                    error,
                    step: Some(step),
                };
            }
        }
        let env = self.env(&root, None);
        let mut output = Map::new();
        for field in &self.workflow.output {
            match env.eval(&field.value) {
                Ok(value) => {
                    output.insert(field.name.clone(), value);
                }
                Err(error) => {
                    return Outcome::Failed {
                        error: StepError::new(
                            ErrorKind::Expression,
                            format!("output `{}`: {error}", field.name),
                        ),
                        step: None,
                    };
                }
            }
        }
        Outcome::Completed {
            output: Value::Object(output),
        }
    }

    fn env<'a>(
        &'a self,
        ctx: &'a Ctx,
        recipe_input: Option<(&'a [String], &'a Map<String, Value>)>,
    ) -> Env<'a> {
        Env {
            input: &self.input,
            input_fields: &self.workflow.input_fields,
            scope: &ctx.scope,
            loops: &ctx.loops,
            error: ctx.error.as_deref(),
            recipe_input,
        }
    }

    fn block<'a>(&'a self, nodes: &'a [Node], ctx: Ctx) -> BoxFuture<'a, Result<(), Interrupt>> {
        Box::pin(async move {
            for node in nodes {
                self.node(node, &ctx).await?;
            }
            Ok(())
        })
    }

    async fn node(&self, node: &'p Node, ctx: &Ctx) -> Result<(), Interrupt> {
        match node {
            Node::Step(step) => self.step(step, ctx).await,
            Node::Condition {
                branches,
                otherwise,
                ..
            } => {
                for branch in branches {
                    let holds = self
                        .env(ctx, None)
                        .eval(&branch.condition)
                        .map_err(|error| self.failed(StepError::from(error), "condition"))?;
                    if holds == Value::Bool(true) {
                        return self.block(&branch.body, ctx.clone()).await;
                    }
                }
                match otherwise {
                    Some(body) => self.block(body, ctx.clone()).await,
                    None => Ok(()),
                }
            }
            Node::Loop {
                slot,
                id,
                collection,
                concurrency,
                body,
                ..
            } => {
                let items = match self.env(ctx, None).eval(collection) {
                    Ok(Value::Array(items)) => items,
                    Ok(other) => {
                        let error = StepError::new(
                            ErrorKind::Expression,
                            format!(
                                "loop `{id}` needs a list, found {}",
                                crate::eval::describe(&other)
                            ),
                        );
                        return Err(self.failed(error, id));
                    }
                    Err(error) => return Err(self.failed(error.into(), id)),
                };
                let iterations = items.into_iter().enumerate().map(|(index, item)| {
                    let mut loops = (*ctx.loops).clone();
                    loops.push((Arc::new(item), index));
                    let iteration = Ctx {
                        scope: Scope::child(&ctx.scope),
                        loops: Arc::new(loops),
                        error: ctx.error.clone(),
                        prefix: format!("{}{id}[{index}]/", ctx.prefix),
                    };
                    let scope = Arc::clone(&iteration.scope);
                    let run: Settled<'_> =
                        Box::pin(async move { (scope, self.block(body, iteration).await) });
                    run
                });
                // Iterations start as others finish; after one fails or
                // parks, no new one starts (those in flight settle).
                let results =
                    run_bounded(iterations, (*concurrency).max(1) as usize, |(_, result)| {
                        result.is_err()
                    })
                    .await;
                let mut records = Vec::with_capacity(results.len());
                let mut interrupt = None;
                for (scope, result) in results {
                    if let Err(error) = result {
                        interrupt = Some(merge_interrupts(interrupt, error));
                    }
                    records.push(self.record_of(&scope));
                }
                if let Some(interrupt) = interrupt {
                    return Err(interrupt);
                }
                ctx.scope.set(*slot, Value::Array(records));
                Ok(())
            }
            Node::Parallel { slot, id, branches } => {
                let runs: Vec<Settled<'_>> = branches
                    .iter()
                    .map(|branch| {
                        let child = Ctx {
                            scope: Scope::child(&ctx.scope),
                            loops: Arc::clone(&ctx.loops),
                            error: ctx.error.clone(),
                            prefix: format!("{}{id}/{}/", ctx.prefix, branch.name),
                        };
                        let scope = Arc::clone(&child.scope);
                        let run: Settled<'_> =
                            Box::pin(async move { (scope, self.block(&branch.body, child).await) });
                        run
                    })
                    .collect();
                // Every branch settles before the join, whatever the others do.
                let results = run_bounded(runs.into_iter(), branches.len().max(1), |_| false).await;
                let mut record = Map::new();
                let mut interrupt = None;
                for (branch, (scope, result)) in branches.iter().zip(results) {
                    if let Err(error) = result {
                        interrupt = Some(merge_interrupts(interrupt, error));
                    }
                    record.insert(branch.name.clone(), self.record_of(&scope));
                    scope.merge_into(&ctx.scope);
                }
                if let Some(interrupt) = interrupt {
                    return Err(interrupt);
                }
                ctx.scope.set(*slot, Value::Object(record));
                Ok(())
            }
        }
    }

    /// The outputs set in one iteration or branch, by step id.
    fn record_of(&self, scope: &Scope) -> Value {
        let mut record = Map::new();
        for (slot, value) in scope.own_outputs() {
            if let Some(info) = self.workflow.slots.get(slot as usize) {
                record.insert(info.id.clone(), (*value).clone());
            }
        }
        Value::Object(record)
    }

    fn failed(&self, error: StepError, step: &str) -> Interrupt {
        Interrupt::Failed {
            error,
            step: step.to_string(),
        }
    }

    async fn step(&self, step: &'p Step, ctx: &Ctx) -> Result<(), Interrupt> {
        let path = format!("{}{}", ctx.prefix, step.id);
        if let Some(record) = self.services.journal.lookup(&path) {
            return self.replay(step, ctx, &path, record).await;
        }
        let started_ms = now_ms();
        let kind = self
            .workflow
            .slots
            .get(step.slot as usize)
            .map_or(StepKind::Recipe, |s| s.kind);
        let env = self.env(ctx, None);
        // A step whose arguments cannot be evaluated fails before any attempt.
        let refused = |error: StepError| {
            self.settle(
                step,
                ctx,
                &path,
                kind,
                Value::Null,
                Err(error),
                Vec::new(),
                started_ms,
            )
        };
        let args = match self.args(step, &env) {
            Ok(args) => args,
            Err(error) => return refused(error).await,
        };
        if let Action::Approval {
            approvers,
            message,
            expires_ms,
            on_reject,
            on_expire,
        } = &step.action
        {
            let approvers = match approver_list(&env, approvers) {
                Ok(approvers) => approvers,
                Err(error) => return refused(error).await,
            };
            let message = env.eval(message).ok().map_or_else(String::new, |m| {
                m.as_str().map_or_else(|| m.to_string(), str::to_string)
            });
            let pending = PendingApproval {
                path: path.clone(),
                step_id: step.id.clone(),
                approvers,
                message,
                expires_ms: *expires_ms,
                on_reject: *on_reject,
                on_expire: *on_expire,
            };
            let record = StepRecord {
                path: path.clone(),
                step_id: step.id.clone(),
                kind,
                status: StepStatus::Pending,
                input: serde_json::to_value(&pending).unwrap_or(Value::Null),
                output: None,
                error: None,
                attempts: Vec::new(),
                started_ms,
                ended_ms: started_ms,
            };
            self.journal(record).await?;
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(pending);
            return Err(Interrupt::Parked);
        }
        let _place = match &self.services.steps {
            Some(places) => places.acquire().await.ok(),
            None => None,
        };
        let (result, attempts) = self.attempts(step, &path, &args, ctx).await;
        self.settle(step, ctx, &path, kind, args, result, attempts, started_ms)
            .await
    }

    /// A step the journal already holds: its recorded outcome, not a new run.
    async fn replay(
        &self,
        step: &'p Step,
        ctx: &Ctx,
        path: &str,
        record: StepRecord,
    ) -> Result<(), Interrupt> {
        match record.status {
            StepStatus::Completed => {
                if let Some(output) = record.output {
                    ctx.scope.set(step.slot, output);
                }
                Ok(())
            }
            StepStatus::Pending => {
                let Ok(pending) = serde_json::from_value::<PendingApproval>(record.input.clone())
                else {
                    return Err(Interrupt::Parked);
                };
                if let Some(expired) = expire(&record, &pending, now_ms()) {
                    // Journal the expiry as the decision, then replay it.
                    self.journal(expired.clone()).await?;
                    return Box::pin(self.replay(step, ctx, path, expired)).await;
                }
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(pending);
                Err(Interrupt::Parked)
            }
            StepStatus::Failed => {
                let error = record
                    .error
                    .unwrap_or_else(|| StepError::new(ErrorKind::Server, "failed"));
                self.on_error(step, ctx, path, error).await
            }
        }
    }

    fn args(&self, step: &Step, env: &Env<'_>) -> Result<Value, StepError> {
        let fields = match &step.action {
            Action::Recipe { args, .. } | Action::Browser { args, .. } => args.as_slice(),
            Action::Approval { .. } => return Ok(Value::Null),
            Action::KbWrite {
                collection,
                title,
                content,
                metadata,
            } => {
                let mut args = json!({
                    "collection": env.render(collection)?,
                    "title": env.eval(title)?,
                    "content": env.eval(content)?,
                    "metadata": metadata.as_ref().map(|m| env.eval(m)).transpose()?,
                    "key": self.key(step, env)?,
                });
                if let Some(department) = &self.workflow.department {
                    args["department"] = Value::String(department.clone());
                }
                return Ok(args);
            }
            Action::Handoff {
                department,
                message,
                subject,
            } => {
                return Ok(json!({
                    "department": env.render(department)?,
                    "message": env.eval(message)?,
                    "subject": subject.as_ref().map(|s| env.eval(s)).transpose()?,
                    "key": self.key(step, env)?,
                }));
            }
        };
        let mut map = Map::with_capacity(fields.len());
        for field in fields {
            map.insert(field.name.clone(), env.eval(&field.value)?);
        }
        Ok(Value::Object(map))
    }

    fn key(&self, step: &Step, env: &Env<'_>) -> Result<Option<String>, StepError> {
        Ok(match &step.idempotency_key {
            Some(key) => Some(match env.eval(key)? {
                Value::String(text) => text,
                other => other.to_string(),
            }),
            None => None,
        })
    }

    /// Runs the step's action with its retries and per-attempt timeout.
    async fn attempts(
        &self,
        step: &Step,
        path: &str,
        args: &Value,
        ctx: &Ctx,
    ) -> (Result<Option<Value>, StepError>, Vec<Attempt>) {
        let mut attempts = Vec::new();
        let mut index = 0;
        loop {
            // Not once the run is another process's: it runs this step itself.
            if let Err(error) = self.services.journal.admit().await {
                return (Err(error), attempts);
            }
            let call_id = format!("{}:{path}:{index}", self.run_id);
            let timeout = Duration::from_millis(step.timeout_ms);
            let result =
                match tokio::time::timeout(timeout, self.action(step, args, &call_id, ctx)).await {
                    Ok(result) => result,
                    Err(_) => Err(StepError::new(
                        ErrorKind::Timeout,
                        format!(
                            "the attempt ran past the step's timeout of {} ms",
                            step.timeout_ms
                        ),
                    )),
                };
            match result {
                Ok(output) => {
                    attempts.push(Attempt {
                        index,
                        error: None,
                        delay_ms: None,
                    });
                    return (Ok(output), attempts);
                }
                Err(error) => {
                    let last = index + 1 >= step.retry.attempts || !error.kind.retryable();
                    let delay = (!last).then(|| backoff(step, index, &error, &call_id));
                    attempts.push(Attempt {
                        index,
                        error: Some(format!("{}: {}", error.kind.name(), error.message)),
                        delay_ms: delay.map(|d| d.as_millis() as u64),
                    });
                    match delay {
                        Some(delay) => tokio::time::sleep(delay).await,
                        None => return (Err(error), attempts),
                    }
                }
            }
            index += 1;
        }
    }

    async fn action(
        &self,
        step: &Step,
        args: &Value,
        call_id: &str,
        ctx: &Ctx,
    ) -> Result<Option<Value>, StepError> {
        match &step.action {
            Action::Recipe { recipe, .. } => {
                let recipe = self.plan.recipes.get(*recipe as usize).ok_or_else(|| {
                    StepError::new(
                        ErrorKind::Unsupported,
                        "the plan names a recipe it does not hold",
                    )
                })?;
                let no_inputs = Map::new();
                let inputs = args.as_object().unwrap_or(&no_inputs);
                let prompt = self
                    .env(ctx, Some((&recipe.input_fields, inputs)))
                    .render(&recipe.prompt)?;
                // The workflow's documents, then the recipe's own, ranked
                // against what this call asks.
                let own = if recipe.context.is_empty() {
                    Vec::new()
                } else {
                    let terms = crate::kb::search_terms(&prompt);
                    self.services
                        .effects
                        .kb_context(&recipe.context, None, &terms, crate::kb::MOST_DOCUMENTS)
                        .await?
                };
                let prompt =
                    crate::kb::with_context(prompt, &crate::kb::merged(&self.context, own));
                let call = RecipeCall {
                    recipe: &recipe.name,
                    model: &recipe.model,
                    prompt,
                    input: args,
                    output_schema: &recipe.output_schema,
                    call_id: call_id.to_string(),
                };
                let output = self.services.provider.complete(&call).await?;
                let mismatches = crate::schema::validate(&recipe.output_schema, &output);
                if !mismatches.is_empty() {
                    return Err(StepError::new(
                        ErrorKind::InvalidOutput,
                        format!(
                            "the output does not match recipe `{}`: {mismatches}",
                            recipe.name
                        ),
                    ));
                }
                Ok(Some(output))
            }
            Action::KbWrite { .. } => {
                let write: KbWrite = serde_json::from_value(args.clone())
                    .map_err(|e| StepError::new(ErrorKind::Expression, format!("kb_write: {e}")))?;
                Ok(Some(self.services.effects.kb_write(&write).await?))
            }
            Action::Handoff { .. } => {
                let mut handoff = args.clone();
                if let Some(map) = handoff.as_object_mut() {
                    map.insert("run_id".into(), Value::String(self.run_id.clone()));
                }
                let handoff: Handoff = serde_json::from_value(handoff)
                    .map_err(|e| StepError::new(ErrorKind::Expression, format!("handoff: {e}")))?;
                self.services.effects.handoff(&handoff).await?;
                Ok(None)
            }
            Action::Browser { server, tool, .. } => {
                let Some(mcp) = &self.services.mcp else {
                    return Err(StepError::new(
                        ErrorKind::Unsupported,
                        format!("no MCP client configured: cannot call `{tool}`"),
                    ));
                };
                let server = self.plan.mcp_servers.get(*server as usize).ok_or_else(|| {
                    StepError::new(
                        ErrorKind::Unsupported,
                        "the plan names an MCP server it does not hold",
                    )
                })?;
                Ok(Some(mcp.call_tool(server, tool, args).await?))
            }
            Action::Approval { .. } => Ok(None),
        }
    }

    /// Journals a step's outcome and applies its error policy.
    #[allow(clippy::too_many_arguments)] // reason: one call site per outcome; a struct would only rename them
    async fn settle(
        &self,
        step: &'p Step,
        ctx: &Ctx,
        path: &str,
        kind: StepKind,
        input: Value,
        result: Result<Option<Value>, StepError>,
        attempts: Vec<Attempt>,
        started_ms: u64,
    ) -> Result<(), Interrupt> {
        let (status, output, error) = match &result {
            Ok(output) => (StepStatus::Completed, output.clone(), None),
            Err(error) => (StepStatus::Failed, None, Some(error.clone())),
        };
        let record = StepRecord {
            path: path.to_string(),
            step_id: step.id.clone(),
            kind,
            status,
            input,
            output: output.clone(),
            error: error.clone(),
            attempts,
            started_ms,
            ended_ms: now_ms(),
        };
        // The output is durable before a dependent step can use it.
        self.journal(record).await?;
        match result {
            Ok(output) => {
                if let Some(output) = output {
                    ctx.scope.set(step.slot, output);
                }
                Ok(())
            }
            Err(error) => self.on_error(step, ctx, path, error).await,
        }
    }

    async fn journal(&self, record: StepRecord) -> Result<(), Interrupt> {
        let step = record.step_id.clone();
        self.services
            .journal
            .record(record)
            .await
            .map_err(|error| self.failed(error, &step))
    }

    async fn on_error(
        &self,
        step: &'p Step,
        ctx: &Ctx,
        path: &str,
        error: StepError,
    ) -> Result<(), Interrupt> {
        match &step.on_error {
            OnError::Fail => Err(self.failed(error, path)),
            OnError::Continue => Ok(()),
            OnError::Fallback(block) => {
                let fallback = Ctx {
                    error: Some(Arc::new(error_value(&error, path))),
                    prefix: format!("{path}/fallback/"),
                    ..ctx.clone()
                };
                self.block(block, fallback).await
            }
        }
    }
}

/// Why a decision on an approval was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    UnknownStep(String),
    NotPending(String),
    Expired(String),
    NotAnApprover {
        approver: String,
        approvers: Vec<String>,
    },
    /// The run has ended (failed or completed): nothing of it is decided any more.
    RunEnded {
        run_id: String,
        status: String,
    },
}

impl std::fmt::Display for DecideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecideError::UnknownStep(path) => write!(f, "no approval at `{path}` in this run"),
            DecideError::NotPending(path) => {
                write!(f, "the approval at `{path}` is already decided")
            }
            DecideError::Expired(path) => write!(
                f,
                "the approval at `{path}` has expired; resuming the run applies its `on_expire`"
            ),
            DecideError::NotAnApprover {
                approver,
                approvers,
            } => write!(
                f,
                "{approver} may not decide this approval; its approvers are {}",
                approvers.join(", ")
            ),
            DecideError::RunEnded { run_id, status } => write!(
                f,
                "run `{run_id}` is {status}: its approvals can no longer be decided"
            ),
        }
    }
}

/// A decision on an approval: who decides (and the approver groups they
/// belong to: an approval may name a group), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approver: String,
    pub groups: Vec<String>,
    pub approved: bool,
    pub comment: Option<String>,
    /// RFC 3339, UTC.
    pub decided_at: String,
}

impl PendingApproval {
    /// Whether `approver`, a member of the approver `groups`, may decide it:
    /// an approval names people and approver groups.
    pub fn may_decide(&self, approver: &str, groups: &[String]) -> bool {
        // Addresses compare without regard to case, as mail delivers them
        // (`Carol@Acme.io` is mailed, then decides as `carol@acme.io`).
        self.approvers
            .iter()
            .any(|a| a.eq_ignore_ascii_case(approver) || groups.contains(a))
    }
}

/// The decision rule, shared by every store: the record of the approval at
/// `path` after `approver` decides it at `now_ms`, or why that is refused.
pub fn decide_record(
    record: Option<&StepRecord>,
    path: &str,
    decision: &Decision,
    now_ms: u64,
) -> Result<StepRecord, DecideError> {
    let Decision {
        approver,
        groups,
        approved,
        comment,
        decided_at,
    } = decision;
    let record = record.ok_or_else(|| DecideError::UnknownStep(path.to_string()))?;
    if record.status != StepStatus::Pending {
        return Err(DecideError::NotPending(path.to_string()));
    }
    let pending: PendingApproval = serde_json::from_value(record.input.clone())
        .map_err(|_| DecideError::UnknownStep(path.to_string()))?;
    if expire(record, &pending, now_ms).is_some() {
        return Err(DecideError::Expired(path.to_string()));
    }
    if !pending.may_decide(approver, groups) {
        return Err(DecideError::NotAnApprover {
            approver: approver.to_string(),
            approvers: pending.approvers,
        });
    }
    // An address is recorded in one spelling, whatever case it came in.
    let approver = if approver.contains('@') {
        approver.to_lowercase()
    } else {
        approver.clone()
    };
    let mut decided = record.clone();
    decided.ended_ms = now_ms;
    decided.output = Some(json!({
        "approved": approved,
        "approver": approver,
        "comment": comment,
        "decided_at": decided_at,
    }));
    if !approved && pending.on_reject == OnReject::Fail {
        decided.status = StepStatus::Failed;
        decided.error = Some(StepError::new(
            ErrorKind::Rejected,
            format!("{approver} rejected the approval"),
        ));
    } else {
        decided.status = StepStatus::Completed;
    }
    Ok(decided)
}

/// When the approval pending in `record` expires (milliseconds since the
/// epoch), if it is a pending approval with an expiry: what a store indexes
/// to find the gates due without reading every record.
pub fn gate_due_ms(record: &StepRecord) -> Option<u64> {
    if record.status != StepStatus::Pending {
        return None;
    }
    let pending: PendingApproval = serde_json::from_value(record.input.clone()).ok()?;
    Some(record.started_ms.saturating_add(pending.expires_ms?))
}

/// The record of an approval whose time ran out, decided by its `on_expire`:
/// `reject` counts as a rejection (then `on_reject` applies), `fail` fails the
/// step. `None` while it has time left or never expires.
pub fn expire(record: &StepRecord, pending: &PendingApproval, now_ms: u64) -> Option<StepRecord> {
    let expires_ms = pending.expires_ms?;
    if now_ms < record.started_ms.saturating_add(expires_ms) {
        return None;
    }
    let mut expired = record.clone();
    expired.ended_ms = now_ms;
    expired.output = Some(json!({
        "approved": false,
        "approver": "",
        "comment": "expired",
        "decided_at": crate::time::rfc3339_utc(now_ms),
    }));
    let fails = match pending.on_expire {
        OnExpire::Fail => true,
        OnExpire::Reject => pending.on_reject == OnReject::Fail,
    };
    if fails {
        expired.status = StepStatus::Failed;
        expired.error = Some(StepError::new(
            ErrorKind::Expired,
            format!("the approval expired after {expires_ms} ms"),
        ));
    } else {
        expired.status = StepStatus::Completed;
    }
    Some(expired)
}

/// An approval's approvers. An approval nobody may decide would park the run
/// for ever, so an empty list fails the step instead, saying why.
fn approver_list(env: &Env<'_>, approvers: &flow_plan::Expr) -> Result<Vec<String>, StepError> {
    match env.eval(approvers)? {
        Value::Array(items) if !items.is_empty() => Ok(items
            .into_iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .collect()),
        other => Err(StepError::new(
            ErrorKind::Expression,
            format!(
                "an approval needs at least one approver, found {}",
                crate::eval::describe(&other)
            ),
        )),
    }
}

/// The `error` value in a fallback block.
fn error_value(error: &StepError, step: &str) -> Value {
    json!({ "message": error.message, "kind": error.kind.name(), "step": step })
}

/// A failure outweighs a park: the run fails even if another branch waits.
fn merge_interrupts(current: Option<Interrupt>, next: Interrupt) -> Interrupt {
    match (current, next) {
        (Some(failed @ Interrupt::Failed { .. }), _) => failed,
        (_, next) => next,
    }
}

/// `min(cap, first · 2^attempt + jitter)`, or the provider's `Retry-After`
/// when it asks for more, within the cap. The jitter (up to a quarter of the
/// delay) is derived from the call id, so a replay waits the same.
fn backoff(step: &Step, attempt: u32, error: &StepError, call_id: &str) -> Duration {
    let first = step.retry.backoff_min_ms;
    let cap = step.retry.backoff_max_ms.max(first);
    let base = first.saturating_mul(1u64 << attempt.min(32));
    let jitter = crate::offline::seed_of(&[call_id]) % (base / 4 + 1);
    let mut delay = base.saturating_add(jitter).min(cap);
    if let Some(after) = error.retry_after {
        let after = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        delay = delay.max(after.min(cap));
    }
    Duration::from_millis(delay)
}

/// Runs futures with at most `limit` in flight, in their order, and returns
/// the results in that order once all that started have settled; after a
/// result for which `stop` holds, no further future starts.
pub(crate) async fn run_bounded<'a, T: Send + 'a>(
    futures: impl Iterator<Item = BoxFuture<'a, T>>,
    limit: usize,
    stop: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut results: Vec<Option<T>> = Vec::new();
    let mut waiting = futures.enumerate();
    let mut running: Vec<(usize, BoxFuture<'a, T>)> = Vec::new();
    let mut stopped = false;
    loop {
        // Futures are created only when they start, so a long loop does not
        // hold every iteration at once.
        while !stopped && running.len() < limit {
            match waiting.next() {
                Some(next) => {
                    results.push(None);
                    running.push(next);
                }
                None => break,
            }
        }
        if running.is_empty() {
            break;
        }
        let (index, result) = FirstReady(&mut running).await;
        stopped |= stop(&result);
        results[index] = Some(result);
    }
    results.into_iter().flatten().collect()
}

/// Resolves with the first of the running futures that completes, removing it.
struct FirstReady<'r, 'a, T>(&'r mut Vec<(usize, BoxFuture<'a, T>)>);

impl<T> Future for FirstReady<'_, '_, T> {
    type Output = (usize, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(usize, T)> {
        let running = &mut *self.0;
        for position in 0..running.len() {
            if let Poll::Ready(result) = running[position].1.as_mut().poll(cx) {
                let (index, _) = running.remove(position);
                return Poll::Ready((index, result));
            }
        }
        Poll::Pending
    }
}
