//! Moving a run to another version of its workflow: where the run stands,
//! and whether it can go on there (`flow_plan::compat` answers per place).
//! flowd's migrate and redrive endpoints and `flow migrate` / `flow redrive
//! --to` ask the same questions here.

use flow_plan::Plan;
use flow_plan::compat::{Code, Comparison, Incompatibility, compare};

use crate::journal::{Outcome, StepRecord, StepStatus};
use crate::store::RunRow;

/// The execution paths run `row` waits or stopped at: the gates it is
/// parked at, the steps that failed or were between attempts, from its
/// journal `records` and its outcome.
pub fn places_of(row: &RunRow, records: &[StepRecord]) -> Vec<String> {
    let mut places: Vec<String> = records
        .iter()
        .filter(|record| {
            matches!(
                record.status,
                StepStatus::Pending | StepStatus::Failed | StepStatus::Retrying
            )
        })
        .map(|record| record.path.clone())
        .collect();
    let outcome = row
        .outcome
        .as_ref()
        .and_then(|outcome| serde_json::from_value::<Outcome>(outcome.clone()).ok());
    match outcome {
        Some(Outcome::Parked { pending }) => places.extend(pending.into_iter().map(|g| g.path)),
        Some(Outcome::Failed {
            step: Some(step), ..
        }) => places.push(step),
        _ => {}
    }
    places.sort();
    places.dedup();
    places
}

/// Whether runs of one workflow on `old` can go on on `new`: the plans
/// compared once, then asked for each run's places, since a migration
/// looks at many runs of the same version.
pub struct Mover<'p> {
    workflow: String,
    /// `None` when `old` has no workflow of this name.
    comparison: Option<Comparison<'p>>,
}

impl<'p> Mover<'p> {
    pub fn new(old: &'p Plan, new: &'p Plan, workflow: &str) -> Mover<'p> {
        Mover {
            workflow: workflow.to_string(),
            comparison: compare(old, new, workflow),
        }
    }

    /// Why run `row`, with its journal's `records`, cannot go on on the new
    /// version: empty when it can. A run that stopped between steps (one
    /// cancelled while a step was out, which left no record) is asked at
    /// the last step it recorded, in the plan's order: it completed that
    /// one and what it may have run before, and what comes after it runs
    /// in order (regression: it was refused with D002, even on its own
    /// version). One that recorded nothing starts afresh on any version.
    pub fn problems_of_run(&self, row: &RunRow, records: &[StepRecord]) -> Vec<Incompatibility> {
        let mut places = places_of(row, records);
        if places.is_empty()
            && let Some(comparison) = &self.comparison
        {
            let recorded: std::collections::HashSet<String> = records
                .iter()
                .map(|record| flow_plan::compat::pattern(&record.path))
                .collect();
            let last = comparison
                .places()
                .map(|(path, _)| path)
                .filter(|path| recorded.contains(*path))
                .last();
            match last {
                Some(last) => places.push(last.to_string()),
                None => return Vec::new(),
            }
        }
        self.problems(&places)
    }

    /// Why a run at `places` cannot go on on the new version: empty when
    /// it can.
    pub fn problems(&self, places: &[String]) -> Vec<Incompatibility> {
        let Some(comparison) = &self.comparison else {
            return vec![Incompatibility {
                code: Code::WorkflowRemoved,
                place: String::new(),
                step: self.workflow.clone(),
                reason: format!("the run's version has no workflow `{}`", self.workflow),
            }];
        };
        if places.is_empty() {
            return vec![Incompatibility {
                code: Code::ResumePointRemoved,
                place: String::new(),
                step: String::new(),
                reason: "the run stopped between steps, where no comparison can place it"
                    .to_string(),
            }];
        }
        let mut problems: Vec<Incompatibility> = Vec::new();
        for place in places {
            let found = match comparison.at(place) {
                Some(found) => found,
                None => vec![Incompatibility {
                    code: Code::ResumePointRemoved,
                    place: place.clone(),
                    step: place.clone(),
                    reason: format!("the run's version has no step at `{place}`"),
                }],
            };
            // A problem before several of the run's places (a loop each of
            // its gates waits in) is said once (regression, an audit: the
            // same line printed for each gate).
            for problem in found {
                let said = problems.iter().any(|earlier| {
                    (earlier.code, &earlier.step, &earlier.reason)
                        == (problem.code, &problem.step, &problem.reason)
                });
                if !said {
                    problems.push(problem);
                }
            }
        }
        problems
    }
}

