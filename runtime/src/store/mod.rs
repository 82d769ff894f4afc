//! The store interface: what the runtime and the `flow` CLI need of a durable
//! store, whatever keeps it.
//!
//! SQLite (`crate::sqlite`) is the embedded default; a PostgreSQL store
//! implements the same traits. The invariants every implementation keeps:
//!
//! * Under full durability, a step record is durable before the next
//!   attempt of any step of its run goes out (`Journal::admit`), so a
//!   dependent step never acts on an output a crash could lose; see
//!   `journal.rs` for when a record shares its commit.
//! * `decide` applies `crate::approval::decide_record` to the pending record
//!   atomically: of concurrent decisions on one gate, exactly one applies.
//! * `claim_run` gives a run to at most one live process; only the owner adds
//!   active time to it or records how it ended.

mod commit_wait;
mod journal;
pub mod json;
pub mod record;

use std::sync::Arc;
use std::time::Instant;

use flow_plan::{Durability, Plan};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{DecideError, Decision};
use crate::error::{ErrorKind, StepError};
use crate::journal::{Journal, Outcome, StepRecord};
use crate::services::{BoxFuture, Effects, KbDocument, KbWrite};

pub use commit_wait::driven_alone;
pub use journal::{JournalBackend, JournalWrite, NewRun, RunEnd, RunHandle, StoreJournal};

/// What went wrong in a store, as a value: callers decide by its kind
/// (a lost lease ends an invocation quietly, the rest are failures) and
/// render it at the edge (flowd's `store_unavailable` problem, the CLI's
/// message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The database failed or refused the request: its driver's words.
    Database(String),
    /// The store's writer (SQLite's thread, PostgreSQL's task) has stopped,
    /// so nothing more is written.
    WriterStopped,
    /// Something stored could not be read back, or a value could not be
    /// encoded for storing: what, and why.
    Damaged(String),
    /// The store holds nothing under that name (a plan's hash, a key).
    Missing(String),
    /// The run is no longer this invocation's: its lease passed to another
    /// process, or it was cancelled. Nothing of the request was written.
    LeaseLost,
    /// The store cannot be used as it was given: its URL or schema name, a
    /// database a newer flow wrote, a writer that could not start.
    Unusable(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Database(message)
            | StoreError::Damaged(message)
            | StoreError::Missing(message)
            | StoreError::Unusable(message) => f.write_str(message),
            StoreError::WriterStopped => f.write_str("the journal writer has stopped"),
            StoreError::LeaseLost => f.write_str(
                "the run is no longer this process's (its lease passed to another process, or it was cancelled)",
            ),
        }
    }
}

impl std::error::Error for StoreError {}

/// A store's failure as a step's: retried as a server error would be.
impl From<StoreError> for StepError {
    fn from(error: StoreError) -> StepError {
        StepError::new(ErrorKind::Server, format!("store: {error}"))
    }
}

/// Where a run stands. Stored as its `as_str` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Executing, or left so by a process that died (then due for recovery).
    Running,
    /// Parked at one or more approvals; holds no task or memory.
    PendingApproval,
    Completed,
    Failed,
    /// Stopped by a cancel request; it does not resume.
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::PendingApproval => "pending_approval",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Every status, in the order a run may pass through them.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Running,
        RunStatus::PendingApproval,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The status named `name`, as `as_str` writes it.
    pub fn parse(name: &str) -> Option<RunStatus> {
        RunStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == name)
    }

    /// The status a run is stored with once an invocation ends this way.
    pub fn of(outcome: &Outcome) -> RunStatus {
        match outcome {
            Outcome::Completed { .. } => RunStatus::Completed,
            Outcome::Parked { .. } => RunStatus::PendingApproval,
            Outcome::Failed { .. } => RunStatus::Failed,
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The account of runs started by the local `flow` CLI; flowd's account ids
/// are never empty.
pub const NO_ACCOUNT: &str = "";

/// A run as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: String,
    pub workflow: String,
    pub plan_hash: String,
    pub status: RunStatus,
    pub input: Value,
    pub outcome: Option<Value>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Active time used so far (not counting time parked at approvals).
    pub active_ms: i64,
    /// Whose run it is (`NO_ACCOUNT` for the local CLI's).
    pub account: String,
    /// How often it was redriven (`RunStore::redrive_run`).
    pub redrives: u32,
}

/// A workflow an account deployed: each deployment of a changed plan is a
/// new version; runs start on a version's plan and stay on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deployment {
    pub workflow: String,
    pub version: u32,
    pub plan_hash: String,
    pub created_ms: i64,
}

