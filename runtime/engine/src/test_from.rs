//! A recorded run written as a `test` block (`flow test-from RUN`, flowd's
//! `GET /v1/runs/{id}/test`): its input, each recipe's and tool's recorded
//! answers as mocks (a sequence for loops and retries, failures as the
//! provider's errors), each approval's decisions (a sequence for a gate in
//! a loop), and its status and output
//! as expectations, so that a run seen in production becomes a regression
//! test in one command.
//!
//! The text is written in one line per member; the drivers lay it out with
//! the compiler's formatter (`flow_compiler::format::format_source`), which
//! this crate does not link.

use std::collections::BTreeMap;

use flow_plan::{Action, DURATION_PATTERN, ErrorKind, Plan, StepKind};
use serde_json::Value;

use crate::journal::{Attempt, StepRecord, StepStatus};

/// What a run's test is written from: the run's row and journal.
pub struct RecordedRun<'a> {
    pub id: &'a str,
    pub workflow: &'a str,
    pub input: &'a Value,
    pub records: &'a [StepRecord],
    /// The run's status as the API spells it (`completed`, `failed`,
    /// `pending_approval`, `cancelled`, `running`).
    pub status: &'a str,
    /// The execution path of the step a failed run failed at, if a step.
    pub failed_at: Option<&'a str>,
    /// The output of a completed run.
    pub output: Option<&'a Value>,
}

/// The `test` block of `run`, after an `import` of the workflow's file;
/// or why none can be written.
pub fn test_block(plan: &Plan, run: &RecordedRun<'_>) -> Result<String, String> {
    let workflow = plan.workflow(run.workflow).ok_or_else(|| {
        format!(
            "the run's plan has no workflow `{}` (it was built from {})",
            run.workflow, plan.source
        )
    })?;
    // The output schema of each step's answers, by step id.
    let mut schemas: BTreeMap<String, Option<&Value>> = BTreeMap::new();
    workflow.each_step(&mut |step| {
        let schema = match &step.action {
            Action::Recipe { recipe, .. } => plan
                .recipes
                .get(*recipe as usize)
                .map(|recipe| &recipe.output_schema),
            _ => None,
        };
        // Steps of one id share it: the checker keeps ids unique.
        schemas.entry(step.id.clone()).or_insert(schema);
    });

    // Calls in the order they were made: a sequence answers them in turn.
    let mut records: Vec<&StepRecord> = run.records.iter().collect();
    records.sort_by(|a, b| (a.started_ms, &a.path).cmp(&(b.started_ms, &b.path)));

    let import = plan
        .source
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(&plan.source);
    // A test's input is a record: a run started with another JSON value
    // failed at preflight, and its test would not parse (regression, an
    // audit: "the test written from the run does not parse").
    if !run.input.is_object() {
        return Err(format!(
            "the run's input is {}, not an object of the workflow's input fields: the run failed before its first step, and a test needs an input the workflow takes",
            flow_plan::describe_value(run.input)
        ));
    }
    let mut text = format!("import {}\n\n", string_literal(import));
    text.push_str(&format!(
        "test {} {{\n",
        string_literal(&format!("run {}", run.id))
    ));
    text.push_str(&format!("workflow {}\n", run.workflow));
    text.push_str(&format!(
        "input {}\n",
        literal(run.input, Some(&workflow.input_schema))
    ));
    let mut mocked: Vec<&str> = Vec::new();
    for record in &records {
        if !matches!(record.kind, StepKind::Recipe | StepKind::Browser)
            || mocked.contains(&record.step_id.as_str())
        {
            continue;
        }
        mocked.push(&record.step_id);
        let schema = schemas.get(&record.step_id).copied().flatten();
        let answers: Vec<String> = records
            .iter()
            .filter(|other| other.step_id == record.step_id)
            .flat_map(|other| answers(other, schema))
            .collect();
        if let Some(mock) = mock(&record.step_id, &answers) {
            text.push_str(&mock);
        }
    }
    // A gate's decisions in the order they were made, one per time the
    // run parked there (a gate in a loop); one still waiting is `wait`,
    // else the last decision would decide it too, and the test's run go
    // past where the run parked.
    let mut decided: Vec<&str> = Vec::new();
    for record in &records {
        if record.kind != StepKind::Approval || decided.contains(&record.step_id.as_str()) {
            continue;
        }
        decided.push(&record.step_id);
        let decisions: Vec<String> = records
            .iter()
            .filter(|other| other.step_id == record.step_id)
            .filter_map(|other| match other.status {
                StepStatus::Pending => Some("wait".to_string()),
                _ => other.output.as_deref().and_then(decision),
            })
            .collect();
        if !decisions.is_empty() {
            text.push_str(&format!(
                "decide step.{} {}\n",
                record.step_id,
                decisions.join(" then ")
            ));
        }
    }
    text.push_str(&end_expectation(run, &records));
    // A record's fields one by one: a failure then names the field.
    match run.output {
        Some(Value::Object(fields)) if !fields.is_empty() => {
            for (name, value) in fields {
                output_expectations(&format!("output.{name}"), value, &mut text);
            }
        }
        Some(output) => output_expectations("output", output, &mut text),
        None => {}
    }
    text.push_str("}\n");
    Ok(text)
}

