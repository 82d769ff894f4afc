//! Driving a run on a `Store`: one invocation of a run from claim to finish.
//!
//! The interpreter knows journals; this module knows runs. It opens the run's
//! journal, counts the run's active time against the workflow's deadline
//! across invocations, records how the invocation ended, and picks up a
//! decision that arrived while the run was executing. The `flow` CLI and the
//! daemon both drive runs through it; they differ in how they report.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flow_plan::Plan;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::PendingApproval;
use crate::error::{ErrorKind, StepError};
use crate::journal::StepStatus;
use crate::journal::{Hold, Journal, Outcome, StepRecord};
use crate::services::{BoxFuture, McpClient, Provider, Services};
use crate::store::{NewRun, RunEnd, RunLog, RunRow, RunStatus, Store, StoreError};

/// Called with each step record as the run journals it (a progress display,
/// metrics). One that refuses a record (flowd's stored-bytes quota) stops
/// the run at that step with its error, the record written all the same:
/// the step has acted (a model was paid, a tool acted), and a redrive
/// must go on after it, not do it again.
pub type Observer = Arc<dyn Fn(&StepRecord) -> Result<(), StepError> + Send + Sync>;

/// How often a running run's active time is recorded, so that a crash does not
/// hand the recovered run a fresh budget.
const ACTIVE_TICK: Duration = Duration::from_secs(1);

/// A new run id: the time in milliseconds and 96 random bits, in base 36.
pub fn new_run_id() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // 96 random bits: an id names one run and says nothing of others (a
    // counter shared by every account told each tenant how many runs the
    // others started), and nobody can guess another's.
    let mut random = [0u8; 12];
    if getrandom::getrandom(&mut random).is_err() {
        // No randomness from the system: not worth refusing a run for, but
        // never a predictable id either.
        let fallback = std::collections::hash_map::RandomState::new();
        let high = std::hash::BuildHasher::hash_one(&fallback, millis);
        let low = std::hash::BuildHasher::hash_one(&fallback, high);
        random[..8].copy_from_slice(&high.to_le_bytes());
        random[8..].copy_from_slice(&low.to_le_bytes()[..4]);
    }
    let mut wide = [0u8; 16];
    wide[..12].copy_from_slice(&random);
    format!(
        "run-{}-{}",
        base36(u128::from(millis)),
        base36(u128::from_le_bytes(wide))
    )
}

fn base36(mut n: u128) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// How a run stands: what `flow run --json` prints, flowd's
/// `GET /v1/runs/{id}` answers and its webhooks post.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunRecord {
    pub run_id: String,
    pub status: RunStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// When the run was started, in milliseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<i64>,
    /// When it last changed (started, parked, resumed, ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_ms: Option<i64>,
    /// The run's input.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Option<Value>,
    /// The workflow's output, once it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub output: Option<Value>,
    /// The approvals it is parked at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_approvals: Option<Vec<PendingApproval>>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

impl RunRecord {
    /// The record of a run that has no outcome to tell (running, cancelled).
    pub fn new(run_id: &str, status: RunStatus) -> RunRecord {
        RunRecord {
            run_id: run_id.to_string(),
            status,
            workflow: None,
            created_ms: None,
            updated_ms: None,
            input: None,
            output: None,
            pending_approvals: None,
            error: None,
        }
    }
}

/// Why a run failed: the error and the execution path of the step it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunError {
    pub kind: ErrorKind,
    pub message: String,
    pub step: Option<String>,
    /// The attempts `step` made before it failed the run (absent: none, as
    /// when an expression or the workflow's timeout failed it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The record of run `run_id` once an invocation ended with `outcome`.
pub fn run_record(run_id: &str, outcome: &Outcome) -> RunRecord {
    let mut record = RunRecord::new(run_id, RunStatus::of(outcome));
    match outcome {
        Outcome::Completed { output } => record.output = Some(output.clone()),
        Outcome::Parked { pending } => record.pending_approvals = Some(pending.clone()),
        Outcome::Failed {
            error,
            step,
            attempts,
        } => {
            record.error = Some(RunError {
                kind: error.kind,
                message: error.message.clone(),
                step: step.clone(),
                attempts: *attempts,
            });
        }
    }
    record
}