/// What a notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    /// A handoff step passed work to a department.
    Handoff,
    /// A run parked at an approval its audience may decide.
    Approval,
}

impl NotificationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Handoff => "handoff",
            NotificationKind::Approval => "approval",
        }
    }

    pub fn parse(name: &str) -> Option<NotificationKind> {
        [NotificationKind::Handoff, NotificationKind::Approval]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// An in-app notification of an account. Its audience is a department (a
/// handoff) or an approval's approver entry (an email or an approver group);
/// who belongs to a department or group is the daemon's configuration, so
/// membership changes apply to notifications already stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Notification {
    /// The store's row. flowd's API shows each account its own number for
    /// it, since the rows count every account's notifications.
    pub id: i64,
    pub account: String,
    pub kind: NotificationKind,
    pub audience: String,
    pub run_id: String,
    /// The approval's execution path (approval notifications).
    pub step_path: Option<String>,
    pub subject: Option<String>,
    pub message: String,
    pub created_ms: i64,
    /// Whether the reader it was listed for has marked it read.
    pub read: bool,
}

/// A notification to store; `key` makes storing it again a no-op.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNotification<'a> {
    pub account: &'a str,
    pub kind: NotificationKind,
    pub audience: &'a str,
    pub run_id: &'a str,
    pub step_path: Option<&'a str>,
    pub subject: Option<&'a str>,
    pub message: &'a str,
    pub key: Option<&'a str>,
}

/// A notification due to be mailed, with what earlier attempts did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub notification: Notification,
    /// Attempts so far that left some recipient to try again.
    pub attempts: u32,
    /// The recipients an earlier attempt already reached.
    pub sent_to: Vec<String>,
}

/// What an attempt at mailing a notification leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailNext {
    /// Nothing: it is out of the outbox, so.
    Done(MailState),
    /// Try the recipients not reached yet again at this time (ms since the
    /// epoch).
    Retry(u64),
}

/// How an outbox entry's email went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailState {
    Sent,
    /// Every attempt failed; logged and counted, never retried.
    Failed,
    /// No SMTP server is configured, or nobody to send it to.
    Skipped,
}

impl MailState {
    pub fn as_str(self) -> &'static str {
        match self {
            MailState::Sent => "sent",
            MailState::Failed => "failed",
            MailState::Skipped => "skipped",
        }
    }
}

/// Which of a reader's notifications to list (`Store::notifications`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationQuery {
    /// Only those the reader has not marked read.
    pub unread_only: bool,
    /// At most this many, newest first.
    pub limit: usize,
}

/// Which of an account's runs to list (`Store::account_runs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    pub workflow: Option<String>,
    pub status: Option<RunStatus>,
    /// At most this many, newest first.
    pub limit: usize,
    /// Only runs older than this one (its `created_ms` and id): the next
    /// page after a page that ended with it.
    pub before: Option<(i64, String)>,
}

/// One run's view of a store: the journal the interpreter replays and
/// records into, and the effects (KB writes, notifications) its steps have.
pub trait RunLog: Journal + Effects {
    /// Persists the records that wait in memory (those `durability
    /// approval` holds back, or the last of a run under full durability).
    fn flush(&self) -> StoreFuture<'_, ()>;

    /// Records how this invocation ended, with the records that wait, in
    /// one commit, and gives the run up. False when the run is no longer
    /// this invocation's (cancelled, or taken by another process): then
    /// its end is not recorded.
    fn finish(&self, end: RunEnd) -> StoreFuture<'_, bool>;

    /// Adds `active` to the run's active time and renews this invocation's
    /// hold on the run: the runner's heartbeat while the run executes.
    /// False when the run is no longer this invocation's (taken over after
    /// its lease ran out, or cancelled): nothing was changed.
    fn heartbeat(&self, active: std::time::Duration) -> StoreFuture<'_, bool>;
}

/// What a store answers: a future, so that a store over the network
/// (PostgreSQL) can wait without blocking the runtime's threads.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Everything a durable store keeps, in parts with one concern each; the
/// CLI and flowd hold an `Arc<dyn Store>`. `runtime/tests/store.rs` holds
/// every part of SQLite and PostgreSQL to the same rules.
pub trait Store:
    PlanStore + RunStore + ApprovalStore + NotificationStore + EventStore + KbStore
{
}

impl<T: PlanStore + RunStore + ApprovalStore + NotificationStore + EventStore + KbStore> Store
    for T
{
}