/// `expect PATH == VALUE`, but for the approvals' decisions `value` holds:
/// a decision's `decided_at` is when someone decided, which the test's run
/// dates on its own clock (`2000-01-01T00:00:00Z` on), so it is not
/// expected, and the values around it are expected part by part.
fn output_expectations(path: &str, value: &Value, text: &mut String) {
    if !holds_decision(value) {
        text.push_str(&format!("expect {path} == {}\n", literal(value, None)));
        return;
    }
    let decision = is_decision(value);
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                if decision && name == "decided_at" {
                    text.push_str(&format!(
                        "// {path}.decided_at: a decision's time, which a test dates on its own clock\n"
                    ));
                } else if flow_plan::is_ident(name) {
                    output_expectations(&format!("{path}.{name}"), field, text);
                } else {
                    text.push_str(&format!(
                        "// {path}: holds a decision's time under a field no path can name\n"
                    ));
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                output_expectations(&format!("{path}[{index}]"), item, text);
            }
        }
        _ => {}
    }
}

/// Whether `value` is an approval's output: `approved`, `approver`,
/// `comment` and `decided_at`.
fn is_decision(value: &Value) -> bool {
    value.get("approved").is_some_and(Value::is_boolean)
        && value.get("approver").is_some_and(Value::is_string)
        && value.get("decided_at").is_some_and(Value::is_string)
}

/// Whether `value` is, or holds, an approval's output.
fn holds_decision(value: &Value) -> bool {
    is_decision(value)
        || match value {
            Value::Object(fields) => fields.values().any(holds_decision),
            Value::Array(items) => items.iter().any(holds_decision),
            _ => false,
        }
}

/// The expectation on how the run ended, or a comment saying why a test
/// cannot state it: a test cannot cancel a run or stop one midway, and its
/// in-memory store never refuses a KB write or a handoff.
fn end_expectation(run: &RecordedRun<'_>, records: &[&StepRecord]) -> String {
    let effect_failed = run.failed_at.and_then(|path| {
        records.iter().find(|record| {
            record.path == path && matches!(record.kind, StepKind::KbWrite | StepKind::Handoff)
        })
    });
    match (run.status, effect_failed) {
        ("failed", Some(record)) => format!(
            "// The run failed at `{}` ({}), which a test's store never fails: its status is not expected.\n",
            record.path,
            record.kind.name()
        ),
        ("completed" | "failed", _) => format!("expect status {}\n", run.status),
        ("pending_approval", _) => "expect status parked\n".to_string(),
        ("cancelled", _) => {
            "// The run was cancelled, which a test cannot do: its end is not expected, and the steps it did not reach need mocks of their own.\n"
                .to_string()
        }
        _ => "// The run had not ended when this test was written: its end is not expected, and the steps it did not reach need mocks of their own.\n"
            .to_string(),
    }
}

