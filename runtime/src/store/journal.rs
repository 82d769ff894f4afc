//! The one `RunLog` of the durable stores: what a run's journal keeps in
//! memory, when it may still act for its run, and how a refusal by the store
//! ends its hold. A store supplies only its writes (`JournalBackend`).
//!
//! Invariants:
//! * A record is looked up from memory: the records loaded when the journal
//!   opened, kept current by this invocation's own writes.
//! * Under full durability, every record is durable before the next attempt
//!   of any step of the run goes out (`Journal::admit` writes what waits and
//!   waits for its commit), and at the latest with the run's end or the next
//!   heartbeat. So one run after another costs one commit per step: a
//!   step's record shares its commit with the next step's start, or with the
//!   run's end (`RunLog::finish`), and a new run's row with its first write.
//!   A record that a wait follows (a retry's backoff) is written at once.
//! * Under `durability approval`, records wait in memory until `flush` or
//!   the run's end.
//! * Once the store says the run is no longer this invocation's
//!   (`StoreError::LeaseLost`, or a renewal that finds the run gone), the
//!   hold is lost for good: nothing more is written and no attempt starts.
//! * Where holds expire (`JournalBackend::lease`), an attempt starts without
//!   asking the store only within nine tenths of the lease since the last
//!   renewal was sent, as this process's monotonic clock counts; it runs on
//!   while the process is stopped, so a process resumed after SIGSTOP asks.
//!   A model call asks the same hold once more as its body goes out
//!   (`Journal::hold`, `fenced_body.rs`): a stop between the two is no gap.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow_plan::Durability;
use serde_json::Value;

use super::{RunLog, RunStatus, StoreError, StoreFuture, lock};
use crate::error::StepError;
use crate::journal::{Hold, Journal, StepRecord, StepStatus};
use crate::services::{BoxFuture, Effects, Handoff, KbDocument, KbWrite};

/// A run as its journal opened it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHandle {
    pub id: String,
    /// The run's account: its KB documents and notifications are this
    /// account's.
    pub account: String,
    /// The claim the journal opened in; a store whose processes share runs
    /// writes only while the run is still in it (fencing).
    pub epoch: i64,
}

/// A run that is not in the store yet: its row is written as its first
/// attempt goes out (`StoreJournal::write_before_attempt`), unawaited,
/// and SQLite's writer commits it with the first record when that comes
/// within a millisecond.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub workflow: String,
    pub plan_hash: String,
    pub input: Value,
    /// The kind of provider that answers its recipes, kept in its history
    /// as `RunChange::Began` when given.
    pub provider: Option<String>,
}

impl NewRun {
    /// The run's history as its row is stored: its `Began`, if any.
    pub fn history(&self) -> String {
        match &self.provider {
            Some(provider) => format!(
                "[{}]",
                super::RunChange::Began {
                    at_ms: crate::time::now_stored_ms(),
                    provider: provider.clone(),
                }
                .to_json()
            ),
            None => "[]".to_string(),
        }
    }
}

/// How an invocation of a run ended: written with its last records.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnd {
    pub status: RunStatus,
    pub outcome: Value,
    /// The active time this invocation used since its last heartbeat.
    pub active: Duration,
}

/// One write of a run's journal, applied whole in one transaction: the
/// run's row if it is new, its records in the order they came, and how the
/// invocation ended.
#[derive(Debug, Default)]
pub struct JournalWrite {
    pub start: Option<NewRun>,
    /// Shared with the journal's memory, which keeps each for lookups: a
    /// record is built once, not copied.
    pub records: Vec<Arc<StepRecord>>,
    pub end: Option<RunEnd>,
}

impl JournalWrite {
    fn is_empty(&self) -> bool {
        self.start.is_none() && self.records.is_empty() && self.end.is_none()
    }

