//! Whether a run of one version of a workflow can go on on another: the
//! analysis behind `flowc diff`, and behind moving parked runs to a newer
//! version and redriving a failed run on one.
//!
//! It works on plans, so that the runtime can ask it without the compiler.
//! The question is one of execution paths because a run is a replay: the
//! interpreter runs the plan again from the top, and a step whose path the
//! journal holds takes its recorded outcome instead of running. A run of
//! OLD moved to NEW therefore keeps what its journal says at each path, and
//! NEW decides everything else:
//!
//! * a record whose path NEW has no step at is never read again (its work
//!   is lost, its effects are done but unknown to NEW);
//! * a record is replayed as NEW's step at that path, so that step must be
//!   of the same kind, and what NEW's references read from it must be what
//!   OLD's type of it guarantees;
//! * a step of NEW that the journal has no record of runs when the replay
//!   reaches it, so a step NEW orders before where the run stopped would
//!   run late, after work NEW orders after it (after the gate's decision);
//! * a pending gate is found by its path; NEW must reach that path, under
//!   the same conditions, or the decision is never asked for again.
//!
//! The places a run of OLD can be at are its steps: a gate (an approval) a
//! run waits at, or any step a run failed at or was running when its
//! process stopped. A place inside a loop stands for every iteration
//! (`articles[*]/review`, see [`pattern`]). For each place, what a run there
//! may hold is every step that may have completed before it: earlier
//! statements (every branch of an earlier condition), other iterations of
//! an enclosing loop, sibling parallel branches, the step whose fallback
//! the place is in. The analysis is conservative: where a run may hold a
//! record, it assumes it does.

use std::collections::HashMap;
use std::ops::Range;

use serde::Serialize;
use serde_json::Value;

use crate::schema;

mod codes;
use crate::{Expr, Node, OnError, PathSegment, Plan, Ref, Root, Step, StepKind, Workflow};
pub use codes::{Code, CodeInfo};

/// What a run is doing at a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlaceKind {
    /// An approval: runs wait here for a decision (or failed at it).
    Gate,
    /// Any other step: runs failed here, or were running it when their
    /// process stopped.
    Step,
}

/// One reason a run at a place cannot go on on the new version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incompatibility {
    pub code: Code,
    /// Where the run waits or stopped: an execution path, with `[*]` for
    /// any iteration of a loop.
    pub place: String,
    /// The execution path the problem is about: the place itself, a step
    /// the run has a record of, a step the new version added, or
    /// `workflow_input`.
    pub step: String,
    /// Why, in a sentence.
    pub reason: String,
}

/// A place and whether runs there can go on on the new version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlaceVerdict {
    pub path: String,
    pub kind: PlaceKind,
    pub compatible: bool,
}

/// One problem and every place it stops runs at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub code: Code,
    pub step: String,
    pub reason: String,
    pub places: Vec<String>,
}

/// The comparison of one workflow across two versions, for people and
/// tools: each place with its verdict, and each problem once with the
/// places it stops runs at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub workflow: String,
    pub compatible: bool,
    pub places: Vec<PlaceVerdict>,
    pub findings: Vec<Finding>,
}

