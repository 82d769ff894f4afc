//! `flowc diff OLD NEW`: for each place a run of OLD's workflows can wait or
//! stop at, whether it can go on on NEW. The analysis is
//! `flow_plan::compat`, on plans, which flowd asks too; this is its edge:
//! reading the two versions and rendering the reports.

use std::fmt::Write as _;
use std::path::Path;

use flow_plan::Plan;
use flow_plan::compat::{self, PlaceKind, Report};
use serde::Serialize;

use crate::commands::build::{compile, compile_quietly};
use crate::commands::check::{Stream, print};
use crate::{Exit, Format};

/// Places named in one finding, and places listed per workflow, before
/// the human report says how many more there are (the JSON has them all).
const SHOWN: usize = 8;
const SHOWN_PLACES: usize = 50;

/// How `diff` prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DiffFormat {
    /// Each problem with where it stops runs and a hint, then each place.
    Human,
    /// One JSON document.
    Json,
}

pub(crate) fn run(
    old: &Path,
    new: &Path,
    root: Option<&Path>,
    workflow: Option<&str>,
    format: DiffFormat,
) -> Exit {
    // With `--format json` a version's diagnostics are the answer on
    // stdout, as `flowc build --format json` gives them: a script read
    // nothing there (an audit). The first version that does not check is
    // the one reported there, as one document; in words, both are.
    let loaded = match format {
        DiffFormat::Human => match (load(old, root, format), load(new, root, format)) {
            (Ok(old), Ok(new)) => Ok((old, new)),
            _ => Err(Exit::Usage),
        },
        DiffFormat::Json => {
            load(old, root, format).and_then(|old| Ok((old, load(new, root, format)?)))
        }
    };
    let (old_plan, new_plan) = match loaded {
        Ok(plans) => plans,
        // A version that does not check cannot be compared, whatever the
        // reason: that is a usage error of `diff`, not an answer.
        Err(_) => return Exit::Usage,
    };
    let names: Vec<&str> = match workflow {
        Some(name) if old_plan.workflow(name).is_some() => vec![name],
        Some(name) => {
            let names: Vec<&str> = old_plan.workflows.iter().map(|w| w.name.as_str()).collect();
            eprintln!(
                "error: no workflow named `{name}` in {}; its workflows are: {}",
                old.display(),
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            );
            return Exit::Usage;
        }
        None => old_plan.workflows.iter().map(|w| w.name.as_str()).collect(),
    };
    let reports: Vec<Report> = names
        .iter()
        .filter_map(|name| compat::compare(&old_plan, &new_plan, name))
        .map(|comparison| comparison.report())
        .collect();
    let compatible = reports.iter().all(|report| report.compatible);
    match format {
        DiffFormat::Human => emit(&human(&reports)),
        DiffFormat::Json => {
            let document = Document {
                compatible,
                old: Version::of(&old_plan),
                new: Version::of(&new_plan),
                workflows: &reports,
            };
            let text = serde_json::to_string_pretty(&document).unwrap_or_default();
            emit(&format!("{text}\n"));
        }
    }
    if compatible { Exit::Ok } else { Exit::Problems }
}

/// Writes the answer to stdout.
fn emit(text: &str) {
    out!("{text}");
}

/// A version: a `flowc build` plan (`*.json`), held to what the compiler
/// writes as `flow run` holds it, or a source compiled here. Problems are
/// printed (a source's in `format`, on stdout for JSON); the error is the
/// exit code.
fn load(file: &Path, root: Option<&Path>, format: DiffFormat) -> Result<Plan, Exit> {
    if file
        .extension()
        .is_some_and(|extension| extension == "json")
    {
        let shown = file.display();
        let text = std::fs::read_to_string(file).map_err(|error| {
            eprintln!(
                "error: cannot read {shown}: {}",
                crate::loader::io_reason(&error)
            );
            Exit::Usage
        })?;
        let plan = Plan::from_json(&text).map_err(|error| {
            eprintln!("error: {shown}: {error}");
            Exit::Usage
        })?;
        // A plan file is often a version deployed before: held to what a
        // stored plan is.
        plan.validate_stored().map_err(|problems| {
            eprintln!("error: {shown}: {problems}");
            Exit::Usage
        })?;
        return Ok(plan);
    }
    match format {
        // Diagnostics go to stderr: stdout is the comparison's.
        DiffFormat::Human => compile(file, root, Format::Human, Stream::Stderr),
        // A version's warnings are said beside the comparison; its errors
        // are the answer, in place of the comparison.
        DiffFormat::Json => {
            let (compiled, reports) = compile_quietly(file, root)?;
            if let Some(reports) = reports {
                match compiled {
                    Ok(_) => print(&reports, Format::Human, Stream::Stderr),
                    Err(_) => print(&reports, Format::Json, Stream::Stdout),
                }
            }
            compiled
        }
    }
}

