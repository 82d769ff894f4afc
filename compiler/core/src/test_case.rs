//! Lowering `test` blocks: from a checked file to the data a test runner
//! needs, with values as JSON and every expectation with its source text.
//!
//! Like `lower`, it runs only on a file without errors, so every name
//! resolves; the runner (`flowc test`) runs each case on the interpreter
//! against the plan of the file that declares its workflow.

use serde::Serialize;
use serde_json::{Map, Number, Value};

use crate::check::Checked;
use crate::diagnostic::{FileId, Span};
use crate::syntax::ast::{
    self, BinaryOp, Decision, ExpectKind, ExprKind, Failure, MockAnswer, MockTarget, Segment,
};

/// One test, ready to run.
#[derive(Debug, Clone, Serialize)]
pub struct TestCase {
    pub name: String,
    /// The workflow it runs, and the file (of the checked program) that
    /// declares it.
    pub workflow: String,
    #[serde(skip)]
    pub workflow_file: FileId,
    pub input: Value,
    pub mocks: Vec<MockCase>,
    pub decisions: Vec<DecisionCase>,
    pub expects: Vec<ExpectCase>,
    /// The `test "..."` line, for reports.
    pub line: usize,
}

/// What successive calls of a step or recipe answer; the last answer
/// serves every call after it.
#[derive(Debug, Clone, Serialize)]
pub struct MockCase {
    pub target: Target,
    pub answers: Vec<Answer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Target {
    Step(String),
    Recipe(String),
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Value(Value),
    Fails(Failure),
}

#[derive(Debug, Clone, Serialize)]
pub struct DecisionCase {
    pub step: String,
    /// One per time the run parks at the gate, the last for every time
    /// after it.
    pub decided: Vec<GateDecision>,
}

/// What a test does with a gate the time its run parks there.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateDecision {
    Decided(Decided),
    /// The approval expires (its `on_expire` applies).
    Expire,
    /// Left undecided: the run stays parked there.
    Wait,
}

#[derive(Debug, Clone, Serialize)]
pub struct Decided {
    pub approved: bool,
    pub by: String,
    pub comment: Option<String>,
    /// The line of its `decide`, which a refused decision names.
    pub line: usize,
}

/// An expectation, with the text it was written as.
#[derive(Debug, Clone, Serialize)]
pub struct ExpectCase {
    pub text: String,
    pub line: usize,
    pub what: Expectation,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Expectation {
    Status {
        status: String,
    },
    Ran {
        step: String,
        ran: bool,
        /// Arguments one of the step's runs had, when the test says.
        with: Option<Value>,
    },
    Attempts {
        step: String,
        count: u64,
    },
    /// The output along `path` (field names and indices) compared by `op`
    /// (`==`, `!=`, `<`, `<=`, `>`, `>=`) with `value`.
    Output {
        path: Vec<PathPart>,
        op: String,
        value: Value,
    },
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum PathPart {
    Field(String),
    Index(u64),
}

impl serde::Serialize for Failure {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Failure::Status(status) => serializer.serialize_u16(*status),
            other => serializer.serialize_str(
                Failure::WORDS
                    .iter()
                    .find(|(_, failure)| failure == other)
                    .map_or("failure", |(word, _)| word),
            ),
        }
    }
}

