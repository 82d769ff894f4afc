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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flow_plan::{Action, Node, OnError, Plan, Step, StepKind, Workflow};
use serde_json::{Map, Value, json};

use crate::approval::{PendingApproval, expire};
use crate::bounded::run_bounded;
use crate::error::{ErrorKind, StepError};
use crate::eval::Env;
use crate::journal::{Attempt, Outcome, StepRecord, StepStatus, Way};
use crate::scope::{Output, Scope};
use crate::services::{
    BoxFuture, CallProgress, Handoff, InFlight, KbDocument, KbWrite, RecipeCall, Repair, Services,
    StepsInFlight,
};
use crate::time::now_ms;

/// A loop iteration or parallel branch once it has run: its scope and how it ended.
type Settled<'a> = BoxFuture<'a, (Arc<Scope>, Result<(), Interrupt>)>;

/// Why a block stopped early.
enum Interrupt {
    Parked,
    Failed {
        error: StepError,
        step: String,
        /// The failed step's attempts (see `Outcome::Failed`).
        attempts: u32,
    },
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
    /// The steps executing now: what a workflow timeout, which drops them,
    /// records of them, and what the run's driver shows as its steps now.
    in_flight: InFlightTable,
    /// The redrive this invocation belongs to (0: the run's first drive).
    round: u32,
}

/// A run's table of its steps in flight: its driver's, when it holds one
/// (`Services::in_flight`), else the interpreter's own, which takes no
/// allocation (a run takes about 300 at B1).
enum InFlightTable {
    Own(StepsInFlight),
    Shared(Arc<StepsInFlight>),
}

impl InFlightTable {
    fn get(&self) -> &StepsInFlight {
        match self {
            InFlightTable::Own(table) => table,
            InFlightTable::Shared(table) => table,
        }
    }
}

/// Runs (or resumes) the workflow `workflow` of `plan` with `input`.
pub async fn run(
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    services: Services,
) -> Outcome {
    run_within(plan, workflow, run_id, input, services, Duration::ZERO, 0).await
}