    /// A new run's row alone, which no one waits for
    /// (`StoreJournal::write_before_attempt`): a store may hold it a moment
    /// for a write that someone waits for, to commit the two at once.
    pub fn start_alone(&self) -> bool {
        self.start.is_some() && self.records.is_empty() && self.end.is_none()
    }
}

/// What a store does for a run's journal. Each call applies whole or not
/// at all; `StoreError::LeaseLost` says that the run is no longer this
/// process's, and nothing was written.
pub trait JournalBackend: Send + Sync + 'static {
    /// How long this process may act for a run without asking the store
    /// again: the lease, where processes hold runs by leases (PostgreSQL);
    /// where a run is its process's while the process lives (SQLite), how
    /// long a confirmation that it still is holds (a renewal, or a write
    /// the store fenced: `writes_renew`), so that a process paused or
    /// between two steps while another took the run (a cancel, a redrive)
    /// asks before its next attempt. `None`: never ask.
    fn lease(&self) -> Option<Duration>;

    /// Whether a write the store committed confirms the hold as a renewal
    /// does: where every write is fenced by the run's owner and holds do
    /// not run out in the store (SQLite). A PostgreSQL lease runs out
    /// whatever the writes.
    fn writes_renew(&self) -> bool {
        false
    }

    /// Queues `write` when called (also if the future is never polled: a
    /// journal dropped with records in hand still sends them); the future
    /// resolves once it is durable. Writes queued together share a commit.
    /// An `end` that finds the run no longer this process's (cancelled,
    /// taken over) fails the write with `LeaseLost`.
    fn write(&self, run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()>;

    /// Adds `active` to the run's active time and renews the hold; false
    /// when the run is no longer this process's (nothing changed).
    fn renew<'a>(&'a self, run: &'a RunHandle, active: Duration) -> StoreFuture<'a, bool>;

    /// `Effects::kb_write` in the run's account.
    fn kb_write<'a>(&'a self, run: &'a RunHandle, write: &'a KbWrite) -> StoreFuture<'a, Value>;

    /// `Effects::kb_context` in the run's account.
    fn kb_context<'a>(
        &'a self,
        run: &'a RunHandle,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> StoreFuture<'a, Vec<KbDocument>>;

    /// `Effects::handoff` in the run's account.
    fn handoff<'a>(&'a self, run: &'a RunHandle, handoff: &'a Handoff) -> StoreFuture<'a, ()>;
}

/// One invocation's journal of a run, over a store's `JournalBackend`.
pub struct StoreJournal<B: JournalBackend> {
    backend: Arc<B>,
    /// Shared with each write the journal queues, rather than copied.
    run: Arc<RunHandle>,
    memory: JournalMemory,
    /// Whether this invocation may still act for the run; shared with the
    /// requests its attempts send (`Journal::hold`).
    hold: Arc<Hold>,
}

impl<B: JournalBackend> StoreJournal<B> {
    /// The journal of `run`, whose stored records are `records`, held as
    /// `hold` says ([`StoreJournal::hold_from`] for a whole lease).
    pub fn new(
        backend: Arc<B>,
        run: RunHandle,
        hold: Hold,
        records: Vec<StepRecord>,
        durability: Durability,
    ) -> StoreJournal<B> {
        StoreJournal {
            backend,
            run: Arc::new(run),
            memory: JournalMemory::new(records, durability),
            hold: Arc::new(hold),
        }
    }

    /// The hold of a run that is this process's (unless `held` is false)
    /// by a whole lease counted from no earlier than `from`: the moment the
    /// claim, create or read that found it so was asked. Not the moment
    /// its answer came: a process stopped between the two (SIGSTOP, a VM
    /// pause) would count the lease from when it continued, and send a
    /// step that another process took over and ran meanwhile (the chaos
    /// test, seed 1796625127954100555: a run's first step sent 622 ms after
    /// it completed elsewhere). A tenth is kept back for clocks that run at
    /// slightly different rates.
    pub fn hold_from(backend: &B, held: bool, from: Instant) -> Hold {
        Hold::new(held, backend.lease().map(|lease| from + lease * 9 / 10))
    }

