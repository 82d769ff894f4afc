//! Checking one workflow: step table, definite-run analysis, references and types.
//!
//! Definite-run analysis is structural rather than a data-flow fixpoint, because
//! step ids are unique in a workflow and the control flow is a tree: a step `s`
//! has certainly run at a use `u` when `s` ends before `u` in the source, `s`
//! cannot fail silently (`on_error continue` or `fallback`), and every container
//! of `s` that does not also contain `u` is a parallel branch whose `parallel`
//! has joined before `u`. This costs O(nesting depth) per reference and no
//! per-branch copies of a "ran" set, which keeps 100k-step workflows linear.
//!
//! The `Checker`'s methods are in the submodules by what they check: a
//! step (`steps`), an expression (`exprs`), a reference (`refs`), a
//! destination (`destinations`); this file holds the step table and the
//! walk over statements.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::check::env::{
    Env, McpInfo, fields_within_schema_bounds, names_an_alias, require_named, require_plain,
    resolve_fields,
};
use crate::check::types::{Fields, PLACEHOLDER_CHARS, Ty};
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, Edit, FileId, Span};
use crate::lock::{LockedServer, LockedTool};
use crate::suggest::{Budget, candidates_list, did_you_mean, shown_list};
use crate::syntax::ROOTS;
use crate::syntax::ast::*;

mod destinations;
mod exprs;
mod refs;
mod steps;
mod table;

pub use table::StepTable;

/// What kind of step an id names.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    Recipe(EcoString),
    /// Whether the gate has an `expires`: a test may let only such a gate
    /// expire.
    Approval {
        expires: bool,
        /// The approvers when written as a list of plain strings, as a
        /// test's `decide ... by` must name one of them.
        approvers: Option<Arc<[EcoString]>>,
    },
    KbWrite,
    Handoff,
    /// Boxed: few steps are browser steps, and the two names inline made
    /// every entry of the checker's step table 16 bytes larger.
    Browser(Box<McpTool>),
    Loop,
    Parallel,
    /// A step whose statement did not parse.
    Unknown,
}

impl StepKind {
    /// Whether a test may answer for the step (`mock step.x`): it calls a
    /// model or a tool. An approval is decided, an effect kept in memory.
    pub fn is_mockable(&self) -> bool {
        matches!(
            self,
            StepKind::Recipe(_) | StepKind::Browser(_) | StepKind::Unknown
        )
    }

    /// Whether the id names a step, not a loop or a parallel block.
    pub fn is_step(&self) -> bool {
        !matches!(self, StepKind::Loop | StepKind::Parallel)
    }
}

/// The MCP tool a browser step calls.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub server: EcoString,
    pub tool: EcoString,
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
        id: EcoString,
        span: Span,
    },
    /// A branch of the parallel statement spanning `span`.
    ParallelBranch {
        parallel: EcoString,
        branch: EcoString,
        span: Span,
    },
    /// The fallback block of step `step`.
    Fallback {
        step: EcoString,
        span: Span,
    },
    /// The workflow's `on_error` handler.
    WorkflowHandler {
        span: Span,
    },
}

#[derive(Debug, Clone)]
pub struct StepInfo {
    pub id: EcoString,
    /// Where the id is written.
    pub id_span: Span,
    /// The whole statement, options included.
    pub span: Span,
    pub kind: StepKind,
    /// `None` for steps without output (handoff).
    pub output: Option<Ty>,
    /// Fixed once registered: a slice, 8 bytes smaller than a `Vec`.
    pub containers: Box<[Container]>,
    /// `on_error continue` or `fallback`: the step may end without output.
    pub may_fail: bool,
}

#[derive(Debug, Clone)]
pub struct WorkflowInfo {
    pub name: String,
    pub file: FileId,
    /// Its inputs, shared with the type of `workflow_input`.
    pub input: Arc<Fields>,
    /// Every id of the workflow; its index is the step's slot in the plan.
    pub steps: StepTable,
    pub timeout_ms: u64,
    /// The type of the workflow's `output` record, when it has one.
    pub output: Option<Ty>,
    /// Every `for` loop with the type of its items, for editors: the checker
    /// knows `loop_item`'s type only while it is inside the loop.
    pub loops: Vec<LoopInfo>,
}