/// `articles[3]/review` as a place: each iteration index as `[*]`. Ids and
/// branch names are identifiers, so a `[` in a path opens an index.
pub fn pattern(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(']') {
            out.push('*');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// One workflow's versions, compared: ask it about places with
/// [`Comparison::at`], or for everything with [`Comparison::report`].
pub struct Comparison<'p> {
    old: Version<'p>,
    /// `None` when the new plan has no workflow of this name.
    new: Option<Version<'p>>,
    /// What the new version reads from records that the old types do not
    /// guarantee, found once for every place.
    reads: Vec<BadRead>,
    /// By entry of the new version: what reads its output (steps by path,
    /// conditions, loops, the workflow's output), for messages.
    readers: Vec<Vec<String>>,
}

/// Compares the workflow `workflow` of `old` with the one of the same name
/// in `new`; `None` when `old` has no such workflow.
pub fn compare<'p>(old: &'p Plan, new: &'p Plan, workflow: &str) -> Option<Comparison<'p>> {
    let old = Version::new(old, old.workflow(workflow)?);
    let new = new.workflow(workflow).map(|w| Version::new(new, w));
    let (reads, readers) = match &new {
        Some(new) => (bad_reads(&old, new), readers(new)),
        None => (Vec::new(), Vec::new()),
    };
    Some(Comparison {
        old,
        new,
        reads,
        readers,
    })
}

impl Comparison<'_> {
    pub fn workflow(&self) -> &str {
        &self.old.workflow.name
    }

    /// Every place a run of the old version can be waiting or stopped at,
    /// in the order of the workflow.
    pub fn places(&self) -> impl Iterator<Item = (&str, PlaceKind)> {
        self.old.entries.iter().map(|entry| {
            let kind = match entry.kind {
                StepKind::Approval => PlaceKind::Gate,
                _ => PlaceKind::Step,
            };
            (entry.path.as_str(), kind)
        })
    }

    /// Why a run waiting or stopped at `path` (a journal's path such as
    /// `articles[3]/review`, or a place's pattern) cannot go on on the new
    /// version: empty when it can. `None` when `path` is no step of the old
    /// version. A run waiting at several gates (parallel branches, loop
    /// iterations) can move when none of them has a problem.
    pub fn at(&self, path: &str) -> Option<Vec<Incompatibility>> {
        let place = *self.old.by_path.get(pattern(path).as_str())?;
        let mut found = Vec::new();
        self.check(place, &mut found);
        Some(found)
    }

    /// Every place with its verdict, and each problem once with the places
    /// it stops runs at.
    pub fn report(&self) -> Report {
        let mut places = Vec::with_capacity(self.old.entries.len());
        let mut findings: Vec<Finding> = Vec::new();
        let mut index: HashMap<(Code, String, String), usize> = HashMap::new();
        let mut found = Vec::new();
        for (place, (path, kind)) in self.places().enumerate() {
            found.clear();
            self.check(place, &mut found);
            places.push(PlaceVerdict {
                path: path.to_string(),
                kind,
                compatible: found.is_empty(),
            });
            for problem in found.drain(..) {
                let key = (problem.code, problem.step, problem.reason);
                match index.get(&key) {
                    Some(&at) => findings[at].places.push(problem.place),
                    None => {
                        index.insert(key.clone(), findings.len());
                        findings.push(Finding {
                            code: key.0,
                            step: key.1,
                            reason: key.2,
                            places: vec![problem.place],
                        });
                    }
                }
            }
        }
        findings.sort_by_key(|finding| finding.code);
        Report {
            workflow: self.workflow().to_string(),
            compatible: findings.is_empty(),
            places,
            findings,
        }
    }

    /// The problems of runs at the old version's entry `place`.
    fn check(&self, place: usize, found: &mut Vec<Incompatibility>) {
        let old = &self.old;
        let at = &old.entries[place];
        let mut problem = |code: Code, step: &str, reason: String| {
            found.push(Incompatibility {
                code,
                place: at.path.clone(),
                step: step.to_string(),
                reason,
            });
        };
        let Some(new) = &self.new else {
            problem(
                Code::WorkflowRemoved,
                "",
                format!("the new version has no workflow `{}`", old.workflow.name),
            );
            return;
        };
        let what = if at.kind == StepKind::Approval {
            "the gate"
        } else {
            "the step"
        };
        let counterpart = new.by_path.get(at.path.as_str()).map(|&i| &new.entries[i]);
        match counterpart {
            None => problem(
                Code::ResumePointRemoved,
                &at.path,
                format!(
                    "{what} `{}` has no step at its path in the new version",
                    at.path
                ),
            ),
            Some(now) if now.kind != at.kind => problem(
                Code::StepKindChanged,
                &at.path,
                format!(
                    "`{}` was {} and is {} in the new version",
                    at.path,
                    described(at.kind),
                    described(now.kind)
                ),
            ),
            Some(now) if now.guards != at.guards => problem(
                Code::ResumePointGuarded,
                &at.path,
                format!(
                    "the new version reaches {what} `{}` under other conditions{}",
                    at.path,
                    guard_change(&at.guards, &now.guards)
                ),
            ),
            Some(_) => {}
        }
        // What a run here may hold, as the new version would read it (a
        // loop's record is its steps', which are looked at one by one).
        for entry in &old.entries {
            if entry.path == at.path || !may_precede(&entry.position, &at.position) {
                continue;
            }
            if entry.kind == StepKind::Loop {
                // Replayed, a loop takes its collection again: one the run
                // has begun that takes fewer items now may fail it.
                if let Some(now) = new
                    .by_path
                    .get(entry.path.as_str())
                    .map(|&i| &new.entries[i])
                    && now.kind == StepKind::Loop
                    && let Some(fewer) = now.max_items
                    && entry.max_items.is_none_or(|before| fewer < before)
                {
                    problem(
                        Code::ResumePointGuarded,
                        &entry.path,
                        format!(
                            "the new version's loop `{}` takes at most {fewer} item{} ({}): a run that began it with more fails when it goes on",
                            entry.path,
                            if fewer == 1 { "" } else { "s" },
                            entry.max_items.map_or(
                                "the old version's had no bound".to_string(),
                                |before| format!("the old version's took at most {before}")
                            )
                        ),
                    );
                }
                continue;
            }
            match new
                .by_path
                .get(entry.path.as_str())
                .map(|&i| &new.entries[i])
            {
                None => problem(
                    Code::CompletedStepRemoved,
                    &entry.path,
                    format!(
                        "`{}` may have completed, and the new version has no step at its path",
                        entry.path
                    ),
                ),
                Some(now) if now.kind != entry.kind => problem(
                    Code::StepKindChanged,
                    &entry.path,
                    format!(
                        "`{}` was {} and is {} in the new version",
                        entry.path,
                        described(entry.kind),
                        described(now.kind)
                    ),
                ),
                // The replay decides the conditions before the place again:
                // under other ones it may take a branch the run did not, and
                // run its steps late, after the place (regression: an `if`
                // changed before a gate moved, and the other branch ran
                // after the decision). A step every run at the place ran
                // would be passed over, its record unread and its work
                // lost as a removed step's is, unless the new version too
                // runs it before the place whatever the conditions
                // (regression, an audit: a step moved into an `if` before
                // a gate moved, and a step after it read it as absent).
                Some(now) if now.guards != entry.guards && !certainly_ran(entry, at) => problem(
                    Code::ResumePointGuarded,
                    &entry.path,
                    format!(
                        "the new version runs `{}`, before where these runs are, under other conditions{}: the replay may go another way than the run went",
                        entry.path,
                        guard_change(&entry.guards, &now.guards)
                    ),
                ),
                // (A place the new version lacks is D002 already.)
                Some(now)
                    if now.guards != entry.guards
                        && counterpart.is_some_and(|place| !certainly_ran(now, place)) =>
                {
                    problem(
                        Code::ResumePointGuarded,
                        &entry.path,
                        format!(
                            "runs here may have completed `{}`, and the new version runs it under other conditions{}: the replay may pass it over, its record unread",
                            entry.path,
                            guard_change(&entry.guards, &now.guards)
                        ),
                    )
                }
                // A failure the old version went on past is replayed as
                // the run's failure when the new one no longer takes it.
                Some(now)
                    if entry
                        .step
                        .is_some_and(|step| !matches!(step.on_error, OnError::Fail))
                        && now
                            .step
                            .is_some_and(|step| matches!(step.on_error, OnError::Fail)) =>
                {
                    problem(
                        Code::FailureNoLongerTaken,
                        &entry.path,
                        format!(
                            "`{}` may have failed, which the old version went on past (its `on_error`), and fails the run in the new version",
                            entry.path
                        ),
                    );
                }
                Some(_) => {}
            }
        }
        let mut input_reported = false;
        for read in &self.reads {
            let recorded = read
                .recorded
                .is_none_or(|step| may_precede(&old.entries[step].position, &at.position));
            // A gate's pending record is replayed: its own arguments are
            // not evaluated again, those of a failed step are. In a loop
            // around both, the iterations still to come evaluate the
            // reader again, on what the run recorded outside the loop
            // (its input, a step before the loop).
            let again_in_later_iterations = |reader: usize| {
                shares_loop(&old.entries[reader].position, &at.position)
                    && read
                        .recorded
                        .is_none_or(|step| !shares_loop(&old.entries[step].position, &at.position))
            };
            let done = read.reader.is_some_and(|step| {
                (certainly_precedes(&old.entries[step], at)
                    || (step == place && at.kind == StepKind::Approval))
                    && !again_in_later_iterations(step)
            });
            if recorded && !done {
                input_reported |= read.recorded.is_none();
                problem(Code::OutputIncompatible, &read.step, read.reason.clone());
            }
        }
        // Every invocation checks the run's input against the workflow's
        // input type, read or not: one that old runs' inputs may not fit
        // fails them when they go on (regression: a field dropped from the
        // input moved, and the run failed at preflight after the decision).
        // Said once for the place: a read of the input here said it.
        if !input_reported
            && !schema::assignable(&old.workflow.input_schema, &new.workflow.input_schema)
        {
            problem(
                Code::OutputIncompatible,
                "workflow_input",
                input_change(&old.workflow.input_schema, &new.workflow.input_schema),
            );
        }
        if let Some(now) = counterpart {
            self.added_before(at, now, &mut problem);
        }
    }

    /// D006: the steps the new version may run before `now` (the place
    /// `at` in the new version) that a run at `at` has no record of, and
    /// that would run out of order when the replay reaches them.
    fn added_before(
        &self,
        at: &Entry<'_>,
        now: &Entry<'_>,
        problem: &mut impl FnMut(Code, &str, String),
    ) {
        let (old, Some(new)) = (&self.old, &self.new) else {
            return;
        };
        let recorded = |entry: &Entry<'_>| {
            old.by_path
                .get(entry.path.as_str())
                .is_some_and(|&i| may_precede(&old.entries[i].position, &at.position))
        };
        for (index, entry) in new.entries.iter().enumerate() {
            // A new loop's steps are looked at one by one.
            if entry.path == now.path
                || entry.kind == StepKind::Loop
                || !may_precede(&entry.position, &now.position)
                || recorded(entry)
            {
                continue;
            }
            let why = if certainly_precedes(entry, now) {
                format!(
                    "the new version runs `{}` before where these runs stopped",
                    entry.path
                )
            } else if shares_loop(&entry.position, &now.position) {
                format!(
                    "`{}` is new in the loop's body, and earlier iterations completed without it",
                    entry.path
                )
            } else if let Some(later) = new
                .entries
                .iter()
                .find(|later| certainly_precedes(entry, later) && recorded(later))
            {
                format!(
                    "the new version runs `{}` before `{}`, which these runs may have completed",
                    entry.path, later.path
                )
            } else {
                // A step alone at the end of a sibling branch: running it
                // now is a schedule the new version could have had.
                continue;
            };
            let read_by = match self.readers.get(index).map(Vec::as_slice) {
                None | Some([]) => String::new(),
                Some([one]) => format!(" (read by {one})"),
                Some([first, second]) => format!(" (read by {first} and {second})"),
                Some([first, rest @ ..]) => format!(" (read by {first} and {} more)", rest.len()),
            };
            problem(
                Code::StepAddedBefore,
                &entry.path,
                format!(
                    "{why}; they have no record of it, so it would run late, on resume{read_by}"
                ),
            );
        }
    }
}

