//! `flow show RUN`: a run's trace as a person reads it. A header says how
//! the run stands; below it, the tree of its step executions, nested as the
//! workflow nests them: a loop's iterations and a parallel's branches under
//! them, a fallback under the step it stands in for, the workflow's error
//! handler apart.
//!
//! The tree is built from execution paths alone (`lookups/billing/invoices`,
//! `scans[3]/page`, `classify/fallback/retry`), which every journal has, so
//! that a trace from flowd's API reads the same as one from the local store.

use flow_plan::StepKind;
use flow_runtime::approval::PendingApproval;
use flow_runtime::error::ErrorKind;
use flow_runtime::journal::{StepRecord, StepStatus, failed_at};
use flow_runtime::runner::RunError;
use flow_runtime::services::StepNow;
use flow_runtime::store::{RunChange, RunStatus};
use serde_json::Value;

use crate::style::{self, Paint, Tone};

/// The format of `flow show --json`: each step record carries it as
/// `trace_version`, so that a script can tell the shape it reads. Raised
/// only when a field changes meaning or goes; added fields keep it.
pub(crate) const TRACE_VERSION: u32 = 1;

/// What the header says of a run; what a source does not know is `None`
/// (flowd's API does not tell a run's plan or active time).
#[derive(Debug, Clone)]
pub(crate) struct RunSummary {
    pub(crate) id: String,
    pub(crate) workflow: Option<String>,
    pub(crate) status: RunStatus,
    pub(crate) interrupted: bool,
    pub(crate) plan_hash: Option<String>,
    pub(crate) created_ms: Option<i64>,
    pub(crate) active_ms: Option<i64>,
    pub(crate) error: Option<RunError>,
    pub(crate) output: Option<Value>,
    /// What happened to the run besides its steps; its deliveries to
    /// destinations are listed after the steps.
    pub(crate) history: Vec<RunChange>,
    /// The steps it executes now (flowd tells them of a run it drives; a
    /// store does not know them).
    pub(crate) in_flight: Vec<StepNow>,
}

/// How to render.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options<'a> {
    /// Show each step's output, and the run's.
    pub(crate) outputs: bool,
    /// Where the hints' commands act.
    pub(crate) via: style::Via<'a>,
    pub(crate) paint: Paint,
    /// Now, in milliseconds since the epoch: how long a pending approval
    /// has waited.
    pub(crate) now_ms: u64,
}

/// The records as `flow show --json` prints them: the journal's records,
/// each with `trace_version`.
pub(crate) fn json(records: &[StepRecord]) -> Value {
    Value::Array(
        records
            .iter()
            .map(|record| {
                let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
                if let Value::Object(fields) = &mut value {
                    fields.insert("trace_version".into(), TRACE_VERSION.into());
                }
                value
            })
            .collect(),
    )
}

/// The trace as lines of text.
pub(crate) fn render(run: &RunSummary, records: &[StepRecord], options: &Options<'_>) -> String {
    let mut out = steps(run, records, options);
    out.push_str(&history(&run.history, options.paint));
    out
}

