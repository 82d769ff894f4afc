//! How `flowc test` tells what happened: a line per test, then each
//! failure with the expectation, what was found and the run's trace; or
//! one JSON document.

use std::fmt::Write as _;
use std::time::Duration;

use flow_engine::journal::StepRecord;
use serde_json::{Value, json};

use super::{Job, Verdict};

/// The human report: a line per test, the failures, a summary.
pub(crate) fn human(jobs: &[Job], verdicts: &[Verdict]) -> String {
    let mut text = String::new();
    for (job, verdict) in jobs.iter().zip(verdicts) {
        let _ = writeln!(
            text,
            "test {} ... {} ({} virtual)",
            title(job),
            if verdict.passed() { "ok" } else { "FAILED" },
            virtual_time(verdict.ran.elapsed)
        );
    }
    for (job, verdict) in jobs.iter().zip(verdicts) {
        if verdict.passed() {
            continue;
        }
        let _ = writeln!(text, "\n--- {} ---", title(job));
        for miss in &verdict.misses {
            if !miss.expected.is_empty() {
                let line = miss
                    .line
                    .map(|l| format!(" (line {l})"))
                    .unwrap_or_default();
                let _ = writeln!(text, "  expected: {}{line}", miss.expected);
            }
            let _ = writeln!(text, "  found:    {}", miss.found);
        }
        let _ = writeln!(text, "  trace:");
        if verdict.ran.records.is_empty() {
            let _ = writeln!(text, "    (no step ran)");
        }
        for record in ordered(&verdict.ran.records) {
            let _ = writeln!(text, "    {}", trace_line(record));
        }
    }
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    let _ = writeln!(
        text,
        "\n{} test{}: {} passed, {failed} failed",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" },
        jobs.len() - failed
    );
    text
}

/// The JSON report: every test with its verdict, misses and trace.
pub(crate) fn json(jobs: &[Job], verdicts: &[Verdict], files_not_checking: usize) -> Value {
    let tests: Vec<Value> = jobs
        .iter()
        .zip(verdicts)
        .map(|(job, verdict)| {
            json!({
                "file": job.file,
                "line": job.case.line,
                "name": job.case.name,
                "workflow": job.case.workflow,
                "passed": verdict.passed(),
                "virtual_ms": verdict.ran.elapsed.as_millis() as u64,
                "misses": verdict.misses,
                "trace": ordered(&verdict.ran.records)
                    .into_iter()
                    .map(trace_entry)
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    json!({
        "tests": tests,
        "passed": jobs.len() - failed,
        "failed": failed,
        "files_not_checking": files_not_checking,
    })
}

fn title(job: &Job) -> String {
    format!("{}:{} \"{}\"", job.file, job.case.line, job.case.name)
}

/// The records in the order the run made them.
fn ordered(records: &[StepRecord]) -> Vec<&StepRecord> {
    let mut ordered: Vec<&StepRecord> = records.iter().collect();
    ordered.sort_by(|a, b| (a.started_ms, &a.path).cmp(&(b.started_ms, &b.path)));
    ordered
}

/// A record as the JSON report shows it: what happened, without the wall
/// clock's times, which mean nothing in virtual time.
fn trace_entry(record: &StepRecord) -> Value {
    json!({
        "path": record.path,
        "step": record.step_id,
        "kind": record.kind,
        "status": record.status,
        "attempts": record
            .attempts
            .iter()
            .map(|attempt| json!({ "error": attempt.error, "delay_ms": attempt.delay_ms }))
            .collect::<Vec<_>>(),
        "error": record.error.as_ref().map(|error| &error.message),
    })
}

/// `path  kind  status  N attempt(s)  last error`.
fn trace_line(record: &StepRecord) -> String {
    let kind = serde_json::to_value(record.kind)
        .ok()
        .and_then(|kind| kind.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut line = format!(
        "{:<28} {:<9} {:<10} {} attempt{}",
        record.path,
        kind,
        record.status.as_str(),
        record.attempts.len(),
        if record.attempts.len() == 1 { "" } else { "s" }
    );
    let errors: Vec<&str> = record
        .attempts
        .iter()
        .filter_map(|attempt| attempt.error.as_deref())
        .collect();
    if !errors.is_empty() {
        let _ = write!(line, "  [{}]", errors.join("; "));
    } else if let Some(error) = &record.error {
        let _ = write!(line, "  [{}]", error.message);
    }
    line
}

/// A virtual duration as a person reads it: `0s`, `14s`, `2m 30s`.
fn virtual_time(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    match (seconds / 60, seconds % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m {s}s"),
    }
}