/// Plans by content hash, and each account's deployments of them.
///
/// Invariants: a stored plan means what it meant when first stored (its
/// hash is its content); a version number of an account's workflow is never
/// given twice, even after `undeploy`; a plan that no deployment or run
/// uses any more is deleted.
pub trait PlanStore: Send + Sync {
    /// Keeps `plan` under its hash. A stored copy whose text differs is
    /// replaced: with the same hash it is the same plan, so the stored text
    /// is damaged, or written by a flow that wrote plans otherwise; putting
    /// the plan again (a deploy of its source) is how a plan that no longer
    /// loads is mended, and its runs then go on.
    fn put_plan<'a>(&'a self, plan: &'a Plan) -> StoreFuture<'a, ()>;

    fn plan<'a>(&'a self, hash: &'a str) -> StoreFuture<'a, Plan>;

    /// Deploys `workflow` of the stored plan `plan_hash` for `account`: a new
    /// version, unless the latest version already has this plan.
    fn deploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        plan_hash: &'a str,
    ) -> StoreFuture<'a, Deployment>;

    /// The account's deployments, by workflow then version.
    fn deployments<'a>(&'a self, account: &'a str) -> StoreFuture<'a, Vec<Deployment>>;

    /// The deployment a start of `workflow` runs: `version` if one is
    /// named, else the latest; `None` when there is none. What a start
    /// reads, rather than the account's whole list, which grows with every
    /// version deployed.
    fn deployment<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, Option<Deployment>>;

    /// Retires `account`'s deployments of `workflow`, one `version` or all:
    /// new runs cannot start them, runs already started keep their plan,
    /// and a version number is never given again. A plan that nothing uses
    /// any more is deleted. How many deployments were retired.
    fn undeploy<'a>(
        &'a self,
        account: &'a str,
        workflow: &'a str,
        version: Option<u32>,
    ) -> StoreFuture<'a, usize>;
}

