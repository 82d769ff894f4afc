//! Checking one workflow: step table, definite-run analysis, references and types.
//!
//! Definite-run analysis is structural rather than a data-flow fixpoint, because
//! step ids are unique in a workflow and the control flow is a tree: a step `s`
//! has certainly run at a use `u` when `s` ends before `u` in the source, `s`
//! cannot fail silently (`on_error continue` or `fallback`), and every container
//! of `s` that does not also contain `u` is a parallel branch whose `parallel`
//! has joined before `u`. This costs O(nesting depth) per reference and no
//! per-branch copies of a "ran" set, which keeps 100k-step workflows linear.

use std::collections::HashMap;

use crate::check::env::{Env, McpInfo, require_plain, resolve_fields};
use crate::check::types::Ty;
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, Edit, FileId, Span};
use crate::suggest::{candidates_list, did_you_mean};
use crate::syntax::ROOTS;
use crate::syntax::ast::*;

/// What kind of step an id names.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Recipe(String),
    /// Whether the gate has an `expires`: a test may let only such a gate
    /// expire.
    Approval {
        expires: bool,
    },
    KbWrite,
    Handoff,
    Browser {
        server: String,
        tool: String,
    },
    Loop,
    Parallel,
    /// A step whose statement did not parse.
    Unknown,
}

/// A construct that encloses a step, outermost first in `StepInfo::containers`.
#[derive(Debug, Clone, PartialEq)]
pub enum Container {
    /// Branch `branch` (0 for `if`, then each `else if`, then `else`) of the
    /// `if` statement spanning `span`.
    IfBranch {
        span: Span,
        branch: usize,
    },
    LoopBody {
        id: String,
        span: Span,
    },
    /// A branch of the parallel statement spanning `span`.
    ParallelBranch {
        parallel: String,
        branch: String,
        span: Span,
    },
    /// The fallback block of step `step`.
    Fallback {
        step: String,
        span: Span,
    },
    /// The workflow's `on_error` handler.
    WorkflowHandler {
        span: Span,
    },
}

#[derive(Debug, Clone)]
pub struct StepInfo {
    pub id: String,
    /// Where the id is written.
    pub id_span: Span,
    /// The whole statement, options included.
    pub span: Span,
    pub kind: StepKind,
    /// `None` for steps without output (handoff).
    pub output: Option<Ty>,
    pub containers: Vec<Container>,
    /// `on_error continue` or `fallback`: the step may end without output.
    pub may_fail: bool,
}

#[derive(Debug, Clone)]
pub struct WorkflowInfo {
    pub name: String,
    pub file: FileId,
    pub input: Vec<(String, Ty)>,
    /// Every id of the workflow; its index is the step's slot in the plan.
    pub steps: Vec<StepInfo>,
    pub timeout_ms: u64,
    /// The type of the workflow's `output` record, when it has one.
    pub output: Option<Ty>,
    /// Every `for` loop with the type of its items, for editors: the checker
    /// knows `loop_item`'s type only while it is inside the loop.
    pub loops: Vec<LoopInfo>,
}

#[derive(Debug, Clone)]
pub struct LoopInfo {
    pub id: String,
    /// The whole `for` statement, as in [`Container::LoopBody`].
    pub span: Span,
    pub item: Ty,
}

impl WorkflowInfo {
    pub fn step(&self, id: &str) -> Option<(usize, &StepInfo)> {
        self.steps.iter().enumerate().find(|(_, s)| s.id == id)
    }
}

pub(crate) const DEFAULT_WORKFLOW_TIMEOUT_MS: u64 = 5 * 60 * 1000;
pub(crate) const DEFAULT_STEP_TIMEOUT_MS: u64 = 60 * 1000;
pub(crate) const DEFAULT_ATTEMPTS: i64 = 3;
/// Bounds that keep a plan's numbers meaningful to the runtime: more attempts
/// than this is a loop, not a retry, and more iterations in flight than this
/// would only queue on the account's concurrency limit. They are the plan
/// format's, so that `Plan::validate` refuses exactly what the checker does.
const MAX_ATTEMPTS: i64 = flow_plan::limits::MAX_ATTEMPTS as i64;
const MAX_CONCURRENCY: i64 = flow_plan::limits::MAX_CONCURRENCY as i64;
const MAX_LOOP_ITEMS: i64 = flow_plan::limits::MAX_LOOP_ITEMS as i64;

pub(crate) fn approval_output() -> Ty {
    Ty::record(vec![
        ("approved".into(), Ty::Bool),
        ("approver".into(), Ty::String),
        ("comment".into(), Ty::String.optional()),
        ("decided_at".into(), Ty::String),
    ])
}

pub(crate) fn kb_write_output() -> Ty {
    Ty::record(vec![("id".into(), Ty::String), ("version".into(), Ty::Int)])
}

pub(crate) fn error_ty() -> Ty {
    Ty::record(vec![
        ("message".into(), Ty::String),
        ("kind".into(), Ty::String),
        ("step".into(), Ty::String),
    ])
}

pub(crate) fn approval_params() -> Vec<(String, Ty)> {
    vec![
        ("approvers".into(), Ty::list(Ty::String)),
        ("message".into(), Ty::String),
        ("expires".into(), Ty::Duration.optional()),
        (
            "on_reject".into(),
            Ty::enumeration(vec!["fail".into(), "continue".into()]).optional(),
        ),
        (
            "on_expire".into(),
            Ty::enumeration(vec!["reject".into(), "fail".into()]).optional(),
        ),
    ]
}

pub(crate) fn kb_write_params() -> Vec<(String, Ty)> {
    vec![
        ("title".into(), Ty::String),
        ("content".into(), Ty::String),
        ("metadata".into(), Ty::Json.optional()),
    ]
}

pub(crate) fn handoff_params() -> Vec<(String, Ty)> {
    vec![
        ("message".into(), Ty::String),
        ("subject".into(), Ty::String.optional()),
    ]
}