/// Why run `row` of `workflow` on `old`, with its journal's `records`,
/// cannot go on on `new`: empty when it can. For one run; many runs share
/// a [`Mover`].
pub fn move_problems(
    old: &Plan,
    new: &Plan,
    workflow: &str,
    row: &RunRow,
    records: &[StepRecord],
) -> Vec<Incompatibility> {
    Mover::new(old, new, workflow).problems_of_run(row, records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStatus;
    use serde_json::json;

    fn plan(body: &str) -> Plan {
        let source = format!(
            "recipe r {{ model \"m\" input {{ q: string }} output {{ a: string }} prompt \"{{{{input.q}}}}\" }}\nworkflow w {{\n{body}\n}}\n"
        );
        let checked = flow_compiler::check_source("w.flow", &source);
        assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
        flow_compiler::lower(&checked).expect("lowers")
    }

    fn completed(path: &str) -> StepRecord {
        StepRecord {
            path: path.into(),
            step_id: path.into(),
            kind: flow_plan::StepKind::Recipe,
            status: StepStatus::Completed,
            input: json!({}),
            output: Some(json!({ "a": "x" }).into()),
            error: None,
            attempts: Vec::new(),
            started_ms: 0,
            ended_ms: 0,
            round: 0,
        }
    }

    /// Regression (an audit): a run cancelled while a step was out has no
    /// record of it, so no place: it was refused on every version, its own
    /// too (D002). It is asked at the last step it recorded.
    #[test]
    fn a_run_stopped_between_steps_is_asked_at_its_last_record() {
        let old = plan("step a = r { q: \"1\" }\nstep b = r { q: step.a.a }");
        let later =
            plan("step a = r { q: \"1\" }\nstep b = r { q: step.a.a }\nstep c = r { q: \"3\" }");
        let earlier =
            plan("step z = r { q: \"0\" }\nstep a = r { q: \"1\" }\nstep b = r { q: step.a.a }");
        let row = RunRow {
            id: "r".into(),
            workflow: "w".into(),
            plan_hash: old.hash.clone(),
            status: RunStatus::Cancelled,
            input: json!({}),
            outcome: None,
            created_ms: 0,
            updated_ms: 0,
            active_ms: 0,
            account: String::new(),
            redrives: 0,
        };
        let records = [completed("a")];
        assert_eq!(move_problems(&old, &old, "w", &row, &records), []);
        assert_eq!(move_problems(&old, &later, "w", &row, &records), []);
        let refused = move_problems(&old, &earlier, "w", &row, &records);
        assert_eq!(refused[0].code, Code::StepAddedBefore, "{refused:?}");
        // The step it ran in the branch it took is the place, not the
        // branch after it in the plan's order, which it never reached.
        let branches = plan(
            "if \"x\" == \"x\" {\nstep a = r { q: \"1\" }\n} else {\nstep b = r { q: \"2\" }\n}\nstep d = r { q: \"3\" }",
        );
        let no_else =
            plan("if \"x\" == \"x\" {\nstep a = r { q: \"1\" }\n}\nstep d = r { q: \"3\" }");
        let row = RunRow {
            plan_hash: branches.hash.clone(),
            ..row
        };
        assert_eq!(move_problems(&branches, &no_else, "w", &row, &records), []);
        // Nothing recorded: it starts afresh wherever it goes.
        assert_eq!(move_problems(&old, &earlier, "w", &row, &[]), []);
    }

    /// A problem before several of a run's places is said once.
    /// Regression (an audit): a run parked at two gates printed the same
    /// refusal once per gate.
    #[test]
    fn a_problem_before_several_places_is_said_once() {
        let gates = "parallel p {\nbranch x { step g1 = approval { approvers: [\"a\"], message: \"m\" } }\nbranch y { step g2 = approval { approvers: [\"a\"], message: \"m\" } }\n}";
        let old = plan(&format!("step a = r {{ q: \"1\" }}\n{gates}"));
        let new = plan(gates);
        let problems = Mover::new(&old, &new, "w").problems(&["p/x/g1".into(), "p/y/g2".into()]);
        let removed: Vec<_> = problems
            .iter()
            .filter(|problem| problem.code == Code::CompletedStepRemoved)
            .collect();
        assert_eq!(removed.len(), 1, "{problems:?}");
    }
}