/// A kind of step in a sentence.
fn described(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Recipe => "a recipe step",
        StepKind::Approval => "an approval",
        StepKind::KbWrite => "a KB write",
        StepKind::Handoff => "a handoff",
        StepKind::Browser => "a browser action",
        StepKind::Loop => "a loop",
        StepKind::Parallel => "a parallel block",
    }
}

/// How one frame of a step's position nests in its parent's: the position
/// is the path from the workflow to the step through these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// 0 for the workflow's body, 1 for its `on_error` handler.
    Block(u8),
    /// The statement's index in its block.
    Seq(u32),
    /// A branch of a condition (`otherwise` after the others).
    Branch(u32),
    /// A loop's body: every iteration at once.
    Iter,
    /// A parallel block's branch.
    Par(u32),
    /// The fallback block of the step before it.
    Fallback,
}

/// Whether a run at position `at` may hold a record of the step at
/// position `step`: it comes in an earlier statement, in a sibling parallel
/// branch, in another iteration of a loop around both, or `at` is in its
/// fallback block (it failed). Other branches of a condition around both
/// did not run.
fn may_precede(step: &[Frame], at: &[Frame]) -> bool {
    let mut in_loop = false;
    for (a, b) in step.iter().zip(at) {
        if a != b {
            return in_loop
                || match (a, b) {
                    (Frame::Seq(i), Frame::Seq(j)) => i < j,
                    (Frame::Block(i), Frame::Block(j)) => i < j,
                    (Frame::Par(_), Frame::Par(_)) => true,
                    _ => false,
                };
        }
        in_loop |= *a == Frame::Iter;
    }
    step.len() < at.len() || in_loop
}

