//! Judging a test's expectations against what its run did.

use flow_compiler::test_case::{ExpectCase, Expectation, PathPart, TestCase};
use flow_engine::eval::same;
use flow_engine::journal::{Outcome, failed_at};
use serde::Serialize;
use serde_json::Value;

use super::run::Ran;

/// An expectation that did not hold, or a run that went astray.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Miss {
    /// What the test says, as written (empty for what the run did on its
    /// own: a call without a mock, a gate left undecided).
    pub(crate) expected: String,
    pub(crate) line: Option<usize>,
    pub(crate) found: String,
}

impl Miss {
    /// What the run did on its own, which no line of the test says.
    pub(crate) fn of_run(found: String) -> Miss {
        Miss {
            expected: String::new(),
            line: None,
            found,
        }
    }
}

/// Every way `ran` falls short of `case`: the calls no mock answered and a
/// run that could not go on first, since they explain what follows.
pub(crate) fn judge(case: &TestCase, ran: &Ran) -> Vec<Miss> {
    let mut misses: Vec<Miss> = ran
        .unmocked
        .iter()
        .map(|call| Miss {
            expected: String::new(),
            line: None,
            found: format!(
                "step `{}`{} calls {}, which the test does not mock; add {}",
                call.step,
                match &call.path {
                    Some(path) if path != &call.step => format!(" at `{path}`"),
                    _ => String::new(),
                },
                call.what,
                // `--offline` makes up a recipe's answer from its type; a
                // tool's answer has none to make it from.
                if call.what.starts_with("recipe") {
                    format!(
                        "`mock step.{} = {{ ... }}` (or run with --offline for made-up answers)",
                        call.step
                    )
                } else {
                    format!("`mock step.{} = ...` with what the tool answers", call.step)
                }
            ),
        })
        .collect();
    if let Some(stuck) = &ran.stuck {
        misses.push(stuck.clone());
    }
    for expect in &case.expects {
        if let Some(found) = check(expect, ran) {
            misses.push(Miss {
                expected: expect.text.clone(),
                line: Some(expect.line),
                found,
            });
        }
    }
    misses
}

/// What was found instead, when `expect` does not hold.
fn check(expect: &ExpectCase, ran: &Ran) -> Option<String> {
    match &expect.what {
        Expectation::Status { status } => {
            let (actual, detail) = status_of(&ran.outcome);
            (actual != status).then(|| format!("the run {actual}{detail}"))
        }
        Expectation::Ran {
            step,
            ran: wanted,
            with,
        } => {
            let runs: Vec<_> = ran
                .records
                .iter()
                .filter(|record| record.step_id == *step)
                .collect();
            // A run with every field the test names, equal (a number as a
            // number, whatever its spelling; an argument left out as null).
            let fits = |input: &Value| match with {
                Some(Value::Object(fields)) => fields
                    .iter()
                    .all(|(name, value)| same(input.get(name).unwrap_or(&Value::Null), value)),
                _ => true,
            };
            let did = runs.iter().any(|record| fits(&record.input));
            (did != *wanted).then(|| match (did, runs.as_slice()) {
                (true, _) if with.is_some() => format!("step `{step}` ran with those arguments"),
                // Ran, whatever came of it: a failure under `on_error
                // continue`, a gate left undecided.
                (true, runs) => {
                    let ended: Vec<&str> = runs.iter().map(|r| r.status.as_str()).collect();
                    format!("step `{step}` ran ({})", ended.join(", then "))
                }
                (false, []) => format!("step `{step}` did not run"),
                (false, runs) => {
                    let had: Vec<String> = runs
                        .iter()
                        .map(|record| shown_arguments(&record.input, with.as_ref()))
                        .collect();
                    format!("step `{step}` ran with {}", had.join(", then "))
                }
            })
        }
        Expectation::Attempts { step, count } => {
            let records: Vec<_> = ran
                .records
                .iter()
                .filter(|record| record.step_id == *step)
                .collect();
            if records.is_empty() {
                return Some(format!("step `{step}` did not run"));
            }
            let made: usize = records.iter().map(|record| record.attempts.len()).sum();
            (made as u64 != *count).then(|| format!("step `{step}` made {made} attempt(s)"))
        }
        Expectation::Output { path, op, value } => {
            let Outcome::Completed { output } = &ran.outcome else {
                let (actual, detail) = status_of(&ran.outcome);
                return Some(format!("the run {actual}{detail}, so it has no output"));
            };
            let found = along(output, path);
            let holds = match (op.as_str(), found) {
                ("==", found) => same(found.unwrap_or(&Value::Null), value),
                ("!=", found) => !same(found.unwrap_or(&Value::Null), value),
                (op, Some(found)) => match (found.as_f64(), value.as_f64()) {
                    (Some(a), Some(b)) => match op {
                        "<" => a < b,
                        "<=" => a <= b,
                        ">" => a > b,
                        _ => a >= b,
                    },
                    _ => false,
                },
                (_, None) => false,
            };
            (!holds).then(|| match found {
                Some(found) => format!("{} is {found}", shown(path)),
                None => format!("{} is absent", shown(path)),
            })
        }
    }
}

/// The arguments of a step's run that `with` names, as `{ field: value }`.
fn shown_arguments(input: &Value, with: Option<&Value>) -> String {
    let names: Vec<&String> = match with {
        Some(Value::Object(fields)) => fields.keys().collect(),
        _ => Vec::new(),
    };
    let fields: Vec<String> = names
        .iter()
        .map(|name| {
            format!(
                "{name}: {}",
                input.get(name.as_str()).unwrap_or(&Value::Null)
            )
        })
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

/// `completed`, `failed` or `parked`, and what to add after it.
fn status_of(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Completed { .. } => ("completed", String::new()),
        Outcome::Failed {
            error,
            step,
            attempts,
        } => (
            "failed",
            format!(
                "{}: {}",
                failed_at(step.as_deref(), *attempts),
                error.message
            ),
        ),
        Outcome::Parked { pending } => (
            "parked",
            pending
                .first()
                .map(|gate| format!(" at {}", gate.path))
                .unwrap_or_default(),
        ),
    }
}

fn along<'v>(value: &'v Value, path: &[PathPart]) -> Option<&'v Value> {
    path.iter().try_fold(value, |value, part| match part {
        PathPart::Field(name) => value.get(name),
        PathPart::Index(index) => value.get(*index as usize),
    })
}

fn shown(path: &[PathPart]) -> String {
    let mut text = "output".to_string();
    for part in path {
        match part {
            PathPart::Field(name) => text.push_str(&format!(".{name}")),
            PathPart::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    text
}