    /// The journal of a run that this process starts: `start` is its row
    /// when the store does not have it yet (written with the first write),
    /// `None` when `create_run` stored it, asked at `held_from` (a run not
    /// stored yet is held from its first write: any instant before it
    /// will do). Nothing is read from the store.
    pub fn fresh(
        backend: Arc<B>,
        run_id: &str,
        account: &str,
        start: Option<NewRun>,
        held_from: Instant,
        durability: Durability,
    ) -> StoreJournal<B> {
        // A run starts in epoch 0; a claim starts the next.
        let run = RunHandle {
            id: run_id.to_string(),
            account: account.to_string(),
            epoch: 0,
        };
        let hold = StoreJournal::hold_from(&*backend, true, held_from);
        let journal = StoreJournal::new(backend, run, hold, Vec::new(), durability);
        lock(&journal.memory.unsent).start = start;
        journal
    }

    pub fn run(&self) -> &RunHandle {
        &self.run
    }

    fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// What the store answered, after marking the hold lost if it said so.
    fn settle<T>(&self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(answer, Err(StoreError::LeaseLost)) {
            self.hold.lose();
        }
        answer
    }

    /// Queues `write` unless the hold is lost; the answer is to `settle`.
    fn send(&self, write: JournalWrite) -> StoreFuture<'static, ()> {
        if write.is_empty() {
            return Box::pin(std::future::ready(Ok(())));
        }
        if self.is_lost() {
            return Box::pin(std::future::ready(Err(StoreError::LeaseLost)));
        }
        self.backend.write(&self.run, write)
    }

    /// Sends `write` and waits for its commit. A store waits out what may
    /// pass (SQLite's lock held by another process, PostgreSQL's lost
    /// connection) before it fails a write; a write it fails takes its
    /// records with it, which is what keeps a record the store refuses for
    /// good from failing every later write of the run, its end included.
    async fn write_waited(&self, write: JournalWrite) -> Result<(), StoreError> {
        // Records are what the store fences by owner (a run's row alone is
        // inserted if new, whoever owns it).
        let (sent, confirms) = (Instant::now(), !write.records.is_empty());
        let written = super::commit_wait::commit(self.send(write)).await;
        if written.is_ok()
            && confirms
            && self.backend.writes_renew()
            && let Some(lease) = self.backend.lease()
        {
            self.hold.renewed(sent + lease * 9 / 10);
        }
        self.settle(written)
    }

    /// Writes what waits in memory, and waits for its commit.
    async fn write_unsent(&self) -> Result<(), StoreError> {
        self.write_waited(self.memory.take_unsent()).await
    }

    /// Writes what must be in the store before an attempt goes out, and
    /// waits for its commit: under full durability, the records that wait
    /// (with the run's row if it is new). A new row alone is queued and
    /// not waited for: the call goes out as the row is committed, so that
    /// a process killed during its run's first step (a model's seconds)
    /// leaves the run for `flow recover`, not nothing, and no attempt
    /// waits for an fsync of its own. Before, the row waited for the first
    /// record: a `flow run` killed before its first step ended was lost.
    async fn write_before_attempt(&self) -> Result<(), StoreError> {
        let (write, wait) = self.memory.take_before_attempt();
        if !wait {
            // Queued; a row that failed to store goes again with the
            // next write waited for (it stays in what waits).
            drop(self.send(write));
            return Ok(());
        }
        self.write_waited(write).await
    }

    /// Writes what must be in the store before the run writes anything
    /// else (a KB document, a handoff) or renews its hold, and waits for
    /// its commit: under full durability everything that waits, under
    /// `durability approval` the run's row if it is new.
    async fn write_before_effect(&self) -> Result<(), StoreError> {
        self.write_waited(self.memory.take_before_effect()).await
    }

    async fn renew(&self, active: Duration) -> Result<bool, StoreError> {
        self.write_before_effect().await?;
        if self.is_lost() {
            return Ok(false);
        }
        let sent = Instant::now();
        let renewed = self.backend.renew(&self.run, active).await?;
        if renewed {
            if let Some(lease) = self.backend.lease() {
                self.hold.renewed(sent + lease * 9 / 10);
            }
        } else {
            self.hold.lose();
        }
        Ok(renewed)
    }
}

