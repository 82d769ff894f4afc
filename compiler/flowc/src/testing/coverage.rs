//! Branch coverage: every place a run can go one way or another, from the
//! plan, and whether a test's run went each way, from what its journal was
//! told as it went (`run::Ways`) and from its records.
//!
//! The places: each arm of an `if` (and the `else`, written or not), a
//! step's fallback or `continue` against its success, an approval approved,
//! rejected and expired, a loop over no items and over several, each
//! parallel branch failing, the workflow's `on_error` handler. An arm or an
//! iteration may run no step, so which way a condition went, how many
//! items a loop had and which blocks were entered come from the
//! interpreter (`Way`); how a step ended comes from its record. Blocks are
//! told apart by the prefix of their steps' paths, so that a loop or an
//! arm is judged in each iteration of what encloses it.

use flow_engine::journal::{StepRecord, StepStatus};
use flow_plan::{Action, Expr, Node, OnError, Workflow};
use serde::Serialize;
use serde_json::Value;

use super::run::{Ran, Ways};

/// One way a run can go at one place, and the tests whose run went it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Arm {
    /// Where: `if@12:3`, `step.refund`, `loop scans`, `parallel lookups`.
    pub(crate) place: String,
    /// Which way: `else if #1`, `rejected`, `no items`, `branch crm fails`.
    pub(crate) arm: String,
    pub(crate) taken_by: Vec<String>,
}

/// The arms of `workflow` with the tests (by name) whose runs took each.
pub(crate) fn arms<'r>(
    workflow: &Workflow,
    runs: impl IntoIterator<Item = (&'r str, &'r Ran)>,
) -> Vec<Arm> {
    let mut arms = untested(workflow);
    for (test, ran) in runs {
        let mut points = Vec::new();
        walk_workflow(workflow, &Run::new(ran), &mut points);
        for (arm, point) in arms.iter_mut().zip(&points) {
            if point.taken {
                arm.taken_by.push(test.to_string());
            }
        }
    }
    arms
}

/// The arms of a workflow no test runs, so that it shows what there is to
/// cover.
pub(crate) fn untested(workflow: &Workflow) -> Vec<Arm> {
    let ways = Ways::default();
    let run = Run {
        records: &[],
        ways: &ways,
    };
    let mut points = Vec::new();
    walk_workflow(workflow, &run, &mut points);
    points
        .into_iter()
        .map(|point| Arm {
            place: point.place,
            arm: point.arm,
            taken_by: Vec::new(),
        })
        .collect()
}

/// What one run did, as the walk asks it.
struct Run<'r> {
    records: &'r [StepRecord],
    ways: &'r Ways,
}

impl<'r> Run<'r> {
    fn new(ran: &'r Ran) -> Run<'r> {
        Run {
            records: &ran.records,
            ways: &ran.ways,
        }
    }

    fn of(&self, step: &str) -> impl Iterator<Item = &'r StepRecord> {
        self.records.iter().filter(move |r| r.step_id == step)
    }

    fn entered(&self, at: &str) -> bool {
        self.ways.entered.contains(at)
    }

    /// The blocks among `instances` where condition `id` took `arm`.
    fn took(&self, instances: &[String], id: &str, arm: usize) -> Vec<String> {
        instances
            .iter()
            .filter(|at| {
                // A borrowed key: the set holds owned strings.
                self.ways
                    .arms
                    .contains(&((*at).clone(), id.to_string(), arm))
            })
            .cloned()
            .collect()
    }
}

struct Point {
    place: String,
    arm: String,
    taken: bool,
}

fn walk_workflow(workflow: &Workflow, run: &Run<'_>, out: &mut Vec<Point>) {
    // The first arm is the workflow itself, so that one no test runs is
    // not covered, branches or none.
    let root = String::new();
    out.push(point("workflow", "runs", run.entered(&root)));
    let top = if run.entered(&root) {
        vec![root]
    } else {
        Vec::new()
    };
    block(&workflow.body, &top, run, out);
    if let OnError::Fallback(handler) = &workflow.on_error {
        let handler_at = "on_error/".to_string();
        let taken = run.entered(&handler_at);
        out.push(point("workflow", "on_error handler runs", taken));
        let instances = if taken { vec![handler_at] } else { Vec::new() };
        block(handler, &instances, run, out);
    }
}

fn point(place: impl Into<String>, arm: impl Into<String>, taken: bool) -> Point {
    Point {
        place: place.into(),
        arm: arm.into(),
        taken,
    }
}