impl RunRecord {
    /// The record of a stored run: how it stands, with its workflow,
    /// times and input (what flowd's `GET /v1/runs/{id}` answers).
    pub fn of_row(row: &RunRow) -> RunRecord {
        let outcome: Option<Outcome> = row
            .outcome
            .as_ref()
            .and_then(|o| serde_json::from_value(o.clone()).ok());
        let mut record = match (&outcome, row.status) {
            (
                Some(outcome),
                RunStatus::Completed | RunStatus::Failed | RunStatus::PendingApproval,
            ) => run_record(&row.id, outcome),
            _ => RunRecord::new(&row.id, row.status),
        };
        record.workflow = Some(row.workflow.clone());
        record.created_ms = Some(row.created_ms);
        record.updated_ms = Some(row.updated_ms);
        record.input = Some(row.input.clone());
        record
    }
}

/// The `test` block of a stored run (see `test_from`), unformatted: the
/// drivers lay it out with the compiler's formatter.
pub fn test_from_row(plan: &Plan, row: &RunRow, records: &[StepRecord]) -> Result<String, String> {
    let outcome: Option<Outcome> = row
        .outcome
        .as_ref()
        .and_then(|o| serde_json::from_value(o.clone()).ok());
    let output = match &outcome {
        Some(Outcome::Completed { output }) => Some(output),
        _ => None,
    };
    let failed_at = match &outcome {
        Some(Outcome::Failed { step, .. }) => step.as_deref(),
        _ => None,
    };
    crate::test_from::test_block(
        plan,
        &crate::test_from::RecordedRun {
            id: &row.id,
            workflow: &row.workflow,
            input: &row.input,
            records,
            status: row.status.as_str(),
            failed_at,
            output,
        },
    )
}

/// Why `drive` did not record how an invocation ended.
#[derive(Debug)]
pub enum DriveError {
    Store(StoreError),
    /// The run was taken over by another process (this one's lease ran out)
    /// or cancelled while this invocation ran it: nothing more of this
    /// invocation was recorded, and the run is the other process's to go on.
    Lost,
}

impl From<StoreError> for DriveError {
    fn from(error: StoreError) -> DriveError {
        match error {
            StoreError::LeaseLost => DriveError::Lost,
            error => DriveError::Store(error),
        }
    }
}

impl std::fmt::Display for DriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriveError::Store(error) => write!(f, "{error}"),
            DriveError::Lost => f.write_str(
                "the run was cancelled or taken over by another process while this one ran it; how this invocation ended is not recorded",
            ),
        }
    }
}

/// How `drive` finds its run.
#[derive(Debug, Clone)]
pub enum Invocation {
    /// A run not in the store yet, of `account`: its row is written with its
    /// first step's record, in one commit.
    Start { account: String, run: NewRun },
    /// A run of `account` that `create_run` has just stored, asked at
    /// `asked_at` (its lease counts from no earlier): nothing to read back.
    Created { account: String, asked_at: Instant },
    /// A run claimed to go on (a decision, a recovery, a redrive): its
    /// records and active time are read.
    Resume,
}

/// The real provider run `run_id` began with, when this process
/// answers with the offline one (`here` is its kind): going on here would
/// give the run's next steps made-up answers, and it would complete as if
/// they were the model's. `None` when the run may go on here, as runs begun
/// before their provider was kept may.
pub async fn missing_provider(
    store: &dyn Store,
    run_id: &str,
    here: &str,
) -> Result<Option<String>, StoreError> {
    if here != "offline" {
        return Ok(None);
    }
    let history = store.run_history(run_id).await?;
    Ok(history.into_iter().find_map(|change| match change {
        crate::store::RunChange::Began { provider, .. } if provider != "offline" => Some(provider),
        _ => None,
    }))
}