/// Runs: their rows, who executes them, their journals.
///
/// Invariants: `claim_run` gives a run to at most one live process; only
/// the owner adds active time to it or records how it ended (`finish_run`
/// answers false to any other); a cancelled run is ended for everyone; a
/// run is deleted only once it has ended, with its journal.
pub trait RunStore: Send + Sync {
    /// Creates run `id` of `account`, `running` and owned by this process,
    /// its history begun with `run.provider` when given. With an
    /// idempotency key that one of the account's runs already has, creates
    /// nothing and answers false (`run_by_key` finds that run).
    fn create_run<'a>(
        &'a self,
        id: &'a str,
        account: &'a str,
        run: &'a NewRun,
        idempotency_key: Option<&'a str>,
    ) -> StoreFuture<'a, bool>;

    /// The account's run started with idempotency key `key`.
    fn run_by_key<'a>(&'a self, account: &'a str, key: &'a str) -> StoreFuture<'a, Option<RunRow>>;

    /// Takes the run for this process if its status is one of `from` and no
    /// other live process is executing it; says whether it was taken.
    fn claim_run<'a>(&'a self, id: &'a str, from: &'a [RunStatus]) -> StoreFuture<'a, bool>;

    /// Records how an invocation of the run ended and the active time it used,
    /// and gives the run up. False when this process no longer owns the run
    /// (it was cancelled, or another process took it): nothing is recorded.
    fn finish_run<'a>(
        &'a self,
        id: &'a str,
        status: RunStatus,
        outcome: &'a Value,
        active: std::time::Duration,
    ) -> StoreFuture<'a, bool>;

    fn run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<RunRow>>;

    /// Run `id` if `account` owns it. Another account's run is answered as
    /// a run that does not exist, in about the same time whatever its size,
    /// so that a tenant learns nothing of others' runs by asking.
    fn account_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Option<RunRow>> {
        Box::pin(async move { Ok(self.run(id).await?.filter(|row| row.account == account)) })
    }

    /// Every run, oldest first.
    fn runs(&self) -> StoreFuture<'_, Vec<RunRow>>;

    /// The runs left `running` (executing, or left so by a process that
    /// died), oldest first.
    fn unfinished_runs(&self) -> StoreFuture<'_, Vec<RunRow>>;

    /// The runs left `running` that no live process holds: given up (no
    /// owner), or whose owner is gone (the SQLite store: its process died;
    /// PostgreSQL: its lease ran out, this process's own included, which
    /// the caller leaves alone where it drives them). Oldest first;
    /// `claim_run` takes them over. A daemon sharing its store looks for
    /// them while it serves, so that a process that died does not leave its
    /// runs until some process restarts.
    fn orphaned_runs(&self) -> StoreFuture<'_, Vec<RunRow>>;

    /// Gives up the runs this process holds `running`, once a stopping
    /// daemon stopped their tasks: the writes they queued before it are
    /// committed first, and then (where owners hold leases) the runs have
    /// no owner and `orphaned_runs` lists them to every process at once,
    /// rather than once a lease runs out, and any write sent after it is
    /// refused, as after a claim by another process. Where the owner is
    /// the process (SQLite), its exit frees them.
    fn release_runs(&self) -> StoreFuture<'_, ()>;

    /// A run's step records in the order they were recorded.
    fn step_records<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>>;

    /// Cancels a run that is running or parked: it becomes `cancelled`, has no
    /// owner, and whatever an executing process records of it afterwards is
    /// ignored (`finish_run` applies to its owner only). Says whether it was
    /// cancelled (false: unknown or already ended).
    fn cancel_run<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool>;

    /// Makes a run that failed or was cancelled `running` again, claimed by
    /// this process, for its next redrive: its outcome is cleared, its
    /// active time (the workflow's deadline) starts over, and its failed
    /// steps may be written again (`redriven`). The interpreter runs those
    /// that failed the run; the rest replays. Answers the redrive's round,
    /// or `None` (unknown, not failed or cancelled, or `MAX_REDRIVES` done).
    ///
    /// With `to_plan`, the run goes on on that plan (a newer version the
    /// caller found compatible, `flow_plan::compat`). The redrive, and the
    /// move, are kept in the run's history.
    fn redrive_run<'a>(
        &'a self,
        id: &'a str,
        to_plan: Option<&'a str>,
    ) -> StoreFuture<'a, Option<u32>>;

    /// Moves a parked run from plan `from_plan` to `to_plan` (a version the
    /// caller found compatible at each gate it waits at), keeping the move in
    /// its history. False when the run is not parked on `from_plan` (any
    /// more: it was decided, cancelled or moved meanwhile).
    fn move_run<'a>(
        &'a self,
        id: &'a str,
        from_plan: &'a str,
        to_plan: &'a str,
    ) -> StoreFuture<'a, bool>;

    /// What happened to a run besides its steps, oldest first: redrives and
    /// moves to other versions.
    fn run_history<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Vec<RunChange>>;

    /// Deletes `account`'s run `id` with its journal and its notifications,
    /// if it has ended (a cancelled run once `DELETE_AFTER_CANCEL_MS` has
    /// passed: a process cut off from the store may still be writing it).
    fn delete_run<'a>(&'a self, account: &'a str, id: &'a str) -> StoreFuture<'a, Deletion>;

    /// Deletes at most `limit` runs of any account that ended before
    /// `before_ms` (retention); how many.
    fn delete_ended_runs(&self, before_ms: i64, limit: usize) -> StoreFuture<'_, usize>;

    /// Bytes `account`'s data takes in the store: the plans it deployed,
    /// its runs with their inputs, outcomes and journals, its KB documents
    /// and notifications (indexes and other overhead not counted). It reads
    /// every row of the account: a sweep's question, not a request's.
    fn stored_bytes<'a>(&'a self, account: &'a str) -> StoreFuture<'a, u64>;

    /// The account's runs that match `query`, newest first.
    fn account_runs<'a>(
        &'a self,
        account: &'a str,
        query: &'a RunQuery,
    ) -> StoreFuture<'a, Vec<RunRow>>;

    /// Opens a run's journal, loading its records for replay. With
    /// `Durability::Approval`, records are persisted only by `RunLog::flush`.
    fn open_journal<'a>(
        self: Arc<Self>,
        run_id: &'a str,
        durability: Durability,
    ) -> StoreFuture<'a, Arc<dyn RunLog>>;

    /// The journal of a run this process starts now, read from nothing:
    /// with `start`, a run not stored yet, whose row (owned by this
    /// process) its first write carries; without, one `create_run` stored,
    /// asked at `held_from` (where a lease counts from: `StoreJournal::fresh`).
    fn fresh_journal(
        self: Arc<Self>,
        run_id: &str,
        account: &str,
        start: Option<NewRun>,
        held_from: Instant,
        durability: Durability,
    ) -> Arc<dyn RunLog>;
}

/// The gates of one account's workflow that wait for a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingGates {
    pub account: String,
    pub workflow: String,
    pub gates: u64,
}

/// Decisions on the approvals runs are parked at.
///
/// Invariant: of concurrent decisions on one gate, exactly one applies
/// (`crate::approval::decide_record`, atomically with the read of the
/// pending record).
pub trait ApprovalStore: Send + Sync {
    /// The parked runs with a gate whose expiry (`approval::gate_due_ms`) is
    /// at or before `now_ms`, oldest first.
    fn expired_gates(&self, now_ms: u64) -> StoreFuture<'_, Vec<RunRow>>;