/// The arms in `nodes`, a block the run entered at each of `instances`:
/// the path prefixes its steps have there (`""` at the top, `scans[2]/` in
/// a loop's third iteration, `lookups/crm/` in a parallel branch).
fn block(nodes: &[Node], instances: &[String], run: &Run<'_>, out: &mut Vec<Point>) {
    for node in nodes {
        match node {
            Node::Step(step) => {
                let place = format!("step.{}", step.id);
                if let Action::Approval(approval) = &step.action {
                    let decided = |approved: bool, expired: bool| {
                        run.of(&step.id).any(|record| {
                            let output = record.output.as_ref();
                            let yes = output.and_then(|o| o.get("approved")?.as_bool());
                            let by = output.and_then(|o| o.get("approver")?.as_str());
                            yes == Some(approved) && (by == Some("")) == expired
                        })
                    };
                    out.push(point(&place, "approved", decided(true, false)));
                    out.push(point(&place, "rejected", decided(false, false)));
                    // A gate without `expires` never expires (E405 in a test).
                    if approval.expires_ms.is_some() {
                        out.push(point(&place, "expired", decided(false, true)));
                    }
                }
                // A test's store never fails a KB write or a handoff, nor
                // can a test mock one (E402): their failures are no arm a
                // test can take.
                if matches!(step.action, Action::KbWrite(_) | Action::Handoff(_)) {
                    continue;
                }
                let failed: Vec<String> = run
                    .of(&step.id)
                    .filter(|record| record.status == StepStatus::Failed)
                    .map(|record| format!("{}/fallback/", record.path))
                    .filter(|at| run.entered(at))
                    .collect();
                match &step.on_error {
                    OnError::Fail => {}
                    OnError::Continue => {
                        let continued = run
                            .of(&step.id)
                            .any(|record| record.status == StepStatus::Failed);
                        out.push(point(&place, "fails, the run goes on", continued));
                    }
                    OnError::Fallback(body) => {
                        out.push(point(
                            &place,
                            "fails, its fallback runs",
                            !failed.is_empty(),
                        ));
                        block(body, &failed, run, out);
                    }
                }
            }
            Node::Condition {
                id,
                branches,
                otherwise,
            } => {
                // Every arm of the condition first, then what each holds.
                let arms: Vec<Vec<String>> = (0..branches.len())
                    .map(|arm| run.took(instances, id, arm))
                    .collect();
                for (index, at) in arms.iter().enumerate() {
                    let arm = match index {
                        0 => "if".to_string(),
                        n => format!("else if #{n}"),
                    };
                    out.push(point(id, arm, !at.is_empty()));
                }
                let rest = run.took(instances, id, branches.len());
                let arm = if otherwise.is_some() {
                    "else"
                } else {
                    "no branch"
                };
                out.push(point(id, arm, !rest.is_empty()));
                for (branch, at) in branches.iter().zip(&arms) {
                    block(&branch.body, at, run, out);
                }
                block(otherwise.as_deref().unwrap_or_default(), &rest, run, out);
            }
            Node::Loop {
                id,
                body,
                collection,
                ..
            } => {
                let place = format!("loop {id}");
                let counts: Vec<(&String, usize)> = instances
                    .iter()
                    .filter_map(|at| {
                        let items = run.ways.loops.get(&(at.clone(), id.clone()))?;
                        Some((at, *items))
                    })
                    .collect();
                let none = counts.iter().any(|(_, items)| *items == 0);
                let several = counts.iter().any(|(_, items)| *items >= 2);
                // A list written out has as many items in every run.
                let written = match collection {
                    Expr::List(items) => Some(items.len()),
                    Expr::Literal(Value::Array(items)) => Some(items.len()),
                    _ => None,
                };
                if written.is_none_or(|items| items == 0) {
                    out.push(point(&place, "no items", none));
                }
                if written.is_none_or(|items| items >= 2) {
                    out.push(point(&place, "several items", several));
                }
                // The iterations that started (after one fails or parks,
                // no new one does).
                let iterations: Vec<String> = counts
                    .iter()
                    .flat_map(|(at, items)| (0..*items).map(move |i| format!("{at}{id}[{i}]/")))
                    .filter(|at| run.entered(at))
                    .collect();
                block(body, &iterations, run, out);
            }
            Node::Parallel { id, branches, .. } => {
                let place = format!("parallel {id}");
                let within: Vec<Vec<String>> = branches
                    .iter()
                    .map(|branch| {
                        instances
                            .iter()
                            .map(|at| format!("{at}{id}/{}/", branch.name))
                            .filter(|at| run.entered(at))
                            .collect()
                    })
                    .collect();
                for (branch, at) in branches.iter().zip(&within) {
                    // A branch fails where a step of it failed with
                    // nothing to take the failure (`on_error continue` or
                    // a fallback goes on in the branch).
                    // (Not a KB write or a handoff, which a test's store
                    // never fails: a branch of only those cannot fail in a
                    // test, and has no such arm.)
                    let mut failing: Vec<String> = Vec::new();
                    Node::each_step_in(&branch.body, &mut |step| {
                        let unfailing =
                            matches!(step.action, Action::KbWrite(_) | Action::Handoff(_));
                        if let (OnError::Fail, false) = (&step.on_error, unfailing) {
                            failing.push(step.id.clone());
                        }
                    });
                    if failing.is_empty() {
                        continue;
                    }
                    let failed = run.records.iter().any(|record| {
                        record.status == StepStatus::Failed
                            && failing.contains(&record.step_id)
                            && at.iter().any(|at| record.path.starts_with(at.as_str()))
                    });
                    out.push(point(
                        &place,
                        format!("branch {} fails", branch.name),
                        failed,
                    ));
                }
                for (branch, at) in branches.iter().zip(&within) {
                    block(&branch.body, at, run, out);
                }
            }
        }
    }
}