/// Runs (or resumes) a run that has already been active for `spent`. The
/// workflow's timeout counts active time only: time parked at an approval is
/// not in `spent`. When the budget runs out, everything in flight (other
/// parallel branches and iterations included) is cancelled and the run fails;
/// the cancelled steps have no record, so a later replay would run them again.
///
/// `round` is the run's redrive (0 before any): a step that failed the run
/// in an earlier round runs again, with its retry budget anew; what
/// completed is replayed.
pub async fn run_within(
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    input: Value,
    services: Services,
    spent: Duration,
    round: u32,
) -> Outcome {
    let Some(workflow) = plan.workflow(workflow) else {
        return Outcome::Failed {
            error: StepError::new(
                ErrorKind::Unsupported,
                format!("the plan has no workflow `{workflow}`"),
            ),
            step: None,
            attempts: 0,
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
                attempts: 0,
            };
        }
    };
    let in_flight = match &services.in_flight {
        Some(shared) => InFlightTable::Shared(Arc::clone(shared)),
        None => InFlightTable::Own(StepsInFlight::default()),
    };
    let interpreter = Interpreter {
        plan,
        workflow,
        run_id: run_id.to_string(),
        input,
        services,
        pending: Mutex::new(Vec::new()),
        context: ready.context,
        in_flight,
        round,
    };
    let budget = Duration::from_millis(workflow.timeout_ms).saturating_sub(spent);
    // `timeout` polls once before it checks the clock; a run with no time
    // left must not start at all.
    let outcome = if budget.is_zero() {
        None
    } else {
        // Active time: a stop of the process is not the workflow's.
        crate::stall::timeout(budget, interpreter.workflow()).await
    };
    match outcome {
        Some(outcome) => outcome,
        None => {
            let error = StepError::new(
                ErrorKind::Timeout,
                format!(
                    "the workflow ran past its timeout of {} of active time",
                    flow_plan::written::duration(workflow.timeout_ms)
                ),
            );
            // The work in flight is gone, recorded as cut short first: the
            // handler's `error.step` names the step the timeout stopped.
            let step = interpreter.record_cut_short(workflow.timeout_ms).await;
            // The workflow's handler still runs, seeing the top-level steps
            // that completed (from the journal).
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
                    error: Some(Arc::new(error_value(&error, step.as_deref().unwrap_or("")))),
                    prefix: "on_error/".to_string(),
                };
                let _ = interpreter.block(handler, ctx).await;
            }
            Outcome::Failed {
                error,
                step,
                attempts: 0,
            }
        }
    }
}

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
            Err(Interrupt::Failed {
                error,
                step,
                attempts,
            }) => {
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
                    attempts,
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
                        attempts: 0,
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
            slots: &self.workflow.slots,
            scope: &ctx.scope,
            loops: &ctx.loops,
            error: ctx.error.as_deref(),
            recipe_input,
            output: None,
        }
    }

    fn block<'a>(&'a self, nodes: &'a [Node], ctx: Ctx) -> BoxFuture<'a, Result<(), Interrupt>> {
        Box::pin(async move {
            self.services.journal.went(Way::Entered { at: &ctx.prefix });
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
                id,
                branches,
                otherwise,
            } => {
                let journal = &self.services.journal;
                for (arm, branch) in branches.iter().enumerate() {
                    // A `json` value the checker let through must be a
                    // boolean: one that was not read as false, and the
                    // branch was skipped without a word (an audit).
                    let holds = self
                        .env(ctx, None)
                        .eval(&branch.condition)
                        .and_then(|holds| crate::eval::truthy(&holds))
                        .map_err(|error| self.failed(StepError::from(error), "condition"))?;
                    if holds {
                        journal.went(Way::Arm {
                            at: &ctx.prefix,
                            id,
                            arm,
                        });
                        return self.block(&branch.body, ctx.clone()).await;
                    }
                }
                journal.went(Way::Arm {
                    at: &ctx.prefix,
                    id,
                    arm: branches.len(),
                });
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
                max_items,
                body,
                ..
            } => {
                let items = match self.env(ctx, None).eval(collection) {
                    Ok(Value::Array(items))
                        if max_items.is_some_and(|max| items.len() > max as usize) =>
                    {
                        // The bound `flowc check` took the loop's time from:
                        // past it the workflow could outrun its budget.
                        let error = StepError::new(
                            ErrorKind::Expression,
                            format!(
                                "loop `{id}` has {} items, more than its `max {}`",
                                items.len(),
                                max_items.unwrap_or_default()
                            ),
                        );
                        return Err(self.failed(error, &loop_path(ctx, id)));
                    }
                    Ok(Value::Array(items)) => items,
                    Ok(other) => {
                        let error = StepError::new(
                            ErrorKind::Expression,
                            format!(
                                "loop `{id}` needs a list, found {}",
                                crate::eval::describe(&other)
                            ),
                        );
                        return Err(self.failed(error, &loop_path(ctx, id)));
                    }
                    Err(error) => return Err(self.failed(error.into(), &loop_path(ctx, id))),
                };
                self.services.journal.went(Way::Loop {
                    at: &ctx.prefix,
                    id,
                    items: items.len(),
                });
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
                let mut iterations = Vec::with_capacity(results.len());
                let mut interrupt = None;
                for (scope, result) in results {
                    if let Err(error) = result {
                        interrupt = Some(merge_interrupts(interrupt, error));
                    }
                    iterations.push(scope.own_outputs());
                }
                if let Some(interrupt) = interrupt {
                    return Err(interrupt);
                }
                ctx.scope
                    .set(*slot, Output::Iterations(Arc::new(iterations)));
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
                let mut outputs = Vec::with_capacity(results.len());
                let mut interrupt = None;
                for (branch, (scope, result)) in branches.iter().zip(results) {
                    if let Err(error) = result {
                        interrupt = Some(merge_interrupts(interrupt, error));
                    }
                    outputs.push((branch.name.clone(), scope.own_outputs()));
                    scope.merge_into(&ctx.scope);
                }
                if let Some(interrupt) = interrupt {
                    return Err(interrupt);
                }
                ctx.scope.set(*slot, Output::Branches(Arc::new(outputs)));
                Ok(())
            }
        }
    }

    /// A failure outside a step's attempts (an expression, the journal).
    /// `step` is the execution path of what failed (a step's, a loop's).
    fn failed(&self, error: StepError, step: &str) -> Interrupt {
        Interrupt::Failed {
            error,
            step: step.to_string(),
            attempts: 0,
        }
    }

    async fn step(&self, step: &'p Step, ctx: &Ctx) -> Result<(), Interrupt> {
        // Joined, not `format!`ted: two per step were 3 % of B1's instructions.
        let path = [ctx.prefix.as_str(), step.id.as_str()].concat();
        // A step recorded between two attempts goes on after its last one,
        // as does one that failed the run before this redrive; any other
        // record is the step's outcome.
        let retrying = match self.services.journal.lookup(&path) {
            Some(record) if record.status == StepStatus::Retrying => Some(record),
            Some(record) if self.redrives(step, &record) => Some(record),
            Some(record) => return self.replay(step, ctx, &path, record).await,
            None => None,
        };
        // A redriven step starts anew; its earlier attempts are kept.
        let started_ms = match &retrying {
            Some(record) if record.status == StepStatus::Retrying => record.started_ms,
            _ => now_ms(),
        };
        let kind = self
            .workflow
            .slots
            .get(step.slot as usize)
            .map_or(StepKind::Recipe, |s| s.kind);
        let env = self.env(ctx, None);
        // A step whose arguments cannot be evaluated fails before any attempt.
        let refused = |path: String, error: StepError| {
            self.settle(
                step,
                ctx,
                path,
                kind,
                Value::Null,
                Err(error),
                Vec::new(),
                started_ms,
            )
        };
        let args = match self.args(step, &env) {
            Ok(args) => args,
            Err(error) => return refused(path, error).await,
        };
        if let Action::Approval(approval) = &step.action {
            let flow_plan::ApprovalAction {
                approvers,
                message,
                expires_ms,
                on_reject,
                on_expire,
            } = &**approval;
            let approvers = match approver_list(&env, approvers) {
                Ok(approvers) => approvers,
                Err(error) => return refused(path, error).await,
            };
            let message = env.eval(message).ok().map_or_else(String::new, |m| {
                m.as_str().map_or_else(|| m.to_string(), str::to_string)
            });
            if let Err(error) = message_within_bound("the approval's message", message.len()) {
                return refused(path, error).await;
            }
            let pending = PendingApproval {
                path: path.clone(),
                step_id: step.id.clone(),
                approvers,
                message,
                expires_ms: *expires_ms,
                expires_at: expires_ms
                    .map(|after| crate::time::rfc3339_utc(started_ms.saturating_add(after))),
                on_reject: *on_reject,
                on_expire: *on_expire,
                opened_ms: Some(started_ms),
            };
            let record = StepRecord {
                path: path.clone(),
                step_id: step.id.clone(),
                kind,
                status: StepStatus::Pending,
                input: serde_json::to_value(&pending).unwrap_or(Value::Null),
                output: None,
                error: None,
                attempts: retrying.map(earlier_decisions).unwrap_or_default(),
                started_ms,
                ended_ms: started_ms,
                round: self.round,
            };
            self.journal(step, record).await?;
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(pending);
            return Err(Interrupt::Parked);
        }
        let mut place = None;
        let (made, wait) = match retrying {
            // A redriven step goes at once.
            Some(record) if record.status == StepStatus::Failed => {
                (record.attempts, Duration::ZERO)
            }
            // What is left of the wait its last attempt asked for.
            Some(record) => {
                let wait_ms = record.attempts.last().and_then(|a| a.delay_ms).unwrap_or(0);
                let due_ms = record.ended_ms.saturating_add(wait_ms);
                let left = Duration::from_millis(due_ms.saturating_sub(now_ms()));
                (record.attempts, left)
            }
            None => (Vec::new(), Duration::ZERO),
        };
        // A step that goes at once takes its place first: one waiting for a
        // place is in no table, and a deadline then records no call of it.
        if wait.is_zero() {
            place = self.step_place().await;
        }
        self.in_flight().insert(
            path.clone(),
            InFlight {
                slot: step.slot,
                kind,
                started_ms,
                attempts: made.clone(),
                // Unset while it waits to retry, the rest of the time a
                // call is out (or about to be).
                calling_since: wait.is_zero().then(now_ms),
            },
        );
        let (result, attempts) = self
            .attempts(
                step, &path, &args, ctx, kind, started_ms, made, wait, &mut place,
            )
            .await;
        drop(place);
        // Out of the table before its record is queued, in the same poll:
        // a workflow timeout finds either the step or its record.
        self.in_flight().remove(&path);
        self.settle(step, ctx, path, kind, args, result, attempts, started_ms)
            .await
    }

    /// Whether `record`, this step's, is a failure of an earlier round that
    /// a redrive runs again: one that failed the run (a failure its
    /// `on_error` takes in is kept, as the steps after it saw it).
    fn redrives(&self, step: &Step, record: &StepRecord) -> bool {
        // A failure the step's `on_error` took in stays as it was, since
        // later steps saw it; one the workflow's deadline cut short never
        // reached the policy.
        let cut_short = record.attempts.last().is_some_and(|a| a.cut_short);
        record.status == StepStatus::Failed
            && record.round < self.round
            && (matches!(step.on_error, OnError::Fail) || cut_short)
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<String, InFlight>> {
        self.in_flight.get().table()
    }

    /// Records the steps a workflow timeout cut short as failed by it, with
    /// the attempts they made and the one whose call was out; answers the
    /// path of the one that started first.
    async fn record_cut_short(&self, timeout_ms: u64) -> Option<String> {
        let mut cut: Vec<(String, InFlight)> = self.in_flight().drain().collect();
        // Recorded in path order, whatever order the table holds them in.
        cut.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let first = cut
            .iter()
            .min_by_key(|(_, step)| step.started_ms)
            .map(|(path, _)| path.clone());
        let error = StepError::new(
            ErrorKind::Timeout,
            format!(
                "the workflow's timeout of {} ran out while this step ran",
                flow_plan::written::duration(timeout_ms)
            ),
        );
        for (path, step) in cut {
            let mut attempts = step.attempts;
            // The attempt out, or the last one when the step waited to
            // retry, is marked: the step's `on_error` never saw this
            // failure, and a redrive runs the step again.
            if let Some(called_ms) = step.calling_since {
                attempts.push(Attempt {
                    index: attempts.len() as u32,
                    error: Some(format!("timeout: {}", error.message)),
                    delay_ms: None,
                    round: self.round,
                    repair: false,
                    started_ms: Some(called_ms),
                    ended_ms: Some(now_ms()),
                    cut_short: true,
                });
            } else if let Some(last) = attempts.last_mut() {
                last.cut_short = true;
            }
            let record = StepRecord {
                path,
                step_id: self
                    .workflow
                    .slots
                    .get(step.slot as usize)
                    .map_or_else(String::new, |slot| slot.id.clone()),
                kind: step.kind,
                status: StepStatus::Failed,
                input: Value::Null,
                output: None,
                error: Some(error.clone()),
                attempts,
                started_ms: step.started_ms,
                ended_ms: now_ms(),
                round: self.round,
            };
            // The run fails whatever happens to this record.
            let _ = self.services.journal.record(record).await;
        }
        first
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
                if let Some(expired) = expire(&record, &pending, now_ms(), self.round) {
                    // Journal the expiry as the decision, then replay it.
                    self.journal(step, expired.clone()).await?;
                    return Box::pin(self.replay(step, ctx, path, expired)).await;
                }
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(pending);
                Err(Interrupt::Parked)
            }
            // A retrying record resumes in `step`; here it can only be a
            // record that lost its last attempt, a failure.
            StepStatus::Failed | StepStatus::Retrying => {
                let attempts = record.attempts_made();
                let error = record
                    .error
                    .unwrap_or_else(|| StepError::new(ErrorKind::Server, "failed"));
                self.on_error(step, ctx, path, error, attempts).await
            }
        }
    }

    fn args(&self, step: &Step, env: &Env<'_>) -> Result<Value, StepError> {
        let fields = match &step.action {
            Action::Recipe { args, .. } => args.as_slice(),
            Action::Browser(browser) => browser.args.as_slice(),
            Action::Approval(_) => return Ok(Value::Null),
            Action::KbWrite(write) => {
                let flow_plan::KbWriteAction {
                    collection,
                    title,
                    content,
                    metadata,
                } = &**write;
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
            Action::Handoff(handoff) => {
                let flow_plan::HandoffAction {
                    department,
                    message,
                    subject,
                } = &**handoff;
                let message = env.eval(message)?;
                let subject = subject.as_ref().map(|s| env.eval(s)).transpose()?;
                message_within_bound("the handoff's message", text_len(&message))?;
                if let Some(subject) = &subject {
                    message_within_bound("the handoff's subject", text_len(subject))?;
                }
                return Ok(json!({
                    "department": env.render(department)?,
                    "message": message,
                    "subject": subject,
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

    /// Runs the step's action with its retries and per-attempt timeout,
    /// after the attempts it `made` in earlier invocations and a `wait`
    /// left of their backoff. Before each backoff, the attempts so far are
    /// journaled (`StepStatus::Retrying`), so that however often the
    /// process dies, the step makes at most its allowed attempts, plus the
    /// one whose call was out at a crash.
    #[allow(clippy::too_many_arguments)] // reason: the step's identity and where it resumes; one call site
    async fn attempts(
        &self,
        step: &Step,
        path: &str,
        args: &Value,
        ctx: &Ctx,
        kind: StepKind,
        started_ms: u64,
        made: Vec<Attempt>,
        wait: Duration,
        place: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> (Result<Option<Value>, StepError>, Vec<Attempt>) {
        let mut attempts = made;
        // Every attempt has its own index (its call's identity); the retry
        // budget counts this round's only, every call of it: a repair
        // request too, but that an answer that did not fit always gets its
        // one, past the budget if need be. So `retry N` makes at most N
        // calls, or N + 1 when the last answer is repaired.
        let mut index = attempts.len() as u32;
        let mut tries = attempts.iter().filter(|a| a.round == self.round).count() as u32;
        // Set after an answer that did not fit: the next attempt asks again.
        let mut repair: Option<Repair> = None;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            *place = self.step_place().await;
            self.calling(path);
        }
        loop {
            if repair.is_none() && tries >= step.retry.attempts.max(1) {
                // Only a plan changed under a resumed run gets here.
                let error = StepError::new(ErrorKind::Server, "the step's attempts ran out");
                return (Err(error), attempts);
            }
            // Not once the run is another process's: it runs this step itself.
            if let Err(error) = self.services.journal.admit().await {
                return (Err(error), attempts);
            }
            let call_id = call_id(&self.run_id, path, index);
            let timeout = Duration::from_millis(step.timeout_ms);
            let deadline = tokio::time::Instant::now() + timeout;
            let called_ms = now_ms();
            let progress = CallProgress::default();
            // The step's time, not the process's: an answer that waited
            // in the socket while the process was stopped is taken.
            let result = match crate::stall::timeout(
                timeout,
                self.action(
                    step,
                    args,
                    path,
                    ctx,
                    Attempting {
                        call_id: &call_id,
                        repair: repair.clone(),
                        deadline,
                        progress: &progress,
                    },
                ),
            )
            .await
            {
                Some(result) => result,
                None => Err(self.timed_out(step, &progress)),
            };
            let answered_ms = now_ms();
            let repairing = repair.take();
            match result {
                Ok(output) => {
                    attempts.push(Attempt {
                        index,
                        error: None,
                        delay_ms: None,
                        round: self.round,
                        repair: repairing.is_some(),
                        started_ms: Some(called_ms),
                        ended_ms: Some(answered_ms),
                        cut_short: false,
                    });
                    return (Ok(output), attempts);
                }
                Err(mut error) if repairing.is_none() && error.repairable.is_some() => {
                    // An answer that did not fit: one repair request, at once,
                    // as an attempt of its own.
                    attempts.push(Attempt {
                        index,
                        error: Some(format!("{}: {}", error.kind.name(), error.message)),
                        delay_ms: None,
                        round: self.round,
                        repair: false,
                        started_ms: Some(called_ms),
                        ended_ms: Some(answered_ms),
                        cut_short: false,
                    });
                    repair = error.repairable.take();
                    // Journaled before the repair goes out, as before a
                    // retry: a crash then resumes after the answer that did
                    // not fit, within the budget, rather than afresh.
                    let between = (step, path, kind, args, started_ms);
                    if let Err(error) = self.between_attempts(between, error, &attempts).await {
                        return (Err(error), attempts);
                    }
                    index += 1;
                    tries += 1;
                    continue;
                }
                Err(mut error) => {
                    let last = tries + 1 >= step.retry.attempts || !error.kind.retryable();
                    let delay = (!last).then(|| backoff(step, tries, &error, &call_id));
                    // The wait is held to the backoff's MAX; said, since the
                    // fix (a larger MAX) is the author's, where the step
                    // retries this failure at all.
                    let cap = backoff_cap(step);
                    let retried = error.kind.retryable() && step.retry.attempts > 1;
                    if let Some(asked) = error
                        .retry_after
                        .filter(|_| retried)
                        .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
                        .filter(|asked| *asked > cap)
                    {
                        error.message.push_str(&format!(
                            " (the provider asked to wait {}, past the backoff's MAX of {}: raise MAX for a provider whose limits reset slowly)",
                            flow_plan::written::duration(asked),
                            flow_plan::written::duration(cap)
                        ));
                    }
                    attempts.push(Attempt {
                        index,
                        error: Some(format!("{}: {}", error.kind.name(), error.message)),
                        delay_ms: delay.map(|d| d.as_millis() as u64),
                        round: self.round,
                        repair: repairing.is_some(),
                        started_ms: Some(called_ms),
                        ended_ms: Some(answered_ms),
                        cut_short: false,
                    });
                    let Some(delay) = delay else {
                        return (Err(error), attempts);
                    };
                    if let Some(in_flight) = self.in_flight().get_mut(path) {
                        in_flight.attempts = attempts.clone();
                        in_flight.calling_since = None;
                    }
                    let between = (step, path, kind, args, started_ms);
                    if let Err(error) = self.between_attempts(between, error, &attempts).await {
                        return (Err(error), attempts);
                    }
                    // The account's place is given back for the wait: a
                    // step waiting out a rate limit held it, and a provider
                    // limiting every step stalled the account's other runs.
                    *place = None;
                    tokio::time::sleep(delay).await;
                    *place = self.step_place().await;
                    self.calling(path);
                    // A repair request that failed on the way (a timeout, a
                    // 503) is asked again, not a fresh answer that would
                    // need a repair of its own.
                    repair = repairing;
                }
            }
            index += 1;
            tries += 1;
        }
    }

    /// Journals the step at `path` between two attempts (`Retrying`, with
    /// `error` and the `attempts` so far), so that however often the
    /// process dies, the step makes at most its allowed attempts.
    async fn between_attempts(
        &self,
        (step, path, kind, args, started_ms): (&Step, &str, StepKind, &Value, u64),
        error: StepError,
        attempts: &[Attempt],
    ) -> Result<(), StepError> {
        let retrying = StepRecord {
            path: path.to_string(),
            step_id: step.id.clone(),
            kind,
            status: StepStatus::Retrying,
            input: args.clone(),
            output: None,
            error: Some(error),
            attempts: attempts.to_vec(),
            started_ms,
            ended_ms: now_ms(),
            round: self.round,
        };
        self.services.journal.record(retrying).await
    }

    /// A place among the account's steps executing at once (flowd's
    /// `steps_in_flight`), held while an attempt runs, not while a step
    /// waits to retry; none where there is no such bound. Places closed (a
    /// stopping flowd) start no attempt: the step waits here until its
    /// run's task is stopped, and runs where the run resumes.
    async fn step_place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let places = self.services.steps.as_ref()?;
        match Arc::clone(places).acquire_owned().await {
            Ok(place) => Some(place),
            Err(_closed) => std::future::pending().await,
        }
    }

    /// Notes that the step at `path` is done waiting: its next call goes
    /// out. Only a retry takes the lock; the first attempt needs none.
    fn calling(&self, path: &str) {
        if let Some(in_flight) = self.in_flight().get_mut(path) {
            in_flight.calling_since = Some(now_ms());
        }
    }

    /// The error of an attempt its step's timeout ended: what had not
    /// answered, as far as the provider said (`CallProgress`) or the step
    /// names it.
    fn timed_out(&self, step: &Step, progress: &CallProgress) -> StepError {
        let mut message = format!(
            "the attempt ran past the step's timeout of {}",
            flow_plan::written::duration(step.timeout_ms)
        );
        let stage = progress.said().or_else(|| match &step.action {
            Action::Browser(browser) => {
                let server = self.plan.mcp_servers.get(browser.server as usize)?;
                Some(format!(
                    "the tool `{}` of MCP server `{}` had not answered",
                    browser.tool, server.name
                ))
            }
            _ => None,
        });
        if let Some(stage) = stage {
            message.push_str(": ");
            message.push_str(&stage);
        }
        StepError::new(ErrorKind::Timeout, message)
    }

    async fn action(
        &self,
        step: &Step,
        args: &Value,
        path: &str,
        ctx: &Ctx,
        attempting: Attempting<'_>,
    ) -> Result<Option<Value>, StepError> {
        let Attempting {
            call_id,
            repair,
            deadline,
            progress,
        } = attempting;
        match &step.action {
            Action::Recipe { recipe, .. } => {
                let recipe = self.plan.recipes.get(*recipe as usize).ok_or_else(|| {
                    StepError::new(
                        ErrorKind::Unsupported,
                        "the plan names a recipe it does not hold",
                    )
                })?;
                // The checker proves each argument's type, but lets a
                // `json` value through to a typed input (its shape is known
                // only now): checked here, before the model is asked. A
                // `string` input takes any such value as its JSON text, as
                // the prompt would show it. An input valid as given has no
                // such value (one fails a `string`'s schema): only one that
                // is not is looked at for them, not every step's.
                let mut texts = None;
                let mut mismatches = crate::schema::validate(&recipe.input_schema, args);
                if !mismatches.is_empty() {
                    texts = as_text_where_strings_go(&recipe.input_schema, args);
                    if let Some(texts) = &texts {
                        mismatches = crate::schema::validate(&recipe.input_schema, texts);
                    }
                }
                let args = texts.as_ref().unwrap_or(args);
                if !mismatches.is_empty() {
                    return Err(StepError::new(
                        ErrorKind::Expression,
                        format!(
                            "the input does not match recipe `{}`: {mismatches}",
                            recipe.name
                        ),
                    ));
                }
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
                    path,
                    call_id,
                    repair,
                    journal: Some(self.services.journal.as_ref()),
                    deadline: Some(deadline),
                    progress: Some(progress),
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
            Action::KbWrite(_) => {
                let write: KbWrite = serde_json::from_value(args.clone())
                    .map_err(|e| StepError::new(ErrorKind::Expression, format!("kb_write: {e}")))?;
                named(
                    "kb_write",
                    &[("collection", &write.collection), ("title", &write.title)],
                    write.key.as_deref(),
                )?;
                Ok(Some(self.services.effects.kb_write(&write).await?))
            }
            Action::Handoff(_) => {
                let mut handoff = args.clone();
                if let Some(map) = handoff.as_object_mut() {
                    map.insert("run_id".into(), Value::String(self.run_id.clone()));
                }
                let handoff: Handoff = serde_json::from_value(handoff)
                    .map_err(|e| StepError::new(ErrorKind::Expression, format!("handoff: {e}")))?;
                named(
                    "handoff",
                    &[("department", &handoff.department)],
                    handoff.key.as_deref(),
                )?;
                self.services.effects.handoff(&handoff).await?;
                Ok(None)
            }
            Action::Browser(browser) => {
                let (server, tool) = (&browser.server, &browser.tool);
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
                let journal = Some(self.services.journal.as_ref());
                Ok(Some(
                    mcp.call_tool(server, tool, args, path, journal).await?,
                ))
            }
            Action::Approval(_) => Ok(None),
        }
    }

    /// Journals a step's outcome and applies its error policy.
    #[allow(clippy::too_many_arguments)] // reason: one call site per outcome; a struct would only rename them
    async fn settle(
        &self,
        step: &'p Step,
        ctx: &Ctx,
        path: String,
        kind: StepKind,
        input: Value,
        result: Result<Option<Value>, StepError>,
        attempts: Vec<Attempt>,
        started_ms: u64,
    ) -> Result<(), Interrupt> {
        let (status, output, error) = match result {
            Ok(output) => (StepStatus::Completed, output.map(Arc::new), None),
            Err(error) => (StepStatus::Failed, None, Some(error)),
        };
        let record = StepRecord {
            path,
            step_id: step.id.clone(),
            kind,
            status,
            input,
            output,
            error,
            attempts,
            started_ms,
            ended_ms: now_ms(),
            round: self.round,
        };
        // The output is durable before any later attempt of the run goes
        // out (`Journal::admit`): a dependent step never acts on an output
        // a crash could lose.
        let output = record.output.clone();
        // The path is the record's; a failure's error policy needs a copy.
        let failed = record
            .error
            .clone()
            .map(|error| (error, record.path.clone(), record.attempts_made()));
        self.journal(step, record).await?;
        match failed {
            None => {
                if let Some(output) = output {
                    ctx.scope.set(step.slot, output);
                }
                Ok(())
            }
            Some((error, path, attempts)) => self.on_error(step, ctx, &path, error, attempts).await,
        }
    }

    /// Journals `record`, a record of `step`.
    async fn journal(&self, step: &Step, record: StepRecord) -> Result<(), Interrupt> {
        self.services
            .journal
            .record(record)
            .await
            .map_err(|error| self.failed(error, &step.id))
    }

    async fn on_error(
        &self,
        step: &'p Step,
        ctx: &Ctx,
        path: &str,
        error: StepError,
        attempts: u32,
    ) -> Result<(), Interrupt> {
        match &step.on_error {
            OnError::Fail => Err(Interrupt::Failed {
                error,
                step: path.to_string(),
                attempts,
            }),
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

/// The decisions of a gate that a redrive asks again (its record failed
/// the run: rejected, or expired), as attempts of the new asking: the
/// record that asks again replaces the one that held them, and the trace
/// keeps every decision as it keeps every attempt of a step.
fn earlier_decisions(record: StepRecord) -> Vec<Attempt> {
    let mut attempts = record.attempts;
    let decision = record.output.as_deref();
    let by = decision
        .and_then(|d| d["approver"].as_str())
        .filter(|by| !by.is_empty());
    let comment = decision
        .and_then(|d| d["comment"].as_str())
        .filter(|comment| !comment.is_empty() && by.is_some())
        .map(|comment| format!(": {comment}"))
        .unwrap_or_default();
    let error = record.error.map(|error| match by {
        // The rejection's own message names the approver.
        Some(_) => format!("{}: {}{comment}", error.kind.name(), error.message),
        None => format!("{}: {}", error.kind.name(), error.message),
    });
    attempts.push(Attempt {
        index: attempts.len() as u32,
        error,
        delay_ms: None,
        round: record.round,
        repair: false,
        started_ms: Some(record.started_ms),
        ended_ms: Some(record.ended_ms),
        cut_short: false,
    });
    attempts
}

/// An approval's approvers. An approval nobody may decide would park the run
/// for ever, so an empty list fails the step instead, saying why.
fn approver_list(env: &Env<'_>, approvers: &flow_plan::Expr) -> Result<Vec<String>, StepError> {
    match env.eval(approvers)? {
        Value::Array(items) if items.len() > flow_plan::limits::MAX_APPROVERS => {
            Err(StepError::new(
                ErrorKind::Expression,
                format!(
                    "an approval names {} approvers, more than the {} it may: name an approver group instead",
                    items.len(),
                    flow_plan::limits::MAX_APPROVERS
                ),
            ))
        }
        // A blank name is no one: a gate that only a blank name may decide
        // would be decided by a key that names no person.
        Value::Array(items)
            if items
                .iter()
                .any(|v| v.as_str().is_some_and(|s| s.trim().is_empty())) =>
        {
            Err(StepError::new(
                ErrorKind::Expression,
                "an approval's approvers include a blank name".to_string(),
            ))
        }
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

/// Refuses a message to people (`what`) of `len` bytes past
/// [`flow_plan::limits::MAX_MESSAGE_BYTES`]: stored and sent once for each
/// recipient.
fn message_within_bound(what: &str, len: usize) -> Result<(), StepError> {
    let most = flow_plan::limits::MAX_MESSAGE_BYTES;
    if len <= most {
        return Ok(());
    }
    Err(StepError::new(
        ErrorKind::Expression,
        format!(
            "{what} is {len} bytes, more than the {most} a message to people may have: put the details in a KB document and refer to it"
        ),
    ))
}

/// The bytes of a value as text: a string's own, any other's JSON.
fn text_len(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        other => other.to_string().len(),
    }
}

/// The `error` value in a fallback block.
fn error_value(error: &StepError, step: &str) -> Value {
    json!({ "message": error.message, "kind": error.kind.name(), "step": step })
}

/// What one attempt of a step is: its call's identity, the answer a
/// repair asks about, when its timeout ends it, and where its call
/// stands meanwhile.
struct Attempting<'a> {
    call_id: &'a str,
    repair: Option<Repair>,
    deadline: tokio::time::Instant,
    progress: &'a CallProgress,
}

/// An attempt's identity, `RUN:PATH:INDEX`: what the provider is asked
/// to deduplicate by. Built in one allocation, as it is made for every
/// attempt.
fn call_id(run_id: &str, path: &str, index: u32) -> String {
    use std::fmt::Write;
    let mut id = String::with_capacity(run_id.len() + path.len() + 12);
    id.push_str(run_id);
    id.push(':');
    id.push_str(path);
    id.push(':');
    let _ = write!(id, "{index}");
    id
}

/// Refuses an effect whose names, computed by templates, came out empty
/// (a department, a collection, a title, its idempotency key): the checker
/// refuses them written empty, and a run would have written under nothing,
/// or made every effect keyed `""` one.
fn named(effect: &str, names: &[(&str, &str)], key: Option<&str>) -> Result<(), StepError> {
    let key = key.map(|key| ("idempotency key", key));
    for (what, name) in names.iter().copied().chain(key) {
        if name.trim().is_empty() {
            return Err(StepError::new(
                ErrorKind::Expression,
                format!("{effect}: its {what} is empty, as its template gave it"),
            ));
        }
    }
    Ok(())
}

/// A failure outweighs a park: the run fails even if another branch waits.
fn merge_interrupts(current: Option<Interrupt>, next: Interrupt) -> Interrupt {
    match (current, next) {
        (Some(failed @ Interrupt::Failed { .. }), _) => failed,
        (_, next) => next,
    }
}

/// `min(cap, first · 2^attempt + jitter)`, or the provider's `Retry-After`
/// when it asks for more, within the cap (the design's "honour
/// `Retry-After`, capped": a provider asking for hours does not hold a run
/// for them; the step's `backoff` MAX says how long is worth waiting). The
/// jitter (up to a quarter of the delay) is derived from the call id, so a
/// replay waits the same.
/// The longest wait between two attempts of `step`, in milliseconds.
fn backoff_cap(step: &Step) -> u64 {
    step.retry.backoff_max_ms.max(step.retry.backoff_min_ms)
}

fn backoff(step: &Step, attempt: u32, error: &StepError, call_id: &str) -> Duration {
    let first = step.retry.backoff_min_ms;
    let cap = backoff_cap(step);
    let base = first.saturating_mul(1u64 << attempt.min(32));
    let jitter = crate::offline::seed_of(&[call_id]) % (base / 4 + 1);
    let mut delay = base.saturating_add(jitter).min(cap);
    if let Some(after) = error.retry_after {
        let after = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        delay = delay.max(after.min(cap));
    }
    Duration::from_millis(delay)
}

/// `args` with each value given to a `string` input of `schema` that is
/// an object, a list, a number or a boolean (a `json` value, which the
/// checker lets through) replaced by its JSON text; `None` when there is
/// none such.
fn as_text_where_strings_go(schema: &Value, args: &Value) -> Option<Value> {
    let properties = schema.get("properties")?.as_object()?;
    let given = args.as_object()?;
    let to_text = |name: &String, value: &Value| {
        let string_input = properties
            .get(name)
            .and_then(|field| field.get("type"))
            .is_some_and(|ty| ty == "string");
        string_input && !matches!(value, Value::String(_) | Value::Null)
    };
    if !given.iter().any(|(name, value)| to_text(name, value)) {
        return None;
    }
    let texts = given
        .iter()
        .map(|(name, value)| {
            let value = if to_text(name, value) {
                Value::String(value.to_string())
            } else {
                value.clone()
            };
            (name.clone(), value)
        })
        .collect();
    Some(Value::Object(texts))
}

/// The execution path of loop `id` in `ctx`: a run failed at a nested
/// loop was said to fail at its bare id, which no comparison of versions
/// (`flow redrive --to`) could place.
fn loop_path(ctx: &Ctx, id: &str) -> String {
    format!("{}{id}", ctx.prefix)
}