/// A step's mock, `mock step.ID = A` or `mock step.ID A then B ...`, its
/// equal neighbours folded (`fails 429 twice`). `None` without answers.
fn mock(step: &str, answers: &[String]) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut index = 0;
    while index < answers.len() {
        let answer = &answers[index];
        let mut count = 1;
        while answer.starts_with("fails ") && answers.get(index + count) == Some(answer) {
            count += 1;
        }
        parts.push(match count {
            1 => answer.clone(),
            2 => format!("{answer} twice"),
            n => format!("{answer} {n} times"),
        });
        index += count;
    }
    let first = parts.first()?;
    let head = if first.starts_with("fails ") {
        format!("mock step.{step} {first}")
    } else {
        format!("mock step.{step} = {first}")
    };
    let rest: String = parts[1..].iter().map(|p| format!(" then {p}")).collect();
    Some(format!("{head}{rest}\n"))
}

/// What one execution of a step answered, attempt by attempt: a failure
/// for each failed attempt (but one whose answer a repair request mended,
/// which a test's answer stands for), then the recorded output.
fn answers(record: &StepRecord, schema: Option<&Value>) -> Vec<String> {
    let mut answers = Vec::new();
    for (index, attempt) in record.attempts.iter().enumerate() {
        // A redriven run's earlier drives are not the test's: it runs once,
        // so only the attempts of the drive that settled the step count
        // (before, every round's failures were mocked in one sequence, and
        // the test failed where the run had been redriven).
        if attempt.round != record.round {
            continue;
        }
        let repaired = record
            .attempts
            .get(index + 1)
            .is_some_and(|next| next.repair);
        if repaired {
            continue;
        }
        if let Some(failure) = failure(attempt) {
            answers.push(failure);
        }
    }
    if record.status == StepStatus::Completed
        && let Some(output) = &record.output
    {
        answers.push(literal(output, schema));
    }
    answers
}

/// A failed attempt as a mock's `fails ...`: the error kind the provider
/// answered (`kind: message`, as the interpreter records it).
fn failure(attempt: &Attempt) -> Option<String> {
    let error = attempt.error.as_deref()?;
    let (kind, message) = error.split_once(": ").unwrap_or((error, ""));
    // The status as a provider's error says it (`URL answered 500
    // Internal Server Error: ...`, `answered 200 OK with an error
    // (overloaded_error, as a 529)`) or a mock's (`HTTP 500 (mocked)`),
    // when it is one a mock fails with for the same kind: a 200 or a
    // redirect is none (an audit: `fails 200` did not parse).
    let status = |default: u16| {
        ["as a ", "answered ", "HTTP "]
            .iter()
            .filter_map(|marker| {
                let (_, rest) = message.split_once(marker)?;
                rest.get(..3)?.parse::<u16>().ok()
            })
            .find(|status| {
                (400..600).contains(status) && ErrorKind::of_status(*status).name() == kind
            })
            .unwrap_or(default)
    };
    let what = match kind {
        k if k == ErrorKind::RateLimited.name() => "429".to_string(),
        k if k == ErrorKind::Server.name() => status(503).to_string(),
        k if k == ErrorKind::Client.name() => status(400).to_string(),
        k if k == ErrorKind::Timeout.name() => "timeout".to_string(),
        k if k == ErrorKind::Connection.name() => "connection".to_string(),
        k if k == ErrorKind::InvalidOutput.name() => "invalid_output".to_string(),
        // Other errors (an expression, a refused argument) are the run's
        // own, not the provider's: the test's run makes them again.
        _ => return None,
    };
    Some(format!("fails {what}"))
}