impl<B: JournalBackend> RunLog for StoreJournal<B> {
    fn flush(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.write_unsent())
    }

    /// Under full durability, what waits is written first: a record waits
    /// for the next attempt only while one comes soon, and a sibling branch
    /// that calls a slow model must not hold it back for long.
    fn heartbeat(&self, active: Duration) -> StoreFuture<'_, bool> {
        Box::pin(self.renew(active))
    }

    fn finish(&self, end: RunEnd) -> StoreFuture<'_, bool> {
        let mut write = self.memory.take_unsent();
        write.end = Some(end);
        Box::pin(async move {
            match self.write_waited(write).await {
                Ok(()) => Ok(true),
                Err(StoreError::LeaseLost) => Ok(false),
                Err(error) => Err(error),
            }
        })
    }
}

/// A journal dropped with records in hand (its run's task aborted: a
/// cancel, a signal) still sends them, as a store that wrote each at once
/// would have them; under `durability approval` they are dropped, as that
/// durability promises.
impl<B: JournalBackend> Drop for StoreJournal<B> {
    fn drop(&mut self) {
        drop(self.send(self.memory.take_before_effect()));
    }
}

impl<B: JournalBackend> Journal for StoreJournal<B> {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        self.memory.lookup(path)
    }

    fn resumed(&self) -> bool {
        self.memory.any()
    }

    fn hold(&self) -> Option<Arc<Hold>> {
        Some(Arc::clone(&self.hold))
    }

    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        if self.is_lost() {
            return Box::pin(std::future::ready(Err(StoreError::LeaseLost.into())));
        }
        match self.memory.remember(record) {
            Some(write) => Box::pin(async move { Ok(self.write_waited(write).await?) }),
            None => Box::pin(async { Ok(()) }),
        }
    }

    /// Writes the records that wait (full durability) and waits for their
    /// commit: no attempt goes out on an output a crash could lose. Then,
    /// without asking the store while the hold is surely live; after that
    /// (a process paused past its lease), only once a renewal succeeded.
    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        Box::pin(async move {
            self.write_before_attempt().await?;
            if self.hold.live() {
                return Ok(());
            }
            if self.is_lost() {
                return Err(StoreError::LeaseLost.into());
            }
            match self.renew(Duration::ZERO).await? {
                true => Ok(()),
                false => Err(StoreError::LeaseLost.into()),
            }
        })
    }
}

impl<B: JournalBackend> Effects for StoreJournal<B> {
    fn kb_write<'a>(&'a self, write: &'a KbWrite) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            if self.is_lost() {
                return Err(StoreError::LeaseLost.into());
            }
            let cleaned = has_nul(&[
                &write.collection,
                &write.title,
                &write.content,
                write.key.as_deref().unwrap_or(""),
                write.department.as_deref().unwrap_or(""),
            ])
            .then(|| KbWrite {
                collection: text_column(&write.collection),
                title: text_column(&write.title),
                content: text_column(&write.content),
                metadata: write.metadata.clone(),
                key: write.key.as_deref().map(text_column),
                department: write.department.as_deref().map(text_column),
            });
            let write = cleaned.as_ref().unwrap_or(write);
            self.write_before_effect().await?;
            Ok(self.settle(self.backend.kb_write(&self.run, write).await)?)
        })
    }

    fn kb_context<'a>(
        &'a self,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KbDocument>, StepError>> {
        Box::pin(async move {
            Ok(self
                .backend
                .kb_context(&self.run, ids, department, terms, limit)
                .await?)
        })
    }

    fn handoff<'a>(&'a self, handoff: &'a Handoff) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(async move {
            if self.is_lost() {
                return Err(StoreError::LeaseLost.into());
            }
            let cleaned = has_nul(&[
                &handoff.department,
                &handoff.message,
                handoff.subject.as_deref().unwrap_or(""),
                handoff.key.as_deref().unwrap_or(""),
            ])
            .then(|| Handoff {
                run_id: handoff.run_id.clone(),
                department: text_column(&handoff.department),
                message: text_column(&handoff.message),
                subject: handoff.subject.as_deref().map(text_column),
                key: handoff.key.as_deref().map(text_column),
            });
            let handoff = cleaned.as_ref().unwrap_or(handoff);
            self.write_before_effect().await?;
            Ok(self.settle(self.backend.handoff(&self.run, handoff).await)?)
        })
    }
}

