//! The syntax tree of one `.flow` file.
//!
//! The tree is built from the pest parse by `parse.rs`. It keeps every span the
//! checker needs for labels, and nothing of pest: later stages never see a `Pair`.
//! Where the source had a syntax error, the tree simply lacks the broken part
//! (a statement skipped by recovery) or holds `ExprKind::Error`.

pub use ecow::EcoString;

use crate::diagnostic::Span;

/// A name as written, with where it was written. The text is an
/// [`EcoString`]: 16 bytes, and a name of up to 15 bytes (nearly every
/// id, field and recipe) is stored in it rather than allocated, so that
/// copying one into the checker's tables or the plan costs nothing either.
#[derive(Debug, Clone, PartialEq)]
pub struct Name {
    pub text: EcoString,
    pub span: Span,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceFile {
    pub items: Vec<Item>,
}

impl SourceFile {
    pub fn workflows(&self) -> impl Iterator<Item = &Workflow> {
        self.items.iter().filter_map(|item| match item {
            Item::Workflow(workflow) => Some(workflow),
            _ => None,
        })
    }

    pub fn tests(&self) -> impl Iterator<Item = &TestDecl> {
        self.items.iter().filter_map(|item| match item {
            Item::Test(test) => Some(test),
            _ => None,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Import(Import),
    Type(TypeDecl),
    Recipe(Recipe),
    Mcp(McpServer),
    Workflow(Workflow),
    Test(TestDecl),
}

impl Item {
    pub fn span(&self) -> Span {
        match self {
            Item::Import(import) => import.span,
            Item::Type(decl) => decl.span,
            Item::Recipe(recipe) => recipe.span,
            Item::Mcp(server) => server.span,
            Item::Workflow(workflow) => workflow.span,
            Item::Test(test) => test.span,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    pub path: StringLit,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TypeDecl {
    pub docs: Vec<String>,
    pub name: Name,
    pub ty: TypeExpr,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    pub kind: TypeExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeExprKind {
    /// `string`, `int`, ..., or an alias declared with `type`.
    Named(Name),
    List(Box<TypeExpr>),
    Record(Vec<FieldDecl>),
    /// A string literal type; a union of them is an enum.
    Literal(String),
    Union(Vec<TypeExpr>),
    Optional(Box<TypeExpr>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldDecl {
    pub docs: Vec<String>,
    pub name: Name,
    pub ty: TypeExpr,
}

/// A record type written as a member (`input { ... }`), with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordTypeDecl {
    pub fields: Vec<FieldDecl>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    pub docs: Vec<String>,
    pub name: Name,
    pub model: Option<StringLit>,
    pub input: Option<RecordTypeDecl>,
    pub output: Option<TypeExpr>,
    pub prompt: Option<StringLit>,
    pub context: Vec<StringLit>,
    /// Part of the body did not parse; a missing member may be in that part.
    pub recovered: bool,
    pub span: Span,
}

impl Recipe {
    /// A recipe of its name alone, its members to be filled in as read.
    pub fn named(docs: Vec<String>, name: Name) -> Recipe {
        Recipe {
            docs,
            name,
            model: None,
            input: None,
            output: None,
            prompt: None,
            context: Vec::new(),
            recovered: false,
            span: Span::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    pub docs: Vec<String>,
    pub name: Name,
    pub command: Option<StringLit>,
    pub args: Vec<Expr>,
    pub url: Option<StringLit>,
    pub env: Option<RecordLit>,
    /// Part of the body did not parse; a missing member may be in that part.
    pub recovered: bool,
    pub span: Span,
}

impl McpServer {
    /// A server of its name alone, its members to be filled in as read.
    pub fn named(docs: Vec<String>, name: Name) -> McpServer {
        McpServer {
            docs,
            name,
            command: None,
            args: Vec::new(),
            url: None,
            env: None,
            recovered: false,
            span: Span::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub docs: Vec<String>,
    pub name: Name,
    pub input: Option<RecordTypeDecl>,
    pub timeout: Option<DurationLit>,
    pub context: Vec<StringLit>,
    /// The department that owns the workflow: documents its runs write
    /// belong to it, and its documents are context for every recipe.
    pub department: Option<StringLit>,
    pub durability: Option<Name>,
    pub on_error: Option<ErrorPolicy>,
    /// Where the run's result goes when it reaches an event, in the order
    /// written (`deliver on ... to ...`).
    pub destinations: Vec<Destination>,
    pub body: Vec<Stmt>,
    pub output: Option<RecordLit>,
    pub span: Span,
}

/// `deliver on completed, failed to webhook "crm"`: the run events (checked
/// to be known by the checker) and what receives the result.
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    pub events: Vec<Name>,
    pub target: DestinationTarget,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DestinationTarget {
    /// An endpoint of the account's, by name, configured in flowd.
    Webhook { endpoint: StringLit },
    /// The account's people or approver groups, by address or group name.
    Email {
        to: Vec<StringLit>,
        subject: StringLit,
        body: StringLit,
    },
    /// A document of a knowledge-base collection, versioned by title.
    Kb {
        collection: StringLit,
        title: StringLit,
        content: Expr,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

/// A statement, every kind boxed: a `Step` is about 370 bytes, a `ForStmt`
/// 200 and a `ParallelStmt` 96, and unboxed every slot of a block's
/// `Vec<Stmt>` took the size of the largest. Boxing steps and loops took a
/// 10,000-step file's peak heap from 40 MB to 33 MB; boxing the rest took
/// a 100,000-step file's list of statements from 9.6 MB to 1.6 MB.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    Step(Box<Step>),
    If(Box<IfStmt>),
    For(Box<ForStmt>),
    Parallel(Box<ParallelStmt>),
}

/// A step: 216 bytes, in mimalloc's size class of 224 (the next is 256,
/// where it was), so its rarer parts are boxed (see [`StepCall`]) and its
/// `docs` a slice.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub docs: Box<[String]>,
    pub id: Name,
    pub call: StepCall,
    pub options: StepOptions,
    pub span: Span,
}

/// What a step calls. 56 bytes, the size of the recipe call that most
/// steps make: the other kinds box what would make them as large, so that
/// the enum's tag fits in a spare value of the recipe call's fields (72
/// bytes with the tag beside them).
#[derive(Debug, Clone, PartialEq)]
pub enum StepCall {
    Recipe {
        recipe: Name,
        args: RecordLit,
    },
    Approval {
        keyword: Span,
        args: RecordLit,
    },
    KbWrite {
        collection: Box<StringLit>,
        args: RecordLit,
    },
    Handoff {
        department: Box<StringLit>,
        args: RecordLit,
    },
    Browser {
        server: Box<Name>,
        tool: Box<Name>,
        args: RecordLit,
    },
    /// A step the parser could not read, which a syntax error reports: its
    /// id stays declared, with an unknown output, so that references to it
    /// are not reported as well. `args` is empty and spans the skipped text.
    Broken {
        args: RecordLit,
    },
}

impl StepCall {
    pub fn args(&self) -> &RecordLit {
        match self {
            StepCall::Recipe { args, .. }
            | StepCall::Approval { args, .. }
            | StepCall::KbWrite { args, .. }
            | StepCall::Handoff { args, .. }
            | StepCall::Browser { args, .. }
            | StepCall::Broken { args } => args,
        }
    }

    /// Whether running the step twice is visible outside the run; such steps
    /// want an idempotency key when they are retried.
    pub fn has_side_effects(&self) -> bool {
        matches!(
            self,
            StepCall::KbWrite { .. } | StepCall::Handoff { .. } | StepCall::Browser { .. }
        )
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            StepCall::Recipe { .. } => "recipe",
            StepCall::Approval { .. } => "approval",
            StepCall::KbWrite { .. } => "kb_write",
            StepCall::Handoff { .. } => "handoff",
            StepCall::Browser { .. } => "browser",
            StepCall::Broken { .. } => "unreadable",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOptions {
    pub retry: Option<Retry>,
    pub timeout: Option<DurationLit>,
    /// Boxed, as the idempotency key: few steps have one.
    pub on_error: Option<Box<ErrorPolicy>>,
    /// Boxed: few steps have one, and inline it took 64 of a step's bytes.
    pub idempotency: Option<Box<Expr>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    pub attempts: i64,
    pub attempts_span: Span,
    pub backoff: Option<(DurationLit, DurationLit)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ErrorPolicy {
    Fail(Span),
    Continue(Span),
    /// Boxed: inline, the block made every step 16 bytes larger.
    Fallback(Box<Block>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct IfStmt {
    /// The `if` and every `else if`, in order.
    pub branches: Vec<(Expr, Block)>,
    pub else_block: Option<Block>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ForStmt {
    pub collection: Expr,
    pub id: Name,
    pub concurrency: Option<(i64, Span)>,
    /// `max N`: the most items the loop takes.
    pub max_items: Option<(i64, Span)>,
    pub body: Block,
    pub span: Span,
    /// Written `for ID in COLLECTION` (a slip, reported at the header): ID
    /// was meant as the item's name, so its uses in the body are read as
    /// `loop_item` rather than reported once each.
    pub names_item: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParallelStmt {
    pub id: Name,
    pub branches: Vec<Branch>,
    /// Part of the block did not parse; a missing branch may be in that part.
    pub recovered: bool,
    /// The steps of statements written outside any branch, which did not
    /// parse there: declared (as `StepCall::Broken`) so that references to
    /// them are not reported again.
    pub broken: Vec<Stmt>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    pub name: Name,
    pub body: Block,
    pub span: Span,
}

/// A duration as written: digits and a unit. A bare number has no unit
/// (`timeout 60`), which the checker reports; a unit flow does not know
/// (`2w`) the parser reports, so the tree keeps no text of it.
///
/// 16 bytes: the amount, the unit and whether the digits made a number
/// share one word (read through [`Self::amount`] and [`Self::unit`]). A
/// step holds three durations (its timeout, its backoff's bounds), and at
/// 24 bytes each they took it to mimalloc's class of 224 bytes, not 192.
#[derive(Clone, PartialEq)]
pub struct DurationLit {
    pub span: Span,
    /// The amount in the low [`AMOUNT_BITS`], the unit's code above it
    /// ([`DurationUnit::code`], never 0, so that an `Option` of a duration
    /// takes no more room), and the top bit set when there is an amount.
    packed: std::num::NonZeroU64,
}

/// The bits of a duration's amount: an amount past them (over 7 * 10^16,
/// more than two million years in milliseconds) is read as no number, as
/// one of too many digits is, and the checker says it is too long.
const AMOUNT_BITS: u32 = 56;
const AMOUNT_MASK: u64 = (1 << AMOUNT_BITS) - 1;
const HAS_AMOUNT: u64 = 1 << 63;

impl std::fmt::Debug for DurationLit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurationLit")
            .field("amount", &self.amount())
            .field("unit", &self.unit())
            .field("span", &self.span)
            .finish()
    }
}

/// A duration's unit, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationUnit {
    /// None was written: a bare number.
    Missing,
    Known(Unit),
    /// One flow does not know, already reported by the parser.
    Unknown,
}

/// The units flow writes durations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Milliseconds,
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl Unit {
    /// The unit written as `text`, if flow knows it.
    pub fn parse(text: &str) -> Option<Unit> {
        UNITS
            .iter()
            .find(|(u, ..)| *u == text)
            .map(|(_, unit, _)| *unit)
    }

    /// Its length in milliseconds.
    pub fn ms(self) -> u64 {
        UNITS
            .iter()
            .find(|(_, u, _)| *u == self)
            .map_or(1, |(.., ms)| *ms)
    }
}

impl DurationUnit {
    /// A number of 3 bits for the unit, for [`DurationLit`]'s packed word.
    fn code(self) -> u64 {
        match self {
            DurationUnit::Missing => 1,
            DurationUnit::Unknown => 2,
            DurationUnit::Known(unit) => {
                3 + UNITS.iter().position(|(_, u, _)| *u == unit).unwrap_or(0) as u64
            }
        }
    }

    fn from_code(code: u64) -> DurationUnit {
        match code {
            1 => DurationUnit::Missing,
            3.. => UNITS
                .get(code as usize - 3)
                .map_or(DurationUnit::Unknown, |(_, unit, _)| {
                    DurationUnit::Known(*unit)
                }),
            _ => DurationUnit::Unknown,
        }
    }

    /// The unit `text` names; empty text is no unit.
    pub fn of(text: &str) -> DurationUnit {
        match Unit::parse(text) {
            Some(unit) => DurationUnit::Known(unit),
            None if text.is_empty() => DurationUnit::Missing,
            None => DurationUnit::Unknown,
        }
    }
}

impl DurationLit {
    /// `amount` is `None` when the digits make no number (a sign, or too
    /// many of them).
    pub fn new(amount: Option<u64>, unit: DurationUnit, span: Span) -> DurationLit {
        let amount = match amount {
            Some(amount) if amount <= AMOUNT_MASK => amount | HAS_AMOUNT,
            _ => 0,
        };
        let packed = amount | unit.code() << AMOUNT_BITS;
        DurationLit {
            span,
            packed: std::num::NonZeroU64::new(packed).unwrap_or(std::num::NonZeroU64::MIN),
        }
    }

    /// The number written, when the digits make one.
    pub fn amount(&self) -> Option<u64> {
        let packed = self.packed.get();
        (packed & HAS_AMOUNT != 0).then_some(packed & AMOUNT_MASK)
    }

    pub fn unit(&self) -> DurationUnit {
        DurationUnit::from_code((self.packed.get() & !HAS_AMOUNT) >> AMOUNT_BITS)
    }

    /// The duration in milliseconds, when the unit is one we know.
    pub fn millis(&self) -> Option<u64> {
        match self.unit() {
            DurationUnit::Known(unit) => self.amount()?.checked_mul(unit.ms()),
            DurationUnit::Missing | DurationUnit::Unknown => None,
        }
    }
}

/// The units of durations, longest first, with their length in milliseconds.
pub(crate) const UNITS: &[(&str, Unit, u64)] = &[
    ("d", Unit::Days, 86_400_000),
    ("h", Unit::Hours, 3_600_000),
    ("m", Unit::Minutes, 60_000),
    ("s", Unit::Seconds, 1_000),
    ("ms", Unit::Milliseconds, 1),
];

pub(crate) fn unit_ms(unit: &str) -> Option<u64> {
    Unit::parse(unit).map(Unit::ms)
}

/// The length in milliseconds of a unit that other tools write (`w`,
/// `min`, `hours`, `secs`), which flow spells otherwise or not at all.
pub(crate) fn foreign_unit_ms(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_lowercase();
    let ms = match unit.trim_end_matches('s') {
        "w" | "wk" | "week" => 7 * 86_400_000,
        "day" => 86_400_000,
        "hr" | "hour" => 3_600_000,
        "min" | "minute" => 60_000,
        "sec" | "second" => 1_000,
        "msec" | "milli" | "millisecond" => 1,
        _ => return None,
    };
    Some(ms)
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordLit {
    pub fields: Vec<RecordField>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordField {
    pub name: Name,
    pub value: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Duration(DurationLit),
    String(StringLit),
    List(Vec<Expr>),
    Record(RecordLit),
    Path(Path),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// A part the parser could not read; it has already been reported.
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
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

impl BinaryOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Coalesce => "??",
            BinaryOp::Or => "||",
            BinaryOp::And => "&&",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
        }
    }

    /// Binding strength: higher binds tighter.
    pub(crate) fn precedence(self) -> u8 {
        match self {
            BinaryOp::Coalesce => 1,
            BinaryOp::Or => 2,
            BinaryOp::And => 3,
            _ => 4,
        }
    }
}

/// A reference such as `step.classify?.summary` or `loop_item.tags[0]`.
///
/// Its span is its root's and its segments' (no trivia comes between
/// them), not a field: a path of 48 bytes leaves room for [`ExprKind`]'s
/// tag, which makes an expression 56 bytes rather than 64.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    pub root: Name,
    pub segments: Vec<Segment>,
}

impl Path {
    /// From the start of the root to the end of the last segment.
    pub fn span(&self) -> Span {
        let end = self
            .segments
            .last()
            .map_or(self.root.span.end, |segment| segment.span().end);
        Span {
            start: self.root.span.start,
            end,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Field { name: Name, optional: bool },
    Index { index: i64, span: Span },
}

impl Segment {
    pub fn span(&self) -> Span {
        match self {
            Segment::Field { name, .. } => name.span,
            Segment::Index { span, .. } => *span,
        }
    }
}

/// A string literal: its span in the source and its decoded template.
#[derive(Debug, Clone, PartialEq)]
pub struct StringLit {
    pub template: Template,
    pub span: Span,
}

impl StringLit {
    /// The text when the string has no references.
    pub fn as_plain(&self) -> Option<&str> {
        match self.template.parts.as_slice() {
            [] => Some(""),
            [TemplatePart::Text(text)] => Some(text.as_str()),
            _ => None,
        }
    }

    /// The text with references written back as `{{...}}`, for names and messages.
    pub fn display_text(&self) -> String {
        self.template
            .parts
            .iter()
            .map(|part| match part {
                TemplatePart::Text(text) => text.to_string(),
                TemplatePart::Ref(path) => format!("{{{{{}}}}}", path_text(path)),
            })
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Template {
    pub parts: Vec<TemplatePart>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplatePart {
    /// Text between references: most fits in the string itself.
    Text(EcoString),
    Ref(Path),
}

/// Writes a path back as source text (`step.a?.b[0]`).
pub fn path_text(path: &Path) -> String {
    let mut text = path.root.text.to_string();
    for segment in &path.segments {
        match segment {
            Segment::Field { name, optional } => {
                text.push_str(if *optional { "?." } else { "." });
                text.push_str(&name.text);
            }
            Segment::Index { index, .. } => {
                text.push_str(&format!("[{index}]"));
            }
        }
    }
    text
}

/// A `test` block: a run of a workflow with mocked recipes and decided
/// approvals, and what must hold when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct TestDecl {
    pub docs: Vec<String>,
    pub name: StringLit,
    pub workflow: Option<Name>,
    pub input: Option<RecordLit>,
    pub mocks: Vec<Mock>,
    pub decisions: Vec<Decide>,
    pub expects: Vec<Expect>,
    /// Part of the body did not parse; a missing member may be in that part.
    pub recovered: bool,
    pub span: Span,
}

/// `mock step.ID ...` or `mock recipe NAME ...`: the answers of successive
/// calls, the last one repeated for every call after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mock {
    pub target: MockTarget,
    pub answers: Vec<MockAnswer>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MockTarget {
    /// The step with this id, wherever it runs (each loop iteration too).
    Step(Name),
    /// Every call of this recipe that no step mock answers.
    Recipe(Name),
}

impl MockTarget {
    pub fn name(&self) -> &Name {
        match self {
            MockTarget::Step(name) | MockTarget::Recipe(name) => name,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum MockAnswer {
    /// The call returns this value.
    Value(Expr),
    /// The call fails `times` times in a row.
    Fails {
        failure: Failure,
        times: u32,
        span: Span,
    },
}

/// How a mocked call fails, as a provider would: what the retry policy and
/// error handlers see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An HTTP status from the provider (429, 500, 400...).
    Status(u16),
    /// The call did not answer in time.
    Timeout,
    /// The connection failed.
    Connection,
    /// The answer does not fit the recipe's output, even after repair.
    InvalidOutput,
}

impl Failure {
    /// The words that name a failure, as written after `fails`.
    pub const WORDS: &[(&str, Failure)] = &[
        ("timeout", Failure::Timeout),
        ("connection", Failure::Connection),
        ("invalid_output", Failure::InvalidOutput),
    ];

    pub fn describe(self) -> String {
        match self {
            Failure::Status(status) => format!("HTTP {status}"),
            Failure::Timeout => "a timeout".to_string(),
            Failure::Connection => "a connection failure".to_string(),
            Failure::InvalidOutput => "invalid output".to_string(),
        }
    }
}

/// `decide step.ID approve|reject by "who" [comment "..."]` or `expire`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decide {
    pub step: Name,
    /// One per time the run parks at the gate (the last for every time
    /// after it); never empty.
    pub decisions: Vec<Decision>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Decided {
        approved: bool,
        by: StringLit,
        comment: Option<StringLit>,
    },
    Expire,
    /// Left undecided: the run stays parked at the gate.
    Wait,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    pub kind: ExpectKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExpectKind {
    /// `expect status completed`.
    Status(Name),
    /// `expect ran step.x`, or `expect not ran step.x` (`ran` false).
    Ran {
        step: Name,
        ran: bool,
        /// `with { field: value }`: the step's arguments (a handoff's
        /// `message`, a kb_write's `title`...) that one of its runs had.
        with: Option<RecordLit>,
    },
    /// `expect attempts step.x == 3`.
    Attempts {
        step: Name,
        count: i64,
        count_span: Span,
    },
    /// `expect output.field == value` (or another comparison), `expect
    /// output == {...}`: the path below `output`, the operator, the value.
    Output {
        path: Path,
        op: BinaryOp,
        value: Expr,
    },
    /// An expression of another shape, kept for the checker to report.
    Other(Expr),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the packed word of a duration: each unit and amount reads
    /// back as given, and an amount past its bits reads as no number.
    #[test]
    fn durations_read_back_as_written() {
        let span = Span { start: 3, end: 9 };
        let mut units = vec![DurationUnit::Missing, DurationUnit::Unknown];
        units.extend(UNITS.iter().map(|(_, unit, _)| DurationUnit::Known(*unit)));
        for unit in units {
            for amount in [Some(0), Some(1), Some(90), Some(AMOUNT_MASK), None] {
                let lit = DurationLit::new(amount, unit, span);
                assert_eq!((lit.amount(), lit.unit(), lit.span), (amount, unit, span));
            }
            let past = DurationLit::new(Some(AMOUNT_MASK + 1), unit, span);
            assert_eq!((past.amount(), past.unit()), (None, unit));
        }
        let two_days = DurationLit::new(Some(2), DurationUnit::Known(Unit::Days), span);
        assert_eq!(two_days.millis(), Some(172_800_000));
        assert_eq!(std::mem::size_of::<Option<DurationLit>>(), 16);
    }
}

/// Guards the sizes the B6 benchmark's peak memory was brought down with
/// (docs/benchmarks.md): each type here is held once per step, record
/// field or reference of a source, and a field added to one of them moves
/// every large file's memory.
#[cfg(all(test, target_pointer_width = "64"))]
mod sizes {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn a_step_fits_in_192_bytes() {
        assert_eq!(size_of::<Step>(), 192);
        assert_eq!(size_of::<StepCall>(), 56);
        assert_eq!(size_of::<StepOptions>(), 88);
    }

    #[test]
    fn an_expression_is_56_bytes() {
        assert_eq!(size_of::<Expr>(), 56);
        assert_eq!(size_of::<Path>(), 48);
        assert_eq!(size_of::<RecordField>(), 80);
        assert_eq!(size_of::<TemplatePart>(), 48);
    }
}