/// Whether every schedule runs `step` before `at` in the same iteration:
/// an earlier statement of a block around both, or the step whose
/// fallback `at` is in.
fn certainly_precedes(step: &Entry<'_>, at: &Entry<'_>) -> bool {
    for (a, b) in step.position.iter().zip(&at.position) {
        if a != b {
            return match (a, b) {
                (Frame::Seq(i), Frame::Seq(j)) => i < j,
                (Frame::Block(i), Frame::Block(j)) => i < j,
                _ => false,
            };
        }
    }
    step.position.len() < at.position.len()
}

/// Whether every run at `at` ran `step`: it comes before in every
/// schedule, and no condition or loop of its own (beyond those around
/// `at` too) could have passed it over.
fn certainly_ran(step: &Entry<'_>, at: &Entry<'_>) -> bool {
    let shared = step
        .guards
        .iter()
        .zip(&at.guards)
        .take_while(|(a, b)| a == b)
        .count();
    shared == step.guards.len() && certainly_precedes(step, at)
}

/// Whether a loop encloses both positions.
fn shares_loop(step: &[Frame], at: &[Frame]) -> bool {
    step.iter()
        .zip(at)
        .take_while(|(a, b)| a == b)
        .any(|(a, _)| *a == Frame::Iter)
}

/// Why an input of type `old` may not be one of type `new`, for a message.
fn input_change(old: &Value, new: &Value) -> String {
    let fields = |schema: &Value| {
        schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let required = |schema: &Value, name: &str| {
        schema
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|n| n == name))
    };
    let (before, after) = (fields(old), fields(new));
    if let Some(name) = before.keys().find(|name| !after.contains_key(*name)) {
        return format!(
            "old runs' input may hold `{name}`, which the new version's input does not declare"
        );
    }
    for (name, to) in &after {
        match before.get(name) {
            None if required(new, name) => {
                return format!(
                    "the new version's input requires `{name}`, which old runs' input does not have"
                );
            }
            Some(from) if !schema::assignable(from, to) => {
                return format!(
                    "the input's `{name}` was {} and is {} in the new version",
                    schema::show(from),
                    schema::show(to)
                );
            }
            _ => {}
        }
    }
    format!(
        "old runs' input ({}) may not be the new version's ({})",
        schema::show(old),
        schema::show(new)
    )
}