/// Text as every store keeps it in a text column: PostgreSQL's cannot hold
/// U+0000, which a model's output may carry into a KB document or a
/// handoff, so it becomes U+FFFD in both stores alike rather than failing
/// the step on one of them. (JSON columns keep it, escaped.)
fn text_column(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}

/// Whether any of `texts` holds U+0000: only then is a write copied to
/// replace it (KB writes come by the thousand in a loop).
fn has_nul(texts: &[&str]) -> bool {
    texts.iter().any(|text| text.contains('\0'))
}

/// What a store's `RunLog` keeps of its run in memory: the records loaded
/// once for replay, kept current by the run's own writes, and what is still
/// to be written (see the module doc for when it is). Every store's journal
/// is this plus how it writes.
#[derive(Debug)]
struct JournalMemory {
    records: Mutex<HashSet<ByPath>>,
    unsent: Mutex<JournalWrite>,
    durability: Durability,
    /// Whether a new run's row went out alone, unawaited, as its first
    /// attempt did: it stays in `unsent` to go again with the next write
    /// waited for, which stores it if that first write failed (the stores
    /// insert it once, whichever comes second doing nothing).
    start_sent: std::sync::atomic::AtomicBool,
}

/// Records a journal's memory holds before it grows: a run of a dozen
/// steps grew its table three times, each time hashing every record again
/// (0.8 % of B1's CPU), for about 200 bytes a run that this room costs.
const FIRST_ROOM: usize = 16;