    /// Decides the approval pending at `path` of run `run_id`, exactly once
    /// (`crate::approval::decide_record` says when a decision applies). The
    /// inner error is a refusal by those rules; the outer one, the store's.
    ///
    /// A parked run becomes this process's in the same commit (`running`;
    /// on PostgreSQL under a lease): the decider claims it next
    /// (`claim_run` from `Running`), and if it dies first the run is an
    /// orphan that recovery and the sweeps take, where a run left parked at
    /// a decided gate was found by nothing. A run a live process executes
    /// is left to it: the decision is picked up when it parks.
    fn decide<'a>(
        &'a self,
        run_id: &'a str,
        path: &'a str,
        decision: &'a Decision,
    ) -> StoreFuture<'a, Result<(), DecideError>>;

    /// How many gates of parked runs wait for a decision, by account and
    /// workflow.
    fn pending_approvals(&self) -> StoreFuture<'_, Vec<PendingGates>>;
}

/// Notifications (handoffs, approval requests): the inbox people read, and
/// the outbox flowd mails from.
///
/// Invariants: a notification with a key is stored once; an outbox entry
/// is handed to one mailer at a time, and offered again if that mailer
/// dies before it records the attempt.
pub trait NotificationStore: Send + Sync {
    /// Stores a notification (a no-op when its key is already stored); says
    /// whether it was new.
    fn notify<'a>(&'a self, notification: &'a NewNotification<'a>) -> StoreFuture<'a, bool>;

    /// The account's notifications addressed to any of `audiences`, newest
    /// first, each saying whether `reader` has read it.
    fn notifications<'a>(
        &'a self,
        account: &'a str,
        audiences: &'a [String],
        reader: &'a str,
        query: &'a NotificationQuery,
    ) -> StoreFuture<'a, Vec<Notification>>;

    /// The account's notifications to any audience, newest first, at most
    /// `limit`: the view of the local `flow` CLI, whose one user is every
    /// department and approver of its store (it has no people to resolve
    /// audiences with). `read` is false, since no reader is named.
    fn account_notifications<'a>(
        &'a self,
        account: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Notification>>;

    /// Marks the account's notifications `ids` read by `reader`; answers how
    /// many of them exist in the account.
    fn mark_read<'a>(
        &'a self,
        account: &'a str,
        reader: &'a str,
        ids: &'a [i64],
    ) -> StoreFuture<'a, usize>;

    /// Notifications due to be mailed by `now_ms` (the daemon's outbox),
    /// in the order to mail them: each account's oldest first, taken in
    /// turn from the accounts, so that one account's thousands of parked
    /// runs do not hold every other account's approvers waiting behind
    /// their emails. Its cost is the accounts and what it answers, not the
    /// backlog of due notifications, nor with those waiting for a retry
    /// (each account's range of what is due is found by a seek).
    fn to_mail(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, Vec<Outgoing>>;

    /// Records an attempt at mailing notification `id`: the recipients it
    /// reached, and what is left to do.
    fn mailed<'a>(&'a self, id: i64, reached: &'a [String], next: MailNext) -> StoreFuture<'a, ()>;
}

/// The outbox of run events (`completed`, `failed`, `parked`, `cancelled`)
/// that flowd posts to its accounts' webhooks.
///
/// Invariants: an event is kept in the same transaction as the change of
/// the run's status it reports, so no crash loses one, and only for the
/// accounts `keep_events_of` names (of an account kept for `Deliveries`, only
/// for the runs of plans with destinations); an event is handed to one deliverer at
/// a time (`due_events` claims it for `EVENT_CLAIM`), and offered again
/// when that deliverer dies before it records its attempt; its id never
/// changes, so every retry carries the same message id.
pub trait EventStore: Send + Sync {
    /// Keeps the events of `accounts` from now on (and of no other account),
    /// each of the runs `EventsOf` says. flowd calls it as it starts; the
    /// SQLite store then also releases the claims of a deliverer that died,
    /// since one flowd delivers from one file (PostgreSQL's expire, as
    /// processes share it).
    fn keep_events_of<'a>(&'a self, accounts: &'a [(String, EventsOf)]) -> StoreFuture<'a, ()>;

