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
        let mut problems = Vec::new();
        for place in places {
            match comparison.at(place) {
                Some(found) => problems.extend(found),
                None => problems.push(Incompatibility {
                    code: Code::ResumePointRemoved,
                    place: place.clone(),
                    step: place.clone(),
                    reason: format!("the run's version has no step at `{place}`"),
                }),
            }
        }
        problems
    }
}

/// Why a run of `workflow` on `old`, at `places`, cannot go on on `new`:
/// empty when it can. For one run; many runs share a [`Mover`].
pub fn move_problems(
    old: &Plan,
    new: &Plan,
    workflow: &str,
    places: &[String],
) -> Vec<Incompatibility> {
    Mover::new(old, new, workflow).problems(places)
}
