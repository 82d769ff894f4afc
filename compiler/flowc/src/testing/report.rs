//! How `flowc test` tells what happened: a line per test, then each
//! failure with the expectation, what was found and the run's trace; or
//! one JSON document.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use flow_engine::journal::StepRecord;
use serde_json::{Value, json};

use super::{Coverage, Job, Verdict};
use crate::render::{Human, PLAIN_WIDTH, escape_data, escape_property};
use crate::report::Reports;

/// The human report: a line per test, the failures, a summary that counts
/// the files that do not check (their diagnostics are on stderr).
pub(crate) fn human(jobs: &[Job], verdicts: &[Verdict], not_checking: usize) -> String {
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
        text.push_str(&failure(job, verdict));
    }
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    let _ = write!(
        text,
        "\n{} test{}: {} passed, {failed} failed",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" },
        jobs.len() - failed
    );
    match not_checking {
        0 => {}
        1 => text.push_str("; 1 file does not check, so its tests did not run"),
        n => {
            let _ = write!(text, "; {n} files do not check, so their tests did not run");
        }
    }
    text.push('\n');
    text
}

/// A failed test's misses, each expectation with what was found, and the
/// trace of its run: what the human report and JUnit's `<failure>` show.
fn failure(job: &Job, verdict: &Verdict) -> String {
    let mut text = String::new();
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
    for record in ordered(job, &verdict.ran.records) {
        let _ = writeln!(text, "    {}", trace_line(record));
    }
    text
}

/// The JUnit XML report that CI systems (Jenkins, GitLab, Azure, the
/// GitHub test-report actions) read: a `<testsuite>` per test file, a
/// `<testcase>` per test with its file and line, a `<failure>` holding
/// the misses and the trace; files that do not check are a suite of
/// errors of their own, so that the report does not look green. No
/// `time` is given: the wall clock's would make two runs' reports differ,
/// and virtual time is not what a CI's duration charts mean; it is a
/// property of each case instead.
pub(crate) fn junit(
    jobs: &[Job],
    verdicts: &[Verdict],
    reports: &Reports,
    not_checking: &[usize],
) -> String {
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"flowc test\" tests=\"{}\" failures=\"{failed}\" errors=\"{}\">",
        // A file that does not check is a case of its own, an error.
        jobs.len() + not_checking.len(),
        not_checking.len()
    );
    let mut files: Vec<&str> = Vec::new();
    for job in jobs {
        if !files.contains(&job.file.as_str()) {
            files.push(&job.file);
        }
    }
    for file in files {
        let cases: Vec<(&Job, &Verdict)> = jobs
            .iter()
            .zip(verdicts)
            .filter(|(job, _)| job.file == file)
            .collect();
        let _ = writeln!(
            xml,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">",
            xml_escape(file),
            cases.len(),
            cases.iter().filter(|(_, v)| !v.passed()).count()
        );
        for (job, verdict) in cases {
            let _ = write!(
                xml,
                "    <testcase name=\"{}\" classname=\"{}\" file=\"{}\" line=\"{}\">\n      \
                 <properties><property name=\"virtual_time\" value=\"{}\"/></properties>\n",
                xml_escape(&job.case.name),
                xml_escape(&job.case.workflow),
                xml_escape(file),
                job.case.line,
                virtual_time(verdict.ran.elapsed)
            );
            if let Some(first) = verdict.misses.first() {
                let _ = writeln!(
                    xml,
                    "      <failure message=\"{}\">{}</failure>",
                    xml_escape(&first.found),
                    xml_text(&failure(job, verdict))
                );
            }
            let _ = writeln!(xml, "    </testcase>");
        }
        let _ = writeln!(xml, "  </testsuite>");
    }
    if !not_checking.is_empty() {
        let _ = writeln!(
            xml,
            "  <testsuite name=\"flowc check\" tests=\"{0}\" errors=\"{0}\">",
            not_checking.len()
        );
        // Each error of the file in the message's place and in full, as
        // `flowc check` shows it: a CI's report is often all one reads.
        let human = Human::plain(PLAIN_WIDTH);
        for &file in not_checking {
            let errors: Vec<_> = reports
                .reports
                .iter()
                .filter(|r| r.primary.file == file)
                .filter(|r| r.severity == flow_compiler::Severity::Error)
                .collect();
            let message = match errors.first() {
                Some(first) => {
                    let at = reports.position(file, first.primary.span.start);
                    let more = match errors.len() {
                        1 => String::new(),
                        n => format!(" (and {} more)", n - 1),
                    };
                    format!(
                        "the file does not check, so its tests did not run: {}:{}:{}: {} {}{more}",
                        reports.path(file),
                        at.line,
                        at.column,
                        first.code.info().code,
                        first.message
                    )
                }
                None => "the file does not check, so its tests did not run".to_string(),
            };
            let full: String = errors
                .iter()
                .map(|report| human.render(reports, report))
                .collect();
            let _ = writeln!(
                xml,
                "    <testcase name=\"{0}\" classname=\"flowc check\" file=\"{0}\">\n      \
                 <error message=\"{1}\">{2}</error>\n    </testcase>",
                xml_escape(reports.path(file)),
                xml_escape(&message),
                xml_text(&full)
            );
        }
        let _ = writeln!(xml, "  </testsuite>");
    }
    xml.push_str("</testsuites>\n");
    xml
}