pub(crate) fn check_workflow(
    decl: &Workflow,
    file: FileId,
    env: &Env,
    locked: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> WorkflowInfo {
    let input = match &decl.input {
        Some(input) => resolve_fields(&input.fields, file, env, diagnostics),
        None => Vec::new(),
    };
    let mut checker = Checker::new(env, file, diagnostics);
    checker.locked = locked;
    checker.input = Ty::record(input.clone());
    if let Some(timeout) = &decl.timeout
        && let Some(ms) = checker.duration(timeout, "a workflow timeout")
    {
        checker.workflow_timeout_ms = ms;
    }
    for context in &decl.context {
        require_plain(context, "a knowledge-base id", file, checker.diagnostics);
    }
    if let Some(department) = &decl.department {
        require_plain(
            department,
            "a workflow's department",
            file,
            checker.diagnostics,
        );
        if department.display_text().trim().is_empty() {
            checker.diagnostics.push(
                Diagnostic::new(
                    Code::BadOption,
                    file,
                    department.span,
                    "a workflow's department has no name",
                )
                .label("empty")
                .hint("name the department that owns the workflow, e.g. `department \"support\"`, or leave the setting out"),
            );
        }
    }
    if let Some(mode) = &decl.durability
        && mode.text != "full"
        && mode.text != "approval"
    {
        let mut diagnostic = Diagnostic::new(Code::BadOption, file, mode.span, format!("unknown durability mode `{}`", mode.text))
            .label("not a durability mode")
            .hint("`durability full` journals every step before dependants run (the default); `durability approval` persists only at pauses and at the end");
        if let Some(best) = did_you_mean(&mode.text, ["full", "approval"]) {
            diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
        }
        checker.diagnostics.push(diagnostic);
    }

    // Pass 1: every id with its containers and output type.
    checker.collect(&decl.body);
    if let Some(ErrorPolicy::Fallback(block)) = &decl.on_error {
        checker
            .containers
            .push(Container::WorkflowHandler { span: block.span });
        checker.collect(&block.stmts);
        checker.containers.pop();
    }

    // Pass 2: references, types and options, in execution order.
    checker.block(&decl.body);
    if let Some(ErrorPolicy::Fallback(block)) = &decl.on_error {
        checker
            .containers
            .push(Container::WorkflowHandler { span: block.span });
        checker.error_in_scope = true;
        checker.block(&block.stmts);
        checker.error_in_scope = false;
        checker.containers.pop();
    }
    let mut output_ty = None;
    if let Some(output) = &decl.output {
        let mut fields: Vec<(String, Ty)> = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for field in &output.fields {
            if seen.contains(&field.name.text.as_str()) {
                checker.diagnostics.push(
                    Diagnostic::new(
                        Code::DuplicateId,
                        file,
                        field.name.span,
                        format!("output field `{}` is given twice", field.name.text),
                    )
                    .label("given again here"),
                );
            }
            seen.push(&field.name.text);
            let ty = checker.expr(&field.value, false);
            fields.push((field.name.text.clone(), ty));
        }
        output_ty = Some(Ty::record(fields));
    }
    for destination in &decl.destinations {
        let output = output_ty.clone().unwrap_or_else(|| Ty::record(Vec::new()));
        checker.destination(destination, output);
    }
    WorkflowInfo {
        name: decl.name.text.clone(),
        file,
        input,
        timeout_ms: checker.workflow_timeout_ms,
        output: output_ty,
        steps: checker.steps,
        loops: checker.loop_infos,
    }
}

/// Checks a value that a test writes (an input, a mock's answer, an
/// expected output) against `expected`, as a step's argument is checked:
/// missing and extra fields, enum variants, types.
pub(crate) fn check_test_value(
    expr: &Expr,
    expected: &Ty,
    what: &str,
    file: FileId,
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) {
    Checker::new(env, file, diagnostics).value(expr, expected, &what);
}

/// The type a test's `output.a.b` reaches in `ty` (the workflow's output),
/// as a reference's path is followed; `Ty::Any` after a reported problem.
/// A field that may be absent is reachable: a test may expect it `null`.
pub(crate) fn test_path_ty(
    ty: Ty,
    segments: &[Segment],
    file: FileId,
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) -> Ty {
    Checker::new(env, file, diagnostics)
        .walk(ty, segments, true, &|| "the workflow's output".to_string())
}

struct Checker<'e, 'd> {
    env: &'e Env,
    /// Whether the caller gave `flow.lock`: then each MCP server's tools are
    /// in its `McpInfo`, or the lock does not cover the server.
    locked: bool,
    file: FileId,
    diagnostics: &'d mut Vec<Diagnostic>,
    steps: Vec<StepInfo>,
    by_id: HashMap<String, usize>,
    /// The containers of the statement being checked (pass 1 and 2 alike).
    containers: Vec<Container>,
    /// Enclosing loops, outermost first: id, item type, and whether the
    /// id was written as the item's name (`ForStmt::names_item`).
    loops: Vec<(String, Ty, bool)>,
    loop_infos: Vec<LoopInfo>,
    error_in_scope: bool,
    workflow_timeout_ms: u64,
    input: Ty,
    /// Whether the references being checked are in a template, where an
    /// absent value renders as empty text.
    in_template: bool,
    /// Set while a destination is checked: what its references may read.
    destination: Option<DestinationScope>,
}

/// What a destination's templates and content may read: the run's input,
/// and its output when every event it is delivered on is `completed` (a
/// failed, cancelled or parked run has none).
struct DestinationScope {
    output: Option<Ty>,
}

/// Where the text of `step` ends: its record or its last option. Its span
/// may reach past a comment that follows it.
fn step_end(step: &Step) -> u32 {
    let options = &step.options;
    let retry = options.retry.as_ref().map(|retry| {
        let backoff = retry.backoff.as_ref().map_or(0, |(_, max)| max.span.end);
        retry.attempts_span.end.max(backoff)
    });
    let on_error = options.on_error.as_ref().map(|policy| match policy {
        ErrorPolicy::Fail(span) | ErrorPolicy::Continue(span) => span.end,
        ErrorPolicy::Fallback(block) => block.span.end,
    });
    [
        Some(step.call.args().span.end),
        retry,
        options.timeout.as_ref().map(|timeout| timeout.span.end),
        on_error,
        options.idempotency.as_ref().map(|key| key.span.end),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(step.span.end)
}

/// The edit that adds `missing` fields, with placeholder values, to the
/// record `args`: after its last field, or inside its braces when it has
/// none. `None` when a field's type has no placeholder.
fn fill_fields(args: &RecordLit, missing: &[&(String, Ty)]) -> Option<Edit> {
    let mut fields = Vec::new();
    for (name, ty) in missing {
        fields.push(format!("{name}: {}", ty.placeholder()?));
    }
    let fields = fields.join(", ");
    Some(match args.fields.last() {
        Some(last) => Edit::insert(last.value.span.end, format!(", {fields}")),
        None => Edit {
            span: args.span,
            text: format!("{{ {fields} }}"),
        },
    })
}

/// Why a step has not certainly run at a use.
pub(crate) enum NotRun {
    Later,
    /// The use is inside the loop or parallel block that the id names.
    Unfinished,
    /// The step is in another branch of the `if` spanning this span.
    OtherIfBranch(Span),
    /// The use is in the step's own fallback block, which runs because the
    /// step failed.
    OwnFallback,
    Container(Container),
    MayFail,
    InHandler,
}

impl NotRun {
    /// Whether the step may or may not have run at the use, so that an
    /// optional use (`?.`, `??`) means something. A step in a sibling branch
    /// (of an `if` or a `parallel`), in a loop body seen from outside, or in
    /// the error handler seen from the body is never there or races with the
    /// use: `?.` would only hide the mistake.
    fn absence_is_possible(&self) -> bool {
        matches!(
            self,
            NotRun::Container(Container::IfBranch { .. } | Container::Fallback { .. })
                | NotRun::MayFail
                | NotRun::InHandler
        )
    }
}

impl<'e, 'd> Checker<'e, 'd> {
    /// A checker of `file` with nothing in scope yet.
    fn new(env: &'e Env, file: FileId, diagnostics: &'d mut Vec<Diagnostic>) -> Self {
        Checker {
            env,
            locked: false,
            file,
            diagnostics,
            steps: Vec::new(),
            by_id: HashMap::new(),
            containers: Vec::new(),
            loops: Vec::new(),
            loop_infos: Vec::new(),
            error_in_scope: false,
            workflow_timeout_ms: DEFAULT_WORKFLOW_TIMEOUT_MS,
            input: Ty::record(Vec::new()),
            in_template: false,
            destination: None,
        }
    }

    fn push(&mut self, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic);
    }

    // ------------------------------------------------------------ pass 1

    fn register(&mut self, info: StepInfo) {
        // A `parallel` with no name (a syntax error) clashes with none.
        if let Some(&first) = self.by_id.get(&info.id).filter(|_| !info.id.is_empty()) {
            let first = &self.steps[first];
            let diagnostic = Diagnostic::new(Code::DuplicateId, self.file, info.id_span, format!("the id `{}` is used twice", info.id))
                .label("used again here")
                .secondary(self.file, first.id_span, "first used here")
                .hint("step, loop and parallel ids are unique in a workflow: they name journal entries and references");
            self.push(diagnostic);
            return;
        }
        self.by_id.insert(info.id.clone(), self.steps.len());
        self.steps.push(info);
    }

    fn collect(&mut self, stmts: &[Stmt]) {
        for stmt in stmts {
            match stmt {
                Stmt::Step(step) => {
                    let (kind, output) = match &step.call {
                        StepCall::Recipe { recipe, .. } => (
                            StepKind::Recipe(recipe.text.clone()),
                            Some(
                                self.env
                                    .recipes
                                    .get(&recipe.text)
                                    .map_or(Ty::Any, |r| r.output.clone()),
                            ),
                        ),
                        StepCall::Approval { args, .. } => (
                            StepKind::Approval {
                                expires: args.fields.iter().any(|f| f.name.text == "expires"),
                            },
                            Some(approval_output()),
                        ),
                        StepCall::KbWrite { .. } => (StepKind::KbWrite, Some(kb_write_output())),
                        StepCall::Handoff { .. } => (StepKind::Handoff, None),
                        StepCall::Browser { server, tool, .. } => (
                            StepKind::Browser {
                                server: server.text.clone(),
                                tool: tool.text.clone(),
                            },
                            Some(Ty::Json),
                        ),
                        StepCall::Broken { .. } => (StepKind::Unknown, Some(Ty::Any)),
                    };
                    let may_fail = matches!(
                        step.options.on_error,
                        Some(ErrorPolicy::Continue(_) | ErrorPolicy::Fallback(_))
                    );
                    self.register(StepInfo {
                        id: step.id.text.clone(),
                        id_span: step.id.span,
                        span: step.span,
                        kind,
                        output,
                        containers: self.containers.clone(),
                        may_fail,
                    });
                    if let Some(ErrorPolicy::Fallback(block)) = &step.options.on_error {
                        self.containers.push(Container::Fallback {
                            step: step.id.text.clone(),
                            span: block.span,
                        });
                        self.collect(&block.stmts);
                        self.containers.pop();
                    }
                }
                Stmt::If(stmt) => {
                    let blocks = stmt.branches.iter().map(|(_, b)| b).chain(&stmt.else_block);
                    for (branch, block) in blocks.enumerate() {
                        self.containers.push(Container::IfBranch {
                            span: stmt.span,
                            branch,
                        });
                        self.collect(&block.stmts);
                        self.containers.pop();
                    }
                }
                Stmt::For(stmt) => {
                    let first = self.steps.len();
                    self.containers.push(Container::LoopBody {
                        id: stmt.id.text.clone(),
                        span: stmt.span,
                    });
                    self.collect(&stmt.body.stmts);
                    self.containers.pop();
                    let iteration = self.outputs_since(first, self.containers.len() + 1);
                    self.register(StepInfo {
                        id: stmt.id.text.clone(),
                        id_span: stmt.id.span,
                        span: stmt.span,
                        kind: StepKind::Loop,
                        output: Some(Ty::list(iteration)),
                        containers: self.containers.clone(),
                        may_fail: false,
                    });
                }
                Stmt::Parallel(stmt) => {
                    let mut branches = Vec::new();
                    let mut names: Vec<&Name> = Vec::new();
                    for branch in &stmt.branches {
                        if let Some(first) = names.iter().find(|n| n.text == branch.name.text) {
                            let diagnostic = Diagnostic::new(
                                Code::DuplicateId,
                                self.file,
                                branch.name.span,
                                format!(
                                    "branch `{}` appears twice in `{}`",
                                    branch.name.text, stmt.id.text
                                ),
                            )
                            .label("used again here")
                            .secondary(
                                self.file,
                                first.span,
                                "first used here",
                            );
                            self.push(diagnostic);
                        }
                        names.push(&branch.name);
                        let first = self.steps.len();
                        self.containers.push(Container::ParallelBranch {
                            parallel: stmt.id.text.clone(),
                            branch: branch.name.text.clone(),
                            span: stmt.span,
                        });
                        self.collect(&branch.body.stmts);
                        self.containers.pop();
                        branches.push((
                            branch.name.text.clone(),
                            self.outputs_since(first, self.containers.len() + 1),
                        ));
                    }
                    self.collect(&stmt.broken);
                    self.register(StepInfo {
                        id: stmt.id.text.clone(),
                        id_span: stmt.id.span,
                        span: stmt.span,
                        kind: StepKind::Parallel,
                        output: Some(Ty::record(branches)),
                        containers: self.containers.clone(),
                        may_fail: false,
                    });
                }
            }
        }
    }

    /// The record of the outputs of the steps registered since `first` that sit
    /// directly in a block at container depth `depth`: one loop iteration or
    /// one parallel branch. Steps that may not run there are optional fields;
    /// steps of nested loops are reached through the nested loop's own list.
    fn outputs_since(&self, first: usize, depth: usize) -> Ty {
        let fields = self.steps[first..]
            .iter()
            .filter_map(|step| {
                let output = step.output.clone()?;
                let inner = &step.containers[depth.min(step.containers.len())..];
                if inner
                    .iter()
                    .any(|c| matches!(c, Container::LoopBody { .. }))
                {
                    return None;
                }
                let certain = !step.may_fail
                    && inner
                        .iter()
                        .all(|c| matches!(c, Container::ParallelBranch { .. }));
                Some((
                    step.id.clone(),
                    if certain { output } else { output.optional() },
                ))
            })
            .collect();
        Ty::Record(fields)
    }

    // ------------------------------------------------------------ pass 2: statements

    fn block(&mut self, stmts: &[Stmt]) {
        for stmt in stmts {
            self.stmt(stmt);
        }
    }

    fn stmt(&mut self, stmt: &Stmt) {
        match stmt {
            Stmt::Step(step) => self.step(step),
            Stmt::If(stmt) => {
                for (condition, _) in &stmt.branches {
                    let ty = self.expr(condition, false);
                    self.expect_bool(condition, &ty);
                }
                let blocks = stmt.branches.iter().map(|(_, b)| b).chain(&stmt.else_block);
                for (branch, block) in blocks.enumerate() {
                    self.containers.push(Container::IfBranch {
                        span: stmt.span,
                        branch,
                    });
                    self.block(&block.stmts);
                    self.containers.pop();
                }
            }
            Stmt::For(stmt) => {
                let ty = self.expr(&stmt.collection, false);
                let item = match ty {
                    Ty::List(item) => std::sync::Arc::unwrap_or_clone(item),
                    Ty::Any | Ty::Json => ty,
                    other => {
                        let mut diagnostic = Diagnostic::new(
                            Code::NotACollection,
                            self.file,
                            stmt.collection.span,
                            format!("`for` needs a list, found `{}`", self.env.show(&other)),
                        )
                        .label("not a list");
                        if let Ty::Optional(inner) = &other
                            && matches!(**inner, Ty::List(_))
                        {
                            diagnostic = diagnostic
                                .hint("the list may be absent: give a default with `?? []`");
                        }
                        self.push(diagnostic);
                        Ty::Any
                    }
                };
                if let Some((concurrency, span)) = stmt.concurrency
                    && !(1..=MAX_CONCURRENCY).contains(&concurrency)
                {
                    self.push(
                        Diagnostic::new(
                            Code::BadOption,
                            self.file,
                            span,
                            format!("`concurrency` is from 1 to {MAX_CONCURRENCY}"),
                        )
                        .label("out of range")
                        .hint("leave it out to run iterations one at a time"),
                    );
                }
                if let Some((max, span)) = stmt.max_items
                    && !(1..=MAX_LOOP_ITEMS).contains(&max)
                {
                    self.push(
                        Diagnostic::new(
                            Code::BadOption,
                            self.file,
                            span,
                            format!("`max` is from 1 to {MAX_LOOP_ITEMS}"),
                        )
                        .label("out of range")
                        .hint("the most items the loop takes: leave it out when there is no bound"),
                    );
                }
                self.loop_infos.push(LoopInfo {
                    id: stmt.id.text.clone(),
                    span: stmt.span,
                    item: item.clone(),
                });
                self.loops
                    .push((stmt.id.text.clone(), item, stmt.names_item));
                self.containers.push(Container::LoopBody {
                    id: stmt.id.text.clone(),
                    span: stmt.span,
                });
                self.block(&stmt.body.stmts);
                self.containers.pop();
                self.loops.pop();
            }
            Stmt::Parallel(stmt) => {
                if stmt.branches.is_empty() && !stmt.recovered {
                    self.push(
                        Diagnostic::new(
                            Code::Member,
                            self.file,
                            stmt.id.span,
                            format!("parallel block `{}` has no branches", stmt.id.text),
                        )
                        .label("empty")
                        .hint("add `branch name { ... }` blocks"),
                    );
                }
                for branch in &stmt.branches {
                    self.containers.push(Container::ParallelBranch {
                        parallel: stmt.id.text.clone(),
                        branch: branch.name.text.clone(),
                        span: stmt.span,
                    });
                    self.block(&branch.body.stmts);
                    self.containers.pop();
                }
            }
        }
    }

    fn step(&mut self, step: &Step) {
        let args = step.call.args();
        match &step.call {
            // Its syntax error is all there is to say about it.
            StepCall::Broken { .. } => return,
            // The recipe is borrowed from the environment, which outlives the
            // checker, so its inputs need no copy per step.
            StepCall::Recipe { recipe, .. } => match self.env.recipes.get(&recipe.text) {
                // A recipe whose inputs did not parse: its syntax error
                // is all there is to say of the call's arguments.
                Some(info) if info.decl.recovered && info.decl.input.is_none() => {}
                Some(info) => {
                    let decl = info
                        .decl
                        .input
                        .as_ref()
                        .map_or(info.decl.name.span, |i| i.span);
                    self.args(
                        args,
                        &info.input,
                        &format_args!("recipe `{}`", recipe.text),
                        Some((info.file, decl)),
                    );
                }
                None => {
                    let names = self.env.recipes.keys().map(String::as_str);
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownRecipe,
                        self.file,
                        recipe.span,
                        format!("unknown recipe `{}`", recipe.text),
                    )
                    .label("no recipe by this name");
                    if let Some(best) = did_you_mean(&recipe.text, names.clone()) {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    diagnostic = if self.env.recipes.is_empty() {
                        diagnostic.hint("no recipe is declared or imported; declare one with `recipe name { ... }` or `import` a file")
                    } else {
                        diagnostic.hint(format!(
                            "the recipes in scope are {}",
                            candidates_list(names)
                        ))
                    };
                    self.push(diagnostic);
                    self.unchecked_args(args);
                }
            },
            StepCall::Approval { .. } => {
                self.args(args, &approval_params(), &"`approval`", None);
                self.approval_literals(args);
            }
            StepCall::KbWrite { collection, .. } => {
                self.template(collection);
                self.args(args, &kb_write_params(), &"`kb_write`", None);
            }
            StepCall::Handoff { department, .. } => {
                self.template(department);
                self.args(args, &handoff_params(), &"`handoff`", None);
            }
            StepCall::Browser { server, tool, .. } => {
                let env = self.env;
                if let Some(info) = env.mcp_servers.get(&server.text) {
                    if self.tool_call(server, tool, args, info) {
                        self.options(step);
                        return;
                    }
                } else {
                    let names = self.env.mcp_servers.keys().map(String::as_str);
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownMcpServer,
                        self.file,
                        server.span,
                        format!("unknown MCP server `{}`", server.text),
                    )
                    .label("no `mcp` declaration by this name");
                    if let Some(best) = did_you_mean(&server.text, names.clone()) {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    diagnostic = if self.env.mcp_servers.is_empty() {
                        diagnostic.hint("declare it: `mcp browser { command \"npx\" args [\"@playwright/mcp\"] }`")
                    } else {
                        diagnostic.hint(format!(
                            "the MCP servers in scope are {}",
                            candidates_list(names)
                        ))
                    };
                    self.push(diagnostic);
                }
                self.unchecked_args(args);
            }
        }
        self.options(step);
    }

    /// The approval's settings decide how the runtime parks the run, before
    /// any value exists, so they are written as literals; and an approval with
    /// no approver could never be decided.
    fn approval_literals(&mut self, args: &RecordLit) {
        for field in &args.fields {
            let literal = match (field.name.text.as_str(), &field.value.kind) {
                // A number has had its missing unit reported.
                ("expires", ExprKind::Duration(_) | ExprKind::Int(_)) => true,
                ("expires", _) => false,
                ("on_reject" | "on_expire", ExprKind::String(lit)) => lit.as_plain().is_some(),
                ("on_reject" | "on_expire", _) => false,
                ("approvers", ExprKind::List(items)) if items.is_empty() => {
                    self.push(
                        Diagnostic::new(
                            Code::BadOption,
                            self.file,
                            field.value.span,
                            "an approval needs at least one approver",
                        )
                        .label("no approver")
                        .hint("name a group or an email: `approvers: [\"billing-leads\"]`"),
                    );
                    true
                }
                _ => true,
            };
            if !literal {
                self.push(
                    Diagnostic::new(
                        Code::BadOption,
                        self.file,
                        field.value.span,
                        format!("`{}` is written as a literal", field.name.text),
                    )
                    .label("not a literal")
                    .hint(if field.name.text == "expires" {
                        "write a duration such as `48h`"
                    } else {
                        "write one of the variants as a string, such as `\"fail\"`"
                    }),
                );
            }
        }
    }

    fn options(&mut self, step: &Step) {
        let options = &step.options;
        let mut attempts = DEFAULT_ATTEMPTS;
        if let Some(retry) = &options.retry {
            attempts = retry.attempts;
            if !(1..=MAX_ATTEMPTS).contains(&retry.attempts) {
                self.push(
                    Diagnostic::new(
                        Code::BadOption,
                        self.file,
                        retry.attempts_span,
                        format!("`retry` counts attempts, from 1 to {MAX_ATTEMPTS}"),
                    )
                    .label("out of range")
                    .hint("`retry 1` runs the step once, without retrying"),
                );
            }
            if let Some((min, max)) = &retry.backoff {
                let min_ms = self.duration(min, "a backoff");
                let max_ms = self.duration(max, "a backoff");
                if let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms)
                    && min_ms > max_ms
                {
                    self.push(
                        Diagnostic::new(
                            Code::BadDuration,
                            self.file,
                            min.span.to(max.span),
                            "the backoff range goes backwards",
                        )
                        .label("the first delay is longer than the cap")
                        .hint("write the shortest delay first: `backoff 2s..30s`"),
                    );
                }
            }
        }
        if let Some(timeout) = &options.timeout
            && let Some(ms) = self.duration(timeout, "a step timeout")
            && ms > self.workflow_timeout_ms
        {
            self.push(
                Diagnostic::new(
                    Code::StepTimeoutExceedsWorkflow,
                    self.file,
                    timeout.span,
                    format!(
                        "step `{}` may run for {}, longer than its workflow's timeout of {}",
                        step.id.text,
                        show_ms(ms),
                        show_ms(self.workflow_timeout_ms)
                    ),
                )
                .label("the workflow deadline cuts this short")
                .hint("raise the workflow's `timeout` or lower the step's"),
            );
        }
        if let Some(key) = &options.idempotency {
            self.value(key, &Ty::String, &"an idempotency key");
        } else if step.call.has_side_effects() && attempts > 1 {
            let retried = if options.retry.is_some() {
                format!("retried up to {attempts} times")
            } else {
                format!("retried ({DEFAULT_ATTEMPTS} attempts by default)")
            };
            let diagnostic = Diagnostic::new(
                    Code::RetriedSideEffect,
                    self.file,
                    step.id.span,
                    format!("`{}` step `{}` is {retried} without an idempotency key", step.call.kind_name(), step.id.text),
                )
                .label("may take effect more than once")
                .hint("add `idempotency \"{{workflow_input.id}}-...\"` after the call, or `retry 1` if duplicates are harmless");
            let diagnostic = match self.idempotency_key(&step.id.text) {
                Some(key) => diagnostic.fix_with(
                    "Add an idempotency key from the input",
                    vec![Edit::insert(
                        step_end(step),
                        format!(" idempotency \"{key}\""),
                    )],
                ),
                None => diagnostic,
            };
            self.push(diagnostic);
        }
        if let Some(ErrorPolicy::Fallback(block)) = &options.on_error {
            let outer = self.error_in_scope;
            self.error_in_scope = true;
            self.containers.push(Container::Fallback {
                step: step.id.text.clone(),
                span: block.span,
            });
            self.block(&block.stmts);
            self.containers.pop();
            self.error_in_scope = outer;
        }
    }

    /// Validates a duration literal and gives its length.
    fn duration(&mut self, duration: &DurationLit, what: &str) -> Option<u64> {
        // Each problem with its hint and, when the hint names one duration,
        // that duration as the fix.
        let problem = match (&duration.unit, duration.amount) {
            (None, amount) => Some((
                format!("{what} needs a unit"),
                format!(
                    "write `{}s` for seconds, or use `ms`, `m`, `h`, `d`",
                    amount.unwrap_or(0)
                ),
                amount.map(|amount| format!("{amount}s")),
            )),
            (Some(unit), amount) if unit_ms(unit).is_none() => {
                // A unit of another tool is converted, not matched by
                // spelling: `2w` is `14d`, not `2d`.
                let meant = foreign_unit_ms(unit)
                    .and_then(|ms| amount?.checked_mul(ms))
                    .filter(|ms| *ms > 0)
                    .map(whole_duration);
                let (hint, fix) = match (meant, did_you_mean(unit, ["ms", "s", "m", "h", "d"])) {
                    (Some(meant), _) => (
                        format!("write `{meant}`: the units are `ms`, `s`, `m`, `h`, `d`"),
                        Some(meant),
                    ),
                    (None, Some(best)) if unit.len() <= 3 => (
                        format!("did you mean `{best}`? the units are `ms`, `s`, `m`, `h`, `d`"),
                        amount.map(|amount| format!("{amount}{best}")),
                    ),
                    _ => ("the units are `ms`, `s`, `m`, `h`, `d`".to_string(), None),
                };
                Some((format!("unknown duration unit `{unit}`"), hint, fix))
            }
            _ => match duration.millis() {
                None => Some((
                    "the duration is too long".to_string(),
                    "use a larger unit or a shorter duration".to_string(),
                    None,
                )),
                Some(0) => Some((
                    format!("{what} cannot be zero"),
                    "give a positive duration".to_string(),
                    None,
                )),
                Some(_) => None,
            },
        };
        match problem {
            Some((message, hint, fix)) => {
                let mut diagnostic =
                    Diagnostic::new(Code::BadDuration, self.file, duration.span, message)
                        .label("invalid duration")
                        .hint(hint);
                if let Some(fix) = fix {
                    diagnostic = diagnostic.fix(fix);
                }
                self.push(diagnostic);
                None
            }
            None => duration.millis(),
        }
    }

    fn expect_bool(&mut self, expr: &Expr, ty: &Ty) {
        match ty {
            Ty::Bool | Ty::Any | Ty::Json => {}
            Ty::Optional(inner) if **inner == Ty::Bool => self.push(
                Diagnostic::new(
                    Code::NonBoolCondition,
                    self.file,
                    expr.span,
                    "the condition is `bool?`, which may be absent",
                )
                .label("may be absent")
                .hint("give it a default: `(...) ?? false`")
                // `??` binds loosest, so the whole condition is its left side.
                .fix_with(
                    "Treat an absent value as `false`",
                    vec![Edit::insert(expr.span.end, " ?? false")],
                ),
            ),
            other => self.push(
                Diagnostic::new(
                    Code::NonBoolCondition,
                    self.file,
                    expr.span,
                    format!("the condition is `{}`, not `bool`", self.env.show(other)),
                )
                .label("not a boolean")
                .hint("compare it: `== \"value\"`, `>= 4`, `!= null`"),
            ),
        }
    }

    // ------------------------------------------------------------ arguments and values

    /// Checks a browser step against its server's tools in `flow.lock`:
    /// the tool exists, its arguments are the tool's and fit its schema.
    /// False when there is nothing to check against (no lock, or the lock
    /// does not have this server as declared), and the arguments are
    /// checked only as expressions.
    fn tool_call(&mut self, server: &Name, tool: &Name, args: &RecordLit, info: &McpInfo) -> bool {
        if !self.locked {
            return false;
        }
        let Some(locked) = &info.locked else {
            self.push(
                Diagnostic::new(
                    Code::McpServerNotLocked,
                    self.file,
                    server.span,
                    format!(
                        "flow.lock has no tools for MCP server `{}` as it is declared",
                        server.text
                    ),
                )
                .label("its tool and arguments are not checked")
                .secondary(info.file, info.decl.span, "declared here")
                .hint("run `flowc lock` on these files to record its tools"),
            );
            return false;
        };
        let Some(found) = locked.tools.iter().find(|t| t.name == tool.text) else {
            let names = locked.tools.iter().map(|t| t.name.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::UnknownMcpTool,
                self.file,
                tool.span,
                format!("MCP server `{}` has no tool `{}`", server.text, tool.text),
            )
            .label("no such tool in flow.lock");
            if let Some(best) = did_you_mean(&tool.text, names.clone()) {
                diagnostic = diagnostic.hint(format!("did you mean `{best}`?"));
            }
            diagnostic = if locked.tools.is_empty() {
                diagnostic.hint("the server listed no tool when flow.lock was taken")
            } else {
                diagnostic.hint(format!("its tools are {}", candidates_list(names)))
            };
            self.push(diagnostic.hint(
                "flow.lock records the tools the server listed; if it has changed, run `flowc lock` again",
            ));
            self.unchecked_args(args);
            return true;
        };
        let given: Vec<&str> = args.fields.iter().map(|f| f.name.text.as_str()).collect();
        let params = crate::lock::tool_params(&found.input_schema, &given);
        self.args(
            args,
            &params,
            &format_args!("tool `{}.{}`", server.text, tool.text),
            None,
        );
        true
    }

    fn unchecked_args(&mut self, args: &RecordLit) {
        for field in &args.fields {
            self.expr(&field.value, false);
        }
    }

    /// Checks a record literal against declared parameters.
    fn args(
        &mut self,
        args: &RecordLit,
        params: &[(String, Ty)],
        callee: &dyn std::fmt::Display,
        decl: Option<(FileId, Span)>,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        // A misspelt argument is reported once, as unknown with a suggestion,
        // not a second time as the missing input it was meant to be.
        let mut suggested: Vec<&str> = Vec::new();
        for field in &args.fields {
            let name = field.name.text.as_str();
            if seen.contains(&name) {
                self.push(
                    Diagnostic::new(
                        Code::DuplicateId,
                        self.file,
                        field.name.span,
                        format!("`{name}` is given twice"),
                    )
                    .label("given again here"),
                );
                continue;
            }
            seen.push(name);
            match params.iter().find(|(n, _)| n == name) {
                Some((_, ty)) => self.value(&field.value, ty, &format_args!("`{name}`")),
                None => {
                    let names = params.iter().map(|(n, _)| n.as_str());
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownArgument,
                        self.file,
                        field.name.span,
                        format!("{callee} has no input `{name}`"),
                    )
                    .label("unknown input");
                    if let Some(best) =
                        did_you_mean(name, names.clone().filter(|n| !seen.contains(n)))
                    {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                        suggested.push(best);
                    }
                    diagnostic = if params.is_empty() {
                        diagnostic.hint(format!("{callee} takes no inputs"))
                    } else {
                        diagnostic.hint(format!("the inputs are {}", candidates_list(names)))
                    };
                    // A step option written as a field, as YAML would.
                    if ["retry", "timeout", "on_error", "idempotency", "backoff"].contains(&name) {
                        diagnostic = diagnostic.hint(format!(
                            "`{name}` is a step option: it comes after the record, as in `step x = recipe {{ ... }} {name} ...`, without `:`"
                        ));
                    }
                    if let Some((file, span)) = decl {
                        diagnostic = diagnostic.secondary(file, span, "inputs declared here");
                    }
                    self.push(diagnostic);
                    self.expr(&field.value, false);
                }
            }
        }
        let missing: Vec<&(String, Ty)> = params
            .iter()
            .filter(|(name, ty)| {
                !ty.is_optional()
                    && !seen.contains(&name.as_str())
                    && !suggested.contains(&name.as_str())
            })
            .collect();
        if !missing.is_empty() {
            let list: Vec<String> = missing.iter().map(|(n, t)| format!("`{n}: {t}`")).collect();
            let message = if missing.len() == 1 {
                format!("{callee} needs the input {}", list[0])
            } else {
                format!("{callee} needs the inputs {}", list.join(", "))
            };
            let mut diagnostic =
                Diagnostic::new(Code::MissingArgument, self.file, args.span, message)
                    .label("missing here");
            if let Some(fill) = fill_fields(args, &missing) {
                let title = if missing.len() == 1 {
                    format!("Add the input `{}`", missing[0].0)
                } else {
                    "Add the missing inputs".to_string()
                };
                diagnostic = diagnostic.fix_with(title, vec![fill]);
            }
            if let Some((file, span)) = decl {
                diagnostic = diagnostic.secondary(file, span, "inputs declared here");
            }
            self.push(diagnostic);
        }
    }

    /// Checks an expression against an expected type, looking inside literals so
    /// that the error lands on the exact element or field. `what` names the
    /// value in messages only, so it is formatted when there is one: a
    /// `format!` per argument of every step was a fifth of the checker's
    /// allocations.
    fn value(&mut self, expr: &Expr, expected: &Ty, what: &dyn std::fmt::Display) {
        match (&expr.kind, expected.required()) {
            (_, Ty::Any | Ty::Json) => {
                self.expr(expr, false);
            }
            (ExprKind::String(lit), Ty::Enum(variants)) if lit.as_plain().is_some() => {
                let text = lit.as_plain().unwrap_or_default();
                if !variants.iter().any(|v| v == text) {
                    self.not_a_variant(
                        expr.span,
                        text,
                        variants,
                        &format!("{what} must be one of"),
                    );
                }
            }
            (ExprKind::Record(record), Ty::Record(fields)) => {
                self.args(record, fields, &format_args!("the record for {what}"), None);
            }
            (ExprKind::List(items), Ty::List(item_ty)) => {
                for item in items {
                    self.value(item, item_ty, &format_args!("an element of {what}"));
                }
            }
            (ExprKind::Null, _) if expected.is_optional() => {}
            // A bare number where a duration goes is a duration without its
            // unit, said as for `timeout 90`.
            (ExprKind::Int(amount), Ty::Duration) => {
                self.duration(
                    &DurationLit {
                        amount: u64::try_from(*amount).ok(),
                        unit: None,
                        span: expr.span,
                    },
                    &what.to_string(),
                );
            }
            _ => {
                let ty = self.expr(expr, false);
                if !ty.assignable_to(expected) {
                    let mut diagnostic = Diagnostic::new(
                        Code::TypeMismatch,
                        self.file,
                        expr.span,
                        format!(
                            "{what} expects `{}`, found `{}`",
                            self.env.show(expected),
                            self.env.show(&ty)
                        ),
                    )
                    .label(format!("this is `{}`", self.env.show(&ty)));
                    if ty.is_optional() && ty.required().assignable_to(expected) {
                        diagnostic = diagnostic
                            .hint("the value may be absent: give a default with `?? ...`");
                    } else if matches!(expected.required(), Ty::Enum(_)) && ty == Ty::String {
                        diagnostic = diagnostic.hint("only a string literal, or a value of an enum type with these variants, fits an enum");
                    }
                    // The alias's expansion helps to see what differs.
                    let named = self.env.show(expected.required()).to_string();
                    let expansion = expected.required().to_string();
                    if named != expansion {
                        diagnostic = diagnostic.hint(format!("`{named}` is `{expansion}`"));
                    }
                    self.push(diagnostic);
                }
            }
        }
    }

    fn not_a_variant(&mut self, span: Span, text: &str, variants: &[String], prefix: &str) {
        let shown: Vec<String> = variants.iter().map(|v| format!("\"{v}\"")).collect();
        let mut diagnostic = Diagnostic::new(
            Code::NotAVariant,
            self.file,
            span,
            format!("\"{text}\" is not a variant: {prefix} {}", shown.join(", ")),
        )
        .label("not a variant");
        if let Some(best) = did_you_mean(text, variants.iter().map(String::as_str)) {
            diagnostic = diagnostic
                .hint(format!("did you mean \"{best}\"?"))
                .fix(format!("\"{best}\""));
        }
        self.push(diagnostic);
    }

    // ------------------------------------------------------------ expressions

    /// A `deliver` setting: its events known and each given once, its
    /// names plain and not empty, its templates and content read against the
    /// workflow's input and `output`.
    fn destination(&mut self, destination: &Destination, output: Ty) {
        let mut seen: Vec<&str> = Vec::new();
        for event in &destination.events {
            let text = event.text.as_str();
            let events = flow_plan::RunEvent::ALL.map(flow_plan::RunEvent::as_str);
            if flow_plan::RunEvent::parse(text).is_none() {
                let mut diagnostic = Diagnostic::new(
                    Code::BadDestination,
                    self.file,
                    event.span,
                    format!("unknown run event `{text}`"),
                )
                .label("not an event");
                if let Some(best) = did_you_mean(text, events) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                } else {
                    diagnostic = diagnostic.hint(format!(
                        "a result is delivered on {}",
                        candidates_list(events)
                    ));
                }
                self.push(diagnostic);
            } else if seen.contains(&text) {
                self.push(
                    Diagnostic::new(
                        Code::BadDestination,
                        self.file,
                        event.span,
                        format!("the event `{text}` is named twice"),
                    )
                    .label("named again here")
                    .hint("name each event once; the destination gets one delivery per event"),
                );
            }
            seen.push(text);
        }
        let completed_only = destination.events.iter().all(|e| e.text == "completed");
        self.destination = Some(DestinationScope {
            output: completed_only.then_some(output),
        });
        let mut names: Vec<(&StringLit, &str)> = Vec::new();
        match &destination.target {
            DestinationTarget::Webhook { endpoint } => {
                names.push((endpoint, "a webhook endpoint's name"));
            }
            DestinationTarget::Email { to, subject, body } => {
                names.extend(to.iter().map(|to| (to, "an email recipient")));
                self.template(subject);
                self.template(body);
            }
            DestinationTarget::Kb {
                collection,
                title,
                content,
            } => {
                names.push((collection, "a destination's knowledge-base collection"));
                self.template(title);
                self.value(content, &Ty::String, &"a document's content");
            }
        }
        self.destination = None;
        for (name, what) in names {
            require_plain(name, what, self.file, self.diagnostics);
            if name.display_text().trim().is_empty() {
                self.push(
                    Diagnostic::new(
                        Code::BadDestination,
                        self.file,
                        name.span,
                        format!("{what} is empty"),
                    )
                    .label("empty")
                    .hint("name what the account calls it in flowd's configuration"),
                );
            }
        }
    }

    /// A reference in a destination: the workflow's input, or its `output`
    /// when the run completed; nothing a step wrote is kept for delivery.
    fn destination_path(&mut self, path: &Path, optional_ok: bool) -> Option<Ty> {
        let scope = self.destination.as_ref()?;
        let root = path.root.text.as_str();
        let segments = path.segments.as_slice();
        match root {
            "workflow_input" => None,
            "output" => match scope.output.clone() {
                Some(output) => Some(self.walk(output, segments, optional_ok, &|| {
                    "the workflow's output".into()
                })),
                None => {
                    self.push(
                        Diagnostic::new(
                            Code::BadDestination,
                            self.file,
                            path.root.span,
                            "`output` is only there when the run completed",
                        )
                        .label("this destination is also delivered on other events")
                        .hint("read `output` in a `deliver on completed` destination, and `workflow_input` in one for other events"),
                    );
                    Some(Ty::Any)
                }
            },
            _ => {
                let mut diagnostic = Diagnostic::new(
                    Code::BadDestination,
                    self.file,
                    path.root.span,
                    format!("a destination cannot read `{root}`"),
                )
                .label("not in a destination's scope");
                if let Some(best) = did_you_mean(root, ["output", "workflow_input"]) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                } else {
                    diagnostic = diagnostic.hint(
                        "a destination reads `output` and `workflow_input`; put what it needs from a step in the workflow's `output`",
                    );
                }
                self.push(diagnostic);
                Some(Ty::Any)
            }
        }
    }

    fn template(&mut self, lit: &StringLit) {
        self.in_template = true;
        for part in &lit.template.parts {
            if let TemplatePart::Ref(path) = part {
                self.path(path, false);
            }
        }
        self.in_template = false;
    }

    /// The type of an expression. `optional_ok`: the expression is the left
    /// side of `??`, where absent values and steps that may not have run are fine.
    fn expr(&mut self, expr: &Expr, optional_ok: bool) -> Ty {
        match &expr.kind {
            ExprKind::Null => Ty::Null,
            ExprKind::Bool(_) => Ty::Bool,
            ExprKind::Int(_) => Ty::Int,
            ExprKind::Float(_) => Ty::Float,
            ExprKind::Duration(duration) => {
                self.duration(duration, "a duration");
                Ty::Duration
            }
            ExprKind::String(lit) => {
                self.template(lit);
                Ty::String
            }
            ExprKind::List(items) => {
                let types: Vec<Ty> = items.iter().map(|item| self.expr(item, false)).collect();
                let first = types.first().cloned().unwrap_or(Ty::Json);
                if types.iter().all(|t| t.assignable_to(&first)) {
                    Ty::list(first)
                } else {
                    Ty::list(Ty::Json)
                }
            }
            ExprKind::Record(record) => {
                let mut fields: Vec<(String, Ty)> = Vec::new();
                for field in &record.fields {
                    let ty = self.expr(&field.value, false);
                    if fields.iter().any(|(n, _)| *n == field.name.text) {
                        self.push(
                            Diagnostic::new(
                                Code::DuplicateId,
                                self.file,
                                field.name.span,
                                format!("`{}` is given twice", field.name.text),
                            )
                            .label("given again here"),
                        );
                    } else {
                        fields.push((field.name.text.clone(), ty));
                    }
                }
                Ty::record(fields)
            }
            ExprKind::Path(path) => self.path(path, optional_ok),
            ExprKind::Not(inner) => {
                let ty = self.expr(inner, false);
                if !matches!(ty, Ty::Bool | Ty::Any | Ty::Json) {
                    self.push(
                        Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            inner.span,
                            format!("`!` needs a `bool`, found `{}`", self.env.show(&ty)),
                        )
                        .label("not a boolean"),
                    );
                }
                Ty::Bool
            }
            ExprKind::Binary(op, left, right) => self.binary(*op, left, right, expr.span),
            ExprKind::Error => Ty::Any,
        }
    }

    fn binary(&mut self, op: BinaryOp, left: &Expr, right: &Expr, span: Span) -> Ty {
        match op {
            BinaryOp::Coalesce => {
                let left_ty = self.expr(left, true);
                let right_ty = self.expr(right, false);
                if !left_ty.is_optional() && !left_ty.is_unchecked() {
                    self.push(
                        Diagnostic::new(
                            Code::NeedlessOptional,
                            self.file,
                            left.span,
                            format!("this is `{left_ty}`, never absent, so `??` never applies"),
                        )
                        .label("always present")
                        .hint("remove `?? ...`"),
                    );
                    return left_ty;
                }
                let inner = left_ty.required().clone();
                // A literal default for an enum value stays an enum, and must be
                // one of its variants.
                if let (Ty::Enum(variants), ExprKind::String(lit)) = (&inner, &right.kind)
                    && let Some(text) = lit.as_plain()
                {
                    if !variants.iter().any(|v| v == text) {
                        self.not_a_variant(
                            right.span,
                            text,
                            variants,
                            "the default must be one of",
                        );
                    }
                    return inner;
                }
                if matches!(left_ty, Ty::Null) || right_ty.assignable_to(&inner) {
                    return if matches!(left_ty, Ty::Null) {
                        right_ty
                    } else {
                        inner_or(inner, &right_ty)
                    };
                }
                if inner.assignable_to(right_ty.required()) {
                    return right_ty;
                }
                self.push(
                    Diagnostic::new(
                        Code::TypeMismatch,
                        self.file,
                        right.span,
                        format!("the default is `{right_ty}` but the value is `{inner}`"),
                    )
                    .label("default of another type"),
                );
                Ty::Any
            }
            BinaryOp::And | BinaryOp::Or => {
                for side in [left, right] {
                    let ty = self.expr(side, false);
                    if !matches!(ty, Ty::Bool | Ty::Any | Ty::Json) {
                        self.push(
                            Diagnostic::new(
                                Code::TypeMismatch,
                                self.file,
                                side.span,
                                format!(
                                    "`{}` needs `bool` operands, found `{}`",
                                    op.symbol(),
                                    self.env.show(&ty)
                                ),
                            )
                            .label("not a boolean"),
                        );
                    }
                }
                Ty::Bool
            }
            BinaryOp::Eq | BinaryOp::Ne => {
                let left_ty = self.expr(left, false);
                let right_ty = self.expr(right, false);
                // An enum compared with a literal that is not a variant is never equal.
                for (lit, other) in [(left, &right_ty), (right, &left_ty)] {
                    if let (ExprKind::String(text), Ty::Enum(variants)) =
                        (&lit.kind, other.required())
                        && let Some(text) = text.as_plain()
                    {
                        if !variants.iter().any(|v| v == text) {
                            self.not_a_variant(
                                lit.span,
                                text,
                                variants,
                                "the compared value is one of",
                            );
                        }
                        return Ty::Bool;
                    }
                }
                // Two enums can be equal when they share a variant.
                let overlapping_enums = match (left_ty.required(), right_ty.required()) {
                    (Ty::Enum(a), Ty::Enum(b)) => a.iter().any(|v| b.contains(v)),
                    _ => false,
                };
                let comparable = overlapping_enums
                    || left_ty.assignable_to(&right_ty)
                    || right_ty.assignable_to(&left_ty)
                    || (left_ty.is_numeric() && right_ty.is_numeric())
                    || matches!(left_ty, Ty::Null)
                    || matches!(right_ty, Ty::Null);
                if !comparable {
                    self.push(
                        Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            span,
                            format!("cannot compare `{left_ty}` with `{right_ty}`"),
                        )
                        .label("never equal"),
                    );
                }
                Ty::Bool
            }
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                for side in [left, right] {
                    let ty = self.expr(side, false);
                    if !ty.is_numeric() {
                        let mut diagnostic = Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            side.span,
                            format!(
                                "`{}` compares numbers, found `{}`",
                                op.symbol(),
                                self.env.show(&ty)
                            ),
                        )
                        .label("not a number");
                        if ty.is_optional() && ty.required().is_numeric() {
                            diagnostic = diagnostic
                                .hint("the value may be absent: give a default with `?? 0`");
                        }
                        self.push(diagnostic);
                    }
                }
                Ty::Bool
            }
        }
    }

    // ------------------------------------------------------------ references

    fn path(&mut self, path: &Path, optional_ok: bool) -> Ty {
        if let Some(ty) = self.destination_path(path, optional_ok) {
            return ty;
        }
        let segments = path.segments.as_slice();
        let root = path.root.text.as_str();
        match root {
            "workflow_input" => {
                let input = self.input.clone();
                self.walk(input, segments, optional_ok, &|| {
                    "the workflow input".into()
                })
            }
            "step" => self.step_ref(path, optional_ok),
            "loop_item" | "loop_index" => {
                let Some((id, item, _)) = self.loops.last().cloned() else {
                    self.push(
                        Diagnostic::new(Code::LoopItemOutsideLoop, self.file, path.root.span, format!("`{root}` is used outside a loop"))
                            .label("no enclosing `for`")
                            .hint("`loop_item` and `loop_index` exist only inside `for ... as id { ... }`; after a loop, read its results from `step.<loop id>`"),
                    );
                    return Ty::Any;
                };
                if root == "loop_index" {
                    self.walk(Ty::Int, segments, optional_ok, &|| "`loop_index`".into())
                } else {
                    self.walk(item, segments, optional_ok, &|| {
                        format!("an item of loop `{id}`")
                    })
                }
            }
            "loop" => self.loop_ref(path, optional_ok),
            "error" if self.error_in_scope => {
                self.walk(error_ty(), segments, optional_ok, &|| "the error".into())
            }
            "error" => {
                self.push(
                    Diagnostic::new(
                        Code::UnknownRoot,
                        self.file,
                        path.root.span,
                        "`error` is only in scope in a fallback block",
                    )
                    .label("no error here")
                    .hint(
                        "use it inside `on_error fallback { ... }`, where it describes the failure",
                    ),
                );
                Ty::Any
            }
            _ => {
                // The header's slip was reported once; its uses are read as meant.
                let named = self
                    .loops
                    .iter()
                    .rev()
                    .find(|(id, _, names_item)| *names_item && id == root);
                if let Some((id, item, _)) = named.cloned() {
                    return self.walk(item, segments, optional_ok, &|| {
                        format!("an item of loop `{id}`")
                    });
                }
                let mut diagnostic = Diagnostic::new(
                    Code::UnknownRoot,
                    self.file,
                    path.root.span,
                    format!("unknown reference `{root}`"),
                )
                .label("not a reference root");
                let written = path_text(path);
                let rest = &written[root.len()..];
                let innermost = self.loops.last().is_some_and(|(id, ..)| id == root);
                // What the name most likely stands for, as a valid reference.
                let meant = if innermost {
                    Some(("names the loop, not its item", "loop_item".to_string()))
                } else if self.loops.iter().any(|(id, ..)| id == root) {
                    Some((
                        "names an enclosing loop, not its item",
                        format!("loop.{root}.item"),
                    ))
                } else if self.by_id.contains_key(root) {
                    Some(("is a step", format!("step.{root}")))
                } else if self.input.field(root).is_some() {
                    Some((
                        "is a field of the workflow's input",
                        format!("workflow_input.{root}"),
                    ))
                } else {
                    // The literals of other languages.
                    match root {
                        "True" | "TRUE" => Some(("is not a literal", "true".to_string())),
                        "False" | "FALSE" => Some(("is not a literal", "false".to_string())),
                        "None" | "nil" | "undefined" | "NULL" | "Null" => {
                            Some(("is not a literal", "null".to_string()))
                        }
                        _ => None,
                    }
                };
                if let Some((what, replacement)) = meant {
                    diagnostic = diagnostic
                        .hint(format!("`{root}` {what}: write `{replacement}{rest}`"))
                        .fix(replacement);
                } else if root == "input" {
                    diagnostic = diagnostic.hint("in a workflow, its input is `workflow_input`; `input` is for recipe prompts");
                } else if let Some(best) = did_you_mean(root, ROOTS.iter().copied()) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                }
                if diagnostic.fix.is_none() {
                    diagnostic = diagnostic.hint(format!(
                        "references start with {}",
                        candidates_list(ROOTS.iter().copied())
                    ));
                }
                self.push(diagnostic);
                Ty::Any
            }
        }
    }

    fn loop_ref(&mut self, path: &Path, optional_ok: bool) -> Ty {
        let Some(Segment::Field { name: id, .. }) = path.segments.first() else {
            self.push(
                Diagnostic::new(
                    Code::LoopItemOutsideLoop,
                    self.file,
                    path.span,
                    "`loop` needs a loop id: `loop.<id>.item`",
                )
                .label("no loop id"),
            );
            return Ty::Any;
        };
        let Some((_, item, _)) = self
            .loops
            .iter()
            .rev()
            .find(|(l, ..)| *l == id.text)
            .cloned()
        else {
            let names = self.loops.iter().map(|(l, ..)| l.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::LoopItemOutsideLoop,
                self.file,
                id.span,
                format!("no enclosing loop is named `{}`", id.text),
            )
            .label("not an enclosing loop");
            if self.loops.is_empty() {
                diagnostic = diagnostic.hint("`loop.<id>` refers to an enclosing `for ... as id` loop, and there is none here");
            } else {
                if let Some(best) = did_you_mean(&id.text, names.clone()) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                }
                diagnostic = diagnostic.hint(format!(
                    "the enclosing loops are {}",
                    candidates_list(names)
                ));
            }
            self.push(diagnostic);
            return Ty::Any;
        };
        if path.segments.len() < 2 {
            self.push(
                Diagnostic::new(
                    Code::UnknownField,
                    self.file,
                    id.span,
                    format!("`loop.{}` needs `.item` or `.index`", id.text),
                )
                .label("the loop itself is not a value")
                .hint(format!(
                    "write `loop.{}.item` for its current item",
                    id.text
                )),
            );
            return Ty::Any;
        }
        let view = Ty::record(vec![("item".into(), item), ("index".into(), Ty::Int)]);
        self.walk(view, &path.segments[1..], optional_ok, &|| {
            format!("loop `{}`", id.text)
        })
    }

    fn step_ref(&mut self, path: &Path, optional_ok: bool) -> Ty {
        let Some(Segment::Field { name: id, .. }) = path.segments.first() else {
            self.push(
                Diagnostic::new(
                    Code::UnknownStep,
                    self.file,
                    path.span,
                    "`step` needs a step id: `step.<id>.field`",
                )
                .label("no step id"),
            );
            return Ty::Any;
        };
        if let Some(Segment::Field { optional: true, .. }) = path.segments.first() {
            self.push(
                Diagnostic::new(
                    Code::NeedlessOptional,
                    self.file,
                    id.span,
                    "`?.` right after `step` does nothing",
                )
                .label("the step id is not optional")
                .hint(format!(
                    "to read a step that may not have run, write `step.{}?.field`",
                    id.text
                )),
            );
        }
        let use_at = path.span.start;
        let Some(&index) = self.by_id.get(&id.text) else {
            let ran: Vec<&str> = self
                .steps
                .iter()
                .filter(|s| not_run(s, &self.containers, use_at).is_none())
                .map(|s| s.id.as_str())
                .collect();
            // The step being written, or a loop around the use, is never
            // what a reference meant.
            let all = self
                .steps
                .iter()
                .filter(|s| !s.span.contains(use_at))
                .map(|s| s.id.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::UnknownStep,
                self.file,
                id.span,
                format!("unknown step `{}`", id.text),
            )
            .label("no step has this id");
            if let Some(best) = did_you_mean(&id.text, all) {
                diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
            }
            diagnostic = if ran.is_empty() {
                diagnostic.hint("no step has run at this point")
            } else {
                diagnostic.hint(format!(
                    "the steps that have run here are {}",
                    candidates_list(ran)
                ))
            };
            self.push(diagnostic);
            return Ty::Any;
        };
        let reason = not_run(&self.steps[index], &self.containers, use_at);
        // The common case, a step that has run and has an output, needs no
        // copy of the step's record.
        if reason.is_none()
            && let Some(output) = self.steps[index].output.clone()
        {
            return self.walk(output, &path.segments[1..], optional_ok, &|| {
                format!("the output of step `{}`", id.text)
            });
        }
        let step = self.steps[index].clone();
        let Some(output) = step.output.clone() else {
            self.push(
                Diagnostic::new(
                    Code::NoOutput,
                    self.file,
                    id.span,
                    format!("step `{}` is a `handoff`, which has no output", step.id),
                )
                .label("nothing to read")
                .secondary(self.file, step.id_span, "defined here"),
            );
            return Ty::Any;
        };
        let optional_access = matches!(
            path.segments.get(1),
            Some(Segment::Field { optional: true, .. })
        );
        let mut base = output;
        match reason {
            None => {}
            Some(NotRun::Later) => {
                let message = if step.span.contains(use_at) {
                    format!("step `{}` refers to itself", step.id)
                } else {
                    format!("step `{}` runs later", step.id)
                };
                self.push(
                    Diagnostic::new(Code::LaterStep, self.file, id.span, message)
                        .label("not run yet here")
                        .secondary(self.file, step.id_span, "defined here")
                        .hint("a step can use only the steps before it; move this use after the step, or the step before it"),
                );
                return Ty::Any;
            }
            Some(NotRun::Unfinished) => {
                let what = if step.kind == StepKind::Loop {
                    "loop"
                } else {
                    "parallel block"
                };
                self.push(
                    Diagnostic::new(Code::LaterStep, self.file, id.span, format!("the {what} `{}` has not finished here", step.id))
                        .label("used inside itself")
                        .secondary(self.file, step.id_span, format!("the {what} starts here"))
                        .hint(format!("its output exists after the {what}; inside it, use the steps of the current iteration or branch directly")),
                );
                return Ty::Any;
            }
            Some(reason) if (optional_access || optional_ok) && reason.absence_is_possible() => {
                base = base.optional();
            }
            Some(reason) => {
                // The reference as written, made optional, and read through
                // a loop's list of iteration outputs: hints in valid syntax.
                let rest = path_text(path);
                let rest = &rest[format!("step.{}", step.id).len().min(rest.len())..];
                let rest = rest.strip_prefix('?').unwrap_or(rest);
                let optional = format!(
                    "write `step.{}?{}` and give a default with `??` where a value is needed",
                    step.id,
                    if rest.is_empty() { ".field" } else { rest }
                );
                let mut diagnostic = Diagnostic::new(
                    Code::MaybeNotRun,
                    self.file,
                    id.span,
                    if matches!(reason, NotRun::OtherIfBranch(_)) {
                        format!("step `{}` never runs here", step.id)
                    } else {
                        format!("step `{}` may not have run here", step.id)
                    },
                )
                .label(if matches!(reason, NotRun::OtherIfBranch(_)) {
                    "never runs here"
                } else {
                    "may not have run"
                })
                .secondary(self.file, step.id_span, "defined here");
                let absence_is_possible = reason.absence_is_possible();
                diagnostic = match reason {
                    NotRun::Container(Container::IfBranch { span, .. }) => diagnostic
                        .secondary(self.file, span, "it runs only in a branch of this `if`")
                        .hint(optional.clone()),
                    NotRun::Container(Container::LoopBody { id: loop_id, span }) => diagnostic
                        .secondary(self.file, span, format!("it runs once per item of loop `{loop_id}`"))
                        .hint(format!("after the loop, `step.{loop_id}` is the list of iteration outputs: `step.{loop_id}[0].{}{rest}` reads the first", step.id)),
                    NotRun::Container(Container::ParallelBranch { parallel, branch, span }) => diagnostic
                        .secondary(self.file, span, format!("it runs in branch `{branch}` of `{parallel}`, alongside this one"))
                        .hint(format!("sibling branches run concurrently; use it after `{parallel}` joins")),
                    NotRun::Container(Container::Fallback { step: failed, span }) => diagnostic
                        .secondary(self.file, span, format!("it runs only when step `{failed}` fails"))
                        .hint(optional.clone()),
                    NotRun::Container(Container::WorkflowHandler { span }) => diagnostic
                        .secondary(self.file, span, "it runs only when the workflow fails")
                        .hint("a step of the error handler can be read only inside the handler"),
                    NotRun::OwnFallback => diagnostic
                        .hint(format!("this is the fallback of `{}`, which runs because `{}` failed and has no output", step.id, step.id))
                        .hint("read `error.message` to see why it failed"),
                    NotRun::OtherIfBranch(span) => diagnostic
                        .secondary(self.file, span, "it runs in another branch of this `if`, never in this one"),
                    NotRun::MayFail => diagnostic
                        .hint(format!("`{}` has `on_error continue` or a fallback, so it may end without output", step.id))
                        .hint(optional.clone()),
                    NotRun::InHandler => diagnostic
                        .hint("the workflow's error handler runs after any failing step, so later steps may not have run")
                        .hint(optional.clone()),
                    NotRun::Later | NotRun::Unfinished => diagnostic,
                };
                if absence_is_possible {
                    diagnostic = self.optional_fixes(diagnostic, path, base, optional_ok);
                }
                self.push(diagnostic);
                return Ty::Any;
            }
        }
        self.walk(base, &path.segments[1..], optional_ok, &|| {
            format!("the output of step `{}`", id.text)
        })
    }

    /// The fixes of a reference to a step that may not have run: read it
    /// with `?.`, and where a value is needed (a bare reference, not the
    /// left side of `??`), give a default of the type read. A template
    /// renders an absent value as empty text, so `?.` is its whole fix.
    fn optional_fixes(
        &mut self,
        diagnostic: Diagnostic,
        path: &Path,
        output: Ty,
        optional_ok: bool,
    ) -> Diagnostic {
        let (
            Some(Segment::Field { name: id, .. }),
            Some(Segment::Field {
                optional: false, ..
            }),
        ) = (path.segments.first(), path.segments.get(1))
        else {
            return diagnostic;
        };
        let mark = Edit::insert(id.span.end, "?");
        if self.in_template || optional_ok {
            return diagnostic.fix_with(
                format!("Read `step.{}` only if it ran (`?.`)", id.text),
                vec![mark],
            );
        }
        // The type read, for the default: walked as the fix will read it,
        // its diagnostics (if any) left to the reference as it is now.
        let kept = self.diagnostics.len();
        let read = self.walk(output.optional(), &path.segments[1..], true, &String::new);
        self.diagnostics.truncate(kept);
        let Some(default) = read.required().placeholder() else {
            return diagnostic;
        };
        diagnostic.fix_with(
            format!("Read `step.{}` only if it ran, else `{default}`", id.text),
            vec![
                Edit::insert(path.span.start, "("),
                mark,
                Edit::insert(path.span.end, format!(" ?? {default})")),
            ],
        )
    }

    /// An idempotency key for step `id` made of the workflow's input: its
    /// id-like field (or first field a template can render), the step's id,
    /// and the index of each enclosing loop, so that each run, step and
    /// iteration has its own key and a repeated attempt has the same one.
    fn idempotency_key(&self, id: &str) -> Option<String> {
        let Ty::Record(fields) = &self.input else {
            return None;
        };
        let scalar = |ty: &Ty| matches!(ty, Ty::String | Ty::Int | Ty::Enum(_));
        let field =
            fields
                .iter()
                .filter(|(_, ty)| scalar(ty))
                .min_by_key(|(name, _)| match name.as_str() {
                    "id" => 0,
                    name if name.ends_with("_id") || name.ends_with("Id") => 1,
                    name if name.contains("key") => 2,
                    _ => 3,
                })?;
        let mut key = format!("{{{{workflow_input.{}}}}}-{id}", field.0);
        for (loop_id, ..) in &self.loops {
            key.push_str(&format!("-{{{{loop.{loop_id}.index}}}}"));
        }
        Some(key)
    }

    /// Follows `segments` through `ty`, reporting the first step that fails.
    fn walk(
        &mut self,
        ty: Ty,
        segments: &[Segment],
        optional_ok: bool,
        what: &dyn Fn() -> String,
    ) -> Ty {
        let mut ty = ty;
        let mut absent = false;
        // What the value at the current segment is, for messages; built only
        // when a message needs it, since references are checked by the thousand.
        let mut previous: Option<&Segment> = None;
        let describe = |previous: Option<&Segment>| match previous {
            None => what(),
            Some(Segment::Field { name, .. }) => format!("`{}`", name.text),
            Some(Segment::Index { index, .. }) => format!("element [{index}]"),
        };
        for segment in segments {
            let optional_segment = matches!(segment, Segment::Field { optional: true, .. });
            let current = match ty {
                Ty::Optional(inner) => {
                    if !(optional_segment || optional_ok) {
                        self.push(
                            Diagnostic::new(Code::OptionalAccess, self.file, segment.span(), format!("{} may be absent", describe(previous)))
                                .label("read from a value that may be absent")
                                .hint("use `?.` to read it only when present, and `?? default` for a fallback"),
                        );
                        return Ty::Any;
                    }
                    absent = true;
                    std::sync::Arc::unwrap_or_clone(inner)
                }
                Ty::Null => {
                    absent = true;
                    Ty::Any
                }
                Ty::Any => return Ty::Any,
                Ty::Json => return Ty::Json,
                other => {
                    if optional_segment {
                        self.push(
                            Diagnostic::new(
                                Code::NeedlessOptional,
                                self.file,
                                segment.span(),
                                format!("{} is always present", describe(previous)),
                            )
                            .label("`?.` is not needed here")
                            .hint("write `.` instead of `?.`"),
                        );
                    }
                    other
                }
            };
            ty = match (segment, current) {
                (_, Ty::Any) => return Ty::Any,
                (_, Ty::Json) => return Ty::Json,
                (Segment::Field { name, .. }, Ty::Record(fields)) => {
                    match fields.iter().find(|(n, _)| *n == name.text) {
                        Some((_, field)) => field.clone(),
                        None => {
                            let names = fields.iter().map(|(n, _)| n.as_str());
                            let mut diagnostic = Diagnostic::new(
                                Code::UnknownField,
                                self.file,
                                name.span,
                                format!("{} has no field `{}`", describe(previous), name.text),
                            )
                            .label("unknown field");
                            if let Some(best) = did_you_mean(&name.text, names.clone()) {
                                diagnostic =
                                    diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                            }
                            diagnostic = if fields.is_empty() {
                                diagnostic.hint(format!("{} has no fields", describe(previous)))
                            } else {
                                diagnostic
                                    .hint(format!("the fields are {}", candidates_list(names)))
                            };
                            self.push(diagnostic);
                            return Ty::Any;
                        }
                    }
                }
                (Segment::Field { name, .. }, other) => {
                    self.push(
                        Diagnostic::new(
                            Code::UnknownField,
                            self.file,
                            name.span,
                            format!(
                                "{} is `{}`, which has no fields",
                                describe(previous),
                                self.env.show(&other)
                            ),
                        )
                        .label("no fields here"),
                    );
                    return Ty::Any;
                }
                (Segment::Index { .. }, Ty::List(item)) => std::sync::Arc::unwrap_or_clone(item),
                (Segment::Index { span, .. }, other) => {
                    self.push(
                        Diagnostic::new(
                            Code::NotAList,
                            self.file,
                            *span,
                            format!(
                                "{} is `{}`, not a list",
                                describe(previous),
                                self.env.show(&other)
                            ),
                        )
                        .label("cannot index this"),
                    );
                    return Ty::Any;
                }
            };
            previous = Some(segment);
        }
        if absent { ty.optional() } else { ty }
    }
}

