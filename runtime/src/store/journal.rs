//! The one `RunLog` of the durable stores: what a run's journal keeps in
//! memory, when it may still act for its run, and how a refusal by the store
//! ends its hold. A store supplies only its writes (`JournalBackend`).
//!
//! Invariants:
//! * A record is looked up from memory: the records loaded when the journal
//!   opened, kept current by this invocation's own writes.
//! * Under `durability approval`, records wait in memory until `flush`.
//! * Once the store says the run is no longer this invocation's
//!   (`StoreError::LeaseLost`, or a renewal that finds the run gone), the
//!   hold is lost for good: nothing more is written and no attempt starts.
//! * Where holds expire (`JournalBackend::lease`), an attempt starts without
//!   asking the store only within nine tenths of the lease since the last
//!   renewal was sent, as this process's monotonic clock counts; it runs on
//!   while the process is stopped, so a process resumed after SIGSTOP asks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow_plan::Durability;
use serde_json::Value;

use super::{RunLog, StoreError, StoreFuture, lock};
use crate::error::StepError;
use crate::journal::{Journal, StepRecord};
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

/// What a store does for a run's journal. Each call applies whole or not
/// at all; `StoreError::LeaseLost` says that the run is no longer this
/// process's, and nothing was written.
pub trait JournalBackend: Send + Sync + 'static {
    /// How long a hold on a run lasts without renewal, where processes
    /// share the store; `None` where a run is its process's while the
    /// process lives.
    fn lease(&self) -> Option<Duration>;

    /// Writes `record` now, durably before the future resolves; records
    /// queued together share a commit.
    fn append(&self, run: &RunHandle, record: StepRecord) -> StoreFuture<'static, ()>;

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
    run: RunHandle,
    memory: JournalMemory,
    /// Until when an attempt may start without asking the store (holds
    /// that expire only).
    live_until: Mutex<Option<Instant>>,
    lost: AtomicBool,
}

impl<B: JournalBackend> StoreJournal<B> {
    /// The journal of `run`, whose stored records are `records`. `held`
    /// says whether the run was this process's when they were read, and
    /// `read_at` when that was asked.
    pub fn new(
        backend: Arc<B>,
        run: RunHandle,
        held: bool,
        read_at: Instant,
        records: Vec<StepRecord>,
        durability: Durability,
    ) -> StoreJournal<B> {
        let live_until = backend.lease().map(|lease| read_at + lease * 9 / 10);
        StoreJournal {
            backend,
            run,
            memory: JournalMemory::new(records, durability),
            live_until: Mutex::new(live_until),
            lost: AtomicBool::new(!held),
        }
    }

    pub fn run(&self) -> &RunHandle {
        &self.run
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// What the store answered, after marking the hold lost if it said so.
    fn settle<T>(&self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(answer, Err(StoreError::LeaseLost)) {
            self.lost.store(true, Ordering::SeqCst);
        }
        answer
    }

    /// Queues `record` unless the hold is lost; the answer is to `settle`.
    fn append(&self, record: StepRecord) -> StoreFuture<'static, ()> {
        if self.is_lost() {
            return Box::pin(std::future::ready(Err(StoreError::LeaseLost)));
        }
        self.backend.append(&self.run, record)
    }

    async fn renew(&self, active: Duration) -> Result<bool, StoreError> {
        if self.is_lost() {
            return Ok(false);
        }
        let sent = Instant::now();
        let renewed = self.backend.renew(&self.run, active).await?;
        if renewed {
            if let Some(lease) = self.backend.lease() {
                *lock(&self.live_until) = Some(sent + lease * 9 / 10);
            }
        } else {
            self.lost.store(true, Ordering::SeqCst);
        }
        Ok(renewed)
    }
}

impl<B: JournalBackend> RunLog for StoreJournal<B> {
    fn flush(&self) -> StoreFuture<'_, ()> {
        // Queued together, the held-back records share one commit.
        let writes: Vec<_> = self
            .memory
            .take_deferred()
            .into_iter()
            .map(|record| self.append(record))
            .collect();
        Box::pin(async move {
            for write in writes {
                self.settle(write.await)?;
            }
            Ok(())
        })
    }

    fn heartbeat(&self, active: Duration) -> StoreFuture<'_, bool> {
        Box::pin(self.renew(active))
    }
}

impl<B: JournalBackend> Journal for StoreJournal<B> {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        self.memory.lookup(path)
    }

    fn resumed(&self) -> bool {
        self.memory.any()
    }

    fn record<'a>(&'a self, record: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        match self.memory.remember(record) {
            Some(record) => {
                let written = self.append(record);
                Box::pin(async move { Ok(self.settle(written.await)?) })
            }
            None => Box::pin(async { Ok(()) }),
        }
    }

    /// Without asking the store while the hold is surely live; after that
    /// (a process paused past its lease), only once a renewal succeeded.
    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        Box::pin(async move {
            if self.is_lost() {
                return Err(StoreError::LeaseLost.into());
            }
            match *lock(&self.live_until) {
                None => return Ok(()),
                Some(until) if Instant::now() < until => return Ok(()),
                Some(_) => {}
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
/// once for replay, kept current by the run's own writes, and under
/// `durability approval` the records that wait for `RunLog::flush`. Every
/// store's journal is this plus how it writes.
#[derive(Debug)]
struct JournalMemory {
    records: Mutex<HashMap<String, StepRecord>>,
    deferred: Option<Mutex<Vec<StepRecord>>>,
}

impl JournalMemory {
    /// The memory of a run whose stored records are `records`.
    fn new(records: Vec<StepRecord>, durability: Durability) -> JournalMemory {
        JournalMemory {
            records: Mutex::new(
                records
                    .into_iter()
                    .map(|record| (record.path.clone(), record))
                    .collect(),
            ),
            deferred: (durability == Durability::Approval).then(|| Mutex::new(Vec::new())),
        }
    }

    fn lookup(&self, path: &str) -> Option<StepRecord> {
        lock(&self.records).get(path).cloned()
    }

    /// Whether any step was recorded (stored or in this invocation).
    fn any(&self) -> bool {
        !lock(&self.records).is_empty()
    }

    /// Remembers `record` for lookups; gives it back when it is to be
    /// written now, or keeps it for `take_deferred` under `durability approval`.
    fn remember(&self, record: StepRecord) -> Option<StepRecord> {
        lock(&self.records).insert(record.path.clone(), record.clone());
        match &self.deferred {
            Some(deferred) => {
                lock(deferred).push(record);
                None
            }
            None => Some(record),
        }
    }

    /// The records held back since the last call, in the order they came.
    fn take_deferred(&self) -> Vec<StepRecord> {
        self.deferred
            .as_ref()
            .map(|deferred| std::mem::take(&mut *lock(deferred)))
            .unwrap_or_default()
    }
}