    /// At most `due.limit` events due by `due.now_ms`, each claimed for
    /// `EVENT_CLAIM`, and at most `due.per_account` of one account in
    /// flight, counting those `due.in_flight` says the deliverer holds:
    /// within an account in the order they came due (a retried event
    /// behind those due before it), and taken in turn from the accounts
    /// with the fewest in flight. So an account whose endpoints hang holds
    /// a bounded share of the deliverer, and another account's events
    /// still go out first when it has fewer in flight. Answered by id. Its
    /// cost is the accounts and what it answers, not the outbox's backlog:
    /// the deliverer asks after every attempt.
    fn due_events<'a>(&'a self, due: &'a DueEvents<'a>) -> StoreFuture<'a, Vec<RunEvent>>;

    /// Records an attempt at delivering event `id`: the endpoints it
    /// reached, and what is left to do (`Done` removes it).
    fn event_attempted<'a>(
        &'a self,
        id: i64,
        reached: &'a [String],
        next: EventNext,
    ) -> StoreFuture<'a, ()>;

    /// Adds an attempt at one of run `run_id`'s destinations to its
    /// history (a `RunChange::Delivery`), where its trace shows it.
    fn note_delivery<'a>(&'a self, run_id: &'a str, change: &'a RunChange) -> StoreFuture<'a, ()>;
}

/// Which due events a deliverer asks for (`EventStore::due_events`).
#[derive(Debug, Clone, Copy)]
pub struct DueEvents<'a> {
    /// Due by this time (milliseconds since the epoch).
    pub now_ms: u64,
    /// At most this many in all.
    pub limit: usize,
    /// At most this many of one account's events in flight at once,
    /// those in `in_flight` included.
    pub per_account: usize,
    /// The deliverer's attempts in flight, by account.
    pub in_flight: &'a [(String, usize)],
}

impl DueEvents<'_> {
    /// Up to `limit` events due by `now_ms`, with nothing in flight and no
    /// bound per account.
    pub fn any(now_ms: u64, limit: usize) -> DueEvents<'static> {
        DueEvents {
            now_ms,
            limit,
            per_account: usize::MAX,
            in_flight: &[],
        }
    }

    /// `per_account`, as a bound a database compares with.
    pub fn per_account_bound(&self) -> i64 {
        sql_limit(self.per_account)
    }
}

/// Which of an account's runs the outbox keeps events of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsOf {
    /// Every run's: the account has webhook endpoints.
    EveryRun,
    /// Only those of runs whose plan has destinations (`deliver`): no
    /// endpoint would take the others'. Keeping an event costs its insert,
    /// claim and delete in the store, on every run's end.
    Deliveries,
}

/// How long a deliverer holds the events `due_events` gave it before they
/// are offered again: longer than an attempt at an account's endpoints
/// takes (10 s each at most), and short, since it is also how long the
/// events a killed flowd held wait for another. An event offered again
/// while its first attempt still runs is delivered twice, under one
/// message id, which receivers take once.
pub const EVENT_CLAIM: std::time::Duration = std::time::Duration::from_secs(30);

/// A run event waiting in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    pub id: i64,
    pub account: String,
    pub run_id: String,
    pub workflow: String,
    /// `completed`, `failed`, `parked` or `cancelled`.
    pub event: String,
    /// The run's outcome as it was stored with the change (none for a run
    /// cancelled before it recorded one).
    pub outcome: Option<Value>,
    /// When the run's status changed, in milliseconds since the epoch.
    pub created_ms: i64,
    /// Attempts so far that left some endpoint to try again.
    pub attempts: u32,
    /// The endpoints (by name) an earlier attempt already reached.
    pub reached: Vec<String>,
}

/// What an attempt at delivering an event leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventNext {
    /// Nothing (delivered everywhere, or given up): out of the outbox.
    Done,
    /// Try the endpoints not reached yet again at this time (ms since the
    /// epoch).
    Retry(u64),
}

/// Which of an account's KB documents to list (`KbStore::kb_documents`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KbQuery {
    /// Only this collection's.
    pub collection: Option<String>,
    /// Only those that contain any of these words (`crate::kb::search_terms`),
    /// ranked by the store's full-text index; with none, every document by
    /// collection and title.
    pub terms: Vec<String>,
    /// At most this many.
    pub limit: usize,
}

/// Each account's knowledge-base documents (written by runs through their
/// journal's `Effects`), as people browse them.
pub trait KbStore: Send + Sync {
    /// `account`'s documents that match `query`: the latest version of each.
    fn kb_documents<'a>(
        &'a self,
        account: &'a str,
        query: &'a KbQuery,
    ) -> StoreFuture<'a, Vec<KbDocument>>;

    /// `account`'s document `title` of `collection`, its latest version.
    fn kb_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, Option<KbDocument>>;

    /// Writes `write`'s document of `account` outside any run's journal (a
    /// destination's delivery), once per idempotency key as `kb_write`
    /// does: its id and version.
    fn write_document<'a>(&'a self, account: &'a str, write: &'a KbWrite)
    -> StoreFuture<'a, Value>;

    /// Deletes `account`'s KB document; whether there was one.
    fn delete_document<'a>(
        &'a self,
        account: &'a str,
        collection: &'a str,
        title: &'a str,
    ) -> StoreFuture<'a, bool>;
}

