//! The plan: what `flowc build` emits and the runtime executes.
//!
//! This crate is the whole contract between the compiler and the runtime, and
//! depends on nothing but serde and a hash. A plan is self-contained: names are
//! resolved to slots (steps, input fields, loop levels), templates are split
//! into text and references, and every schema the runtime validates against is
//! included as JSON Schema.
//!
//! A plan carries its format version and a content hash. [`Plan::from_json`]
//! refuses a plan of another version or whose hash does not match its content,
//! so a run can be pinned to the exact plan it started on. A hash proves
//! nothing about who wrote a plan, so [`Plan::validate`] holds a plan from
//! outside to what the compiler writes, within the bounds of [`limits`].

use std::fmt::{self, Write as _};

pub mod budget;
mod code_table;
pub mod compat;
mod error_kind;
pub mod graph;
pub mod limits;
pub mod schema;
pub mod unique_keys;
mod validate;
pub mod written;

pub use error_kind::ErrorKind;
#[doc(hidden)]
pub use serde as __serde;
pub use validate::{PlanInPieces, PlanProblem, PlanProblems, describe_value, is_ident};

/// `text` cut to at most `most` characters, the cut marked with `…`: for
/// messages that quote what a plan, an input, a model or a server said.
/// Here because the compiler and the runtime both quote such text and
/// this crate is what they share.
pub fn cut(text: &str, most: usize) -> String {
    if text.chars().count() <= most {
        return text.to_string();
    }
    let mut out: String = text.chars().take(most.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `word` as a POSIX shell would need it written: bare when it has only
/// safe characters, else in single quotes. The commands flow's tools print
/// for pasting are written with it (`flow`'s hints, `flowc init`'s next
/// step, an MCP server's command line).
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Text from outside (what a model, a server or a tool said) made inert
/// for a terminal, a trace or a log: its control characters escaped
/// (`\u{1b}`, `\n`), so that a terminal's escape sequences in it (clear
/// the screen, retitle the window, a fake green "completed") print as
/// text, and a line break cannot leave the line it is shown on.
pub fn inert(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown.into()
}

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The plan format this crate reads and writes. Bumped on any change that an
/// older runtime would misread.
pub const FORMAT_VERSION: u32 = 1;

/// The `pattern` of a `duration` value's schema, the only pattern a plan
/// holds; the runtime matches it by hand rather than with a regex engine.
pub const DURATION_PATTERN: &str = "^[0-9]+(ms|s|m|h|d)$";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format_version: u32,
    /// `sha256:` and the hex digest of the plan's JSON with this field and
    /// `source` empty.
    pub hash: String,
    /// The path of the root source file, for messages.
    pub source: String,
    pub workflows: Vec<Workflow>,
    /// Every recipe the workflows may call, by index.
    pub recipes: Vec<Recipe>,
    /// Every MCP server the workflows may call, by index.
    pub mcp_servers: Vec<McpServer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub name: String,
    /// A model alias that the runtime's configuration resolves.
    pub model: String,
    /// Input field names; `Root::RecipeInput(i)` is the i-th.
    pub input_fields: Vec<String>,
    pub input_schema: Value,
    pub output_schema: Value,
    pub prompt: Template,
    /// Knowledge-base documents or collections retrieved into the prompt.
    pub context: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServer {
    pub name: String,
    pub transport: McpTransport,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum McpTransport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    Http {
        url: String,
    },
}

impl McpTransport {
    /// What makes two declarations the same server, to `flow.lock` and to the
    /// runtime's pool alike: the command line and environment (in any order
    /// of `env`), or the URL. Two transports name one server exactly when
    /// their identities are equal.
    pub fn identity(&self) -> McpTransport {
        let mut identity = self.clone();
        if let McpTransport::Stdio { env, .. } = &mut identity {
            env.sort();
        }
        identity
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub name: String,
    /// Input field names; `Root::InputField(i)` is the i-th.
    pub input_fields: Vec<String>,
    /// The runtime validates a run's input against this before the first step.
    pub input_schema: Value,
    /// Active time allowed for a run; time parked at an approval does not count.
    pub timeout_ms: u64,
    pub durability: Durability,
    /// Knowledge-base documents or collections resolved at preflight.
    pub context: Vec<String>,
    /// The department that owns the workflow: the knowledge-base documents
    /// its runs write belong to it, and the department's documents are
    /// context for its recipes. Absent in plans that name none, so their
    /// JSON (and hash) is what it was before departments existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub department: Option<String>,
    pub on_error: OnError,
    /// Where the run's result goes when it reaches an event, delivered
    /// after the run has its status (never before its answer). Absent in
    /// plans that declare none, so their JSON (and hash) is what it was
    /// before destinations existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<Destination>,
    /// The slot table: `slots[i]` describes the step whose output is slot `i`.
    pub slots: Vec<Slot>,
    pub body: Vec<Node>,
    /// The run's output, evaluated after the last step.
    pub output: Vec<Field>,
}

/// `deliver on EVENTS to TARGET`: what receives a run's result when its
/// status becomes one of `events`. Its references read the workflow's input
/// (`Root::Input`, `Root::InputField`) and output (`Root::Output`) only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Destination {
    pub events: Vec<RunEvent>,
    pub target: DestinationTarget,
}

/// A change of a run's status that destinations and webhooks are told of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEvent {
    Completed,
    Failed,
    Cancelled,
    Parked,
}

impl RunEvent {
    pub const ALL: [RunEvent; 4] = [
        RunEvent::Completed,
        RunEvent::Failed,
        RunEvent::Cancelled,
        RunEvent::Parked,
    ];

    /// Its name, as written after `deliver on` and kept in the outbox.
    pub fn as_str(self) -> &'static str {
        match self {
            RunEvent::Completed => "completed",
            RunEvent::Failed => "failed",
            RunEvent::Cancelled => "cancelled",
            RunEvent::Parked => "parked",
        }
    }

    pub fn parse(text: &str) -> Option<RunEvent> {
        RunEvent::ALL
            .into_iter()
            .find(|event| event.as_str() == text)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DestinationTarget {
    /// An endpoint of the run's account, by the name flowd's configuration
    /// gives it; posted and signed as the account's webhooks are.
    Webhook { endpoint: String },
    /// The account's people (by address) or approver groups (by name).
    Email {
        to: Vec<String>,
        subject: Template,
        body: Template,
    },
    /// A knowledge-base document, a new version for each delivery to the
    /// same title, as `kb_write` writes.
    Kb {
        collection: String,
        title: Template,
        content: Expr,
    },
}

impl DestinationTarget {
    /// Its kind's name, in metrics and traces.
    pub fn kind_name(&self) -> &'static str {
        match self {
            DestinationTarget::Webhook { .. } => "webhook",
            DestinationTarget::Email { .. } => "email",
            DestinationTarget::Kb { .. } => "kb",
        }
    }

    /// Calls `visit` on every reference delivering it evaluates.
    pub fn each_ref<'a>(&'a self, visit: &mut impl FnMut(&'a Ref)) {
        match self {
            DestinationTarget::Webhook { .. } => {}
            DestinationTarget::Email { subject, body, .. } => {
                subject.each_ref(visit);
                body.each_ref(visit);
            }
            DestinationTarget::Kb { title, content, .. } => {
                title.each_ref(visit);
                content.each_ref(visit);
            }
        }
    }
}

/// One entry of a workflow's slot table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    pub id: String,
    pub kind: StepKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Recipe,
    Approval,
    KbWrite,
    Handoff,
    Browser,
    Loop,
    Parallel,
}

