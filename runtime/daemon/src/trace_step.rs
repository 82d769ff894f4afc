//! A step execution as the API answers it (`GET /v1/runs/{id}/trace`):
//! a type of its own, built from the interpreter's `StepRecord`, so that
//! the interpreter's record, the stored record (`flow_runtime::store::
//! record`) and this answer each change alone. Its OpenAPI schema keeps
//! the names `StepRecord` and `Attempt` that clients were given.

use flow_plan::StepKind;
use flow_runtime::error::StepError;
use flow_runtime::journal::{Attempt, StepRecord, StepStatus};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// One step execution: the journal's unit and the trace tree's node.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = StepRecord)]
pub(crate) struct TraceStep {
    path: String,
    step_id: String,
    kind: StepKind,
    status: StepStatus,
    input: Value,
    output: Option<Value>,
    error: Option<StepError>,
    attempts: Vec<TraceAttempt>,
    started_ms: u64,
    ended_ms: u64,
    /// The redrive it was written in (0: the run's first drive): a failed
    /// step of an earlier one runs again in a redrive.
    #[serde(skip_serializing_if = "is_zero")]
    round: u32,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Attempt)]
pub(crate) struct TraceAttempt {
    index: u32,
    error: Option<String>,
    /// The wait before the next attempt.
    delay_ms: Option<u64>,
    /// The redrive it was made in (0: the run's first drive). A redriven
    /// step gets its retry budget anew; its earlier attempts stay.
    #[serde(skip_serializing_if = "is_zero")]
    round: u32,
    /// A repair request: the model shown the attempt before's answer that
    /// did not fit, and asked again. It is not counted in the retry budget.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    repair: bool,
    /// When the attempt's call went out and when its answer (or error)
    /// came, in milliseconds since the Unix epoch: what a timeline draws.
    /// Absent in records written before attempts were timed.
    #[serde(skip_serializing_if = "Option::is_none")]
    started_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_ms: Option<u64>,
    /// The workflow's deadline ended this attempt, or the wait after it:
    /// a redrive runs the step again, whatever its `on_error`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cut_short: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl From<StepRecord> for TraceStep {
    fn from(record: StepRecord) -> TraceStep {
        TraceStep {
            path: record.path,
            step_id: record.step_id,
            kind: record.kind,
            status: record.status,
            input: record.input,
            output: record.output.map(std::sync::Arc::unwrap_or_clone),
            error: record.error,
            attempts: record
                .attempts
                .into_iter()
                .map(TraceAttempt::from)
                .collect(),
            started_ms: record.started_ms,
            ended_ms: record.ended_ms,
            round: record.round,
        }
    }
}

impl From<Attempt> for TraceAttempt {
    fn from(attempt: Attempt) -> TraceAttempt {
        TraceAttempt {
            index: attempt.index,
            error: attempt.error,
            delay_ms: attempt.delay_ms,
            round: attempt.round,
            repair: attempt.repair,
            started_ms: attempt.started_ms,
            ended_ms: attempt.ended_ms,
            cut_short: attempt.cut_short,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flow_runtime::error::ErrorKind;
    use serde_json::json;

    /// Regression guard for the API's trace: its JSON is what the
    /// interpreter's record serialized as before the two were apart, so
    /// `flow --remote trace` and other clients read it unchanged.
    #[test]
    fn the_answer_is_the_records_json_of_before() {
        let record = StepRecord {
            path: "each[0]/a".into(),
            step_id: "a".into(),
            kind: StepKind::Recipe,
            status: StepStatus::Failed,
            input: json!({ "q": 1 }),
            output: None,
            error: Some(StepError::new(ErrorKind::Timeout, "late")),
            attempts: vec![Attempt {
                index: 0,
                error: Some("timeout: late".into()),
                delay_ms: None,
                round: 2,
                repair: true,
                started_ms: Some(1),
                ended_ms: None,
                cut_short: false,
            }],
            started_ms: 1,
            ended_ms: 9,
            round: 2,
        };
        let before = serde_json::to_value(&record).unwrap();
        let after = serde_json::to_value(TraceStep::from(record)).unwrap();
        assert_eq!(after, before);
    }
}
