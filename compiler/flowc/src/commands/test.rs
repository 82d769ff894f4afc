//! `flowc test`: check files and directories, then run the tests they
//! hold on the interpreter, in parallel, and report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flow_compiler::{Checked, FileId};
use flow_plan::Plan;

use crate::loader::{RootFile, print_load_error};
use crate::report::Reports;
use crate::testing::{self, Job, report};
use crate::{Exit, Format};

/// Output formats of `flowc test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TestFormat {
    /// A line per test, then each failure with its trace.
    Human,
    /// One JSON document on stdout.
    Json,
    /// JUnit XML on stdout, for CI systems' test reports.
    Junit,
    /// GitHub Actions annotations (`::error file=...::message`) for each
    /// failure and diagnostic, then the human report, on stdout.
    Github,
}

/// What `flowc test` is asked for besides running the tests.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options<'a> {
    /// Run only the tests whose name contains this.
    pub(crate) filter: Option<&'a str>,
    pub(crate) format: Option<TestFormat>,
    /// Report branch coverage per workflow.
    pub(crate) coverage: bool,
    /// Fail when a workflow's coverage is below this percentage.
    pub(crate) min_coverage: Option<f64>,
    /// Answer the recipe calls a test does not mock with the offline
    /// provider's made-up values instead of failing the test.
    pub(crate) offline: bool,
}

pub(crate) fn run(paths: &[PathBuf], root: Option<&Path>, options: Options<'_>) -> Exit {
    let coverage = options.coverage || options.min_coverage.is_some();
    let (roots, mut reports, without_sources) = super::check::roots_and_reports(paths, root);
    crate::loader::warn_of_no_sources(&without_sources);
    let mut jobs = Vec::new();
    // The plans of files without tests, whose workflows coverage shows untested.
    let mut others = Vec::new();
    // The files given or found whose tests did not run: they, or a file
    // they import, do not check (regression: a broken workflow imported by
    // two test files was counted as one file, which holds no tests).
    let mut roots_not_checking = 0;
    for (root, result) in roots.iter().zip(super::check::check_all(&roots)) {
        match result {
            Ok(checked) => {
                if coverage
                    && checked.files[0].tree.tests().next().is_none()
                    && let Some(plan) = flow_compiler::lower(&checked)
                {
                    others.push(Arc::new(plan));
                }
                let has_tests = checked.files[0].tree.tests().next().is_some();
                let (found, all_ran) = jobs_of(root, &checked, &options, &mut reports);
                roots_not_checking += usize::from(has_tests && !all_ran);
                jobs.extend(found);
            }
            Err(error) => {
                print_load_error(&error);
                reports.unreadable.push((root.path.clone(), error.message));
            }
        }
    }
    reports.sort();
    let mut not_checking: Vec<usize> = reports
        .reports
        .iter()
        .filter(|r| r.severity == flow_compiler::Severity::Error)
        .map(|r| r.primary.file)
        .collect();
    not_checking.dedup();
    let format = options.format.unwrap_or(TestFormat::Human);
    if !reports.reports.is_empty() {
        // Annotations must be on stdout for Actions to read them; any
        // other format keeps stdout for its one document.
        let (diagnostics, stream) = match format {
            TestFormat::Github => (Format::Github, super::check::Stream::Stdout),
            _ => (Format::Human, super::check::Stream::Stderr),
        };
        super::check::print(&reports, diagnostics, stream);
    }
    let verdicts = crate::parallel::map(&jobs, testing::test);
    let covered = coverage.then(|| testing::coverage(&jobs, &verdicts, &others));
    let covered = covered.as_deref();
    match format {
        TestFormat::Human | TestFormat::Github => {
            if format == TestFormat::Github {
                out!("{}", report::github(&jobs, &verdicts));
            }
            out!("{}", report::human(&jobs, &verdicts, roots_not_checking));
            if let Some(covered) = covered {
                out!("{}", report::coverage(covered));
            }
        }
        TestFormat::Json => outln!(
            "{}",
            report::json(&jobs, &verdicts, covered, &reports, roots_not_checking)
        ),
        TestFormat::Junit => out!(
            "{}",
            report::junit(&jobs, &verdicts, &reports, &not_checking)
        ),
    }
    let mut below = false;
    if let Some(min) = options.min_coverage {
        for coverage in covered.unwrap_or_default() {
            if coverage.percent() < min {
                eprintln!(
                    "error: the tests cover {:.0}% of the branches of workflow `{}` ({}), below --min-coverage {min}",
                    coverage.percent(),
                    coverage.workflow,
                    coverage.source
                );
                below = true;
            }
        }
    }
    // A filter that matches nothing is most likely a typo; passing would
    // let CI go green with no test run.
    let matched_none = match options.filter {
        Some(filter) if jobs.is_empty() && not_checking.is_empty() => {
            eprintln!(
                "error: no test's name contains `{filter}`; without --filter, every test runs"
            );
            true
        }
        _ => false,
    };
    if !reports.unreadable.is_empty() {
        Exit::Usage
    } else if reports.errors() > 0 || verdicts.iter().any(|v| !v.passed()) || below || matched_none
    {
        Exit::Problems
    } else {
        Exit::Ok
    }
}

/// The tests of a checked root whose names contain the filter, each with the
/// plan of its workflow's file, none for a file with errors; the root's
/// diagnostics, warnings too, go to `reports` either way. With them,
/// whether every test of the root could run (not when it, or the file of
/// a workflow it tests, does not check).
fn jobs_of(
    root: &RootFile,
    checked: &Checked,
    options: &Options<'_>,
    reports: &mut Reports,
) -> (Vec<Job>, bool) {
    reports.add(checked);
    let Some(cases) = flow_compiler::test_case::lower_tests(checked) else {
        return (Vec::new(), false);
    };
    let mut all_ran = !checked.has_errors();
    let mut plans: HashMap<FileId, Option<Arc<Plan>>> = HashMap::new();
    let mut jobs = Vec::new();
    for case in cases {
        if options.filter.is_some_and(|text| !case.name.contains(text)) {
            continue;
        }
        let plan = plans
            .entry(case.workflow_file)
            .or_insert_with(|| plan_of(root, checked, case.workflow_file, reports))
            .clone();
        match plan {
            Some(plan) => jobs.push(Job {
                file: root.path.clone(),
                plan,
                case,
                offline: options
                    .offline
                    .then(flow_engine::offline::OfflineProvider::default),
            }),
            None => all_ran = false,
        }
    }
    (jobs, all_ran)
}

/// The plan of the file `file` of `checked`, built as `flowc build` builds
/// it: the test runs what would be deployed. An imported file is checked
/// as a root of its own; its problems go to `reports`.
fn plan_of(
    root: &RootFile,
    checked: &Checked,
    file: FileId,
    reports: &mut Reports,
) -> Option<Arc<Plan>> {
    if file == FileId(0) {
        return flow_compiler::lower(checked).map(Arc::new);
    }
    let path = &checked.file(file).path;
    match flow_compiler::check(path, &root.loader()) {
        Ok(theirs) => {
            let plan = flow_compiler::lower(&theirs).map(Arc::new);
            if plan.is_none() {
                reports.add(&theirs);
            }
            plan
        }
        Err(error) => {
            print_load_error(&error);
            reports.unreadable.push((path.clone(), error.message));
            None
        }
    }
}