/// GitHub Actions annotations: an `::error` per miss of a failed test, on
/// the line of the expectation (the test's own line for what the run did
/// on its own), titled with the test's name.
pub(crate) fn github(jobs: &[Job], verdicts: &[Verdict]) -> String {
    let mut text = String::new();
    for (job, verdict) in jobs.iter().zip(verdicts) {
        for miss in &verdict.misses {
            let message = if miss.expected.is_empty() {
                miss.found.clone()
            } else {
                format!("{}\nfound: {}", miss.expected, miss.found)
            };
            let _ = writeln!(
                text,
                "::error file={},line={},title={}::{}",
                escape_property(&job.file),
                miss.line.unwrap_or(job.case.line),
                escape_property(&format!("test \"{}\"", job.case.name)),
                escape_data(&message)
            );
        }
    }
    text
}

/// `text` inside an element, its line breaks as they are.
fn xml_text(text: &str) -> String {
    escape_xml(text, false)
}

/// `text` as an attribute's value: a line break as a reference, since a
/// parser reads one written as it is as a space (regression: a test's name
/// of two lines read as one).
fn xml_escape(text: &str) -> String {
    escape_xml(text, true)
}

/// Text as XML character data, or as an attribute's value.
fn escape_xml(text: &str, attribute: bool) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            '\n' if attribute => escaped.push_str("&#10;"),
            '\r' if attribute => escaped.push_str("&#13;"),
            '\t' if attribute => escaped.push_str("&#9;"),
            '\n' | '\t' | '\r' => escaped.push(c),
            // XML 1.0 has no way to write the other control characters.
            c if c.is_control() => escaped.push('\u{FFFD}'),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The coverage report: per workflow, the share of arms taken, then each
/// arm with the tests that took it.
pub(crate) fn coverage(covered: &[Coverage]) -> String {
    let mut text = String::new();
    for coverage in covered {
        let (taken, all) = coverage.taken();
        let _ = writeln!(
            text,
            "\ncoverage of {} ({}): {taken}/{all} branches, {:.0}%",
            coverage.workflow,
            coverage.source,
            coverage.percent()
        );
        for arm in &coverage.arms {
            let by = match arm.taken_by.as_slice() {
                [] => "NOT TAKEN".to_string(),
                [one] => format!("by \"{one}\""),
                [first, rest @ ..] => format!("by \"{first}\" and {} more", rest.len()),
            };
            let _ = writeln!(text, "  {:<28} {:<28} {by}", arm.place, arm.arm);
        }
    }
    text
}