/// What differs between two guard chains, for a message.
fn guard_change(old: &[String], new: &[String]) -> String {
    let shared = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    match (old.get(shared), new.get(shared)) {
        (None, Some(added)) => format!(": it is now under `{added}`"),
        (Some(gone), None) => format!(": it is no longer under `{gone}`"),
        (Some(gone), Some(added)) => format!(": `{gone}` became `{added}`"),
        (None, None) => String::new(),
    }
}

/// One step of a version, where it runs.
struct Entry<'p> {
    /// Its execution path, with `[*]` for iterations.
    path: String,
    /// `None` for a loop: a place too, since a run fails at a loop whose
    /// collection is longer than its `max` or is no list.
    step: Option<&'p Step>,
    /// A loop's `max`.
    max_items: Option<u32>,
    kind: StepKind,
    position: Vec<Frame>,
    /// The conditions and loop collections that decide whether and how
    /// often it runs, outermost first, written with names (not slots), so
    /// that two versions compare.
    guards: Vec<String>,
}

/// What a slot's reference reads: a step, or a loop or parallel block
/// (the entries inside it, contiguous in the walk's order).
#[derive(Debug, Clone)]
enum Target {
    None,
    Step(usize),
    Block(Range<usize>),
}

/// One version of the workflow, indexed by execution path and by slot.
struct Version<'p> {
    plan: &'p Plan,
    workflow: &'p Workflow,
    entries: Vec<Entry<'p>>,
    by_path: HashMap<String, usize>,
    targets: Vec<Target>,
}