/// Why `step` has not certainly run at byte offset `use_at`, inside
/// `containers` (outermost first), if it has not. The editor asks the same
/// question at the cursor to offer only the steps a reference may use.
pub(crate) fn not_run(step: &StepInfo, containers: &[Container], use_at: u32) -> Option<NotRun> {
    let mut shared = 0;
    while shared < step.containers.len()
        && shared < containers.len()
        && step.containers[shared] == containers[shared]
    {
        shared += 1;
    }
    let use_containers = &containers[shared..];
    if use_containers
        .iter()
        .any(|c| matches!(c, Container::Fallback { step: failed, .. } if *failed == step.id))
    {
        return Some(NotRun::OwnFallback);
    }
    if matches!(step.kind, StepKind::Loop | StepKind::Parallel)
        && use_containers.iter().any(|c| match c {
            Container::LoopBody { id, .. } => *id == step.id,
            Container::ParallelBranch { parallel, .. } => *parallel == step.id,
            _ => false,
        })
    {
        return Some(NotRun::Unfinished);
    }
    // The workflow's handler runs after a failure anywhere, wherever it is written.
    let in_handler = |containers: &[Container]| {
        containers
            .iter()
            .any(|c| matches!(c, Container::WorkflowHandler { .. }))
    };
    if in_handler(use_containers) && !in_handler(&step.containers) {
        return Some(NotRun::InHandler);
    }
    if let (
        Some(Container::IfBranch { span, .. }),
        Some(Container::IfBranch { span: use_span, .. }),
    ) = (step.containers.get(shared), containers.get(shared))
        && span == use_span
    {
        return Some(NotRun::OtherIfBranch(*span));
    }
    if step.span.end > use_at {
        // A sibling parallel branch written later is not "later": it runs alongside.
        return match step.containers.get(shared) {
            Some(container @ Container::ParallelBranch { span, .. }) if span.end > use_at => {
                Some(NotRun::Container(container.clone()))
            }
            _ => Some(NotRun::Later),
        };
    }
    for container in &step.containers[shared..] {
        match container {
            Container::ParallelBranch { span, .. } if span.end <= use_at => {}
            other => return Some(NotRun::Container(other.clone())),
        }
    }
    if step.may_fail {
        return Some(NotRun::MayFail);
    }
    None
}

/// The type of `a ?? b` when `b` fits `a`'s inner type.
fn inner_or(inner: Ty, default: &Ty) -> Ty {
    if default.is_optional() {
        inner.optional()
    } else {
        inner
    }
}

fn show_ms(ms: u64) -> String {
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}