impl StepKind {
    /// The kind as a plan's JSON and people write it: `kb_write`.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Recipe => "recipe",
            StepKind::Approval => "approval",
            StepKind::KbWrite => "kb_write",
            StepKind::Handoff => "handoff",
            StepKind::Browser => "browser",
            StepKind::Loop => "loop",
            StepKind::Parallel => "parallel",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Every completed step is journaled before a dependent step starts.
    Full,
    /// The run is persisted only when it parks and when it ends.
    Approval,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "body", rename_all = "snake_case")]
#[derive(Default)]
pub enum OnError {
    /// The failure fails the run (or, for a step, propagates to the workflow).
    #[default]
    Fail,
    /// The step ends without output and the run goes on.
    Continue,
    /// These nodes run with `Root::Error` in scope, instead of failing.
    Fallback(Vec<Node>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "node", rename_all = "snake_case")]
pub enum Node {
    Step(Step),
    /// `if / else if / else`: the first branch whose condition holds runs.
    Condition {
        /// A stable name for the journal: `if@<line>:<column>` of the source.
        id: String,
        branches: Vec<ConditionBranch>,
        otherwise: Option<Vec<Node>>,
    },
    Loop {
        slot: u32,
        id: String,
        collection: Expr,
        /// Iterations in flight at once; 1 runs them in order.
        concurrency: u32,
        /// `max N`: the most items the loop takes; a longer collection
        /// fails the loop before any iteration. Absent in plans that state
        /// none, so their JSON (and hash) is what it was before.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_items: Option<u32>,
        /// The nesting level of this loop, 0 for the outermost:
        /// `Root::LoopItem(level)` inside refers to its item.
        level: u32,
        body: Vec<Node>,
    },
    Parallel {
        slot: u32,
        id: String,
        branches: Vec<ParallelBranch>,
    },
}

