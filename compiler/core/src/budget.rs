//! Static budgets as diagnostics: a checked program is lowered node by node
//! and each workflow's [`Budget`] (the plan format's answer, which flowd
//! gives at deploy too) is held against what the source states. It sits above the
//! checker and lowering, as the one pass that needs both.

use flow_plan::budget::{Budget, StepBudget};
use flow_plan::limits::DEFAULT_MODEL_CALLS;

use crate::check::{Checked, WorkflowInfo};
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId};
use crate::syntax::ast;

/// How many of the slowest steps a W501 names, and so how many a budget
/// keeps ([`flow_plan::budget::Budget::keep_slowest`]).
pub(crate) const SLOWEST_NAMED: usize = 3;

/// Adds the budgets of a program without errors to its analysis, and their
/// warnings to its diagnostics; and an error where it is past a limit of
/// plans (E212), as a driver that lowers it would report.
pub(crate) fn with_budgets(mut checked: Checked) -> Checked {
    // As `check_and_lower`: a program past a limit has no plan, and so no
    // budgets.
    match crate::lower::budgets_and_limits(&checked) {
        Some((budgets, Ok(()))) => add_budgets(&mut checked, budgets),
        Some((_, Err(problems))) => {
            let past = crate::lower::past_plan_limits(&checked, &problems);
            checked.diagnostics.extend(past);
            crate::check::sort_diagnostics(&mut checked.diagnostics);
        }
        None => {}
    }
    checked
}

/// Adds `budgets`, one per workflow of the root file in order, to the
/// analysis of `checked`, and their warnings to its diagnostics.
pub(crate) fn add_budgets(checked: &mut Checked, mut budgets: Vec<Budget>) {
    // As `lower::budgets_and_limits` folds them, whichever way they were
    // worked out.
    for budget in &mut budgets {
        budget.keep_slowest(SLOWEST_NAMED);
    }
    let mut warnings = Vec::new();
    for ((budget, info), decl) in budgets
        .iter()
        .zip(&checked.analysis.workflows)
        .zip(checked.files[0].tree.workflows())
    {
        warn(budget, info, decl, &mut warnings);
    }
    checked.analysis.budgets = budgets;
    if !warnings.is_empty() {
        checked.diagnostics.extend(warnings);
        crate::check::sort_diagnostics(&mut checked.diagnostics);
    }
}

fn warn(budget: &Budget, info: &WorkflowInfo, decl: &ast::Workflow, out: &mut Vec<Diagnostic>) {
    let file = FileId(0);
    let id_span = |id: &str| info.step(id).map(|(_, step)| step.id_span);
    // Time is held against a timeout the author wrote: the default one is
    // a safety net that default retries and timeouts can outlast by design.
    if let Some(timeout) = &decl.timeout {
        for id in &budget.unbounded_loops {
            let Some(span) = id_span(id) else { continue };
            out.push(
                Diagnostic::new(
                    Code::UnboundedLoop,
                    file,
                    span,
                    format!(
                        "loop `{id}` has no bound on its time: the size of its collection is unknown"
                    ),
                )
                .label("how many items this loop takes is unknown")
                .hint(format!(
                    "state the most items it takes after its `as {id}` and any `concurrency N`, `max 100`: a longer list fails the loop"
                )),
            );
        }
        if let Some(worst) = budget.active_ms
            && worst > info.timeout_ms
        {
            let mut slowest: Vec<&StepBudget> = budget.steps.iter().collect();
            slowest.sort_by_key(|step| std::cmp::Reverse(step.worst_ms));
            let mut diagnostic = Diagnostic::new(
                Code::BudgetExceedsTimeout,
                file,
                timeout.span,
                format!(
                    "workflow `{}` can take up to {} of active time, past its timeout of {}",
                    info.name,
                    show_about(worst),
                    show_about(info.timeout_ms)
                ),
            )
            .label("runs that take every retry to its timeout are cut short here");
            for step in slowest
                .into_iter()
                .take(SLOWEST_NAMED)
                .filter(|step| step.worst_ms > 0)
            {
                if let Some(span) = id_span(&step.id) {
                    diagnostic =
                        diagnostic.secondary(file, span, format!("up to {}", worst_case(step)));
                }
            }
            out.push(diagnostic.hint(
                "raise the workflow's `timeout`, or give the slowest steps a shorter `timeout` or fewer `retry` attempts",
            ));
        }
    }
    if budget.model_calls > DEFAULT_MODEL_CALLS {
        out.push(
            Diagnostic::new(
                Code::ModelCallsOverLimit,
                file,
                decl.name.span,
                format!(
                    "workflow `{}` can have {} model calls in flight at once, more than the {} an account runs at once by default",
                    info.name, budget.model_calls, DEFAULT_MODEL_CALLS
                ),
            )
            .label("loop concurrency times parallel branches")
            .hint("calls past the account's limit wait for a free slot, and the wait counts against the timeout: lower a loop's `concurrency`, or raise the account's `llm_concurrency` in flowd"),
        );
    }
}

/// A step's worst active time, said in full (`3m 20s: 2 attempts ...`):
/// what a hover and a W501 label show.
pub fn worst_case(step: &StepBudget) -> String {
    if step.worst_ms == 0 {
        return "none: waiting for a decision is not active time".to_string();
    }
    let repair = if step.repair {
        " and a repair request"
    } else {
        ""
    };
    let waits = match step.attempts - 1 {
        0 => String::new(),
        1 => format!(", a wait of {}", show_about(step.backoff_ms)),
        n => format!(", {n} waits of {}", show_about(step.backoff_ms)),
    };
    let attempts = match step.attempts {
        1 => "1 attempt".to_string(),
        n => format!("{n} attempts"),
    };
    format!(
        "{}: {attempts}{repair} of {} each{waits}",
        show_about(step.worst_ms),
        show_about(step.timeout_ms),
    )
}

/// A duration as people say it, in its two largest units (`1h 5m`, `90ms`).
pub fn show_about(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let mut parts = Vec::new();
    let mut rest = ms;
    for (size, unit) in UNITS {
        if rest >= size && parts.len() < 2 {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        } else if !parts.is_empty() {
            // Two units that are next to each other, or just one.
            break;
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::show_about;

    #[test]
    fn durations_are_said_in_their_two_largest_units() {
        assert_eq!(show_about(420_000), "7m");
        assert_eq!(show_about(3_900_000), "1h 5m");
        assert_eq!(show_about(90_000), "1m 30s");
        assert_eq!(show_about(86_400_000 + 1_000), "1d");
        assert_eq!(show_about(250), "250ms");
    }
}