/// The JSON report: every test with its verdict, misses and trace, the
/// diagnostics of the files (as `flowc check --format json` gives them),
/// and the coverage when it was asked for.
pub(crate) fn json(
    jobs: &[Job],
    verdicts: &[Verdict],
    covered: Option<&[Coverage]>,
    reports: &Reports,
    files_not_checking: usize,
) -> Value {
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
                "trace": ordered(job, &verdict.ran.records)
                    .into_iter()
                    .map(trace_entry)
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    let mut report = json!({
        "tests": tests,
        "passed": jobs.len() - failed,
        "failed": failed,
        "files_not_checking": files_not_checking,
        "diagnostics": crate::render::json_diagnostics(reports),
        // Regression: a path that could not be read was in the exit code
        // (2) alone, where `flowc check --format json` names it.
        "unreadable": crate::render::json_unreadable(reports),
    });
    if let Some(covered) = covered {
        report["coverage"] = covered
            .iter()
            .map(|coverage| {
                let (taken, all) = coverage.taken();
                json!({
                    "workflow": coverage.workflow,
                    "source": coverage.source,
                    "taken": taken,
                    "branches": all,
                    "percent": coverage.percent(),
                    "arms": coverage.arms,
                })
            })
            .collect();
    }
    report
}

/// Where a test is and its name, written as in its source (regression, an
/// audit: a name with a quote or a newline was printed raw, across lines).
fn title(job: &Job) -> String {
    format!(
        "{}:{} {}",
        job.file,
        job.case.line,
        flow_engine::test_from::string_literal(&job.case.name)
    )
}

/// The records in the order of their steps in the workflow, then of their
/// paths (a loop's iterations): the wall clock's times say nothing of the
/// order in virtual time, and a report must read the same on every run.
fn ordered<'r>(job: &Job, records: &'r [StepRecord]) -> Vec<&'r StepRecord> {
    let mut order: HashMap<String, usize> = HashMap::new();
    if let Some(workflow) = job.plan.workflow(&job.case.workflow) {
        workflow.each_step(&mut |step| {
            let next = order.len();
            order.entry(step.id.clone()).or_insert(next);
        });
    }
    let mut ordered: Vec<&StepRecord> = records.iter().collect();
    ordered.sort_by_cached_key(|record| {
        (
            order.get(&record.step_id).copied(),
            in_number_order(&record.path),
        )
    });
    ordered
}

/// A part of a step's path: text, or an iteration's index.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PathPart<'p> {
    Text(&'p str),
    Index(u64),
}

/// `path` as parts that order iterations by number: `L[2]` before `L[10]`
/// (as text, `L[10]` came first).
fn in_number_order(path: &str) -> Vec<PathPart<'_>> {
    let mut parts = Vec::new();
    let mut rest = path;
    while let Some(digits_at) = rest.find(|c: char| c.is_ascii_digit()) {
        let digits = rest[digits_at..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len(), |end| digits_at + end);
        parts.push(PathPart::Text(&rest[..digits_at]));
        match rest[digits_at..digits].parse() {
            Ok(index) => parts.push(PathPart::Index(index)),
            Err(_) => parts.push(PathPart::Text(&rest[digits_at..digits])),
        }
        rest = &rest[digits..];
    }
    parts.push(PathPart::Text(rest));
    parts
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

/// `path  kind  status  N attempt(s)  last error`; a step that makes no
/// call (a condition, a loop, an approval) has no attempts to count.
fn trace_line(record: &StepRecord) -> String {
    let kind = serde_json::to_value(record.kind)
        .ok()
        .and_then(|kind| kind.as_str().map(str::to_string))
        .unwrap_or_default();
    let attempts = match record.attempts.len() {
        0 => String::new(),
        1 => "1 attempt".to_string(),
        n => format!("{n} attempts"),
    };
    let mut line = format!(
        "{:<28} {:<9} {:<10} {attempts}",
        record.path,
        kind,
        record.status.as_str(),
    );
    line.truncate(line.trim_end().len());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a trace sorted paths as text, `L[10]` before `L[2]`.
    #[test]
    fn iterations_are_in_number_order() {
        let mut paths = vec!["L[10]/s", "L[2]/s", "L[1]/s", "L[1]/t[12]", "L[1]/t[3]"];
        paths.sort_by_cached_key(|path| in_number_order(path));
        assert_eq!(
            paths,
            ["L[1]/s", "L[1]/t[3]", "L[1]/t[12]", "L[2]/s", "L[10]/s"]
        );
    }
}