#[derive(Serialize)]
struct Document<'a> {
    compatible: bool,
    old: Version<'a>,
    new: Version<'a>,
    workflows: &'a [Report],
}

#[derive(Serialize)]
struct Version<'a> {
    source: &'a str,
    hash: &'a str,
}

impl Version<'_> {
    fn of(plan: &Plan) -> Version<'_> {
        Version {
            source: &plan.source,
            hash: &plan.hash,
        }
    }
}

/// The reports for people: each problem with its code, what and where, and
/// a hint; then each place with its verdict; then a summary line.
fn human(reports: &[Report]) -> String {
    let mut out = String::new();
    for report in reports {
        for finding in &report.findings {
            let info = finding.code.info();
            let _ = writeln!(out, "error[{}]: {}", info.code, finding.reason);
            let _ = writeln!(out, "  --> workflow `{}`", report.workflow);
            if !finding.step.is_empty() {
                let _ = writeln!(out, "   = step: {}", finding.step);
            }
            let kind_of = |path: &str| {
                report
                    .places
                    .iter()
                    .find(|place| place.path == path)
                    .map_or("", |place| kind_name(place.kind))
            };
            let listed: Vec<String> = finding
                .places
                .iter()
                .take(SHOWN)
                .map(|place| format!("{place} ({})", kind_of(place)))
                .collect();
            let more = finding.places.len().saturating_sub(SHOWN);
            let _ = writeln!(
                out,
                "   = runs that cannot move: {}{}",
                listed.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            );
            let _ = writeln!(out, "  help: {}", info.hint);
            let _ = writeln!(out, "  (`flowc explain {}` says more)\n", info.code);
        }
        let movable = report
            .places
            .iter()
            .filter(|place| place.compatible)
            .count();
        let _ = writeln!(
            out,
            "workflow `{}`: runs at {movable} of {} place{} can move to the new version",
            report.workflow,
            report.places.len(),
            if report.places.len() == 1 { "" } else { "s" }
        );
        let width = report
            .places
            .iter()
            .take(SHOWN_PLACES)
            .map(|place| place.path.chars().count())
            .max()
            .unwrap_or(0);
        for place in report.places.iter().take(SHOWN_PLACES) {
            let mut codes: Vec<&str> = report
                .findings
                .iter()
                .filter(|finding| finding.places.contains(&place.path))
                .map(|finding| finding.code.as_str())
                .collect();
            // Findings are sorted by code.
            codes.dedup();
            let line = format!(
                "  {} {:<width$}  {:<4}  {}",
                if place.compatible { "ok" } else { "no" },
                place.path,
                kind_name(place.kind),
                codes.join(" ")
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if report.places.len() > SHOWN_PLACES {
            let _ = writeln!(
                out,
                "  ... and {} more places (`--format json` lists them all)",
                report.places.len() - SHOWN_PLACES
            );
        }
        out.push('\n');
    }
    let blocked = reports.iter().filter(|report| !report.compatible).count();
    let _ = writeln!(
        out,
        "{} workflow{} compared: {}",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" },
        if blocked == 0 {
            "every run can move to the new version".to_string()
        } else {
            format!("{blocked} with runs that cannot move to the new version")
        }
    );
    out
}

fn kind_name(kind: PlaceKind) -> &'static str {
    match kind {
        PlaceKind::Gate => "gate",
        PlaceKind::Step => "step",
    }
}