#[derive(Debug, Clone)]
pub struct LoopInfo {
    pub id: EcoString,
    /// The whole `for` statement, as in [`Container::LoopBody`].
    pub span: Span,
    pub item: Ty,
}

impl WorkflowInfo {
    pub fn step(&self, id: &str) -> Option<(usize, &StepInfo)> {
        self.steps.get(id)
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
        Some(input) => {
            let fields = resolve_fields(&input.fields, file, env, diagnostics);
            let what = format!("workflow `{}`", decl.name.text);
            fields_within_schema_bounds(
                fields,
                &what,
                input.fields.iter().any(|field| names_an_alias(&field.ty)),
                file,
                decl.name.span,
                &env.schema_sizes,
                diagnostics,
            )
        }
        None => Vec::new(),
    };
    let input = Arc::new(Fields::new(input));
    let mut checker = Checker::new(env, file, diagnostics);
    checker.locked = locked;
    checker.input = Ty::Record(Arc::clone(&input));
    if let Some(timeout) = &decl.timeout {
        // A timeout that is not valid is reported as such; no step and no
        // budget is then said to outlast it (nor the default it is not).
        checker.workflow_timeout_ms = checker
            .duration(timeout, "a workflow timeout")
            .unwrap_or(u64::MAX);
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
        require_named(
            department,
            (
                Code::BadOption,
                "a workflow's department",
                "name the department that owns the workflow, e.g. `department \"support\"`, or leave the setting out",
            ),
            file,
            checker.diagnostics,
        );
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
    let handler = match &decl.on_error {
        Some(ErrorPolicy::Fallback(block)) => table::ids_in(&block.stmts),
        _ => 0,
    };
    checker.steps = StepTable::with_capacity(table::ids_in(&decl.body) + handler);
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
        let mut seen: HashSet<&str> = HashSet::new();
        for field in &output.fields {
            if !seen.insert(field.name.text.as_str()) {
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
            let ty = checker.expr(&field.value, false);
            fields.push((field.name.text.to_string(), ty));
        }
        output_ty = Some(Ty::record(fields));
    }
    for destination in &decl.destinations {
        let output = output_ty.clone().unwrap_or_else(|| Ty::record(Vec::new()));
        checker.destination(destination, output);
    }
    WorkflowInfo {
        name: decl.name.text.to_string(),
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
    steps: StepTable,
    /// The containers of the statement being checked (pass 1 and 2 alike).
    containers: Vec<Container>,
    /// Enclosing loops, outermost first: id, item type, and whether the
    /// id was written as the item's name (`ForStmt::names_item`).
    loops: Vec<(EcoString, Ty, bool)>,
    loop_infos: Vec<LoopInfo>,
    error_in_scope: bool,
    workflow_timeout_ms: u64,
    input: Ty,
    /// Whether the references being checked are in a template, where an
    /// absent value renders as empty text.
    in_template: bool,
    /// Set while a value is checked where `json` goes: a list literal
    /// there may mix types of elements.
    into_json: bool,
    /// What the names of a record checked against a type are called in
    /// messages: a call's "input"s, a record's "field"s.
    noun: &'static str,
    /// Set while a destination is checked: what its references may read.
    destination: Option<DestinationScope>,
    /// What is left of this workflow's budget for "did you mean" and the
    /// lists of names in hints (`suggest::SUGGESTION_CELLS`).
    suggestions: Budget,
    /// The locked tools of each server by name, and each tool's parameters,
    /// made once per check of a workflow: a scan of a lock's tools, and
    /// the types of a tool's parameters built again, at each call.
    locked_tools: HashMap<usize, HashMap<&'e str, &'e LockedTool>>,
    tool_params: HashMap<usize, Arc<Fields>>,
    /// The servers W304 was said of in this workflow: once each, at its
    /// first browser step (an audit: once per step, alike).
    unlocked_said: HashSet<usize>,
}

/// What a destination's templates and content may read: the run's input,
/// and its output when every event it is delivered on is `completed` (a
/// failed, cancelled or parked run has none).
struct DestinationScope {
    output: Option<Ty>,
    /// Whether the destination is delivered on `completed` too, and the
    /// other events it is delivered on (with no output), as a message
    /// names them.
    also_completed: bool,
    without_output: String,
}

/// Where the text of `step` ends: its record or its last option. Its span
/// may reach past a comment that follows it.
fn step_end(step: &Step) -> u32 {
    let options = &step.options;
    let retry = options.retry.as_ref().map(|retry| {
        let backoff = retry.backoff.as_ref().map_or(0, |(_, max)| max.span.end);
        retry.attempts_span.end.max(backoff)
    });
    let on_error = options.on_error.as_deref().map(|policy| match policy {
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
/// none. `None` when a field's type has no placeholder, or the fields
/// together are longer than one placeholder may be (thousands of missing
/// inputs are for their author to write).
fn fill_fields(args: &RecordLit, missing: &[&(String, Ty)]) -> Option<Edit> {
    let mut left = PLACEHOLDER_CHARS;
    let mut fields = Vec::new();
    for (name, ty) in missing {
        left = left.checked_sub(name.len() + 4)?;
        fields.push(format!("{name}: {}", ty.placeholder_within(&mut left)?));
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
            steps: StepTable::default(),
            containers: Vec::new(),
            loops: Vec::new(),
            loop_infos: Vec::new(),
            error_in_scope: false,
            workflow_timeout_ms: DEFAULT_WORKFLOW_TIMEOUT_MS,
            input: Ty::record(Vec::new()),
            in_template: false,
            into_json: false,
            noun: "input",
            destination: None,
            suggestions: Budget::default(),
            locked_tools: HashMap::new(),
            unlocked_said: HashSet::new(),
            tool_params: HashMap::new(),
        }
    }

    /// The candidate `name` likely misspells, within this workflow's budget
    /// for suggestions.
    fn suggest<'c>(
        &self,
        name: &str,
        candidates: impl IntoIterator<Item = &'c str>,
    ) -> Option<&'c str> {
        crate::suggest::did_you_mean_within(name, candidates, &self.suggestions)
    }

    /// `diagnostic` with the hint `{lead} `a`, `b` (and N more)`, within
    /// this workflow's budget for suggestions.
    fn listing<'c>(
        &self,
        diagnostic: Diagnostic,
        lead: &str,
        candidates: impl IntoIterator<Item = &'c str>,
    ) -> Diagnostic {
        crate::suggest::hint_listing(diagnostic, lead, candidates, &self.suggestions)
    }

    fn push(&mut self, diagnostic: Diagnostic) {
        self.diagnostics.push(diagnostic);
    }

    // ------------------------------------------------------------ pass 1

    /// Registers the step, loop or parallel block `info` describes.
    fn register(&mut self, info: StepInfo) {
        if let Err((first, again)) = self.steps.insert(info) {
            let first = &self.steps[first];
            let diagnostic = Diagnostic::new(Code::DuplicateId, self.file, again.id_span, format!("the id `{}` is used twice", again.id))
                .label("used again here")
                .secondary(self.file, first.id_span, "first used here")
                .hint("step, loop and parallel ids are unique in a workflow: they name journal entries and references");
            self.push(diagnostic);
        }
    }

    /// Registers a loop or parallel block: named by `id`, spanning `span`,
    /// its output `output`; it ends with every step in it, never without
    /// output.
    fn register_block(&mut self, id: &Name, span: Span, kind: StepKind, output: Ty) {
        self.register(StepInfo {
            id: id.text.clone(),
            id_span: id.span,
            span,
            kind,
            output: Some(output),
            containers: self.containers.as_slice().into(),
            may_fail: false,
        });
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
                                    .get(recipe.text.as_str())
                                    .map_or(Ty::Any, |r| r.output.clone()),
                            ),
                        ),
                        StepCall::Approval { args, .. } => (
                            StepKind::Approval {
                                expires: args.fields.iter().any(|f| f.name.text == "expires"),
                                approvers: literal_approvers(args),
                            },
                            Some(approval_output()),
                        ),
                        StepCall::KbWrite { .. } => (StepKind::KbWrite, Some(kb_write_output())),
                        StepCall::Handoff { .. } => (StepKind::Handoff, None),
                        StepCall::Browser { server, tool, .. } => (
                            StepKind::Browser(Box::new(McpTool {
                                server: server.text.clone(),
                                tool: tool.text.clone(),
                            })),
                            Some(Ty::Json),
                        ),
                        StepCall::Broken { .. } => (StepKind::Unknown, Some(Ty::Any)),
                    };
                    let may_fail = matches!(
                        step.options.on_error.as_deref(),
                        Some(ErrorPolicy::Continue(_) | ErrorPolicy::Fallback(_))
                    );
                    self.register(StepInfo {
                        id: step.id.text.clone(),
                        id_span: step.id.span,
                        span: step.span,
                        kind,
                        output,
                        containers: self.containers.as_slice().into(),
                        may_fail,
                    });
                    if let Some(ErrorPolicy::Fallback(block)) = step.options.on_error.as_deref() {
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
                    self.register_block(&stmt.id, stmt.span, StepKind::Loop, Ty::list(iteration));
                }
                Stmt::Parallel(stmt) => {
                    let mut branches = Vec::new();
                    // By name, not a list: a block of 50,000 branches was
                    // quadratic.
                    let mut names: HashMap<&str, &Name> = HashMap::new();
                    for branch in &stmt.branches {
                        if let Some(first) = names.get(branch.name.text.as_str()) {
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
                        } else {
                            names.insert(branch.name.text.as_str(), &branch.name);
                        }
                        let first = self.steps.len();
                        self.containers.push(Container::ParallelBranch {
                            parallel: stmt.id.text.clone(),
                            branch: branch.name.text.clone(),
                            span: stmt.span,
                        });
                        self.collect(&branch.body.stmts);
                        self.containers.pop();
                        branches.push((
                            branch.name.text.to_string(),
                            self.outputs_since(first, self.containers.len() + 1),
                        ));
                    }
                    self.collect(&stmt.broken);
                    self.register_block(
                        &stmt.id,
                        stmt.span,
                        StepKind::Parallel,
                        Ty::record(branches),
                    );
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
                    step.id.to_string(),
                    if certain { output } else { output.optional() },
                ))
            })
            .collect();
        Ty::record(fields)
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
                // A list written out has its length here: more items than
                // `max` would fail every run at the loop.
                if let Some((max, span)) = stmt.max_items
                    && let ExprKind::List(items) = &stmt.collection.kind
                    && (1..=MAX_LOOP_ITEMS).contains(&max)
                    && items.len() as i64 > max
                {
                    self.push(
                        Diagnostic::new(
                            Code::BadOption,
                            self.file,
                            span,
                            format!(
                                "the loop's list has {} items, more than its `max {max}`",
                                items.len()
                            ),
                        )
                        .label("fewer than the list's items")
                        .secondary(self.file, stmt.collection.span, "the list")
                        .hint("every run would fail at the loop: raise `max`, or take items out of the list"),
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
}

/// An approval's `approvers` when they are a list of strings without
/// references; `None` when they are computed.
fn literal_approvers(args: &RecordLit) -> Option<Arc<[EcoString]>> {
    let field = args.fields.iter().find(|f| f.name.text == "approvers")?;
    let ExprKind::List(items) = &field.value.kind else {
        return None;
    };
    items
        .iter()
        .map(|item| match &item.kind {
            ExprKind::String(text) => text.as_plain().map(EcoString::from),
            _ => None,
        })
        .collect()
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
    if !step.kind.is_step()
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