impl<'p> Version<'p> {
    fn new(plan: &'p Plan, workflow: &'p Workflow) -> Version<'p> {
        let mut version = Version {
            plan,
            workflow,
            entries: Vec::new(),
            by_path: HashMap::new(),
            targets: vec![Target::None; workflow.slots.len()],
        };
        let mut position = vec![Frame::Block(0)];
        let mut guards = Vec::new();
        version.walk(&workflow.body, "", &mut position, &mut guards);
        if let OnError::Fallback(handler) = &workflow.on_error {
            let mut position = vec![Frame::Block(1)];
            version.walk(handler, "on_error/", &mut position, &mut guards);
        }
        for (index, entry) in version.entries.iter().enumerate() {
            // A plan from outside may repeat an id; the first is the one
            // the journal's path finds.
            version.by_path.entry(entry.path.clone()).or_insert(index);
        }
        version
    }

    fn target(&mut self, slot: u32, target: Target) {
        if let Some(place) = self.targets.get_mut(slot as usize) {
            *place = target;
        }
    }

    /// Records the steps of `nodes` as the interpreter names them
    /// (`runtime/src/interp.rs`): `prefix` and the id; a loop adds
    /// `id[i]/`, a parallel branch `id/branch/`, a fallback
    /// `path/fallback/`; a condition adds nothing.
    fn walk(
        &mut self,
        nodes: &'p [Node],
        prefix: &str,
        position: &mut Vec<Frame>,
        guards: &mut Vec<String>,
    ) {
        for (index, node) in nodes.iter().enumerate() {
            position.push(Frame::Seq(index as u32));
            match node {
                Node::Step(step) => {
                    let path = format!("{prefix}{}", step.id);
                    self.target(step.slot, Target::Step(self.entries.len()));
                    self.entries.push(Entry {
                        path: path.clone(),
                        step: Some(step),
                        max_items: None,
                        kind: step.action.kind(),
                        position: position.clone(),
                        guards: guards.clone(),
                    });
                    if let OnError::Fallback(body) = &step.on_error {
                        position.push(Frame::Fallback);
                        self.walk(body, &format!("{path}/fallback/"), position, guards);
                        position.pop();
                    }
                }
                Node::Condition {
                    branches,
                    otherwise,
                    ..
                } => {
                    let mut tests = Vec::new();
                    for (branch_index, branch) in branches.iter().enumerate() {
                        tests.push(crate::written::expr(self.workflow, &branch.condition));
                        guards.push(format!("if {}", tests.join(" else if ")));
                        position.push(Frame::Branch(branch_index as u32));
                        self.walk(&branch.body, prefix, position, guards);
                        position.pop();
                        guards.pop();
                    }
                    if let Some(body) = otherwise {
                        guards.push(format!("if {} else", tests.join(" else if ")));
                        position.push(Frame::Branch(branches.len() as u32));
                        self.walk(body, prefix, position, guards);
                        position.pop();
                        guards.pop();
                    }
                }
                Node::Loop {
                    slot,
                    id,
                    collection,
                    body,
                    max_items,
                    ..
                } => {
                    self.entries.push(Entry {
                        path: format!("{prefix}{id}"),
                        step: None,
                        max_items: *max_items,
                        kind: StepKind::Loop,
                        position: position.clone(),
                        guards: guards.clone(),
                    });
                    let first = self.entries.len();
                    guards.push(format!(
                        "for {} as {id}",
                        crate::written::expr(self.workflow, collection)
                    ));
                    position.push(Frame::Iter);
                    self.walk(body, &format!("{prefix}{id}[*]/"), position, guards);
                    position.pop();
                    guards.pop();
                    self.target(*slot, Target::Block(first..self.entries.len()));
                }
                Node::Parallel { slot, id, branches } => {
                    let first = self.entries.len();
                    for (branch_index, branch) in branches.iter().enumerate() {
                        position.push(Frame::Par(branch_index as u32));
                        let prefix = format!("{prefix}{id}/{}/", branch.name);
                        self.walk(&branch.body, &prefix, position, guards);
                        position.pop();
                    }
                    self.target(*slot, Target::Block(first..self.entries.len()));
                }
            }
            position.pop();
        }
    }

    /// What a reference to `slot` along `path` reads: each step's entry
    /// with the path left below its output. A loop's list and a parallel
    /// block's record hold their steps' outputs by id (ids are unique in a
    /// workflow); a reference to the whole block reads every step in it.
    fn reads<'r>(
        &self,
        slot: u32,
        path: &'r [PathSegment],
        out: &mut Vec<(usize, &'r [PathSegment])>,
    ) {
        match self.targets.get(slot as usize) {
            Some(Target::Step(entry)) => out.push((*entry, path)),
            Some(Target::Block(range)) => {
                let is_loop = self
                    .workflow
                    .slots
                    .get(slot as usize)
                    .is_some_and(|s| s.kind == StepKind::Loop);
                // A loop's list is indexed by iteration, a parallel
                // block's record by branch; the step's id comes next.
                let skip = match (is_loop, path.first()) {
                    (true, Some(PathSegment::Index(_))) | (false, Some(PathSegment::Field(_))) => 1,
                    _ => 0,
                };
                let inner = match path.get(skip) {
                    Some(PathSegment::Field(id)) if skip == 1 => self.slot_of(id, range),
                    _ => None,
                };
                match inner {
                    Some(inner) => self.reads(inner, &path[skip + 1..], out),
                    None => out.extend(range.clone().map(|entry| (entry, &path[..0]))),
                }
            }
            Some(Target::None) | None => {}
        }
    }

    /// The slot of the step, loop or parallel block `id` inside `range`.
    fn slot_of(&self, id: &str, range: &Range<usize>) -> Option<u32> {
        let slot = self.workflow.slots.iter().position(|s| s.id == id)? as u32;
        match self.targets.get(slot as usize)? {
            Target::Step(entry) if range.contains(entry) => Some(slot),
            Target::Block(inner) if range.start <= inner.start && inner.end <= range.end => {
                Some(slot)
            }
            _ => None,
        }
    }

    /// The schema of a step's output, when its kind's output is not fixed:
    /// a recipe's declared output, a browser action's `json`. An approval's
    /// and a KB write's outputs are the same in every version, and a
    /// handoff has none.
    fn output_schema(&self, entry: &Entry<'_>) -> Option<&'p Value> {
        match &entry.step?.action {
            crate::Action::Recipe { recipe, .. } => self
                .plan
                .recipes
                .get(*recipe as usize)
                .map(|r| &r.output_schema),
            _ => None,
        }
    }
}

/// A reference of the new version that reads, from a run's records, what
/// the old types do not guarantee.
struct BadRead {
    /// The old entry whose record is read; `None` for the run's input,
    /// which every run has.
    recorded: Option<usize>,
    /// The old entry of the step that reads, when a step reads and the
    /// old version has it at the same path: a run that certainly completed
    /// it does not evaluate its arguments again.
    reader: Option<usize>,
    /// The path of the step read, or `workflow_input`.
    step: String,
    reason: String,
}

/// Every reference of the new version (arguments, conditions, loop
/// collections, the workflow's output) that reads from a record of a step
/// both versions have, or from the input, something the old type does not
/// guarantee. Found once; each place then asks which apply to it.
fn bad_reads(old: &Version<'_>, new: &Version<'_>) -> Vec<BadRead> {
    let mut reads = Reads {
        old,
        new,
        seen: std::collections::HashSet::new(),
        found: Vec::new(),
    };
    each_reference(new, &mut |reference, reader, entry| {
        let reader_old = entry.and_then(|e| old.by_path.get(new.entries[e].path.as_str()).copied());
        reads.check(reference, reader, reader_old);
    });
    reads.found
}

