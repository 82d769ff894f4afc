//! OpenTelemetry traces, exported by OTLP/HTTP in its JSON encoding: a span
//! per run and one per step execution, parented as the trace tree nests them
//! (a step in a loop iteration or parallel branch is a child of the loop or
//! parallel step, a fallback's step a child of the step it stands in for).
//!
//! Ids are derived from the run id and the step's execution path, not
//! random: a run parked for a week and resumed by another process still
//! adds to one trace, and a step's parent is known before the parent's own
//! span is exported (a loop's span ends, and is sent, after its iterations).
//! The run's span, and those of its loops and parallels (which the journal
//! has no records of), are sent when the run completes or fails; its steps
//! are sent as each invocation of the run ends. Exports leave the run's path, are
//! retried, and a failed export is logged and counted, never fails a run.

use std::time::Duration;

use flow_runtime::journal::{StepRecord, StepStatus};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::webhooks::Delivery;

/// The trace of run `run_id`: 16 bytes, as 32 hex digits.
pub(crate) fn trace_id(run_id: &str) -> String {
    hex(&Sha256::digest(run_id.as_bytes())[..16])
}

/// The span of the step at `path` of run `run_id`, or of the run itself
/// (`path` empty): 8 bytes, as 16 hex digits.
pub(crate) fn span_id(run_id: &str, path: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(run_id.as_bytes());
    digest.update([0]);
    digest.update(path.as_bytes());
    hex(&digest.finalize()[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The execution path of the step that contains the step at `path`, and
/// whether it is a loop; `None` for a top-level step (or one of the
/// workflow's error handler).
///
/// Paths nest as the interpreter writes them: `each[2]/x` (an iteration of
/// loop `each`), `gates/legal/x` (branch `legal` of parallel `gates`),
/// `b/fallback/x` (the fallback of `b`), `on_error/x` (the handler).
pub(crate) fn parent_path(path: &str) -> Option<(String, bool)> {
    let segments: Vec<&str> = path.split('/').collect();
    let container = segments.len().checked_sub(2)?;
    let last = segments[container];
    if let Some(open) = last.strip_suffix(']').and_then(|l| l.rfind('[')) {
        let mut parent = segments[..container].to_vec();
        parent.push(&last[..open]);
        return Some((parent.join("/"), true));
    }
    // A branch name or `fallback`: the step is the segment before it.
    let step = container.checked_sub(1)?;
    Some((segments[..=step].join("/"), false))
}

fn string(key: &str, value: &str) -> Value {
    json!({ "key": key, "value": { "stringValue": value } })
}

fn int(key: &str, value: i64) -> Value {
    // OTLP's JSON encoding writes 64-bit integers as strings.
    json!({ "key": key, "value": { "intValue": value.to_string() } })
}

fn nanos(ms: i64) -> String {
    (i128::from(ms) * 1_000_000).to_string()
}

/// What a run's spans are about.
pub(crate) struct RunContext<'a> {
    pub run_id: &'a str,
    pub workflow: &'a str,
    /// The hash of the plan the run executes: which version of the workflow.
    pub plan_hash: &'a str,
}

impl RunContext<'_> {
    fn common(&self) -> Vec<Value> {
        vec![
            string("flow.workflow.name", self.workflow),
            string("flow.workflow.id", self.plan_hash),
            string("flow.run.id", self.run_id),
        ]
    }

    /// The span of a step execution (all its attempts; each failed attempt
    /// is an event).
    pub(crate) fn step_span(&self, record: &StepRecord) -> Value {
        let mut attributes = self.common();
        attributes.extend([
            string("flow.step.path", &record.path),
            string("flow.step.id", &record.step_id),
            string("flow.step.kind", record.kind.name()),
            int("flow.step.attempts", record.attempts.len().max(1) as i64),
        ]);
        let parent = parent_path(&record.path)
            .map(|(path, _)| path)
            .unwrap_or_default();
        let events: Vec<Value> = record
            .attempts
            .iter()
            .filter_map(|attempt| {
                attempt.error.as_ref().map(|error| {
                    json!({
                        "name": "attempt failed",
                        "timeUnixNano": nanos(record.ended_ms as i64),
                        "attributes": [int("flow.step.attempt", i64::from(attempt.index) + 1), string("exception.message", error)],
                    })
                })
            })
            .collect();
        let status = match (&record.status, &record.error) {
            (StepStatus::Failed, Some(error)) => json!({ "code": 2, "message": error.message }),
            (StepStatus::Failed, None) => json!({ "code": 2 }),
            _ => json!({ "code": 1 }),
        };
        json!({
            "traceId": trace_id(self.run_id),
            "spanId": span_id(self.run_id, &record.path),
            "parentSpanId": span_id(self.run_id, &parent),
            "name": format!("{} {}", record.kind.name(), record.step_id),
            "kind": 1,
            "startTimeUnixNano": nanos(record.started_ms as i64),
            "endTimeUnixNano": nanos(record.ended_ms as i64),
            "attributes": attributes,
            "events": events,
            "status": status,
        })
    }

    /// The spans of the loops and parallels that contain the run's steps.
    /// The journal has no records of its own for them (a replay recomputes
    /// them), so each spans its steps: from the first start to the last end.
    /// A path that has a record of its own (a step whose fallback ran) has
    /// its span already.
    pub(crate) fn container_spans(&self, records: &[StepRecord]) -> Vec<Value> {
        let recorded: std::collections::HashSet<&str> =
            records.iter().map(|r| r.path.as_str()).collect();
        // Container path to (is a loop, start, end).
        let mut containers: std::collections::BTreeMap<String, (bool, u64, u64)> =
            std::collections::BTreeMap::new();
        for record in records {
            let mut path = record.path.clone();
            while let Some((parent, is_loop)) = parent_path(&path) {
                if recorded.contains(parent.as_str()) {
                    break;
                }
                let span = containers.entry(parent.clone()).or_insert((
                    is_loop,
                    record.started_ms,
                    record.ended_ms,
                ));
                span.1 = span.1.min(record.started_ms);
                span.2 = span.2.max(record.ended_ms);
                path = parent;
            }
        }
        containers
            .into_iter()
            .map(|(path, (is_loop, started_ms, ended_ms))| {
                let kind = if is_loop { "loop" } else { "parallel" };
                let step_id = path.rsplit('/').next().unwrap_or_default().to_string();
                let parent = parent_path(&path).map(|(p, _)| p).unwrap_or_default();
                let mut attributes = self.common();
                attributes.extend([
                    string("flow.step.path", &path),
                    string("flow.step.id", &step_id),
                    string("flow.step.kind", kind),
                ]);
                json!({
                    "traceId": trace_id(self.run_id),
                    "spanId": span_id(self.run_id, &path),
                    "parentSpanId": span_id(self.run_id, &parent),
                    "name": format!("{kind} {step_id}"),
                    "kind": 1,
                    "startTimeUnixNano": nanos(started_ms as i64),
                    "endTimeUnixNano": nanos(ended_ms as i64),
                    "attributes": attributes,
                    "status": { "code": 1 },
                })
            })
            .collect()
    }

    /// The span of the whole run, from its start to `ended_ms`.
    pub(crate) fn run_span(&self, created_ms: i64, ended_ms: i64, failure: Option<&str>) -> Value {
        let status = match failure {
            Some(message) => json!({ "code": 2, "message": message }),
            None => json!({ "code": 1 }),
        };
        json!({
            "traceId": trace_id(self.run_id),
            "spanId": span_id(self.run_id, ""),
            "name": format!("run {}", self.workflow),
            "kind": 1,
            "startTimeUnixNano": nanos(created_ms),
            "endTimeUnixNano": nanos(ended_ms),
            "attributes": self.common(),
            "status": status,
        })
    }
}

/// Posts `spans` to the OTLP/HTTP traces endpoint under `endpoint` (the
/// collector's base URL, or its full `/v1/traces` URL), off the caller's path.
pub(crate) fn export(
    http: &reqwest::Client,
    endpoint: &str,
    spans: Vec<Value>,
    done: impl Fn(Delivery) + Send + Sync + 'static,
) {
    if spans.is_empty() {
        return;
    }
    let url = if endpoint.ends_with("/v1/traces") {
        endpoint.to_string()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    };
    let body = json!({
        "resourceSpans": [{
            "resource": { "attributes": [string("service.name", "flowd")] },
            "scopeSpans": [{
                "scope": { "name": "flowd", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    });
    let request = http
        .post(&url)
        .header("content-type", "application/json")
        .body(body.to_string());
    deliver(request, format!("trace export to {url}"), done);
}

/// Attempts per trace export, and the wait before the second one (doubling).
const ATTEMPTS: u32 = 5;
const FIRST_WAIT: Duration = Duration::from_millis(250);

/// Sends `request` in a task of its own until it is answered with a 2xx,
/// retrying with backoff in memory; `done` hears how it ended, and failed
/// attempts are logged as `what`. Unlike webhooks, not durable: a trace
/// lost to a restart costs a picture, not an event a receiver acts on.
fn deliver(
    request: reqwest::RequestBuilder,
    what: String,
    done: impl Fn(Delivery) + Send + Sync + 'static,
) {
    tokio::spawn(async move {
        let mut wait = FIRST_WAIT;
        for attempt in 1..=ATTEMPTS {
            let Some(request) = request.try_clone() else {
                break;
            };
            let failure = match request.timeout(Duration::from_secs(10)).send().await {
                Ok(response) if response.status().is_success() => {
                    done(Delivery::Delivered);
                    return;
                }
                Ok(response) => format!("answered {}", response.status()),
                Err(error) => error.to_string(),
            };
            tracing::warn!("{what}, attempt {attempt}/{ATTEMPTS}: {failure}");
            if attempt < ATTEMPTS {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
        done(Delivery::Failed);
    });
}

#[cfg(test)]
mod tests {
    use super::parent_path;

    #[test]
    fn a_step_is_the_child_of_the_step_that_contains_it() {
        for (path, parent) in [
            ("ok", None),
            ("on_error/notify", None),
            ("each[2]/x", Some("each")),
            ("gates/legal/x", Some("gates")),
            ("b/fallback/x", Some("b")),
            ("gates/legal/each[0]/x", Some("gates/legal/each")),
            ("each[1]/b/fallback/c", Some("each[1]/b")),
            ("on_error/each[3]/x", Some("on_error/each")),
        ] {
            assert_eq!(
                parent_path(path).map(|(p, _)| p).as_deref(),
                parent,
                "{path}"
            );
        }
    }
}