/// What happened to the run besides its steps, one line each, oldest
/// first: its cancels and redrives, its moves to other versions, each attempt at a
/// destination.
fn history(history: &[RunChange], paint: Paint) -> String {
    let mut out = String::new();
    for change in history {
        let line = match change {
            RunChange::Cancelled { at_ms } => {
                format!("{} at {}", paint.dim("cancelled  "), style::time(*at_ms))
            }
            RunChange::Redriven { at_ms, round } => format!(
                "{} round {round} at {}",
                paint.dim("redriven   "),
                style::time(*at_ms)
            ),
            RunChange::Moved {
                at_ms,
                from_plan,
                to_plan,
            } => format!(
                "{} from plan {} to plan {} at {}",
                paint.dim("moved      "),
                short_hash(from_plan),
                short_hash(to_plan),
                style::time(*at_ms)
            ),
            RunChange::Delivery {
                destination,
                to,
                event,
                result,
                error,
                ..
            } => {
                let tone = match result.as_str() {
                    "delivered" => Tone::Good,
                    "failed" => Tone::Waiting,
                    _ => Tone::Bad,
                };
                format!(
                    "{} {destination} ({to}, on {event})  {}{}",
                    paint.dim("destination"),
                    paint.tone(tone, result),
                    error.as_ref().map(|e| format!("  {e}")).unwrap_or_default()
                )
            }
            RunChange::Began { .. } => continue,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn steps(run: &RunSummary, records: &[StepRecord], options: &Options<'_>) -> String {
    let mut out = header(run, records, options);
    out.push('\n');
    if records.is_empty() {
        out.push_str(&options.paint.dim("no step has run"));
        out.push('\n');
        return out;
    }
    let mut root = Node::default();
    for (seq, record) in records.iter().enumerate() {
        root.insert(seq, record);
    }
    // Where the run was last: the record that started last (the first
    // recorded of those that started together).
    let latest = records
        .iter()
        .enumerate()
        .max_by_key(|(seq, record)| (record.started_ms, std::cmp::Reverse(*seq)))
        .map_or(0, |(seq, _)| seq);
    let mut rows = Vec::new();
    root.rows(
        &Shown { run, latest },
        Shape::Root,
        "",
        "",
        options,
        &mut rows,
    );
    let widths = [
        rows.iter()
            .map(|r| r.tree.chars().count() + r.name.chars().count())
            .max(),
        rows.iter().map(|r| r.kind.len()).max(),
        rows.iter().map(|r| r.status.len()).max(),
    ]
    .map(Option::unwrap_or_default);
    let paint = options.paint;
    for row in rows {
        let name_pad = widths[0] - row.tree.chars().count() - row.name.chars().count();
        // Padded before painting: escape codes take no columns.
        let mut line = format!(
            "{}{}{}  {}  {}",
            paint.dim(&row.tree),
            paint.bold(&row.name),
            " ".repeat(name_pad),
            paint.dim(&format!("{:<kind$}", row.kind, kind = widths[1])),
            paint.tone(
                row.tone,
                &format!("{:<status$}", row.status, status = widths[2])
            ),
        );
        if !row.rest.is_empty() {
            line.push_str("  ");
            line.push_str(&row.rest);
        }
        out.push_str(line.trim_end());
        out.push('\n');
        for detail in &row.details {
            out.push_str(&format!("{}{detail}\n", paint.dim(&row.below)));
        }
    }
    out
}

/// The header: the run, its workflow and plan, status, start, active time,
/// time waiting for people, and its error or output.
fn header(run: &RunSummary, records: &[StepRecord], options: &Options<'_>) -> String {
    let paint = options.paint;
    let mut lines: Vec<(&str, String)> = vec![("run", paint.bold(&run.id))];
    if let Some(workflow) = &run.workflow {
        let plan = run
            .plan_hash
            .as_deref()
            .map(|hash| paint.dim(&format!("  (plan {})", short_hash(hash))))
            .unwrap_or_default();
        lines.push(("workflow", format!("{workflow}{plan}")));
    }
    lines.push((
        "status",
        paint.tone(
            Tone::of_run(run.status),
            &style::run_status(run.status, run.interrupted),
        ),
    ));
    if let Some(created) = run.created_ms {
        lines.push(("started", style::time(created)));
    }
    if let Some(active) = run.active_ms {
        lines.push((
            "active",
            style::duration(u64::try_from(active).unwrap_or(0)),
        ));
    }
    let approvals: Vec<&StepRecord> = records
        .iter()
        .filter(|r| r.kind == StepKind::Approval)
        .collect();
    if !approvals.is_empty() {
        // A gate still pending in a run that ended waits for no one: its
        // wait stopped counting (unknown when), and is left out.
        let waited: u64 = approvals
            .iter()
            .filter(|r| !(run.ended_undone() && r.status == StepStatus::Pending))
            .map(|r| waited_ms(r, options.now_ms))
            .sum();
        lines.push((
            "waiting",
            format!(
                "{} for people ({} approval{})",
                style::duration(waited),
                approvals.len(),
                if approvals.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    if run.status == RunStatus::Running && !run.in_flight.is_empty() {
        lines.push(("now", steps_now(&run.in_flight, options)));
    }
    if let Some(error) = &run.error {
        let at = match failed_at(error.step.as_deref(), error.attempts) {
            at if at.is_empty() => at,
            at => format!("{}: ", at.trim_start()),
        };
        lines.push((
            "error",
            paint.tone(
                Tone::Bad,
                &format!(
                    "{at}{}: {}",
                    error.kind.name(),
                    style::inert(&error.message)
                ),
            ),
        ));
    }
    let mut out: String = lines
        .into_iter()
        .map(|(key, value)| format!("{}  {value}\n", paint.dim(&format!("{key:<8}"))))
        .collect();
    if options.outputs
        && let Some(output) = &run.output
    {
        out.push_str(&format!("{}  ", paint.dim("output  ")));
        out.push_str(&indented(output, "          "));
        out.push('\n');
    }
    out
}

/// The steps a run executes now, for the header: each with its kind and
/// how long it has run, and its retries so far (`classify (recipe, 3.2 s,
/// attempt 2)`, `fetch (browser, waiting to retry)`).
fn steps_now(steps: &[StepNow], options: &Options<'_>) -> String {
    steps
        .iter()
        .map(|step| {
            let how = match step.calling_since_ms {
                None => "waiting to retry".to_string(),
                Some(_) if step.attempts_failed > 0 => format!(
                    "{}, attempt {}",
                    style::duration(options.now_ms.saturating_sub(step.started_ms)),
                    step.attempts_failed + 1
                ),
                Some(_) => style::duration(options.now_ms.saturating_sub(step.started_ms)),
            };
            format!(
                "{} {}",
                options.paint.bold(&step.path),
                options
                    .paint
                    .dim(&format!("({}, {how})", kind_name(step.kind)))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a trace's rows are drawn from besides their own records.
struct Shown<'a> {
    run: &'a RunSummary,
    /// The place in the journal of the record that started last: the run
    /// was last in the groups that hold it.
    latest: usize,
}

impl RunSummary {
    /// Whether the run has ended without completing: a gate it waited at
    /// is decided by no one now.
    fn ended_undone(&self) -> bool {
        matches!(self.status, RunStatus::Failed | RunStatus::Cancelled)
    }
}

/// `sha256:` and the first 12 hex digits: enough to tell plans apart.
fn short_hash(hash: &str) -> &str {
    hash.get(..19).unwrap_or(hash)
}

/// How long an approval has waited or waited for its decision.
fn waited_ms(record: &StepRecord, now_ms: u64) -> u64 {
    let end = if record.status == StepStatus::Pending {
        now_ms
    } else {
        record.ended_ms
    };
    end.saturating_sub(record.started_ms)
}

/// `value` as pretty JSON, its lines after the first indented by `indent`.
fn indented(value: &Value, indent: &str) -> String {
    serde_json::to_string_pretty(value)
        .unwrap_or_default()
        .replace('\n', &format!("\n{indent}"))
}

/// What a node of the tree is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Shape {
    /// The run itself, above the top level.
    #[default]
    Root,
    /// A node that holds a step record (and, below it, its fallback).
    Step,
    Loop,
    Iteration(u64),
    Parallel,
    Branch,
    /// A step's fallback block.
    Fallback,
    /// The workflow's `on_error` block.
    Handler,
    /// A segment of a path not known yet to be any of the above.
    Group,
}

#[derive(Debug, Default)]
struct Node<'r> {
    segment: String,
    shape: Shape,
    record: Option<&'r StepRecord>,
    /// The record's place in the journal: what orders steps that started
    /// in the same millisecond (the one recorded first ran first).
    seq: usize,
    children: Vec<Node<'r>>,
}

/// One line of the tree, and the lines under it.
struct Row {
    /// The tree's lines leading to this node.
    tree: String,
    name: String,
    kind: String,
    status: String,
    tone: Tone,
    /// Duration, attempts, counts.
    rest: String,
    /// The tree's lines that go on below this node, before its details.
    below: String,
    details: Vec<String>,
}

/// `scans[3]`: the loop `scans` and the index 3.
fn iteration(segment: &str) -> Option<(&str, u64)> {
    let (name, rest) = segment.split_once('[')?;
    let index = rest.strip_suffix(']')?.parse().ok()?;
    Some((name, index))
}

impl<'r> Node<'r> {
    fn child(&mut self, segment: &str, shape: Shape) -> &mut Node<'r> {
        let at = match self.children.iter().position(|c| c.segment == segment) {
            Some(at) => at,
            None => {
                self.children.push(Node {
                    segment: segment.to_string(),
                    shape,
                    ..Node::default()
                });
                self.children.len() - 1
            }
        };
        &mut self.children[at]
    }

    fn insert(&mut self, seq: usize, record: &'r StepRecord) {
        let mut node = self;
        for segment in record.path.split('/') {
            node = match iteration(segment) {
                Some((name, index)) => node
                    .child(name, Shape::Loop)
                    .child(&format!("[{index}]"), Shape::Iteration(index)),
                None => node.child(segment, Shape::Group),
            };
        }
        node.shape = Shape::Step;
        node.record = Some(record);
        node.seq = seq;
    }

    /// What a `Group` node is, from where it stands: `fallback` under a
    /// step, `on_error` at the top, a branch under a parallel, and any
    /// other a parallel (whose children are its branches).
    fn resolved(&self, parent: Shape) -> Shape {
        match (self.shape, parent, self.segment.as_str()) {
            (Shape::Group, Shape::Step, "fallback") => Shape::Fallback,
            (Shape::Group, Shape::Root, "on_error") => Shape::Handler,
            (Shape::Group, Shape::Parallel, _) => Shape::Branch,
            (Shape::Group, _, _) => Shape::Parallel,
            (shape, _, _) => shape,
        }
    }

    /// When the first step below (or at) this node started, and its place
    /// in the journal.
    fn first_started(&self) -> (u64, usize) {
        let own = self
            .record
            .map_or((u64::MAX, usize::MAX), |r| (r.started_ms, self.seq));
        self.children
            .iter()
            .map(Node::first_started)
            .fold(own, std::cmp::min)
    }

    /// Whether the record at `seq` in the journal is at or below this node.
    fn holds(&self, seq: usize) -> bool {
        let mut visit = vec![self];
        while let Some(node) = visit.pop() {
            if node.record.is_some() && node.seq == seq {
                return true;
            }
            visit.extend(&node.children);
        }
        false
    }

    /// The status of a group: the worst below it.
    fn worst(&self) -> StepStatus {
        let mut worst = StepStatus::Completed;
        let rank = |status: StepStatus| match status {
            StepStatus::Completed => 0,
            StepStatus::Retrying => 1,
            StepStatus::Pending => 2,
            StepStatus::Failed => 3,
        };
        let mut visit = vec![self];
        while let Some(node) = visit.pop() {
            if let Some(record) = node.record
                && rank(record.status) > rank(worst)
            {
                worst = record.status;
            }
            visit.extend(&node.children);
        }
        worst
    }

    /// The rows of this node's children, in order: iterations by index,
    /// a parallel's branches by name, the rest by when they started.
    /// `path` is this node's execution path (`each[0]` for an iteration).
    fn rows(
        &self,
        run: &Shown<'_>,
        shape: Shape,
        path: &str,
        lead: &str,
        options: &Options<'_>,
        rows: &mut Vec<Row>,
    ) {
        let mut children: Vec<&Node<'r>> = self.children.iter().collect();
        // A parallel's branches start together, so when each started says
        // nothing: they go by name, the same way every time.
        children.sort_by_key(|child| match child.shape {
            Shape::Iteration(index) => (index, (0, 0), String::new()),
            _ if shape == Shape::Parallel => (0, (0, 0), child.segment.clone()),
            _ => (0, child.first_started(), child.segment.clone()),
        });
        let count = children.len();
        for (i, child) in children.into_iter().enumerate() {
            let last = i + 1 == count;
            // The top level has no tree lines of its own.
            let (tree, next) = match shape {
                Shape::Root => (String::new(), String::new()),
                _ if last => (format!("{lead}└─ "), format!("{lead}   ")),
                _ => (format!("{lead}├─ "), format!("{lead}│  ")),
            };
            let child_shape = child.resolved(shape);
            let below = if child.children.is_empty() {
                format!("{next}  ")
            } else {
                format!("{next}│ ")
            };
            let child_path = match child.shape {
                Shape::Iteration(_) => format!("{path}{}", child.segment),
                _ if path.is_empty() => child.segment.clone(),
                _ => format!("{path}/{}", child.segment),
            };
            rows.push(child.row(run, child_shape, &child_path, tree, below, options));
            child.rows(run, child_shape, &child_path, &next, options, rows);
        }
    }

    fn row(
        &self,
        run: &Shown<'_>,
        shape: Shape,
        path: &str,
        tree: String,
        below: String,
        options: &Options<'_>,
    ) -> Row {
        let mut row = Row {
            tree,
            name: self.segment.clone(),
            kind: String::new(),
            status: String::new(),
            tone: Tone::Plain,
            rest: String::new(),
            below,
            details: Vec::new(),
        };
        if let Some(record) = self.record {
            step_row(&mut row, run, record, options);
            return row;
        }
        let status = self.worst();
        row.status = status.as_str().to_string();
        row.tone = step_tone(status);
        // What a group's steps so far say is not all: a gate still pending
        // in a run that failed or was cancelled waits for no one; a loop
        // the run failed at (more items than its `max`) failed whatever its
        // iterations did; a loop whose iterations so far completed, where
        // a run still running was last, goes on (or was cut short by a
        // kill: `running (interrupted)`).
        let failed_at = run.run.error.as_ref().and_then(|e| e.step.as_deref());
        let shown = match status {
            StepStatus::Pending | StepStatus::Retrying if run.run.ended_undone() => {
                Some((run.run.status.as_str(), Tone::Bad))
            }
            _ if shape == Shape::Loop && failed_at == Some(path) => Some(("failed", Tone::Bad)),
            StepStatus::Completed
                if shape == Shape::Loop
                    && run.run.status == RunStatus::Running
                    && self.holds(run.latest) =>
            {
                Some(("running", Tone::Waiting))
            }
            _ => None,
        };
        if let Some((status, tone)) = shown {
            (row.status, row.tone) = (status.to_string(), tone);
        }
        let n = self.children.len();
        let plural = |one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        (row.kind, row.rest) = match shape {
            Shape::Loop => ("loop".into(), plural("iteration", "iterations")),
            Shape::Parallel => ("parallel".into(), plural("branch", "branches")),
            Shape::Branch => ("branch".into(), String::new()),
            Shape::Fallback => ("fallback".into(), String::new()),
            Shape::Handler => ("on_error".into(), String::new()),
            _ => (String::new(), String::new()),
        };
        row
    }
}

fn step_tone(status: StepStatus) -> Tone {
    match status {
        StepStatus::Completed => Tone::Good,
        StepStatus::Failed => Tone::Bad,
        StepStatus::Pending | StepStatus::Retrying => Tone::Waiting,
    }
}

/// A step's kind as plans and the API spell it (`kb_write`).
fn kind_name(kind: StepKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A step record's row: its kind, status, active duration and attempts;
/// an approval's decision, who made it and how long it waited instead.
fn step_row(row: &mut Row, run: &Shown<'_>, record: &StepRecord, options: &Options<'_>) {
    row.kind = kind_name(record.kind);
    row.status = record.status.as_str().to_string();
    row.tone = step_tone(record.status);
    if record.kind == StepKind::Approval {
        approval_row(row, run, record, options);
    } else {
        row.rest = style::duration(record.ended_ms.saturating_sub(record.started_ms));
        if record.attempts.len() > 1 {
            row.rest
                .push_str(&format!("  {} attempts", record.attempts.len()));
        }
    }
    for (place, attempt) in record.attempts.iter().enumerate() {
        if let Some(error) = &attempt.error {
            // The last attempt's wait may be under way, or cut short by
            // the run's end (its deadline, a cancel): what was due, then.
            let last = place + 1 == record.attempts.len();
            let then = attempt
                .delay_ms
                .map(|ms| match last {
                    false => format!("  (then waited {})", style::duration(ms)),
                    true => format!("  (the next attempt due {} later)", style::duration(ms)),
                })
                .unwrap_or_default();
            row.details.push(format!(
                "attempt {}  {}{then}",
                attempt.index + 1,
                style::inert(error)
            ));
        }
    }
    if let Some(error) = &record.error
        && record.attempts.iter().all(|a| a.error.is_none())
        && record.kind != StepKind::Approval
    {
        row.details.push(options.paint.tone(
            Tone::Bad,
            &format!(
                "error  {}: {}",
                error.kind.name(),
                style::inert(&error.message)
            ),
        ));
    }
    if options.outputs
        && let Some(output) = &record.output
    {
        row.details.push(format!(
            "output {}",
            indented(output, &format!("{}       ", row.below))
        ));
    }
}

/// An approval: the decision in the status column (a rejection that lets
/// the run go on is still `rejected`, never `completed`), who decided and
/// when, how long it waited for them; a pending one, who may decide it and
/// the command that does.
fn approval_row(row: &mut Row, run: &Shown<'_>, record: &StepRecord, options: &Options<'_>) {
    let gate: Option<PendingApproval> = serde_json::from_value(record.input.clone()).ok();
    if let Some(gate) = &gate {
        row.details.extend(style::quoted(&gate.message));
    }
    // A gate of a run that failed or was cancelled meanwhile waits for no
    // one: no commands that would be refused, no wait that grows.
    if record.status == StepStatus::Pending && run.run.ended_undone() {
        (row.status, row.tone) = ("undecided".to_string(), Tone::Plain);
        row.rest = format!("the run is {}", run.run.status.as_str());
        return;
    }
    let waited = style::duration(waited_ms(record, options.now_ms));
    if record.status == StepStatus::Pending {
        row.rest = format!("waiting {waited}");
        let Some(gate) = gate else { return };
        row.details
            .push(format!("approvers: {}", gate.approvers.join(", ")));
        if let Some(expires) = &gate.expires_at {
            row.details.push(format!("expires {expires}"));
        }
        // Past its expiry it takes no decision (regression: its commands
        // were offered, and refused): resuming the run applies `on_expire`,
        // which flowd does by itself and `flow recover` does here.
        if flow_runtime::approval::gate_due_ms(record).is_some_and(|due| due <= options.now_ms) {
            (row.status, row.tone) = ("expired".to_string(), Tone::Bad);
            if let style::Via::Db(_) = options.via {
                row.details.push(
                    "`flow recover` applies what it does on expiry (`on_expire`)".to_string(),
                );
            }
            return;
        }
        let command =
            style::approve_command(&run.run.id, &record.path, &gate.approvers, options.via, 0);
        row.details.push(format!("approve: {command}"));
        row.details.push(format!("reject:  {command} --reject"));
        return;
    }
    let decision = record.output.as_ref();
    let approved = decision.and_then(|d| d["approved"].as_bool());
    let approver = decision
        .and_then(|d| d["approver"].as_str())
        .unwrap_or_default();
    let expired = record.error.as_ref().map(|e| e.kind) == Some(ErrorKind::Expired)
        || (approved == Some(false) && approver.is_empty());
    (row.status, row.tone) = match (approved, expired) {
        (_, true) => ("expired".to_string(), Tone::Bad),
        (Some(true), _) => ("approved".to_string(), Tone::Good),
        (Some(false), _) => ("rejected".to_string(), Tone::Bad),
        (None, _) => (row.status.clone(), row.tone),
    };
    row.rest = format!("waited {waited}");
    if !expired && !approver.is_empty() {
        let when = decision
            .and_then(|d| d["decided_at"].as_str())
            .map(|at| format!(" at {at}"))
            .unwrap_or_default();
        let comment = decision
            .and_then(|d| d["comment"].as_str())
            .filter(|c| !c.is_empty())
            // Written by a person, through the API: a comment with
            // escape sequences could clear the screen and forge lines.
            .map(|c| format!(": \"{}\"", style::inert(c)))
            .unwrap_or_default();
        let approver = style::inert(approver);
        row.details.push(format!("by {approver}{when}{comment}"));
    }
}