/// Calls `visit` on every reference of a version that a run evaluates,
/// with who reads (for a message) and the reading entry when a step
/// reads: steps' arguments, conditions and loop collections (in the body
/// and the workflow's handler), the workflow's output.
fn each_reference(version: &Version<'_>, visit: &mut impl FnMut(&Ref, &str, Option<usize>)) {
    for (index, entry) in version.entries.iter().enumerate() {
        let Some(step) = entry.step else { continue };
        let reader = format!("`{}`", entry.path);
        step.each_ref(&mut |reference| visit(reference, &reader, Some(index)));
    }
    let mut guards = |nodes: &[Node]| {
        each_guard_expr(nodes, &mut |expr, reader| {
            expr.each_ref(&mut |reference| visit(reference, &reader, None));
        });
    };
    guards(&version.workflow.body);
    if let OnError::Fallback(handler) = &version.workflow.on_error {
        guards(handler);
    }
    for field in &version.workflow.output {
        let reader = format!("the workflow's output `{}`", field.name);
        field
            .value
            .each_ref(&mut |reference| visit(reference, &reader, None));
    }
}

/// The state of [`bad_reads`]: each path read is compared once.
struct Reads<'a, 'p> {
    old: &'a Version<'p>,
    new: &'a Version<'p>,
    seen: std::collections::HashSet<(Option<usize>, String, bool, Option<usize>)>,
    found: Vec<BadRead>,
}

