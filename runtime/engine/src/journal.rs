//! What a run leaves behind: one record per step execution, under its
//! execution path, and the run's outcome. The `Journal` trait is where the
//! interpreter writes records and where a replay finds them; the stores
//! implement it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flow_plan::StepKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::PendingApproval;
use crate::error::StepError;
use crate::services::BoxFuture;
use crate::sync::lock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Completed,
    Failed,
    /// An approval waiting for a decision.
    Pending,
    /// A step between two attempts: the attempts it made so far, journaled
    /// before the wait, so that a crash does not give it a fresh budget. A
    /// replay resumes it after its last attempt.
    Retrying,
}

impl StepStatus {
    /// The status as the stores keep it and the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Completed => "completed",
            StepStatus::Failed => "failed",
            StepStatus::Pending => "pending",
            StepStatus::Retrying => "retrying",
        }
    }

    /// Whether a later record of the same step replaces this one: an
    /// approval's record when it is decided or expires, a retrying step's
    /// when it makes its next attempt or ends. Completed and failed records
    /// are final.
    pub fn is_replaceable(self) -> bool {
        matches!(self, StepStatus::Pending | StepStatus::Retrying)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub index: u32,
    pub error: Option<String>,
    /// The wait before the next attempt.
    pub delay_ms: Option<u64>,
    /// The redrive it was made in (0: the run's first drive). A redriven
    /// step gets its retry budget anew; its earlier attempts stay.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u32,
    /// A repair request: the model shown the attempt before's answer that
    /// did not fit, and asked again. It counts in the retry budget, but is
    /// made past it when the last attempt's answer did not fit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
    /// When the attempt's call went out and when its answer (or error)
    /// came, in milliseconds since the Unix epoch: what a timeline draws.
    /// Absent in records written before attempts were timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// The workflow's deadline ended this attempt, or the wait after it:
    /// the step's `on_error` never saw the failure, so a redrive runs the
    /// step again whatever its policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_short: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One step execution: the journal's unit and the trace tree's node. The
/// interpreter's own: the stores keep it in a format of theirs
/// (`flow_runtime::store::record`), flowd answers it as a type of its own
/// (`trace_step.rs`); its serde shape is `flow trace --json`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub path: String,
    pub step_id: String,
    pub kind: StepKind,
    pub status: StepStatus,
    pub input: Value,
    /// Shared with the scope the step's output is read from: the two would
    /// otherwise each hold a copy, built and freed once per step.
    pub output: Option<Arc<Value>>,
    pub error: Option<StepError>,
    pub attempts: Vec<Attempt>,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// The redrive it was written in (0: the run's first drive): a failed
    /// step of an earlier one runs again in a redrive.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u32,
}

impl StepRecord {
    /// The attempts made in the record's drive: a redrive gives a failed
    /// step its retries anew, and its earlier attempts stay in the record.
    pub fn attempts_made(&self) -> u32 {
        let made = self.attempts.iter().filter(|a| a.round == self.round);
        made.count() as u32
    }
}

/// Which way a run went where it could go more than one, as the
/// interpreter tells its journal (`Journal::went`): for branch coverage
/// (`flowc test`), which cannot read an arm or an iteration that ran no
/// step from the records. The stores keep none of it: what a replay needs
/// is in the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way<'a> {
    /// A block was entered whose steps' paths start with `at`: the
    /// workflow's (`""`), a loop's iteration, a parallel branch, a step's
    /// fallback, the workflow's `on_error` handler.
    Entered { at: &'a str },
    /// Condition `id`, in the block entered at `at`, took arm `arm`: its
    /// branches in order, then its `else` (or, without one, no branch) as
    /// the number of its branches.
    Arm {
        at: &'a str,
        id: &'a str,
        arm: usize,
    },
    /// Loop `id`, in the block entered at `at`, went over `items` items.
    Loop {
        at: &'a str,
        id: &'a str,
        items: usize,
    },
}

/// Where step records go, and where a replay finds them.
pub trait Journal: Send + Sync {
    fn lookup(&self, path: &str) -> Option<StepRecord>;
    /// Whether the run has recorded any step: a resumed invocation, not a
    /// first one.
    fn resumed(&self) -> bool;
    /// Durable, in the stores that promise it, before the next `admit`
    /// of the run resolves or the run ends; a record that a wait follows
    /// (`Retrying`) before the future resolves.
    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>>;
    /// Whether this invocation may still act for the run: asked before each
    /// attempt of a step goes out. A store whose processes hold runs by
    /// leases answers an error once the lease passed to another process, so
    /// that a process paused past its lease does not repeat the new owner's
    /// work (see `flow_runtime::postgres`).
    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// The invocation's hold on the run, where it can be lost: a request
    /// that leaves the process (a model call) asks it once more as its body
    /// goes out, since `admit` may be milliseconds old by then and a process
    /// stopped in between (SIGSTOP) must not send a step another process
    /// has run meanwhile. `None` where the run cannot pass to another.
    fn hold(&self) -> Option<Arc<Hold>> {
        None
    }
    /// The run went `way` (see [`Way`]); only a test's journal keeps it.
    fn went(&self, _way: Way<'_>) {}
}

/// Whether an invocation may still act for its run, as its journal last
/// learnt: lost for good once the store said so, and live without asking
/// the store only until a time on this process's monotonic clock (which
/// runs on while the process is stopped).
#[derive(Debug)]
pub struct Hold {
    lost: AtomicBool,
    live_until: Mutex<Option<Instant>>,
}

impl Hold {
    /// A hold that is live until `live_until` (`None`: while not lost), or
    /// lost already unless `held`.
    pub fn new(held: bool, live_until: Option<Instant>) -> Hold {
        Hold {
            lost: AtomicBool::new(!held),
            live_until: Mutex::new(live_until),
        }
    }

    /// Whether an action may go out now without asking the store.
    pub fn live(&self) -> bool {
        !self.is_lost() && self.live_until().is_none_or(|until| Instant::now() < until)
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The store said that the run is no longer this invocation's.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Until when the hold is live without asking (`None`: it does not
    /// expire).
    pub fn live_until(&self) -> Option<Instant> {
        *lock(&self.live_until)
    }

    /// A renewal extended the hold to `until`, unless a later one said
    /// longer already (a write that waited long answers after the heartbeat
    /// sent since).
    pub fn renewed(&self, until: Instant) {
        let mut live_until = lock(&self.live_until);
        *live_until = Some(live_until.map_or(until, |known| known.max(until)));
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Completed {
        output: Value,
    },
    Parked {
        pending: Vec<PendingApproval>,
    },
    Failed {
        error: StepError,
        step: Option<String>,
        /// The attempts the step made, its retries used up, before its error
        /// failed the run; 0 when the run failed outside a step's attempts
        /// (an expression, a preflight, the workflow's timeout).
        #[serde(default, skip_serializing_if = "is_zero")]
        attempts: u32,
    },
}

/// Where a run failed, as its messages say it before the error:
/// " at `scan[2]/page` after 3 attempts", " at `classify`" or nothing.
pub fn failed_at(step: Option<&str>, attempts: u32) -> String {
    match (step, attempts) {
        (None, _) => String::new(),
        (Some(step), 0 | 1) => format!(" at `{step}`"),
        (Some(step), attempts) => format!(" at `{step}` after {attempts} attempts"),
    }
}