/// Runs (or resumes) `run_id`, which this process has created or claimed,
/// until it completes, fails or parks, and records how it ended. `mcp` is
/// the process's MCP pool, shared by its runs; without one a
/// browser step fails as unsupported. `steps` bounds the steps executing at
/// once (`Services::steps`); `in_flight`, when given, is the table of the
/// steps it executes now (`Services::in_flight`).
#[allow(clippy::too_many_arguments)] // reason: the services of a run; the binaries pass each from its own place
pub async fn drive(
    store: &Arc<dyn Store>,
    plan: &Plan,
    workflow: &str,
    run_id: &str,
    mut invocation: Invocation,
    input: Value,
    provider: Arc<dyn Provider>,
    mcp: Option<Arc<dyn McpClient>>,
    observer: Option<Observer>,
    steps: Option<Arc<tokio::sync::Semaphore>>,
    in_flight: Option<Arc<crate::services::StepsInFlight>>,
) -> Result<Outcome, DriveError> {
    loop {
        let durability = plan
            .workflow(workflow)
            .map_or(flow_plan::Durability::Full, |w| w.durability);
        let (log, fresh) = match std::mem::replace(&mut invocation, Invocation::Resume) {
            // A run not stored yet is held from its first write, later
            // than now.
            Invocation::Start { account, run } => (
                Arc::clone(store).fresh_journal(
                    run_id,
                    &account,
                    Some(run),
                    Instant::now(),
                    durability,
                ),
                true,
            ),
            Invocation::Created { account, asked_at } => (
                Arc::clone(store).fresh_journal(run_id, &account, None, asked_at, durability),
                true,
            ),
            Invocation::Resume => (
                Arc::clone(store).open_journal(run_id, durability).await?,
                false,
            ),
        };
        let journal: Arc<dyn Journal> = match &observer {
            Some(observer) => Arc::new(Observed {
                inner: Arc::clone(&log),
                observer: Arc::clone(observer),
            }),
            None => log.clone(),
        };
        let services = Services {
            provider: Arc::clone(&provider),
            effects: log.clone(),
            mcp: mcp.clone(),
            journal,
            steps: steps.clone(),
            in_flight: in_flight.clone(),
        };
        // The workflow's deadline counts active time across invocations
        // (since the last redrive, which gives it a new budget); a new run
        // has spent none.
        let (spent, round) = if !fresh {
            let row = store.run(run_id).await?;
            (
                row.as_ref().map_or(0, |row| row.active_ms.max(0) as u64),
                row.as_ref().map_or(0, |row| row.redrives),
            )
        } else {
            (0, 0)
        };
        let (started, stalls) = (Instant::now(), crate::stall::Mark::now());
        let beat = Arc::new(Heartbeat::default());
        // Told when a renewal is refused: the run was cancelled, redriven
        // or taken over elsewhere, and the step in flight is cut at once
        // rather than left to run to its end for nothing (an audit: a
        // model call went on for its whole timeout after `flow cancel`).
        let refused = Arc::new(tokio::sync::Notify::new());
        let mut ticker = {
            // Held weakly: the journal is dropped with the invocation (its
            // task stopped), which sends the records it holds there and
            // then, not once this task's abort is processed (a stopping
            // flowd releases its runs after their tasks are stopped).
            let (log, beat, refused) = (
                Arc::downgrade(&log),
                Arc::clone(&beat),
                Arc::clone(&refused),
            );
            AbortOnDrop(tokio::spawn(async move {
                let mut interval = tokio::time::interval(ACTIVE_TICK);
                // After a stop of the process, one tick, not the ticks
                // missed: each adds a tick of active time, and a stop is
                // none (`stall`).
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                interval.tick().await;
                loop {
                    interval.tick().await;
                    if !beat.start() {
                        return;
                    }
                    let Some(log) = log.upgrade() else {
                        return;
                    };
                    let renewed = log.heartbeat(ACTIVE_TICK).await;
                    let stopping = beat.end(matches!(renewed, Ok(true)));
                    // Refused: the run is another's now, and its journal
                    // refuses every step and write of this invocation.
                    if matches!(renewed, Ok(false)) {
                        refused.notify_one();
                        return;
                    }
                    if stopping {
                        return;
                    }
                }
            }))
        };
        let interpretation = CatchPanic(std::pin::pin!(crate::interp::run_within(
            plan,
            workflow,
            run_id,
            input.clone(),
            services,
            Duration::from_millis(spent),
            round,
        )));
        let interpreted = tokio::select! {
            interpreted = interpretation => interpreted,
            () = refused.notified() => {
                beat.stop();
                return Err(DriveError::Lost);
            }
        };
        let outcome = interpreted.unwrap_or_else(|panic| {
            tracing::error!(run = %run_id, "flow failed on this run, a bug in flow: {panic}");
            Outcome::Failed {
                error: StepError::new(
                    ErrorKind::Internal,
                    format!(
                        "flow failed on this run ({panic}): a bug in flow, not in the workflow; the steps it finished are kept, and a redrive goes on from here once flow is fixed"
                    ),
                ),
                step: None,
                attempts: 0,
            }
        });
        if beat.stop() {
            let _ = (&mut ticker.0).await;
        }
        drop(ticker);
        let recorded = ACTIVE_TICK * beat.ticks();
        // A stop of the process (SIGSTOP, a paused VM) is not active time.
        let active = started
            .elapsed()
            .saturating_sub(stalls.stalled())
            .saturating_sub(recorded);
        // The run's end shares its commit with the records that wait
        // (under `durability approval`, all of the invocation's).
        let end = RunEnd {
            status: RunStatus::of(&outcome),
            outcome: serde_json::to_value(&outcome)
                .map_err(|e| StoreError::Damaged(e.to_string()))?,
            active,
        };
        if !log.finish(end).await? {
            return Err(DriveError::Lost);
        }
        // A decision taken while this invocation was running the run (from
        // another process, which could not claim it then) is not in its
        // journal: take the run back and go on. Checked after the run is
        // recorded as parked, so that a decision is either seen here or
        // finds the run parked and continues it itself.
        if let Outcome::Parked { pending } = &outcome
            && decided_meanwhile(store, run_id, pending).await?
            && store
                .claim_run(run_id, &[RunStatus::PendingApproval, RunStatus::Running])
                .await?
        {
            continue;
        }
        return Ok(outcome);
    }
}