impl Reads<'_, '_> {
    /// Compares what `reference`, in `reader` (the old entry `reader_old`
    /// when a step both versions have), reads with what runs recorded.
    fn check(&mut self, reference: &Ref, reader: &str, reader_old: Option<usize>) {
        let (old, new) = (self.old, self.new);
        let written = || crate::written::reference_text(new.workflow, reference);
        match reference.root {
            Root::Step(slot) => {
                let mut targets = Vec::new();
                new.reads(slot, &reference.path, &mut targets);
                for (entry, path) in targets {
                    let now = &new.entries[entry];
                    let Some(&then) = old.by_path.get(now.path.as_str()) else {
                        continue;
                    };
                    let before = &old.entries[then];
                    let (Some(from), Some(to)) =
                        (old.output_schema(before), new.output_schema(now))
                    else {
                        continue;
                    };
                    if from == to || !self.first(Some(then), path, reference.optional, reader_old) {
                        continue;
                    }
                    let records = format!("the record of `{}`", now.path);
                    if let Some(reason) = mismatch(from, to, path, reference.optional, &records) {
                        self.found.push(BadRead {
                            recorded: Some(then),
                            reader: reader_old,
                            step: now.path.clone(),
                            reason: format!("{reader} reads `{}`: {reason}", written()),
                        });
                    }
                }
            }
            Root::Input | Root::InputField(_) => {
                let mut path = Vec::with_capacity(reference.path.len() + 1);
                if let Root::InputField(field) = reference.root {
                    let Some(name) = new.workflow.input_fields.get(field as usize) else {
                        return;
                    };
                    path.push(PathSegment::Field(name.clone()));
                }
                path.extend(reference.path.iter().cloned());
                let (from, to) = (&old.workflow.input_schema, &new.workflow.input_schema);
                if from == to || !self.first(None, &path, reference.optional, reader_old) {
                    return;
                }
                if let Some(reason) = mismatch(from, to, &path, reference.optional, "the input") {
                    self.found.push(BadRead {
                        recorded: None,
                        reader: reader_old,
                        step: "workflow_input".to_string(),
                        reason: format!("{reader} reads `{}`: {reason}", written()),
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether this read of `recorded` (`None`: the input) along `path`,
    /// by the old entry `reader`, is the first of its kind. The reader is
    /// part of it: a read that a place has done (a gate's message, which
    /// its pending record does not evaluate again) hid the same read by a
    /// step after the gate, which a moved run makes (regression: a string
    /// narrowed to an enum moved, and the run failed after its approval).
    fn first(
        &mut self,
        recorded: Option<usize>,
        path: &[PathSegment],
        optional: bool,
        reader: Option<usize>,
    ) -> bool {
        self.seen
            .insert((recorded, format!("{path:?}"), optional, reader))
    }
}

/// What reads each entry's output: the steps by path, the conditions and
/// loops by id, the workflow's output; each once, in the workflow's order.
fn readers(version: &Version<'_>) -> Vec<Vec<String>> {
    let mut readers = vec![Vec::<String>::new(); version.entries.len()];
    each_reference(version, &mut |reference, reader, _| {
        if let Root::Step(slot) = reference.root {
            let mut read = Vec::new();
            version.reads(slot, &reference.path, &mut read);
            for (entry, _) in read {
                let list = &mut readers[entry];
                if list.last().is_none_or(|last| last != reader) {
                    list.push(reader.to_string());
                }
            }
        }
    });
    readers
}

/// Calls `visit` on every condition and loop collection in `nodes`, at any
/// depth, with what it is for a message: the expressions a replay
/// evaluates again whatever the journal holds.
fn each_guard_expr<'a>(nodes: &'a [Node], visit: &mut impl FnMut(&'a Expr, String)) {
    for node in nodes {
        match node {
            Node::Step(step) => {
                if let OnError::Fallback(body) = &step.on_error {
                    each_guard_expr(body, visit);
                }
            }
            Node::Condition {
                id,
                branches,
                otherwise,
            } => {
                for branch in branches {
                    visit(&branch.condition, format!("the condition `{id}`"));
                    each_guard_expr(&branch.body, visit);
                }
                if let Some(body) = otherwise {
                    each_guard_expr(body, visit);
                }
            }
            Node::Loop {
                id,
                collection,
                body,
                ..
            } => {
                visit(collection, format!("the loop `{id}`"));
                each_guard_expr(body, visit);
            }
            Node::Parallel { branches, .. } => {
                for branch in branches {
                    each_guard_expr(&branch.body, visit);
                }
            }
        }
    }
}

/// Why a value recorded under `old`, read along `path`, is not what a
/// reader of `new` expects there (`optional` when the reference takes
/// absence); `None` when it is. `records` names what holds the value in
/// old runs: a step's record, or the input they started with.
fn mismatch(
    old: &Value,
    new: &Value,
    path: &[PathSegment],
    optional: bool,
    records: &str,
) -> Option<String> {
    let expected = schema::project(new, path)?;
    let expected = if optional {
        schema::optional(expected)
    } else {
        expected
    };
    let expected_shown = schema::show(&expected);
    let Some(recorded) = schema::project(old, path) else {
        return Some(format!(
            "expects {expected_shown}, and {records} of old runs has no such path"
        ));
    };
    if schema::assignable(&recorded, &expected) {
        return None;
    }
    Some(if schema::is_null(&recorded) {
        format!("expects {expected_shown}, and {records} of old runs does not have it")
    } else {
        format!(
            "expects {expected_shown}, and {records} of old runs holds {}",
            schema::show(&recorded)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_stand_for_every_iteration() {
        assert_eq!(pattern("articles[3]/review"), "articles[*]/review");
        assert_eq!(pattern("a[0]/b[12]/c"), "a[*]/b[*]/c");
        assert_eq!(pattern("a[*]/c"), "a[*]/c");
        assert_eq!(pattern("gates/legal/l"), "gates/legal/l");
        assert_eq!(pattern("odd[x]/[]["), "odd[x]/[][");
    }

    #[test]
    fn every_code_is_documented_and_parses() {
        for code in Code::ALL {
            let info = code.info();
            assert!(info.explanation.len() > 40, "{}", info.code);
            assert_eq!(Code::parse(info.code), Some(*code));
            assert_eq!(Code::parse(&info.code.to_lowercase()), Some(*code));
            assert_eq!(Code::parse(info.name), Some(*code));
        }
    }

    #[test]
    fn positions_order_what_a_run_may_hold() {
        use Frame::*;
        let body = |frames: &[Frame]| [&[Block(0)], frames].concat();
        // Earlier statements, every branch of an earlier condition.
        assert!(may_precede(&body(&[Seq(0)]), &body(&[Seq(1)])));
        assert!(may_precede(
            &body(&[Seq(0), Branch(1), Seq(0)]),
            &body(&[Seq(1)])
        ));
        assert!(!may_precede(&body(&[Seq(2)]), &body(&[Seq(1)])));
        // Another branch of the same condition never ran.
        assert!(!may_precede(
            &body(&[Seq(0), Branch(0), Seq(0)]),
            &body(&[Seq(0), Branch(1), Seq(1)])
        ));
        // Sibling parallel branches, and other iterations, may have.
        assert!(may_precede(
            &body(&[Seq(0), Par(1), Seq(3)]),
            &body(&[Seq(0), Par(0), Seq(0)])
        ));
        assert!(may_precede(
            &body(&[Seq(0), Iter, Seq(3)]),
            &body(&[Seq(0), Iter, Seq(1)])
        ));
        // The step whose fallback a place is in failed before it.
        assert!(may_precede(
            &body(&[Seq(0)]),
            &body(&[Seq(0), Fallback, Seq(0)])
        ));
        assert!(!may_precede(
            &body(&[Seq(0), Fallback, Seq(0)]),
            &body(&[Seq(0)])
        ));
        // The workflow's handler comes after its body.
        assert!(may_precede(&body(&[Seq(5)]), &[Block(1), Seq(0)]));
        assert!(!may_precede(&[Block(1), Seq(0)], &body(&[Seq(5)])));
    }
}