impl Workflow {
    /// Calls `visit` on every step the workflow can run: in branches, loops,
    /// parallel branches, step fallbacks and the workflow's error handler.
    pub fn each_step(&self, visit: &mut impl FnMut(&Step)) {
        Node::each_step_in(&self.body, visit);
        if let OnError::Fallback(handler) = &self.on_error {
            Node::each_step_in(handler, visit);
        }
    }
}

impl Node {
    /// Calls `visit` on every step of `nodes` at any depth: in branches,
    /// loops, parallel branches and step fallbacks.
    pub fn each_step_in(nodes: &[Node], visit: &mut impl FnMut(&Step)) {
        for node in nodes {
            match node {
                Node::Step(step) => {
                    visit(step);
                    if let OnError::Fallback(body) = &step.on_error {
                        Node::each_step_in(body, visit);
                    }
                }
                Node::Condition {
                    branches,
                    otherwise,
                    ..
                } => {
                    for branch in branches {
                        Node::each_step_in(&branch.body, visit);
                    }
                    if let Some(body) = otherwise {
                        Node::each_step_in(body, visit);
                    }
                }
                Node::Loop { body, .. } => Node::each_step_in(body, visit),
                Node::Parallel { branches, .. } => {
                    for branch in branches {
                        Node::each_step_in(&branch.body, visit);
                    }
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionBranch {
    pub condition: Expr,
    pub body: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelBranch {
    pub name: String,
    pub body: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub slot: u32,
    pub id: String,
    pub action: Action,
    pub retry: Retry,
    pub timeout_ms: u64,
    #[serde(default, skip_serializing_if = "OnError::is_fail")]
    pub on_error: OnError,
    /// Boxed: few steps have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<Box<Expr>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    /// Total attempts, at least 1.
    pub attempts: u32,
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
}

/// What a step does. The kinds other than a recipe call are boxed: they are
/// few in a plan, and unboxed each made every node of a plan the size of the
/// largest (a 100,000-step plan held 27 MB of nodes of 272 bytes). A boxed
/// variant writes the same JSON as the struct variant it replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Recipe { recipe: u32, args: Vec<Field> },
    Approval(Box<ApprovalAction>),
    KbWrite(Box<KbWriteAction>),
    Handoff(Box<HandoffAction>),
    Browser(Box<BrowserAction>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalAction {
    pub approvers: Expr,
    pub message: Expr,
    pub expires_ms: Option<u64>,
    pub on_reject: OnReject,
    pub on_expire: OnExpire,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbWriteAction {
    pub collection: Template,
    pub title: Expr,
    pub content: Expr,
    pub metadata: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoffAction {
    pub department: Template,
    pub message: Expr,
    pub subject: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrowserAction {
    pub server: u32,
    pub tool: String,
    pub args: Vec<Field>,
}

impl Action {
    /// The kind of step this action makes; a step's slot says the same.
    pub fn kind(&self) -> StepKind {
        match self {
            Action::Recipe { .. } => StepKind::Recipe,
            Action::Approval(_) => StepKind::Approval,
            Action::KbWrite(_) => StepKind::KbWrite,
            Action::Handoff(_) => StepKind::Handoff,
            Action::Browser(_) => StepKind::Browser,
        }
    }
}

impl Step {
    /// Calls `visit` on every reference that executing the step evaluates:
    /// its arguments (an approval's approvers and message, a KB write's
    /// and a handoff's fields) and its idempotency key. Its fallback block
    /// is made of steps of its own.
    pub fn each_ref<'a>(&'a self, visit: &mut impl FnMut(&'a Ref)) {
        match &self.action {
            Action::Recipe { args, .. } => {
                for field in args {
                    field.value.each_ref(visit);
                }
            }
            Action::Browser(browser) => {
                for field in &browser.args {
                    field.value.each_ref(visit);
                }
            }
            Action::Approval(approval) => {
                approval.approvers.each_ref(visit);
                approval.message.each_ref(visit);
            }
            Action::KbWrite(write) => {
                write.collection.each_ref(visit);
                write.title.each_ref(visit);
                write.content.each_ref(visit);
                if let Some(metadata) = &write.metadata {
                    metadata.each_ref(visit);
                }
            }
            Action::Handoff(handoff) => {
                handoff.department.each_ref(visit);
                handoff.message.each_ref(visit);
                if let Some(subject) = &handoff.subject {
                    subject.each_ref(visit);
                }
            }
        }
        if let Some(key) = &self.idempotency_key {
            key.each_ref(visit);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnReject {
    Fail,
    Continue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnExpire {
    Reject,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    pub value: Expr,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "expr", content = "value", rename_all = "snake_case")]
pub enum Expr {
    Literal(Value),
    /// A duration literal, in milliseconds.
    Duration(u64),
    Template(Template),
    Ref(Ref),
    List(Vec<Expr>),
    Record(Vec<Field>),
    Not(Box<Expr>),
    Binary {
        op: BinaryOp,
        left: Box<Expr>,
        right: Box<Expr>,
    },
}

impl Expr {
    /// Calls `visit` on every reference in the expression, those in its
    /// templates included, in the order they are written.
    pub fn each_ref<'a>(&'a self, visit: &mut impl FnMut(&'a Ref)) {
        match self {
            Expr::Literal(_) | Expr::Duration(_) => {}
            Expr::Template(template) => template.each_ref(visit),
            Expr::Ref(reference) => visit(reference),
            Expr::List(items) => {
                for item in items {
                    item.each_ref(visit);
                }
            }
            Expr::Record(fields) => {
                for field in fields {
                    field.value.each_ref(visit);
                }
            }
            Expr::Not(inner) => inner.each_ref(visit),
            Expr::Binary { left, right, .. } => {
                left.each_ref(visit);
                right.each_ref(visit);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    /// `a ?? b`: `b` when `a` is null or absent.
    Coalesce,
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A string pre-split into text and references, rendered in a single pass:
/// text that a reference yields is never parsed as a template again.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Template {
    pub parts: Vec<TemplatePart>,
}

impl Template {
    /// Calls `visit` on every reference among the template's parts.
    pub fn each_ref<'a>(&'a self, visit: &mut impl FnMut(&'a Ref)) {
        for part in &self.parts {
            if let TemplatePart::Ref(reference) = part {
                visit(reference);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplatePart {
    Text(String),
    Ref(Ref),
}

/// A resolved reference: a root and a path below it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ref {
    pub root: Root,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<PathSegment>,
    /// Whether absence (a step that did not run, a missing optional field) is
    /// expected here and yields null, as written with `?.` or under `??`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// Defaults are left out of a plan's JSON: references and steps are most of a
/// plan, and their defaults were most of its size.
fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "root", content = "index", rename_all = "snake_case")]
pub enum Root {
    /// The whole workflow input.
    Input,
    /// One field of the workflow input, by index into `Workflow::input_fields`.
    InputField(u32),
    /// A step's output, by slot.
    Step(u32),
    /// The current item of the loop at this nesting level.
    LoopItem(u32),
    /// The current index of the loop at this nesting level.
    LoopIndex(u32),
    /// The error in a fallback block: `{ message, kind, step }`.
    Error,
    /// A recipe's input field in its prompt, by index into `Recipe::input_fields`.
    RecipeInput(u32),
    /// The run's output, in a destination delivered on `completed` only.
    Output,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathSegment {
    Field(String),
    Index(i64),
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The text is not JSON, or not a plan.
    Malformed(String),
    /// A plan of another format version.
    Version { found: u64 },
    /// The content does not match the recorded hash: it was edited by hand or damaged.
    Hash { recorded: String, computed: String },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Malformed(message) => write!(f, "not a valid plan: {message}"),
            PlanError::Version { found } => write!(
                f,
                "plan format version {found} is not supported (this runtime reads version {FORMAT_VERSION}); rebuild the plan with a matching `flowc build`"
            ),
            PlanError::Hash { recorded, computed } => write!(
                f,
                "the plan's content does not match its hash (recorded {recorded}, computed {computed}); it was changed after `flowc build`: rebuild it"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

impl OnError {
    fn is_fail(&self) -> bool {
        matches!(self, OnError::Fail)
    }
}

/// How deeply a plan's JSON may nest. The deepest workflow the compiler accepts
/// (128 levels of blocks) lowers to about 520 levels; reading recurses once per
/// level, and 1,024 levels stay well inside a 2 MiB thread stack.
const MAX_NESTING: usize = 1024;

/// The offset of the first `[` or `{` that nests deeper than `MAX_NESTING`.
fn too_deep_at(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (at, byte) in text.bytes().enumerate() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(at);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Numbers as a plan's hash sees them: a float that is an integer (within
/// the 2^53 that a float holds exactly) is written as that integer, so
/// that a plan whose numbers another tool re-spelled (`jq` writes `0.0` as
/// `0`, and `1e3` as `1000`) keeps its hash. Other floats are written as
/// serde_json writes them, the shortest form that reads back the same.
struct CanonicalNumbers;

impl serde_json::ser::Formatter for CanonicalNumbers {
    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if value.fract() == 0.0 && value.abs() < EXACT {
            write!(writer, "{}", value as i64)
        } else {
            serde_json::ser::CompactFormatter.write_f64(writer, value)
        }
    }

    fn write_f32<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        value: f32,
    ) -> std::io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }
}

impl Plan {
    /// The approvals in a workflow's `on_error` handler, as `workflow/step`:
    /// a failed run never asks them (E213). Refused where a plan is
    /// deployed, not where a stored one is loaded, so that versions
    /// deployed before the check still run.
    pub fn gates_never_asked(&self) -> Vec<String> {
        let mut found = Vec::new();
        for workflow in &self.workflows {
            if let OnError::Fallback(handler) = &workflow.on_error {
                Node::each_step_in(handler, &mut |step| {
                    if matches!(step.action, Action::Approval(_)) {
                        found.push(format!("{}/{}", workflow.name, step.id));
                    }
                });
            }
        }
        found
    }

    /// Whether a run of this plan may deliver its result to a destination
    /// (`deliver`), so that its status changes go to the outbox.
    pub fn delivers(&self) -> bool {
        self.workflows
            .iter()
            .any(|workflow| !workflow.destinations.is_empty())
    }

    /// The hash of this plan's content: SHA-256 of its compact JSON with the
    /// `hash` field empty, each integral number written as an integer
    /// (`CanonicalNumbers`). Takes `&mut` to blank the field in place rather
    /// than clone a whole plan; the field is restored before returning.
    fn content_hash(&mut self) -> String {
        self.hash_with(CanonicalNumbers, false)
    }

    /// The hashes that plans sealed before carry, still accepted since
    /// plans stored then keep them as their identity: with the root file's
    /// path as it was typed (until a deploy of one file typed two ways made
    /// two versions, an audit), and before that with numbers as serde_json
    /// writes them.
    fn legacy_hashes(&mut self) -> [String; 2] {
        [
            self.hash_with(CanonicalNumbers, true),
            self.hash_with(serde_json::ser::CompactFormatter, true),
        ]
    }

    /// The hash of the plan's JSON with an empty `hash`, and an empty
    /// `source` unless `with_source`: the path is how the file was named
    /// (`examples/a.flow`, `a.flow`), not what the plan does.
    fn hash_with(
        &mut self,
        formatter: impl serde_json::ser::Formatter,
        with_source: bool,
    ) -> String {
        /// Feeds serialized JSON straight into the hasher: a plan's JSON can be
        /// many megabytes, and there is no need to hold it in memory.
        struct Hashing(Sha256);
        impl std::io::Write for Hashing {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.update(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let recorded = std::mem::take(&mut self.hash);
        let source = if with_source {
            None
        } else {
            Some(std::mem::take(&mut self.source))
        };
        let mut hashing = Hashing(Sha256::new());
        let mut writer = std::io::BufWriter::with_capacity(64 * 1024, &mut hashing);
        let mut serializer = serde_json::Serializer::with_formatter(&mut writer, formatter);
        self.serialize(&mut serializer)
            .expect("a plan always serializes");
        std::io::Write::flush(&mut writer).expect("hashing does not fail");
        drop(writer);
        self.hash = recorded;
        if let Some(source) = source {
            self.source = source;
        }
        let digest = hashing.0.finalize();
        let mut hex = String::with_capacity(7 + 64);
        hex.push_str("sha256:");
        for byte in digest {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }

    /// Sets the format version and the hash; call after building a plan.
    pub fn seal(mut self) -> Plan {
        self.format_version = FORMAT_VERSION;
        self.hash = self.content_hash();
        self
    }

    /// The plan as pretty JSON, as `flowc build` writes it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan always serializes")
    }

    /// Reads a plan, refusing another format version or a hash mismatch.
    /// It does not [`validate`](Plan::validate) the plan: the runtime reads
    /// its stored plans through here, and one stored before a bound existed
    /// must still resume its runs.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        if let Some(at) = too_deep_at(text) {
            return Err(PlanError::Malformed(format!(
                "nested more than {MAX_NESTING} levels deep at byte {at}"
            )));
        }
        // serde_json's own limit (128 levels) is below what a deep but valid
        // workflow lowers to; the scan above bounds the depth instead.
        fn read<T: serde::de::DeserializeOwned>(text: &str) -> serde_json::Result<T> {
            let mut deserializer = serde_json::Deserializer::from_str(text);
            deserializer.disable_recursion_limit();
            let read = T::deserialize(&mut deserializer)?;
            deserializer.end().map(|()| read)
        }
        // Straight into a plan, which a plan of this version reads as (a
        // tree of JSON values first took as long again, and twice the
        // memory); a plan that does not is read again for its version, so
        // that another version's gets a version error rather than a
        // confusing one about its shape. A plan is an object: serde would
        // take a struct's fields from an array too, in order.
        let read_plan = if text.trim_start().starts_with('{') {
            read::<Plan>(text)
        } else {
            Err(serde::de::Error::custom("a plan is a JSON object"))
        };
        let mut plan: Plan = match read_plan {
            Ok(plan) if plan.format_version == FORMAT_VERSION => plan,
            Ok(plan) => {
                return Err(PlanError::Version {
                    found: plan.format_version.into(),
                });
            }
            Err(error) => {
                let value = read::<Value>(text).map_err(|e| PlanError::Malformed(e.to_string()))?;
                return Err(match value.get("format_version").and_then(Value::as_u64) {
                    Some(version) if version != u64::from(FORMAT_VERSION) => {
                        PlanError::Version { found: version }
                    }
                    Some(_) => PlanError::Malformed(error.to_string()),
                    None if !value.is_object() => PlanError::Malformed(format!(
                        "a plan is a JSON object, not {}",
                        describe_value(&value)
                    )),
                    None => PlanError::Malformed("no `format_version`".to_string()),
                });
            }
        };
        let computed = plan.content_hash();
        if computed != plan.hash && !plan.legacy_hashes().contains(&plan.hash) {
            return Err(PlanError::Hash {
                recorded: plan.hash.clone(),
                computed,
            });
        }
        Ok(plan)
    }

    pub fn workflow(&self, name: &str) -> Option<&Workflow> {
        self.workflows.iter().find(|w| w.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_plan() -> Plan {
        Plan {
            format_version: 0,
            hash: String::new(),
            source: "a.flow".into(),
            workflows: vec![Workflow {
                name: "w".into(),
                input_fields: vec!["x".into()],
                input_schema: serde_json::json!({ "type": "object" }),
                timeout_ms: 300_000,
                durability: Durability::Full,
                context: vec![],
                department: None,
                destinations: vec![],
                on_error: OnError::Fail,
                slots: vec![],
                body: vec![],
                output: vec![Field {
                    name: "echo".into(),
                    value: Expr::Ref(Ref {
                        root: Root::InputField(0),
                        path: vec![],
                        optional: false,
                    }),
                }],
            }],
            recipes: vec![],
            mcp_servers: vec![],
        }
        .seal()
    }

    #[test]
    fn a_sealed_plan_round_trips() {
        let plan = small_plan();
        assert_eq!(plan.format_version, FORMAT_VERSION);
        assert!(plan.hash.starts_with("sha256:"));
        assert_eq!(Plan::from_json(&plan.to_json()), Ok(plan));
    }

    #[test]
    fn an_edited_plan_is_refused() {
        let text = small_plan().to_json().replace("\"echo\"", "\"other\"");
        assert!(matches!(
            Plan::from_json(&text),
            Err(PlanError::Hash { .. })
        ));
    }

    #[test]
    fn absurdly_deep_json_is_refused_without_recursing() {
        let text = format!(
            "{{\"format_version\": 1, \"x\": {}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let error = Plan::from_json(&text).unwrap_err().to_string();
        assert!(error.contains("nested more than 1024 levels"), "{error}");
    }

    #[test]
    fn another_version_is_refused_whatever_its_shape() {
        let text = r#"{ "format_version": 99, "something": "else" }"#;
        assert_eq!(Plan::from_json(text), Err(PlanError::Version { found: 99 }));
        assert!(
            Plan::from_json("[1")
                .unwrap_err()
                .to_string()
                .starts_with("not a valid plan")
        );
    }

    /// Regression (an audit): a plan that is no object was told it had no
    /// `format_version`.
    #[test]
    fn a_plan_that_is_no_object_is_told_so() {
        for (text, kind) in [
            ("[]", "a list"),
            ("7", "a number"),
            ("\"plan\"", "a string"),
        ] {
            assert_eq!(
                Plan::from_json(text).unwrap_err().to_string(),
                format!("not a valid plan: a plan is a JSON object, not {kind}")
            );
        }
    }

    /// Regression (issue 13): a plan passed through `jq` (which writes
    /// `0.0` as `0` and `1e3` as `1000`) was refused as changed after
    /// `flowc build`.
    #[test]
    fn the_hash_does_not_depend_on_how_numbers_are_spelled() {
        let mut plan = small_plan();
        plan.workflows[0].input_schema = serde_json::json!({
            "type": "object",
            "properties": { "x": { "type": "number", "minimum": 0.0, "maximum": 1e3, "multipleOf": 0.5 } }
        });
        let text = plan.seal().to_json();
        assert!(text.contains("0.0") && text.contains("1000.0"), "{text}");
        let respelled = text.replace("0.0,", "0,").replace("1000.0", "1000");
        assert_ne!(text, respelled);
        let read = Plan::from_json(&respelled).expect("the same plan");
        assert_eq!(read.hash, Plan::from_json(&text).unwrap().hash);
    }

    /// A plan sealed before numbers were canonical, or before the root
    /// file's path left the hash, keeps its hash.
    #[test]
    fn a_plan_sealed_with_a_legacy_hash_is_still_read() {
        let mut plan = small_plan();
        plan.format_version = FORMAT_VERSION;
        plan.workflows[0].input_schema = serde_json::json!({ "minimum": 2.0 });
        for legacy in plan.legacy_hashes() {
            plan.hash = legacy;
            assert_ne!(plan.hash, plan.clone().seal().hash);
            let read = Plan::from_json(&plan.to_json()).expect("still accepted");
            assert_eq!(read.hash, plan.hash);
        }
    }

    /// Regression (an audit): the hash held the root file's path as typed,
    /// so one unchanged file deployed as `examples/a.flow`, `a.flow` and
    /// `/abs/a.flow` made three versions.
    #[test]
    fn the_hash_does_not_hold_the_files_path() {
        let mut elsewhere = small_plan();
        elsewhere.source = "examples/a.flow".into();
        let (here, elsewhere) = (small_plan().seal(), elsewhere.seal());
        assert_eq!(here.hash, elsewhere.hash);
        let mut changed = small_plan();
        changed.workflows[0].timeout_ms += 1;
        assert_ne!(changed.seal().hash, here.hash);
    }
}
