//! Branch coverage: every place a run can go one way or another, from the
//! plan, and whether a test's run went each way, from its journal.
//!
//! The places: each arm of an `if` (and the `else`, written or not), a
//! step's fallback or `continue` against its success, an approval approved,
//! rejected and expired, a loop over no items and over several, each
//! parallel branch failing, the workflow's `on_error` handler. Step ids are
//! unique in a workflow and every record names its step, so "a step of this
//! arm ran" is a question of ids; loop iterations and parallel branches
//! are read from the records' execution paths.

use std::collections::{BTreeSet, HashSet};

use flow_engine::journal::{Outcome, StepRecord, StepStatus};
use flow_plan::{Action, Expr, Node, OnError, Workflow};
use serde::Serialize;
use serde_json::Value;

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
    runs: impl IntoIterator<Item = (&'r str, &'r Outcome, &'r [StepRecord])>,
) -> Vec<Arm> {
    let mut arms = untested(workflow);
    for (test, outcome, records) in runs {
        let mut points = Vec::new();
        walk_workflow(workflow, &Run::new(outcome, records), &mut points);
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
    let run = Run {
        records: &[],
        completed: false,
        ran: false,
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
    completed: bool,
    /// Whether a test ran the workflow at all.
    ran: bool,
}

impl<'r> Run<'r> {
    fn new(outcome: &Outcome, records: &'r [StepRecord]) -> Run<'r> {
        Run {
            records,
            completed: matches!(outcome, Outcome::Completed { .. }),
            ran: true,
        }
    }

    fn of(&self, step: &str) -> impl Iterator<Item = &'r StepRecord> {
        self.records.iter().filter(move |r| r.step_id == step)
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
    out.push(point("workflow", "runs", run.ran));
    block(&workflow.body, &[String::new()], run, out);
    if let OnError::Fallback(handler) = &workflow.on_error {
        let taken = run.records.iter().any(|r| r.path.starts_with("on_error/"));
        out.push(point("workflow", "on_error handler runs", taken));
        let instances = if taken {
            vec!["on_error/".to_string()]
        } else {
            Vec::new()
        };
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
/// a loop's third iteration, `lookups/crm/` in a parallel branch), so that
/// a loop or an arm is judged in each iteration of what encloses it.
fn block(nodes: &[Node], instances: &[String], run: &Run<'_>, out: &mut Vec<Point>) {
    for (index, node) in nodes.iter().enumerate() {
        // Where the run got to this node: it went on past it (it completed,
        // or a step at or after it ran there). What a branch without steps
        // relies on.
        let reached: Vec<&String> = instances
            .iter()
            .filter(|at| run.completed || nodes[index..].iter().any(|n| ran_at(n, at, run)))
            .collect();
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
                    .collect();
                match &step.on_error {
                    OnError::Fail => {}
                    OnError::Continue => {
                        out.push(point(&place, "fails, the run goes on", !failed.is_empty()));
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
                let arms: Vec<Vec<String>> = branches
                    .iter()
                    .map(|branch| ran_in_block(&branch.body, instances, run))
                    .collect();
                for (index, at) in arms.iter().enumerate() {
                    let arm = match index {
                        0 => "if".to_string(),
                        n => format!("else if #{n}"),
                    };
                    out.push(point(id, arm, !at.is_empty()));
                }
                // An arm without steps is taken where the run went past the
                // condition and took no other arm.
                let body = otherwise.as_deref().unwrap_or_default();
                let mut rest = ran_in_block(body, instances, run);
                if !body.iter().any(has_steps) {
                    rest.extend(
                        reached
                            .iter()
                            .filter(|at| !arms.iter().any(|arm| arm.contains(at)))
                            .map(|at| (*at).clone()),
                    );
                }
                let arm = if otherwise.is_some() {
                    "else"
                } else {
                    "no branch"
                };
                out.push(point(id, arm, !rest.is_empty()));
                for (branch, at) in branches.iter().zip(&arms) {
                    block(&branch.body, at, run, out);
                }
                block(body, &rest, run, out);
            }
            Node::Loop {
                id,
                body,
                collection,
                ..
            } => {
                let place = format!("loop {id}");
                let iterations: Vec<Vec<String>> = reached
                    .iter()
                    .map(|at| iterations(at, id, run.records))
                    .collect();
                let none = iterations.iter().any(Vec::is_empty);
                let several = iterations.iter().any(|each| each.len() >= 2);
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
                block(body, &iterations.concat(), run, out);
            }
            Node::Parallel { id, branches, .. } => {
                let place = format!("parallel {id}");
                let within: Vec<Vec<String>> = branches
                    .iter()
                    .map(|branch| {
                        instances
                            .iter()
                            .map(|at| format!("{at}{id}/{}/", branch.name))
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
                    let entered = ran_in_block(&branch.body, at, run);
                    block(&branch.body, &entered, run, out);
                }
            }
        }
    }
}

/// The instances among `instances` where a step of `nodes` ran.
fn ran_in_block(nodes: &[Node], instances: &[String], run: &Run<'_>) -> Vec<String> {
    instances
        .iter()
        .filter(|at| nodes.iter().any(|node| ran_at(node, at, run)))
        .cloned()
        .collect()
}

/// Whether a step of `node` (at any depth) has a record under `at`.
fn ran_at(node: &Node, at: &str, run: &Run<'_>) -> bool {
    let mut ids = HashSet::new();
    Node::each_step_in(std::slice::from_ref(node), &mut |step| {
        ids.insert(step.id.clone());
    });
    run.records
        .iter()
        .any(|record| record.path.starts_with(at) && ids.contains(record.step_id.as_str()))
}

fn has_steps(node: &Node) -> bool {
    let mut any = false;
    Node::each_step_in(std::slice::from_ref(node), &mut |_| any = true);
    any
}

/// The iterations of loop `id` entered at `at` that left records: their
/// prefixes (`at` `id[i]/`), in order.
fn iterations(at: &str, id: &str, records: &[StepRecord]) -> Vec<String> {
    let start = format!("{at}{id}[");
    records
        .iter()
        .filter_map(|record| {
            let rest = record.path.strip_prefix(&start)?;
            let index = rest.split_once("]/")?.0;
            Some(format!("{start}{index}]/"))
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}