/// The root file's tests, in order; `None` when the program has errors.
pub fn lower_tests(checked: &Checked) -> Option<Vec<TestCase>> {
    checked.program()?;
    let file = &checked.files[0];
    let lines = crate::diagnostic::LineIndex::new(&file.text);
    let cases = file
        .tree
        .tests()
        .zip(&checked.analysis.tests)
        .filter_map(|(decl, info)| {
            let (workflow, workflow_file) = info.workflow.clone()?;
            let text = |span: Span| {
                file.text
                    .get(span.start as usize..span.end as usize)
                    .unwrap_or_default()
                    .to_string()
            };
            Some(TestCase {
                name: info.name.clone(),
                workflow,
                workflow_file,
                input: decl
                    .input
                    .as_ref()
                    .map_or(Value::Object(Map::new()), |input| record(&input.fields)),
                mocks: decl
                    .mocks
                    .iter()
                    .map(|mock| MockCase {
                        target: match &mock.target {
                            MockTarget::Step(name) => Target::Step(name.text.to_string()),
                            MockTarget::Recipe(name) => Target::Recipe(name.text.to_string()),
                        },
                        answers: mock
                            .answers
                            .iter()
                            .flat_map(|answer| match answer {
                                MockAnswer::Value(value) => vec![Answer::Value(json(value))],
                                MockAnswer::Fails { failure, times, .. } => {
                                    vec![Answer::Fails(*failure); *times as usize]
                                }
                            })
                            .collect(),
                    })
                    .collect(),
                decisions: decl.decisions.iter().fold(
                    Vec::<DecisionCase>::new(),
                    |mut cases, decide| {
                        // Several `decide`s of one gate make one sequence.
                        let decided = decide.decisions.iter().map(|decision| match decision {
                            Decision::Decided {
                                approved,
                                by,
                                comment,
                            } => GateDecision::Decided(Decided {
                                approved: *approved,
                                by: by.display_text(),
                                comment: comment.as_ref().map(ast::StringLit::display_text),
                                line: lines.line_col(&file.text, by.span.start).0,
                            }),
                            Decision::Expire => GateDecision::Expire,
                            Decision::Wait => GateDecision::Wait,
                        });
                        match cases.iter_mut().find(|case| case.step == decide.step.text) {
                            Some(case) => case.decided.extend(decided),
                            None => cases.push(DecisionCase {
                                step: decide.step.text.to_string(),
                                decided: decided.collect(),
                            }),
                        }
                        cases
                    },
                ),
                expects: decl
                    .expects
                    .iter()
                    .filter_map(|expect| {
                        Some(ExpectCase {
                            text: text(expect.span),
                            line: lines.line_col(&file.text, expect.span.start).0,
                            what: expectation(&expect.kind)?,
                        })
                    })
                    .collect(),
                line: lines.line_col(&file.text, decl.span.start).0,
            })
        })
        .collect();
    Some(cases)
}

fn expectation(kind: &ExpectKind) -> Option<Expectation> {
    Some(match kind {
        ExpectKind::Status(status) => Expectation::Status {
            status: status.text.to_string(),
        },
        ExpectKind::Ran { step, ran, with } => Expectation::Ran {
            step: step.text.to_string(),
            ran: *ran,
            with: with.as_ref().map(|with| record(&with.fields)),
        },
        ExpectKind::Attempts { step, count, .. } => Expectation::Attempts {
            step: step.text.to_string(),
            count: u64::try_from(*count).ok()?,
        },
        ExpectKind::Output { path, op, value } => Expectation::Output {
            path: path
                .segments
                .iter()
                .map(|segment| match segment {
                    Segment::Field { name, .. } => PathPart::Field(name.text.to_string()),
                    Segment::Index { index, .. } => PathPart::Index((*index).max(0) as u64),
                })
                .collect(),
            op: match op {
                BinaryOp::Coalesce | BinaryOp::Or | BinaryOp::And => return None,
                other => other.symbol().to_string(),
            },
            value: json(value),
        },
        ExpectKind::Other(_) => return None,
    })
}

/// A literal as JSON, as the plan holds literals: a duration in
/// milliseconds. The checker lets only literals into a test.
fn json(expr: &ast::Expr) -> Value {
    match &expr.kind {
        ExprKind::Null | ExprKind::Error => Value::Null,
        ExprKind::Bool(b) => Value::Bool(*b),
        ExprKind::Int(i) => Value::from(*i),
        ExprKind::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        ExprKind::Duration(duration) => Value::from(duration.millis().unwrap_or(0)),
        ExprKind::String(lit) => Value::String(lit.display_text()),
        ExprKind::List(items) => Value::Array(items.iter().map(json).collect()),
        ExprKind::Record(lit) => record(&lit.fields),
        // Operators over literals are not values a test writes; the
        // checker gives them a type, the runner nothing to compare.
        ExprKind::Path(_) | ExprKind::Not(_) | ExprKind::Binary(..) => Value::Null,
    }
}

fn record(fields: &[ast::RecordField]) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|field| (field.name.text.to_string(), json(&field.value)))
            .collect(),
    )
}