/// A future whose panic is caught, answered with the panic's message: a
/// bug met by one run fails that run, recorded with the steps it finished,
/// where the panic ended the task (flowd's run stayed `running`, driven by
/// nobody) or the process (`flow run`), and left the run to meet it again.
struct CatchPanic<'a, F>(std::pin::Pin<&'a mut F>);

impl<F: Future> Future for CatchPanic<'_, F> {
    type Output = Result<F::Output, String>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = self.get_mut().0.as_mut();
        // Unwind safety: after a panic the future is not polled again, and
        // what it shared (the journal, the store) keeps no state a panic
        // half-writes: their locks are taken poisoned or not.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(polled) => polled.map(Ok),
            Err(panic) => std::task::Poll::Ready(Err(panic
                .downcast_ref::<&str>()
                .map(|said| said.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string()))),
        }
    }
}

/// An invocation's heartbeat: the ticker renews the run's lease each
/// `ACTIVE_TICK` and counts the renewals, whose time the run's end leaves
/// out of its active time. It is stopped between renewals, not during
/// one: a renewal cut off after it was sent may still apply, and its time
/// would then count twice, in the renewal and in the run's end. Between
/// renewals the ticker is aborted at once; waiting for its task to see a
/// stop signal cost every invocation a millisecond of cross-thread
/// wake-ups (B3 one run after another: 2,150 -> 650 parks a second).
#[derive(Default)]
struct Heartbeat(std::sync::Mutex<Beats>);