impl JournalMemory {
    /// The memory of a run whose stored records are `records`.
    fn new(records: Vec<StepRecord>, durability: Durability) -> JournalMemory {
        // The last record of a path is the one looked up, as `remember`
        // keeps it (the stores hold one row per path).
        let mut by_path = HashSet::with_capacity(records.len().max(FIRST_ROOM));
        for record in records {
            by_path.replace(ByPath(Arc::new(record)));
        }
        JournalMemory {
            records: Mutex::new(by_path),
            unsent: Mutex::new(JournalWrite::default()),
            durability,
            start_sent: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lookup(&self, path: &str) -> Option<StepRecord> {
        lock(&self.records)
            .get(path)
            .map(|record| StepRecord::clone(&record.0))
    }

    /// Whether any step was recorded (stored or in this invocation).
    fn any(&self) -> bool {
        !lock(&self.records).is_empty()
    }

    /// Remembers `record` for lookups and to be written; gives back what is
    /// to be written now. Under full durability that is when a wait follows
    /// the record (a retry's backoff), or when records of several branches
    /// came with no attempt between them: then each branch waits for its
    /// own, rather than for a sibling's next attempt. A gate's record parks
    /// its branch, so it waits (with its run's end, when the run parks).
    fn remember(&self, record: StepRecord) -> Option<JournalWrite> {
        let now = self.durability == Durability::Full
            && match record.status {
                StepStatus::Retrying => true,
                StepStatus::Pending => false,
                StepStatus::Completed | StepStatus::Failed => {
                    !lock(&self.unsent).records.is_empty()
                }
            };
        let record = Arc::new(record);
        lock(&self.records).replace(ByPath(Arc::clone(&record)));
        let mut unsent = lock(&self.unsent);
        unsent.records.push(record);
        now.then(|| std::mem::take(&mut *unsent))
    }

    /// What is to be written, taken: the run's row if not written yet, and
    /// the records in the order they came.
    fn take_unsent(&self) -> JournalWrite {
        std::mem::take(&mut *lock(&self.unsent))
    }

    /// What must be written before an attempt goes out: under full
    /// durability the records that wait, with the run's row if new.
    /// And whether the attempt waits for its commit: not for a new run's
    /// row alone (`StoreJournal::write_before_attempt`).
    fn take_before_attempt(&self) -> (JournalWrite, bool) {
        let mut unsent = lock(&self.unsent);
        match self.durability {
            Durability::Full if !unsent.records.is_empty() => (std::mem::take(&mut *unsent), true),
            _ => {
                // Sent once alone, and kept for the next write waited for.
                let first = !self
                    .start_sent
                    .swap(true, std::sync::atomic::Ordering::Relaxed);
                let start = unsent.start.clone().filter(|_| first);
                (
                    JournalWrite {
                        start,
                        ..JournalWrite::default()
                    },
                    false,
                )
            }
        }
    }

    /// What must be written before any other write of the run: everything
    /// under full durability, the run's row only under `durability
    /// approval`.
    fn take_before_effect(&self) -> JournalWrite {
        match self.durability {
            Durability::Full => self.take_unsent(),
            Durability::Approval => JournalWrite {
                start: lock(&self.unsent).start.take(),
                ..JournalWrite::default()
            },
        }
    }
}

/// A record of the journal's memory, found by its path: the set's key is
/// the record's own, not a copy of it made for every step.
#[derive(Debug)]
struct ByPath(Arc<StepRecord>);

impl Borrow<str> for ByPath {
    fn borrow(&self) -> &str {
        &self.0.path
    }
}

// Equality and hash are the path's, as `Borrow<str>` requires.
impl PartialEq for ByPath {
    fn eq(&self, other: &ByPath) -> bool {
        self.0.path == other.0.path
    }
}

impl Eq for ByPath {}

impl Hash for ByPath {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.path.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::OfflineProvider;
    use crate::services::Services;

    /// A store that keeps what each write carried, as one line each:
    /// what shares a commit is what one write carries.
    #[derive(Default)]
    struct Writes(Mutex<Vec<String>>);

    impl JournalBackend for Writes {
        fn lease(&self) -> Option<Duration> {
            None
        }

        fn write(&self, _run: &Arc<RunHandle>, write: JournalWrite) -> StoreFuture<'static, ()> {
            let mut parts = Vec::new();
            if write.start.is_some() {
                parts.push("start".to_string());
            }
            parts.extend(
                write
                    .records
                    .iter()
                    .map(|record| format!("{}:{}", record.path, record.status.as_str())),
            );
            if let Some(end) = &write.end {
                parts.push(format!("end:{}", end.status.as_str()));
            }
            lock(&self.0).push(parts.join(" "));
            Box::pin(std::future::ready(Ok(())))
        }

        fn renew<'a>(&'a self, _run: &'a RunHandle, _active: Duration) -> StoreFuture<'a, bool> {
            lock(&self.0).push("renew".to_string());
            Box::pin(std::future::ready(Ok(true)))
        }

        fn kb_write<'a>(&'a self, _: &'a RunHandle, _: &'a KbWrite) -> StoreFuture<'a, Value> {
            Box::pin(std::future::ready(Ok(Value::Null)))
        }