/// What `Store::delete_run` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    /// The run has not ended (or was cancelled too recently): nothing deleted.
    NotEnded(RunStatus),
    /// No such run of the account.
    Unknown,
}

/// How long a cancelled run is kept before it may be deleted: longer than a
/// lease, after which no other process still writes it.
pub const DELETE_AFTER_CANCEL_MS: i64 = 30_000;

/// How often one run may be redriven: a run that keeps failing is a bug or
/// an outage to look at, not one to retry for ever.
pub const MAX_REDRIVES: u32 = 10;

/// Something that happened to a run besides its steps: its trace shows it
/// among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunChange {
    /// Started, its recipes answered by `provider` (`offline`, `openai`,
    /// `anthropic`): a resumption by a process answering with another kind
    /// is told apart (`flow recover` without a provider configured would
    /// have finished a real model's run with the offline provider's
    /// made-up answers).
    Began { at_ms: i64, provider: String },
    /// Cancelled (`cancel_run`). Kept because a redrive overwrites the
    /// status: without it, a cancelled run redriven read as one that
    /// failed.
    Cancelled { at_ms: i64 },
    /// Redriven (`redrive_run`): its `round`.
    Redriven { at_ms: i64, round: u32 },
    /// Moved to another plan (another version of its workflow).
    Moved {
        at_ms: i64,
        from_plan: String,
        to_plan: String,
    },
    /// An attempt at delivering the run's result to one of its workflow's
    /// destinations (`deliver`), after the run's status changed.
    Delivery {
        at_ms: i64,
        /// The delivery's id, the same on every attempt
        /// (`destination::delivery_id`).
        id: String,
        /// The destination's index in the workflow's plan.
        destination: u32,
        /// `webhook`, `email` or `kb`.
        to: String,
        /// The run event delivered: `completed`, `failed`, `cancelled`, `parked`.
        event: String,
        /// `delivered`, `failed` (tried again later) or `given_up`.
        result: String,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl RunChange {
    /// As stored: one element of the run's `history` JSON array.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "null".to_string())
    }

    /// A stored or served history, each change that reads: one of a kind
    /// this version does not know (written by a later flowd sharing the
    /// store, or served by one) is left out, not the whole history.
    pub fn list(history: &serde_json::Value) -> Vec<RunChange> {
        history
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|change| RunChange::deserialize(change).ok())
            .collect()
    }

    /// [`RunChange::list`] of a history as stored, as JSON text.
    pub fn list_from_text(history: &str) -> Vec<RunChange> {
        serde_json::from_str(history)
            .map_or_else(|_| Vec::new(), |history| RunChange::list(&history))
    }
}

/// How long a store's journal writer waits for its database to take a
/// batch before it fails the batch (and each run with a record in it):
/// SQLite's lock held by another process, PostgreSQL's connection lost.
/// Past it, a database gone for good stops the runs with the cause rather
/// than leaving every run waiting unseen.
pub(crate) const LONGEST_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Why `redrive_run` refused a run, told from its row read after the
/// refusal: another process may have redriven it meanwhile (regression:
/// the row read before said it had been redriven 0 times, the most it
/// may be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveRefused {
    /// It did not fail and was not cancelled.
    NotRedrivable { run: String, status: RunStatus },
    /// It was redriven `MAX_REDRIVES` times.
    Exhausted { run: String, redrives: u32 },
    /// It could be redriven, but changed as it was: another redrive, run
    /// to its failure meanwhile.
    Changed { run: String },
}

impl RedriveRefused {
    pub fn of(row: &RunRow) -> RedriveRefused {
        let run = row.id.clone();
        match row.status {
            RunStatus::Failed | RunStatus::Cancelled if row.redrives >= MAX_REDRIVES => {
                RedriveRefused::Exhausted {
                    run,
                    redrives: row.redrives,
                }
            }
            RunStatus::Failed | RunStatus::Cancelled => RedriveRefused::Changed { run },
            status => RedriveRefused::NotRedrivable { run, status },
        }
    }

    /// Its code in flowd's problem answers.
    pub fn code(&self) -> &'static str {
        match self {
            RedriveRefused::NotRedrivable { .. } | RedriveRefused::Changed { .. } => {
                "not_redrivable"
            }
            RedriveRefused::Exhausted { .. } => "redrives_exhausted",
        }
    }
}