/// A [`Heartbeat`]'s state, under a lock held for a read and a write.
#[derive(Default)]
struct Beats {
    /// The invocation has ended: no renewal is to start.
    stopped: bool,
    /// A renewal has started and its answer is not counted yet.
    in_flight: bool,
    /// Renewals answered true.
    ticks: u32,
}

impl Heartbeat {
    fn lock(&self) -> std::sync::MutexGuard<'_, Beats> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a renewal may start; it is then in flight.
    fn start(&self) -> bool {
        let mut beats = self.lock();
        beats.in_flight = !beats.stopped;
        beats.in_flight
    }

    /// The renewal is answered (`renewed`: counted); whether the
    /// invocation has ended meanwhile.
    fn end(&self, renewed: bool) -> bool {
        let mut beats = self.lock();
        beats.in_flight = false;
        beats.ticks += u32::from(renewed);
        beats.stopped
    }

    /// Stops the heartbeat; whether a renewal is in flight, which the
    /// ticker then counts before it ends. Otherwise none starts again,
    /// and the ticker can be aborted.
    fn stop(&self) -> bool {
        let mut beats = self.lock();
        beats.stopped = true;
        beats.in_flight
    }

    fn ticks(&self) -> u32 {
        self.lock().ticks
    }
}

/// Aborts the task when dropped (also when the run's own task is aborted,
/// a cancelled run): the active-time ticker never outlives its run.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn decided_meanwhile(
    store: &Arc<dyn Store>,
    run_id: &str,
    pending: &[PendingApproval],
) -> Result<bool, StoreError> {
    let records = store.step_records(run_id).await?;
    Ok(pending.iter().any(|approval| {
        records
            .iter()
            .any(|r| r.path == approval.path && r.status != StepStatus::Pending)
    }))
}

/// What a recovery found: the runs claimed for this process, each with its
/// plan, and the runs left as they were because their plan did not load.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Claimed: the caller drives each.
    pub claimed: Vec<(RunRow, Arc<Plan>)>,
    /// Not claimed, with why their plan did not load: they stay unfinished
    /// (a later recovery tries again), and the rest recover without them.
    pub unloadable: Vec<(RunRow, StoreError)>,
}

/// Claims the runs due for recovery (see `runs_to_recover`) for this
/// process, with their plans as `load` gives them: the caller drives each.
/// Runs another live process is executing are left to it.
///
/// Each run's plan is loaded before the run is claimed: a run claimed and
/// then not driven would be stranded, owned by a live process. A plan that
/// does not load (damaged, missing, refused by the caller's checks) leaves
/// its runs unclaimed and is reported in [`Recovery::unloadable`]; it does
/// not stop the recovery of other runs, which may be other accounts'. A
/// store that fails to claim a run does.
///
/// Each plan is loaded once, however many of the runs use it: a thousand
/// runs of one plan of tens of megabytes read once each held gigabytes.
///
/// Only the runs of the accounts `ours` says: `flow recover` takes its own
/// (`NO_ACCOUNT`), not those of a flowd whose store it is pointed at,
/// which `flow runs` does not list either and flowd resumes itself; a
/// flowd takes its accounts', not those a killed `flow run` left in the
/// same file for `flow recover`.
pub async fn claim_runs_to_recover<Load>(
    store: &dyn Store,
    ours: impl Fn(&str) -> bool,
    mut load: impl FnMut(String) -> Load,
) -> Result<Recovery, StoreError>
where
    Load: Future<Output = Result<Arc<Plan>, StoreError>>,
{
    let now = crate::time::now_ms();
    let mut recovery = Recovery::default();
    let mut plans: HashMap<String, Result<Arc<Plan>, StoreError>> = HashMap::new();
    for row in runs_to_recover(store, now).await? {
        if !ours(&row.account) {
            continue;
        }
        let plan = match plans.get(&row.plan_hash) {
            Some(loaded) => loaded.clone(),
            None => {
                let loaded = load(row.plan_hash.clone()).await;
                plans.insert(row.plan_hash.clone(), loaded.clone());
                loaded
            }
        };
        match plan {
            Err(error) => recovery.unloadable.push((row, error)),
            Ok(plan) => {
                if store
                    .claim_run(&row.id, &[RunStatus::Running, RunStatus::PendingApproval])
                    .await?
                {
                    recovery.claimed.push((row, plan));
                }
            }
        }
    }
    Ok(recovery)
}