/// An approval's recorded decision as a `decide` member's words.
fn decision(output: &Value) -> Option<String> {
    let approved = output.get("approved")?.as_bool()?;
    let approver = output.get("approver")?.as_str()?;
    if approver.is_empty() {
        return Some("expire".to_string());
    }
    let mut words = format!(
        "{} by {}",
        if approved { "approve" } else { "reject" },
        string_literal(approver)
    );
    if let Some(comment) = output.get("comment").and_then(Value::as_str) {
        words.push_str(&format!(" comment {}", string_literal(comment)));
    }
    Some(words)
}

/// `value` as a flow literal; `schema`, when known, says which strings
/// are durations (written bare, `30s`) and which numbers are floats
/// (written with a point).
pub fn literal(value: &Value, schema: Option<&Value>) -> String {
    let schema = schema.map(unwrap_optional);
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let text = n.to_string();
            // A whole number past an `int`'s 64 bits (in a `json` value)
            // is written as the float it then reads as.
            let float = schema.and_then(|s| s.get("type")).and_then(Value::as_str)
                == Some("number")
                || (n.is_u64() && !n.is_i64());
            if float && !text.contains(['.', 'e', 'E']) {
                format!("{text}.0")
            } else {
                text
            }
        }
        Value::String(s) => {
            let duration = schema
                .and_then(|s| s.get("pattern"))
                .and_then(Value::as_str)
                == Some(DURATION_PATTERN);
            if duration {
                s.clone()
            } else {
                string_literal(s)
            }
        }
        Value::Array(items) => {
            let item = schema.and_then(|s| s.get("items"));
            let items: Vec<String> = items.iter().map(|v| literal(v, item)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(fields) => {
            if fields.is_empty() {
                return "{}".to_string();
            }
            let properties = schema.and_then(|s| s.get("properties"));
            let fields: Vec<String> = fields
                .iter()
                .map(|(name, v)| {
                    let field = properties.and_then(|p| p.get(name));
                    format!("{name}: {}", literal(v, field))
                })
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
    }
}

/// The schema of an optional's value (`anyOf: [T, null]`), else `schema`.
fn unwrap_optional(schema: &Value) -> &Value {
    schema
        .get("anyOf")
        .and_then(Value::as_array)
        .and_then(|branches| branches.iter().find(|b| !crate::schema::is_null_schema(b)))
        .unwrap_or(schema)
}

/// `text` as a string literal of the language: quotes, backslashes,
/// control characters and braces escaped (a `{{` would otherwise be read
/// as a reference).
pub fn string_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '{' => out.push_str("\\{"),
            '}' => out.push_str("\\}"),
            // A string holds no other control character as it is (an
            // audit: a model's U+0000 made a test that did not parse).
            c if c.is_control() => out.push_str(&format!("\\u{{{:X}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_follow_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "wait": { "type": "string", "pattern": DURATION_PATTERN },
                "amount": { "anyOf": [{ "type": "number" }, { "type": "null" }] },
                "note": { "type": "string" },
                "tags": { "type": "array", "items": { "type": "string" } },
            }
        });
        let value =
            json!({ "wait": "30s", "amount": 40, "note": "a \"{{x}}\"\n\u{0}\u{7f}", "tags": [] });
        assert_eq!(
            literal(&value, Some(&schema)),
            r#"{ amount: 40.0, note: "a \"\{\{x\}\}\"\n\u{0}\u{7F}", tags: [], wait: 30s }"#
        );
        assert_eq!(literal(&json!(u64::MAX), None), "18446744073709551615.0");
        assert_eq!(literal(&json!(i64::MIN), None), "-9223372036854775808");
    }

    fn failed(path: &str, kind: StepKind) -> StepRecord {
        StepRecord {
            path: path.to_string(),
            step_id: path.rsplit('/').next().unwrap_or(path).to_string(),
            kind,
            status: StepStatus::Failed,
            input: json!({}),
            output: None,
            error: None,
            attempts: Vec::new(),
            started_ms: 1,
            ended_ms: 2,
            round: 0,
        }
    }

    /// What a test can state of a run's end: not a cancel, not an end it
    /// has not reached, not a failure of a store a test holds in memory.
    #[test]
    fn the_end_is_expected_only_where_a_test_can_reach_it() {
        let save = failed("each[1]/save", StepKind::KbWrite);
        let classify = failed("classify", StepKind::Recipe);
        let records = [&save, &classify];
        let run = |status, failed_at| RecordedRun {
            id: "r",
            workflow: "w",
            input: &Value::Null,
            records: &[],
            status,
            failed_at,
            output: None,
        };
        let cases = [
            ("completed", None, "expect status completed"),
            ("pending_approval", None, "expect status parked"),
            ("failed", Some("classify"), "expect status failed"),
            ("failed", None, "expect status failed"),
            (
                "failed",
                Some("each[1]/save"),
                "// The run failed at `each[1]/save` (kb_write), which a test's store never fails",
            ),
            ("cancelled", None, "// The run was cancelled"),
            ("running", None, "// The run had not ended"),
        ];
        for (status, failed_at, says) in cases {
            let line = end_expectation(&run(status, failed_at), &records);
            assert!(line.starts_with(says), "{status}: {line}");
        }
    }

    /// Regression: a provider's 500 was written `fails 503` and its 401
    /// `fails 400`: the status was looked for as a mock says it only.
    #[test]
    fn a_failure_keeps_its_status() {
        let attempt = |error: &str| Attempt {
            index: 0,
            error: Some(error.to_string()),
            delay_ms: None,
            round: 0,
            repair: false,
            started_ms: None,
            ended_ms: None,
            cut_short: false,
        };
        let cases = [
            (
                "server: http://x/v1/chat/completions answered 500 Internal Server Error: boom",
                "fails 500",
            ),
            (
                "client: http://x/v1/chat/completions answered 401 Unauthorized: no",
                "fails 401",
            ),
            ("server: HTTP 502 (mocked)", "fails 502"),
            (
                "server: https://api.example/v1/messages answered 200 OK with an error (overloaded_error, as a 529): Overloaded",
                "fails 529",
            ),
            (
                "client: https://api.example/v1 answered 302 Found, a redirect to https://elsewhere.example",
                "fails 400",
            ),
            ("server: the reply has no content", "fails 503"),
            (
                "rate_limited: http://x answered 429 Too Many Requests",
                "fails 429",
            ),
        ];
        for (error, written) in cases {
            assert_eq!(
                failure(&attempt(error)).as_deref(),
                Some(written),
                "{error}"
            );
        }
    }

    /// Regression: the attempts of every drive of a redriven run were
    /// mocked as one sequence, so that the test failed where the run had
    /// failed before its redrive; a test runs once, as the last drive did.
    #[test]
    fn a_redriven_step_is_answered_as_its_last_drive() {
        let attempt = |round: u32, error: Option<&str>| Attempt {
            index: 0,
            error: error.map(str::to_string),
            delay_ms: None,
            round,
            repair: false,
            started_ms: None,
            ended_ms: None,
            cut_short: false,
        };
        let record = StepRecord {
            status: StepStatus::Completed,
            output: Some(std::sync::Arc::new(json!({ "a": 1 }))),
            attempts: vec![
                attempt(
                    0,
                    Some("timeout: the attempt ran past the step's timeout of 5s"),
                ),
                attempt(
                    0,
                    Some("timeout: the attempt ran past the step's timeout of 5s"),
                ),
                attempt(1, Some("server: HTTP 503 (mocked)")),
                attempt(1, None),
            ],
            round: 1,
            ..failed("c", StepKind::Recipe)
        };
        assert_eq!(answers(&record, None), ["fails 503", "{ a: 1 }"]);
    }

    #[test]
    fn repeated_failures_fold() {
        let answers = [
            "fails 429",
            "fails 429",
            "fails 503",
            "{ a: 1 }",
            "{ a: 2 }",
        ]
        .map(str::to_string);
        assert_eq!(
            mock("s", &answers).unwrap(),
            "mock step.s fails 429 twice then fails 503 then { a: 1 } then { a: 2 }\n"
        );
        assert_eq!(mock("s", &[]), None);
    }
}