impl std::fmt::Display for RedriveRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedriveRefused::NotRedrivable { run, status } => write!(
                f,
                "run `{run}` is {status}: only a failed or cancelled run is redriven"
            ),
            RedriveRefused::Exhausted { run, redrives } => write!(
                f,
                "run `{run}` was redriven {redrives} times, the most a run may be; start a new run"
            ),
            RedriveRefused::Changed { run } => write!(
                f,
                "run `{run}` changed as it was redriven (another redrive took it meanwhile); see how it stands now, and redrive it again if it failed again"
            ),
        }
    }
}

impl RunStatus {
    /// Whether a run with this status will never change again (but by a
    /// cancel's stragglers, see `DELETE_AFTER_CANCEL_MS`).
    pub fn has_ended(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// The key of the notification that asks `approver` to decide the gate
/// `record` holds pending (a store keeps one notification a key): writing
/// the record again asks no one again, and a redrive that asks the gate
/// again (its record's `round`) asks everyone again.
pub(crate) fn gate_notification_key(run_id: &str, record: &StepRecord, approver: &str) -> String {
    match record.round {
        0 => format!("approval:{run_id}:{}:{approver}", record.path),
        round => format!("approval:{run_id}:{}:{approver}:{round}", record.path),
    }
}

/// A count as SQL's `LIMIT` takes it: past `i64::MAX` (`usize::MAX`, for
/// "all") is as good as no limit, where a cast would make it negative, which
/// PostgreSQL refuses.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Milliseconds since the epoch as both stores keep them: past `i64::MAX`
/// (`u64::MAX`, for "whenever") is as late as they go, where a cast would
/// make it -1, before every time kept.
pub(crate) fn sql_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The SQL condition of a listing of runs by `status`, the same text in
/// both stores. The status is written into the statement, not bound: the
/// statuses are a handful of fixed words, and a plan made for any of them
/// (`$3 IS NULL OR status = $3`) cannot tell that a few runs are running
/// among a million completed, so it walked them all rather than reading
/// the index on status, account and time.
pub(crate) fn status_condition(status: Option<RunStatus>) -> String {
    match status {
        Some(status) => format!("status = '{}'", status.as_str()),
        None => "TRUE".to_string(),
    }
}

pub(crate) use flow_engine::sync::lock;

#[cfg(test)]
mod tests {
    use super::{MAX_REDRIVES, RedriveRefused, RunChange, RunRow, RunStatus};

    /// A refused redrive says why from the run as it is after the
    /// refusal. Regression: two redrives at once, the second was told the
    /// run "was redriven 0 times, the most a run may be".
    #[test]
    fn a_refused_redrive_says_why_from_the_run_as_it_is() {
        let row = |status, redrives| RunRow {
            id: "r1".into(),
            workflow: "w".into(),
            plan_hash: "h".into(),
            status,
            input: serde_json::Value::Null,
            outcome: None,
            created_ms: 0,
            updated_ms: 0,
            active_ms: 0,
            account: String::new(),
            redrives,
        };
        let why = |status, redrives| {
            let refused = RedriveRefused::of(&row(status, redrives));
            (refused.code(), refused.to_string())
        };
        assert_eq!(
            why(RunStatus::Running, 1),
            (
                "not_redrivable",
                "run `r1` is running: only a failed or cancelled run is redriven".into()
            )
        );
        assert_eq!(
            why(RunStatus::Failed, MAX_REDRIVES),
            (
                "redrives_exhausted",
                "run `r1` was redriven 10 times, the most a run may be; start a new run".into()
            )
        );
        let (code, message) = why(RunStatus::Failed, 1);
        assert_eq!(code, "not_redrivable");
        assert!(message.contains("another redrive took it"), "{message}");
    }

    /// A change of a kind a later version writes (a flowd sharing the
    /// store, or answering `flow show`) leaves the rest of the history
    /// read: one unknown element lost all of it.
    #[test]
    fn a_history_keeps_what_it_can_read() {
        let history = RunChange::list_from_text(
            r#"[{"kind":"cancelled","at_ms":1},{"kind":"paused_by_a_later_version","at_ms":2},{"kind":"redriven","at_ms":3,"round":1}]"#,
        );
        assert_eq!(
            history,
            [
                RunChange::Cancelled { at_ms: 1 },
                RunChange::Redriven { at_ms: 3, round: 1 }
            ]
        );
        assert!(RunChange::list_from_text("not json").is_empty());
    }
}