/// The runs a restart resumes: those left `running`, and those parked at an
/// approval that has expired by `now_ms` (to apply its `on_expire`). Runs
/// another live process is executing are listed too; `claim_run` refuses them.
pub async fn runs_to_recover(store: &dyn Store, now_ms: u64) -> Result<Vec<RunRow>, StoreError> {
    let mut runs = store.unfinished_runs().await?;
    runs.extend(store.expired_gates(now_ms).await?);
    Ok(runs)
}

/// A run's journal that tells an observer about each record.
struct Observed {
    inner: Arc<dyn RunLog>,
    observer: Observer,
}

impl Journal for Observed {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        self.inner.lookup(path)
    }

    fn resumed(&self) -> bool {
        self.inner.resumed()
    }

    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        let refused = (self.observer)(&record).err();
        let written = self.inner.record(record);
        Box::pin(async move {
            written.await?;
            refused.map_or(Ok(()), Err)
        })
    }

    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        self.inner.admit()
    }

    fn hold(&self) -> Option<Arc<Hold>> {
        self.inner.hold()
    }
}

#[cfg(test)]
mod id_tests {
    /// Regression: ids were `run-<µs>-<pid>-<counter>`, the counter shared
    /// by every account, so each tenant saw how many runs others started.
    #[test]
    fn run_ids_carry_no_counter_and_differ_in_their_random_part() {
        let ids: Vec<String> = (0..1000).map(|_| super::new_run_id()).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        for id in &ids {
            let parts: Vec<&str> = id.split('-').collect();
            assert_eq!(parts.len(), 3, "{id}");
            assert_eq!(parts[0], "run");
            // 96 bits in base 36: about 18 characters, rarely fewer.
            assert!(parts[2].len() >= 12, "{id}");
        }
        // Two ids in a row share no long prefix of their random parts.
        let random = |id: &str| id.rsplit('-').next().unwrap().to_string();
        assert_ne!(random(&ids[0])[..6], random(&ids[1])[..6]);
    }
}

#[cfg(test)]
mod heartbeat_tests {
    use super::Heartbeat;

    /// Guards the heartbeat's stop: an invocation that ends with no
    /// renewal in flight may abort the ticker at once, and none starts
    /// after; one that ends during a renewal waits for it, and the ticker
    /// learns on its answer that it is to end, so that the renewal is
    /// counted once (in the ticks) and not again in the run's end.
    #[test]
    fn a_heartbeat_is_stopped_between_renewals_or_after_one() {
        let idle = Heartbeat::default();
        assert!(!idle.stop(), "nothing in flight: abort at once");
        assert!(!idle.start(), "no renewal starts once stopped");
        assert_eq!(idle.ticks(), 0);

        let busy = Heartbeat::default();
        assert!(busy.start());
        assert!(busy.stop(), "a renewal in flight: wait for it");
        assert!(busy.end(true), "its answer tells the ticker to end");
        assert!(!busy.start());
        assert_eq!(busy.ticks(), 1, "the renewal in flight is counted");

        let going = Heartbeat::default();
        assert!(going.start());
        assert!(!going.end(false), "not stopped: the ticker goes on");
        assert!(!going.stop(), "between renewals: abort at once");
        assert_eq!(going.ticks(), 0, "a refused or failed renewal is not");
    }
}