        fn kb_context<'a>(
            &'a self,
            _: &'a RunHandle,
            _: &'a [String],
            _: Option<&'a str>,
            _: &'a [String],
            _: usize,
        ) -> StoreFuture<'a, Vec<KbDocument>> {
            Box::pin(std::future::ready(Ok(Vec::new())))
        }

        fn handoff<'a>(&'a self, _: &'a RunHandle, _: &'a Handoff) -> StoreFuture<'a, ()> {
            Box::pin(std::future::ready(Ok(())))
        }
    }

    fn plan(source: &str) -> flow_plan::Plan {
        let checked = flow_compiler::check_source("s.flow", source);
        assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
        flow_compiler::lower(&checked).expect("lowers")
    }

    /// Runs `source`'s workflow `w` as `flow run` does and answers what
    /// each write to the store carried.
    async fn writes_of(source: &str) -> Vec<String> {
        let plan = plan(source);
        let writes = Arc::new(Writes::default());
        let start = NewRun {
            workflow: "w".to_string(),
            plan_hash: plan.hash.clone(),
            input: Value::Null,
            provider: None,
        };
        let journal = Arc::new(StoreJournal::fresh(
            Arc::clone(&writes),
            "run-1",
            "",
            Some(start),
            Instant::now(),
            Durability::Full,
        ));
        let services = Services {
            provider: Arc::new(OfflineProvider::default()),
            effects: journal.clone(),
            mcp: None,
            journal: journal.clone(),
            steps: None,
            in_flight: None,
        };
        let outcome = crate::run(&plan, "w", "run-1", serde_json::json!({}), services).await;
        let end = RunEnd {
            status: RunStatus::of(&outcome),
            outcome: Value::Null,
            active: Duration::ZERO,
        };
        assert!(journal.finish(end).await.unwrap());
        drop(journal);
        std::mem::take(&mut *lock(&writes.0))
    }

    const RECIPE: &str =
        r#"recipe r { model "m" input { q: string } output { a: string } prompt "{{input.q}}" }"#;

    /// Regression guard for issue 18's one commit per step: three steps one
    /// after another are three writes waited for, the run's end riding
    /// with the last record; the run's row goes alone as the first attempt
    /// goes out, waited for by no one (a store commits it with the first
    /// record when that comes at once: `START_ALONE_WAIT` in SQLite's
    /// writer), so that a process killed during the first step leaves the
    /// run to recover, and again with the first record, which stores it
    /// if the first write failed.
    #[tokio::test]
    async fn one_step_after_another_is_one_write_each_the_end_with_the_last() {
        let source = format!(
            "{RECIPE}\nworkflow w {{\n  step one = r {{ q: \"1\" }}\n  step two = r {{ q: step.one.a }}\n  step three = r {{ q: step.two.a }}\n}}"
        );
        assert_eq!(
            writes_of(&source).await,
            [
                "start",
                "start one:completed",
                "two:completed",
                "three:completed end:completed"
            ]
        );
    }

    /// A gate parks the run: its record (and so its notification) rides
    /// with the run's end.
    #[tokio::test]
    async fn a_gate_is_written_with_the_runs_end() {
        let source = format!(
            "{RECIPE}\nworkflow w {{\n  step one = r {{ q: \"1\" }}\n  step ok = approval {{ approvers: [\"a@x.io\"], message: \"go?\" }}\n}}"
        );
        assert_eq!(
            writes_of(&source).await,
            [
                "start",
                "start one:completed ok:pending end:pending_approval"
            ]
        );
    }

    /// Records of parallel branches with no attempt between them are
    /// written when the second comes: a branch never waits long for a
    /// sibling's next attempt to carry its record.
    #[tokio::test]
    async fn records_of_parallel_branches_do_not_wait_for_each_other() {
        let source = format!(
            "{RECIPE}\nworkflow w {{\n  parallel p {{\n    branch x {{ step a = r {{ q: \"1\" }} }}\n    branch y {{ step b = r {{ q: \"2\" }} }}\n  }}\n  step c = r {{ q: step.a.a }}\n}}"
        );
        let writes = writes_of(&source).await;
        assert_eq!(writes.len(), 4, "{writes:?}");
        assert_eq!(writes[3], "c:completed end:completed", "{writes:?}");
    }
}
